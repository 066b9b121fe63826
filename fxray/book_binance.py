"""Binance USD-M futures depth captures -> book snapshots and trades, streamed.

A capture is text (gzip / zstd / plain), one `<local_ns> <json>` per line:
    {"lastUpdateId": L, "bids": [[px, qty], ...], "asks": ...}      REST depth snapshot
    {"stream": "<sym>@depth@0ms", "data": {"U", "u", "pu", "b", "a"}}  depth diff (absolute qty)
    {"stream": "<sym>@trade", "data": {"p", "q", "m", "T", ...}}      trade; m = buyer is maker
    {"stream": "<sym>@bookTicker", ...}                                 ignored (redundant with depth)
Timestamps are the local receive time (the first field), the moment the data was known.

Book sync follows Binance's documented procedure: diffs that arrive before the
snapshot are buffered; those with u < L are dropped; the first applied diff must
have U <= L <= u; after that every diff's pu must equal the previous diff's u. A
break is a BookError naming the file and line. Diffs buffered before the snapshot
are applied at the snapshot's time (the book is only known from then on).
"""

from __future__ import annotations

import json

import numpy as np

from fxray import book_engine as eng
from fxray.book_types import PRICE_SCALE, BookError, BookSnapshots, Trades, iter_bytes

DIFFS_PER_CHUNK = 1 << 15


def iter_lines(path: str, kinds: tuple):
    """(line_number, kind, local_ns, json_text) for lines of the given kinds, in time order.

    Lines of other kinds (e.g. 66k bookTicker lines in a 94k-line capture) are skipped
    after a substring test: no int or JSON parsing. The last item is (lines, "eof", None, b"").
    """
    tail, lineno, last, last_line = b"", 0, None, 0
    blocks = iter_bytes(path)
    while True:
        block = next(blocks, None)
        lines = (tail + (block or b"\n")).split(b"\n")
        tail = lines.pop()
        for raw in lines:
            lineno += 1
            kind = _kind(raw)
            if kind not in kinds:
                continue
            ts, js = _split(path, lineno, raw)
            if last is not None and ts < last:
                raise BookError(f"{path}: line {lineno}: local time {ts} is earlier than line "
                                f"{last_line} ({last}); lines must be in arrival order")
            last, last_line = ts, lineno
            yield lineno, kind, ts, js
        if block is None:
            yield lineno, "eof", None, b""  # always last: lets callers count every line
            return


def _split(path: str, lineno: int, raw: bytes):
    ts, _, js = raw.partition(b" ")
    try:
        return int(ts), js
    except ValueError:
        raise BookError(f"{path}: line {lineno}: expected '<local_ns> <json>', "
                        f"got {raw[:60]!r}") from None


def _parse(path: str, lineno: int, js: bytes) -> dict:
    try:
        return json.loads(js)
    except json.JSONDecodeError as e:
        raise BookError(f"{path}: line {lineno}: bad JSON ({e.msg} at column {e.colno})") from None


def _kind(raw: bytes) -> str:
    """Classify a line from its first bytes, so ignored lines are never JSON-parsed."""
    head = raw[:72]
    if b"lastUpdateId" in head:
        return "snapshot"
    if b"@depth" in head:
        return "diff"
    if b"@trade" in head:
        return "trade"
    return "other" if head.strip() else "blank"


class _Levels:
    """Level updates of a batch of book events (one event = the snapshot or one diff)."""

    def __init__(self):
        self.ts, self.n_bid, self.n_ask, self.pairs = [], [], [], []

    def add_event(self, ts: int, bids: list, asks: list) -> None:
        self.ts.append(ts)
        self.n_bid.append(len(bids))
        self.n_ask.append(len(asks))
        self.pairs += bids
        self.pairs += asks

    def arrays(self):
        """(ts, offsets, is_bid, price key in 1e-9 units, qty) for `levels_apply`."""
        n_bid, n_ask = np.array(self.n_bid, np.int64), np.array(self.n_ask, np.int64)
        offsets = np.r_[0, np.cumsum(n_bid + n_ask)]
        is_bid = np.repeat(np.tile([True, False], len(n_bid)), np.column_stack([n_bid, n_ask]).ravel())
        # numpy parses the decimal strings in C; x 1e9 then rint is exact up to 9 decimals
        pq = np.array(self.pairs, dtype=np.float64).reshape(-1, 2)
        key = np.rint(pq[:, 0] * PRICE_SCALE).astype(np.int64)
        return np.array(self.ts, np.int64), offsets, is_bid, key, pq[:, 1].copy()


class _Sync:
    """Binance's book-sync procedure over the lines of one file; owns the pending batch."""

    def __init__(self, path: str, st: dict):
        self.path, self.st = path, st
        self.batch = _Levels()
        self.buffered = []       # (lineno, data) of diffs seen before the snapshot
        self.snap_line = None    # line of the snapshot, once seen
        self.last_id = None      # its lastUpdateId
        self.last_u = None       # final update id of the last applied diff

    def snapshot(self, lineno: int, ts: int, js: bytes) -> None:
        if self.snap_line is not None:
            raise BookError(f"{self.path}: line {lineno}: a second depth snapshot (first at line "
                            f"{self.snap_line}); split the capture into one file per snapshot")
        snap = _parse(self.path, lineno, js)
        self.snap_line, self.last_id = lineno, int(snap["lastUpdateId"])
        eng.clear_book(self.st)
        self.batch.add_event(ts, snap["bids"], snap["asks"])
        for b_line, d in self.buffered:  # buffered diffs apply at the snapshot's time
            self._apply(b_line, ts, d)
        self.buffered = []

    def diff(self, lineno: int, ts: int, js: bytes) -> None:
        d = _parse(self.path, lineno, js)["data"]
        if self.snap_line is None:
            self.buffered.append((lineno, d))
        else:
            self._apply(lineno, ts, d)

    def _apply(self, lineno: int, ts: int, d: dict) -> None:
        if self.last_u is None and d["u"] < self.last_id:
            return  # older than the snapshot: Binance says drop it
        self.last_u = _check_diff(self.path, lineno, d, self.last_u, self.last_id)
        self.batch.add_event(ts, d["b"], d["a"])


def iter_book(path: str, st: dict, stats: dict, out_rows: int = 1 << 16):
    """Yield BookSnapshots for one capture file; `st` is the engine state."""
    sync, last_line = _Sync(path, st), 0
    for lineno, kind, ts, js in iter_lines(path, ("snapshot", "diff")):
        stats["messages"] += lineno - last_line  # every line read counts, skipped ones too
        last_line = lineno
        if kind == "eof":
            break
        stats["end"] = ts
        try:
            (sync.snapshot if kind == "snapshot" else sync.diff)(lineno, ts, js)
        except (KeyError, TypeError, IndexError) as e:
            raise BookError(f"{path}: line {lineno}: malformed {kind} message "
                            f"({type(e).__name__}: {e})") from None
        if len(sync.batch.ts) >= DIFFS_PER_CHUNK:
            yield from _run(path, sync.batch, st, out_rows)
            sync.batch = _Levels()
    if sync.snap_line is None:
        raise BookError(f"{path}: line {last_line}: no depth snapshot (lastUpdateId) "
                        "in the file; cannot build a book from diffs alone")
    yield from _run(path, sync.batch, st, out_rows)


def _check_diff(path: str, lineno: int, d: dict, last_u, last_id: int) -> int:
    """Binance's continuity rules; returns the diff's final update id."""
    if last_u is None:
        if not d["U"] <= last_id <= d["u"]:
            raise BookError(f"{path}: line {lineno}: first diff after the snapshot has "
                            f"U={d['U']} u={d['u']}, which does not bridge lastUpdateId={last_id} "
                            "(diffs missing between snapshot and stream)")
    elif d["pu"] != last_u:
        raise BookError(f"{path}: line {lineno}: depth diff pu={d['pu']} does not continue the "
                        f"previous diff's u={last_u} (sequence gap); recapture or split the file here")
    return d["u"]


def _run(path: str, batch: _Levels, st: dict, out_rows: int):
    if not batch.ts:
        return
    try:
        ts, offsets, is_bid, key, qty = batch.arrays()
    except ValueError as e:
        raise BookError(f"{path}: a depth level is not a [price, qty] pair of numbers ({e})") from None
    e = 0
    while e < len(ts):
        out = eng.new_output(min(out_rows, len(ts) - e + 2))
        e, r = eng.levels_apply(ts, offsets, is_bid, key, qty, e, st["bid_keys"], st["bid_sizes"],
                                st["ask_keys"], st["ask_sizes"], st["last_keys"],
                                st["last_sizes"], st["state"], *out)
        if r:
            yield BookSnapshots(*(a[:r] for a in out))
        if e < len(ts) and r < len(out[0]) - 1:
            eng.grow_levels(st)


def read_trades(path: str) -> Trades:
    """All `@trade` lines; side from `m` (buyer is maker => the seller was the aggressor)."""
    ts, px, qty, side = [], [], [], []
    first = last = None
    for lineno, kind, t, js in iter_lines(path, ("trade",)):
        if kind == "eof":
            break
        first = t if first is None else first
        last = t
        d = _parse(path, lineno, js)["data"]
        ts.append(t)
        px.append(d["p"])
        qty.append(d["q"])
        side.append(-1 if d["m"] else 1)
    segments = np.array([[first, last]], np.int64) if first is not None else np.zeros((0, 2), np.int64)
    return Trades(np.array(ts, np.int64), np.array(px, dtype=np.float64),
                  np.array(qty, dtype=np.float64), np.array(side, np.int8), segments)
