"""Is an fxcache what it claims to be: the value scans and the content hash.

    digest = content_hash(ts, features, ofi, targets)        # BLAKE3, what `cache.write` stores
    verify(market)                                           # O(N): raises CacheError, one line

`cache.open` reads the structure and the metadata (O(metadata): milliseconds for any
size), then runs these O(N) checks unless told `verify=False`. A file's stored `content_hash` is proven here by
hashing its four columns again, so a flipped byte or a file cut short is found, and
what a sweep or a training run records under that hash is what it trained on.

The contract for a writer (docs/reliability.md, "The fxcache content hash"): `content_hash` is the
lowercase hex digest, by the hash named in `content_hash_algo` ("blake3", what `write`
uses; "sha256", files written before it, which have no such key), of the four columns'
raw little-endian bytes, C order, one after the other in column order (ts int64,
features float32, ofi float32, targets float32). fxray stores its first 32 hex digits
(128 bits); the full 64-digit digest is accepted too (and checked in full). Anything else
is refused at open, in one line that says so.
"""

from __future__ import annotations

import hashlib

import numpy as np


class CacheError(ValueError):
    """A bad fxcache file or bad arrays handed to `write`; the message is one line."""


HASH_ALGOS = ("blake3", "sha256")
DEFAULT_ALGO = "blake3"
LEGACY_ALGO = "sha256"  # a file with no content_hash_algo key
COLUMN_ORDER = ("ts", "features", "ofi", "targets")


HASH_DIGITS = 32  # what fxray writes and what a Market's content_hash is (a file's identity)
FULL_DIGITS = 64  # the whole digest (both hashes are 256 bits), also accepted


def stored_hash(path, value, algo: str) -> dict:
    """{"content_hash": its first 32 hex digits, "content_hash_full": all 64 (when stored)} of a
    file's stored content_hash, or CacheError saying exactly what a writer must store."""
    text = value.strip().lower() if isinstance(value, str) else ""
    if len(text) not in (HASH_DIGITS, FULL_DIGITS) or any(c not in "0123456789abcdef" for c in text):
        raise CacheError(
            f"{path}: schema metadata content_hash: {str(value)[:70]!r} is not a content hash: fxray expects the "
            f"{algo} hex digest of the columns' bytes (ts, features, ofi, targets in that order), its first "
            f"{HASH_DIGITS} or all {FULL_DIGITS} hex digits (docs/reliability.md)"
        )
    return {"content_hash": text[:HASH_DIGITS], **({"content_hash_full": text} if len(text) == FULL_DIGITS else {})}


def content_hash(ts, features, ofi, targets, algo: str = DEFAULT_ALGO, digits: int = HASH_DIGITS) -> str:
    """The digest of the four columns' bytes, in column order (a file's identity), as `digits`
    hex digits (32: what fxray stores; 64: the whole digest)."""
    if algo == "blake3":
        import blake3

        h = blake3.blake3(max_threads=blake3.blake3.AUTO)  # a tree hash: the same digest on any thread count
    else:  # "sha256" (cache.parse_meta refuses any other name)
        h = hashlib.sha256()
    for a in (ts, features, ofi, targets):
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return h.hexdigest()[:digits]


def check_values(path: str, cols: dict) -> None:
    """Rows, strictly increasing ts, no NaN/Inf, prices > 0: CacheError naming the row otherwise."""
    ts = cols["ts"]
    if len(ts) == 0:
        raise CacheError(f"{path}: no rows")
    bad = np.flatnonzero(ts[1:] <= ts[:-1])
    if len(bad):
        i = int(bad[0]) + 1
        raise CacheError(
            f"{path}: ts is not strictly increasing at row {i} "
            f"({ts[i - 1]} then {ts[i]}); sort and deduplicate the bars"
        )
    for name in ("features", "ofi", "targets"):
        a = cols[name]
        # A sum in the column's own dtype propagates NaN/Inf in one SIMD pass with no
        # temporary; only when it is not finite (a bad value, or an overflow of huge
        # but finite values) do we pay for the exact elementwise check.
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(a.sum()):
                continue
        bad_rows = np.flatnonzero(~np.isfinite(a).all(axis=1))
        if len(bad_rows):
            row = int(bad_rows[0])
            colno = int(np.flatnonzero(~np.isfinite(a[row]))[0])
            raise CacheError(
                f"{path}: column {name!r} has NaN/Inf (first at row {row}, "
                f"element {colno}); fix the source bars or features"
            )
    targets = cols["targets"]
    if targets.size and not targets.min() > 0:  # a log return of a price <= 0 is NaN, found late
        row = int(np.flatnonzero((targets <= 0).any(axis=1))[0])
        which = ("open", "high", "low", "close")[int(np.flatnonzero(targets[row] <= 0)[0])]
        raise CacheError(
            f"{path}: column 'targets' has a price <= 0 (first at row {row}: {which} {targets[row].tolist()}); "
            "prices must be positive: fix or drop those bars"
        )


def verify(market) -> None:
    """Every value of `market` checked and its content hash recomputed against the stored one;
    CacheError (one line) otherwise."""
    cols = {k: getattr(market, k) for k in COLUMN_ORDER}
    check_values(market.path, cols)
    algo = market.meta.get("content_hash_algo", LEGACY_ALGO)
    stored = market.meta.get("content_hash_full") or market.content_hash  # 64 or 32 hex digits
    digest = content_hash(*cols.values(), algo=algo, digits=len(stored))
    if digest != stored:
        raise CacheError(
            f"{market.path}: its contents do not match its stored content hash ({algo} {digest} != "
            f"{stored}): the file was changed or damaged; rebuild it with `fxray data`"
        )
