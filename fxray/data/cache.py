"""The fxcache format: one uncompressed Arrow IPC file, memory-mapped, zero-copy.

    ts        int64                    bar close time, ns since epoch (UTC), strictly increasing
    features  fixed_size_list<f32>[42] market features known at bar close
    ofi       fixed_size_list<f32>[8]  order-flow features (zeros where no book data)
    targets   fixed_size_list<f64>[4]  open, high, low, close

`write` is atomic (temp file + rename); `open` maps the file and returns numpy
views into the mapping: no per-row Python and no copy. Every problem a reader
can meet is a `CacheError` whose message is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from fxray.data.schema import N_FEATURES, N_OFI, TARGET_NAMES

FORMAT_VERSION = "1"
COLUMNS = {  # name -> (arrow value type, width or None for a scalar column)
    "ts": (pa.int64(), None),
    "features": (pa.float32(), N_FEATURES),
    "ofi": (pa.float32(), N_OFI),
    "targets": (pa.float64(), len(TARGET_NAMES)),
}
REQUIRED_META = ("fxray.version", "feature_names", "ofi_names", "instrument", "bar", "source", "content_hash")


class CacheError(ValueError):
    """A bad fxcache file or bad arrays handed to `write`; the message is one line."""


@dataclass(frozen=True)
class Market:
    """An opened fxcache: read-only numpy views into the memory-mapped file."""

    path: str
    ts: np.ndarray  # (N,) int64 ns
    features: np.ndarray  # (N, 42) float32
    ofi: np.ndarray  # (N, 8) float32
    targets: np.ndarray  # (N, 4) float64 open/high/low/close
    meta: dict = field(repr=False)

    @property
    def n_bars(self) -> int:
        return len(self.ts)

    @property
    def close(self) -> np.ndarray:
        return self.targets[:, 3]

    @property
    def content_hash(self) -> str:
        return self.meta["content_hash"]

    @property
    def feature_names(self) -> list[str]:
        return self.meta["feature_names"]

    @property
    def ofi_names(self) -> list[str]:
        return self.meta["ofi_names"]


def content_hash(ts, features, ofi, targets) -> str:
    """sha256 over the four columns' bytes, in column order (the file's identity)."""
    h = hashlib.sha256()
    for a in (ts, features, ofi, targets):
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()[:32]


def _fixed_list(values: np.ndarray, width: int) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, width)


def write(
    path,
    ts,
    features,
    ofi=None,
    targets=None,
    *,
    feature_names,
    ofi_names,
    instrument: str,
    bar: str,
    source: str,
    extra_meta: dict | None = None,
) -> str:
    """Validate the arrays and write them as an fxcache at `path`, atomically.

    `ofi=None` writes zeros (no order-book data). Returns the content hash.
    Nothing is left at `path` (nor a temp file beside it) if anything fails.
    """
    path = Path(path)
    ts = _as_array(path, "ts", ts, np.int64)
    if ts.ndim != 1:
        raise CacheError(f"{path}: ts must be 1-D, got shape {ts.shape}")
    n = len(ts)
    features = _as_array(path, "features", features, np.float32)
    ofi = np.zeros((n, N_OFI), np.float32) if ofi is None else _as_array(path, "ofi", ofi, np.float32)
    targets = _as_array(path, "targets", targets, np.float64)
    arrays = {"ts": ts, "features": features, "ofi": ofi, "targets": targets}
    _check_arrays(str(path), arrays)
    if len(feature_names) != N_FEATURES or len(ofi_names) != N_OFI:
        raise CacheError(
            f"{path}: need {N_FEATURES} feature names and {N_OFI} ofi names, "
            f"got {len(feature_names)} and {len(ofi_names)}"
        )
    reserved = sorted(set(extra_meta or {}) & set(REQUIRED_META))
    if reserved:
        raise CacheError(f"{path}: extra_meta may not set reserved key(s) {', '.join(reserved)}")
    digest = content_hash(ts, features, ofi, targets)
    meta = {
        "fxray.version": FORMAT_VERSION,
        "feature_names": json.dumps(list(feature_names)),
        "ofi_names": json.dumps(list(ofi_names)),
        "instrument": json.dumps(instrument),
        "bar": json.dumps(bar),
        "source": json.dumps(source),
        "content_hash": json.dumps(digest),
    }
    for k, v in (extra_meta or {}).items():
        meta[k] = json.dumps(v)
    table = pa.table(
        {
            "ts": pa.array(ts),
            "features": _fixed_list(features, N_FEATURES),
            "ofi": _fixed_list(ofi, N_OFI),
            "targets": _fixed_list(targets, len(TARGET_NAMES)),
        }
    ).replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its 0600 mode would survive the rename; os.open applies the umask.
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            with ipc.new_file(f, table.schema) as w:  # uncompressed: mmap gives zero-copy views
                w.write_table(table, max_chunksize=max(n, 1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def open(path, *, check_values: bool = True) -> Market:  # noqa: A001 - mirrors io.open
    """Memory-map an fxcache and return zero-copy views, after validating it.

    `check_values` scans every value for NaN/Inf and checks `ts` is strictly
    increasing (one pass per column, no temporaries the size of the data).
    """
    path = str(path)
    if not os.path.exists(path):
        raise CacheError(f"{path}: no such file (make one with `python -m fxray.data synth|build`)")
    try:
        source = pa.memory_map(path, "r")
        mapped = source.read_buffer()  # the whole mapping, zero-copy: views must point into it
        reader = ipc.open_file(source)
    except (pa.ArrowException, OSError) as e:
        raise CacheError(f"{path}: not an Arrow IPC file or truncated ({_first_line(e)})") from None
    schema = reader.schema
    try:
        raw_meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    except UnicodeDecodeError:
        raise CacheError(f"{path}: schema metadata is not utf-8") from None
    missing = [k for k in REQUIRED_META if k not in raw_meta]
    if missing:
        raise CacheError(f"{path}: not an fxcache: schema metadata lacks {', '.join(missing)}")
    version = raw_meta["fxray.version"]
    if version != FORMAT_VERSION:
        raise CacheError(
            f"{path}: fxcache version {version!r} is unknown to this fxray "
            f"(reads {FORMAT_VERSION!r}); rebuild it with `python -m fxray.data`"
        )
    try:
        meta = {k: (v if k == "fxray.version" else json.loads(v)) for k, v in raw_meta.items()}
    except json.JSONDecodeError as e:
        raise CacheError(f"{path}: schema metadata is not JSON ({e})") from None
    _check_schema(path, schema)
    if reader.num_record_batches != 1:
        raise CacheError(
            f"{path}: expected 1 record batch, found {reader.num_record_batches} (write it with fxray.data.cache.write)"
        )
    try:
        batch = reader.get_batch(0)
    except (pa.ArrowException, OSError) as e:
        raise CacheError(f"{path}: truncated or corrupt record batch ({_first_line(e)})") from None
    cols = {}
    for name, (_, width) in COLUMNS.items():
        col = batch.column(name)
        values = col if width is None else col.values.slice(col.offset * width, len(col) * width)
        nulls = col.null_count or values.null_count
        if nulls:
            raise CacheError(f"{path}: column {name!r} has {nulls} nulls")
        data = values.buffers()[1]
        if (
            data is not None
            and data.size
            and not (mapped.address <= data.address <= mapped.address + mapped.size - data.size)
        ):
            raise CacheError(
                f"{path}: column {name!r} is not stored plainly in the file "
                "(compressed?); rewrite it with fxray.data.cache.write"
            )
        flat = values.to_numpy(zero_copy_only=True)
        cols[name] = flat if width is None else flat.reshape(len(col), width)
    if check_values:
        _check_values(path, cols)
    return Market(path=path, meta=meta, **cols)


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _check_schema(path: str, schema: pa.Schema) -> None:
    names = set(schema.names)
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise CacheError(f"{path}: missing column(s) {', '.join(missing)} (an fxcache has {', '.join(COLUMNS)})")
    repeated = [c for c in COLUMNS if schema.names.count(c) > 1]
    if repeated:
        raise CacheError(f"{path}: column(s) {', '.join(repeated)} appear more than once")
    for name, (vtype, width) in COLUMNS.items():
        t = schema.field(name).type
        if width is None:
            ok = t == vtype
            want = str(vtype)
        else:
            ok = pa.types.is_fixed_size_list(t) and t.list_size == width and t.value_type == vtype
            want = f"fixed_size_list<{vtype}>[{width}]"
        if not ok:
            raise CacheError(f"{path}: column {name!r} is {t}, expected {want}")


def _as_array(path, name: str, values, dtype) -> np.ndarray:
    try:
        a = np.asarray(values)
        if name == "ts":
            # float64 cannot hold ns since epoch exactly (53-bit mantissa): refuse, don't round.
            if a.dtype.kind == "M":
                a = a.astype("datetime64[ns]")
            elif a.dtype.kind not in "iu":
                raise CacheError(f"{path}: ts must be integer ns since epoch, got dtype {a.dtype}")
        return a.astype(dtype, copy=False)
    except (TypeError, ValueError) as e:
        if isinstance(e, CacheError):
            raise
        raise CacheError(f"{path}: {name} is not convertible to {np.dtype(dtype)} ({_first_line(e)})") from None


def _check_arrays(path: str, arrays: dict) -> None:
    n = len(arrays["ts"])
    for name, (_, width) in COLUMNS.items():
        if width is not None and arrays[name].shape != (n, width):
            raise CacheError(f"{path}: {name} must have shape ({n}, {width}), got {arrays[name].shape}")
    _check_values(path, arrays)


def _parallel_sum(a: np.ndarray, min_chunk_rows: int = 262_144) -> float:
    """Sum of all elements, row chunks summed on threads (numpy releases the GIL)."""
    n_chunks = min(os.cpu_count() or 1, 16, max(1, len(a) // min_chunk_rows))
    bounds = np.linspace(0, len(a), n_chunks + 1).astype(int)

    def part(i: int) -> float:
        with np.errstate(over="ignore", invalid="ignore"):  # per thread: errstate is a contextvar
            return float(a[bounds[i] : bounds[i + 1]].sum())

    if n_chunks == 1:
        return part(0)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n_chunks) as pool:
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.sum(list(pool.map(part, range(n_chunks)))))


def _check_values(path: str, cols: dict) -> None:
    ts = cols["ts"]
    if len(ts) == 0:
        raise CacheError(f"{path}: no rows")
    if len(ts) > 1:
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
        if np.isfinite(_parallel_sum(a)):
            continue
        bad_rows = np.flatnonzero(~np.isfinite(a).all(axis=1))
        if len(bad_rows):
            row = int(bad_rows[0])
            colno = int(np.flatnonzero(~np.isfinite(a[row]))[0])
            raise CacheError(
                f"{path}: column {name!r} has NaN/Inf (first at row {row}, "
                f"element {colno}); fix the source bars or features"
            )
