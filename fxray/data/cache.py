"""The fxcache format: one uncompressed Arrow IPC file, memory-mapped, zero-copy.

    ts        int64                    bar close time, ns since epoch (UTC), strictly increasing
    features  fixed_size_list<f32>[42] market features known at bar close
    ofi       fixed_size_list<f32>[8]  order-flow features (zeros where no book data)
    targets   fixed_size_list<f64>[4]  open, high, low, close

`write` is atomic (temp file + rename); `open` maps the file and returns numpy
views into the mapping: no per-row Python and no copy. `open` reads the structure
and the metadata (milliseconds whatever the size), then runs the O(N) checks (every
value, and the content hash recomputed: fxray.data.integrity) before it returns, unless
`verify=False` (a caller that reads the metadata only). Every problem a reader can meet
is a `CacheError` whose message is one line naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from fxray.data import integrity
from fxray.data.atomic import atomic_path
from fxray.data.integrity import CacheError
from fxray.data.schema import N_FEATURES, N_OFI, TARGET_NAMES

FORMAT_VERSION = "1"
COLUMNS = {  # name -> (numpy dtype of the values, width or None for a scalar column)
    "ts": (np.dtype(np.int64), None),
    "features": (np.dtype(np.float32), N_FEATURES),
    "ofi": (np.dtype(np.float32), N_OFI),
    "targets": (np.dtype(np.float64), len(TARGET_NAMES)),
}
REQUIRED_META = ("fxray.version", "feature_names", "ofi_names", "instrument", "bar", "source", "content_hash")
STRING_META = ("instrument", "bar", "source", "content_hash", "content_hash_algo")  # a plain string is accepted
RESERVED_META = (*REQUIRED_META, "content_hash_algo")


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


def _column(values: np.ndarray, width: int | None) -> pa.Array:
    if width is None:
        return pa.array(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).reshape(-1)), width)


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
    arrays = {"ts": _as_array(path, "ts", ts, np.int64)}
    if arrays["ts"].ndim != 1:
        raise CacheError(f"{path}: ts must be 1-D, got shape {arrays['ts'].shape}")
    n = len(arrays["ts"])
    ofi = np.zeros((n, N_OFI), np.float32) if ofi is None else ofi
    for name, values in (("features", features), ("ofi", ofi), ("targets", targets)):
        dtype, width = COLUMNS[name]
        arrays[name] = _as_array(path, name, values, dtype)
        if arrays[name].shape != (n, width):
            raise CacheError(f"{path}: {name} must have shape ({n}, {width}), got {arrays[name].shape}")
    integrity.check_values(str(path), arrays)
    reserved = sorted(set(extra_meta or {}) & set(RESERVED_META))
    if reserved:
        raise CacheError(f"{path}: extra_meta may not set reserved key(s) {', '.join(reserved)}")

    digest = integrity.content_hash(*arrays.values())
    values = {
        "feature_names": list(feature_names),
        "ofi_names": list(ofi_names),
        "instrument": instrument,
        "bar": bar,
        "source": source,
        "content_hash": digest,
        "content_hash_algo": integrity.DEFAULT_ALGO,
        **(extra_meta or {}),
    }
    meta = {"fxray.version": FORMAT_VERSION, **{k: json.dumps(v) for k, v in values.items()}}
    parse_meta(str(path), meta)  # what open checks of the metadata (the names: one per column)
    table = pa.table({name: _column(arrays[name], width) for name, (_, width) in COLUMNS.items()}, metadata=meta)
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        with ipc.new_file(f, table.schema) as w:  # uncompressed: mmap gives zero-copy views
            w.write_table(table, max_chunksize=max(n, 1))
        f.flush()
        os.fsync(f.fileno())
    return digest


def open(path, *, verify: bool = True) -> Market:  # noqa: A001 - mirrors io.open
    """Memory-map an fxcache and return zero-copy views, after validating its structure
    and metadata (O(metadata)) and, unless `verify=False`, the O(N) checks of
    fxray.data.integrity (ts strictly increasing, no NaN/Inf, prices > 0, the content hash
    recomputed).
    """
    path = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CacheError(f"{path}: no such file (make one with `fxray data synth|build`)") from None
    except OSError as e:
        raise CacheError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):  # a FIFO would block the mmap forever; a directory is no file
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise CacheError(f"{path}: is {kind}, not an fxcache file; pass the path of an .fxcache file")
    try:
        source = pa.memory_map(path, "r")
        mapped = source.read_buffer()  # the whole mapping, zero-copy: views must point into it
        reader = ipc.open_file(source)
    except (pa.ArrowException, OSError) as e:
        raise CacheError(f"{path}: not an Arrow IPC file or truncated ({first_line(e)})") from None
    schema = reader.schema
    try:
        raw_meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    except UnicodeDecodeError:
        raise CacheError(f"{path}: schema metadata is not utf-8") from None
    meta = parse_meta(path, raw_meta)
    _check_schema(path, schema)
    if reader.num_record_batches != 1:
        raise CacheError(
            f"{path}: expected 1 record batch, found {reader.num_record_batches} (write it with fxray.data.cache.write)"
        )
    try:
        batch = reader.get_batch(0)
    except (pa.ArrowException, OSError) as e:
        raise CacheError(f"{path}: truncated or corrupt record batch ({first_line(e)})") from None
    if batch.num_rows == 0:
        raise CacheError(f"{path}: no rows")
    cols, end = {}, mapped.address + mapped.size
    for name, (dtype, width) in COLUMNS.items():
        col = batch.column(name)
        values = col if width is None else col.values.slice(col.offset * width, len(col) * width)
        nulls = col.null_count or values.null_count
        if nulls:
            raise CacheError(f"{path}: column {name!r} has {nulls} nulls")
        data = values.buffers()[1]
        if not mapped.address <= data.address <= end - data.size:
            raise CacheError(
                f"{path}: column {name!r} is not stored plainly in the file "
                "(compressed?); rewrite it with fxray.data.cache.write"
            )
        # np.frombuffer, not Array.to_numpy: the same zero-copy view, without the pandas import
        # (150 ms) that pyarrow's to_numpy pays on its first call in a process
        flat = np.frombuffer(data, dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize)
        cols[name] = flat if width is None else flat.reshape(len(col), width)
    market = Market(path=path, meta=meta, **cols)
    if verify:
        integrity.verify(market)
    return market


def parse_meta(path: str, raw: dict[str, str]) -> dict:
    """The schema metadata as values: JSON, or a plain string where the value is a string
    (`instrument: ES`, `fxray.version: 1`: what other programs write). A wrong value names its key."""
    missing = [k for k in REQUIRED_META if k not in raw]
    if missing:
        raise CacheError(f"{path}: not an fxcache: schema metadata lacks {', '.join(missing)}")
    meta = {}
    for key, text in raw.items():
        try:
            value = json.loads(text)
        except ValueError:
            if key in ("feature_names", "ofi_names"):
                raise CacheError(
                    f"{path}: schema metadata {key}: {_short(text)} is not JSON (write the list of names as JSON)"
                ) from None
            value = text  # a plain string (another program's own keys are kept as written too)
        if key in STRING_META and not isinstance(value, str):
            value = text  # `instrument: 1` is the name "1"
        meta[key] = value
    version = meta["fxray.version"]
    if str(version) != FORMAT_VERSION or isinstance(version, (bool, float)):
        raise CacheError(
            f"{path}: schema metadata fxray.version: {_short(raw['fxray.version'])} is unknown to this fxray "
            f"(reads {FORMAT_VERSION!r}); rebuild it with `fxray data`"
        )
    meta["fxray.version"] = FORMAT_VERSION
    for key, width in (("feature_names", N_FEATURES), ("ofi_names", N_OFI)):
        names = meta[key]
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise CacheError(
                f"{path}: schema metadata {key}: must be a JSON list of {width} strings, got {_short(raw[key])}"
            )
        if len(names) != width:
            raise CacheError(
                f"{path}: schema metadata {key}: has {len(names)} names for the {width} columns of "
                f"{key.split('_')[0] if key == 'ofi_names' else 'features'}; name every column once"
            )
    algo = meta.get("content_hash_algo")
    if algo is not None and algo not in integrity.HASH_ALGOS:
        raise CacheError(
            f"{path}: schema metadata content_hash_algo: {algo!r} is not a hash fxray knows "
            f"({', '.join(integrity.HASH_ALGOS)})"
        )
    meta.update(integrity.stored_hash(path, meta["content_hash"], algo or integrity.LEGACY_ALGO))
    return meta


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _check_schema(path: str, schema: pa.Schema) -> None:
    missing = [c for c in COLUMNS if c not in schema.names]
    if missing:
        raise CacheError(f"{path}: missing column(s) {', '.join(missing)} (an fxcache has {', '.join(COLUMNS)})")
    repeated = [c for c in COLUMNS if schema.names.count(c) > 1]
    if repeated:
        raise CacheError(f"{path}: column(s) {', '.join(repeated)} appear more than once")
    for name, (dtype, width) in COLUMNS.items():
        t, vtype = schema.field(name).type, pa.from_numpy_dtype(dtype)
        if width is None:
            ok, want = t == vtype, str(vtype)
        else:
            ok = pa.types.is_fixed_size_list(t) and t.list_size == width and t.value_type == vtype
            want = f"fixed_size_list<{vtype}>[{width}]"
        if not ok:
            raise CacheError(f"{path}: column {name!r} is {t}, expected {want}")


def _as_array(path, name: str, values, dtype) -> np.ndarray:
    try:
        a = np.asarray(values)
        # float64 cannot hold ns since epoch exactly (53-bit mantissa): refuse, don't round.
        if name != "ts" or a.dtype.kind in "iu":
            return a.astype(dtype, copy=False)
        if a.dtype.kind == "M":
            return a.astype("datetime64[ns]").astype(dtype)
    except (TypeError, ValueError) as e:
        raise CacheError(f"{path}: {name} is not convertible to {np.dtype(dtype)} ({first_line(e)})") from None
    raise CacheError(f"{path}: ts must be integer ns since epoch, got dtype {a.dtype}")
