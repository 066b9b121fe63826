"""fxcache: round trip, zero-copy mapping, atomic write, and a one-line CacheError
naming the file for every bad file (built here with raw pyarrow, bypassing `write`)
and every bad argument to `write`."""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from fxray.data import cache, integrity
from fxray.data.atomic import atomic_path
from fxray.data.cache import CacheError

FEATURE_NAMES = [f"feat_{i}" for i in range(cache.N_FEATURES)]
OFI_NAMES = [f"ofi_{i}" for i in range(cache.N_OFI)]
MINUTE_NS = 60 * 10**9


# --- helpers ------------------------------------------------------------------------


def make_arrays(n: int, seed: int = 0) -> dict:
    """Random bars with irregular (but strictly increasing) close times."""
    rng = np.random.default_rng(seed)
    gaps = rng.integers(1, 5, n) * MINUTE_NS
    return {
        "ts": 1_700_000_000 * 10**9 + np.cumsum(gaps),  # (N,) int64
        "features": rng.standard_normal((n, cache.N_FEATURES)).astype(np.float32),
        "ofi": rng.standard_normal((n, cache.N_OFI)).astype(np.float32),
        "targets": 100 + rng.random((n, 4)),  # (N, 4) float64
    }


def write(path, arrays: dict, **kw) -> str:
    args = dict(feature_names=FEATURE_NAMES, ofi_names=OFI_NAMES, instrument="EURUSD", bar="1min", source="test")
    args.update(kw)
    return cache.write(path, arrays["ts"], arrays["features"], arrays["ofi"], arrays["targets"], **args)


def good_meta(arrays: dict, **override) -> dict:
    meta = {
        "fxray.version": cache.FORMAT_VERSION,
        "feature_names": json.dumps(FEATURE_NAMES),
        "ofi_names": json.dumps(OFI_NAMES),
        "instrument": json.dumps("EURUSD"),
        "bar": json.dumps("1min"),
        "source": json.dumps("raw pyarrow"),
        # sha256 and no content_hash_algo key: a file written before BLAKE3 (it must still verify)
        "content_hash": json.dumps(integrity.content_hash(*arrays.values(), algo="sha256")),
    }
    meta.update(override)
    return {k: v for k, v in meta.items() if v is not None}


def fixed_list(values: np.ndarray, type_=None) -> pa.Array:
    values = np.asarray(values)
    flat = pa.array(values.reshape(-1), type=type_)
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def raw_table(arrays: dict, meta: dict | None = None, **columns) -> pa.Table:
    """The fxcache table built by hand; `columns` replaces (or with None drops) a column."""
    cols = {
        "ts": pa.array(arrays["ts"]),
        "features": fixed_list(arrays["features"]),
        "ofi": fixed_list(arrays["ofi"]),
        "targets": fixed_list(arrays["targets"]),
    }
    cols.update(columns)
    table = pa.table({k: v for k, v in cols.items() if v is not None})
    return table.replace_schema_metadata(good_meta(arrays) if meta is None else meta)


def raw_write(path: Path, table: pa.Table, *, max_chunksize=None, options=None) -> Path:
    with ipc.new_file(path, table.schema, options=options) as w:
        w.write_table(table, max_chunksize=max_chunksize)
    return path


def assert_one_line(err: pytest.ExceptionInfo, path, *needles: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle.lower() in msg.lower(), (needle, msg)


def open_error(path, *needles: str) -> None:
    with pytest.raises(CacheError) as err:
        cache.open(path)
    assert_one_line(err, path, *needles)


# --- round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 997])
def test_round_trip_arrays_and_metadata(tmp_path, n):
    arrays = make_arrays(n, seed=n)
    extra = {"synth": {"seed": 3, "drift": 0.5, "names": ["a", "b"]}, "note": "hello"}
    path = tmp_path / "sub" / "m.fxcache"  # the parent directory is created
    digest = write(path, arrays, extra_meta=extra)

    m = cache.open(path)
    for name, want in arrays.items():
        got = getattr(m, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    np.testing.assert_array_equal(m.close, arrays["targets"][:, 3])
    assert m.n_bars == n
    assert m.path == str(path)
    assert m.feature_names == FEATURE_NAMES and m.ofi_names == OFI_NAMES
    assert (m.meta["instrument"], m.meta["bar"], m.meta["source"]) == ("EURUSD", "1min", "test")
    assert m.meta["synth"] == extra["synth"] and m.meta["note"] == "hello"
    assert m.meta["fxray.version"] == cache.FORMAT_VERSION
    assert digest == m.content_hash == integrity.content_hash(m.ts, m.features, m.ofi, m.targets)
    assert digest == integrity.content_hash(*arrays.values())


def test_content_hash_sees_every_column(tmp_path):
    arrays = make_arrays(50)
    base = integrity.content_hash(*arrays.values())
    for name in arrays:
        changed = {k: v.copy() for k, v in arrays.items()}
        changed[name].reshape(-1)[-1] += 1
        assert integrity.content_hash(*changed.values()) != base, name


def test_ofi_none_writes_zeros_and_lists_are_accepted(tmp_path):
    arrays = make_arrays(5)
    path = tmp_path / "m.fxcache"
    cache.write(
        path,
        arrays["ts"].tolist(),
        arrays["features"].tolist(),
        None,
        arrays["targets"].tolist(),
        feature_names=tuple(FEATURE_NAMES),
        ofi_names=OFI_NAMES,
        instrument="X",
        bar="1min",
        source="test",
    )
    m = cache.open(path)
    assert m.ofi.dtype == np.float32 and m.ofi.shape == (5, cache.N_OFI) and not m.ofi.any()
    np.testing.assert_array_equal(m.ts, arrays["ts"])
    np.testing.assert_array_equal(m.features, arrays["features"])


def test_datetime64_ts_is_stored_as_ns(tmp_path):
    arrays = make_arrays(3)
    arrays["ts"] = np.array(["2024-01-01T00:01", "2024-01-01T00:02", "2024-01-01T00:03"], dtype="datetime64[m]")
    write(tmp_path / "m.fxcache", arrays)
    want = np.array(["2024-01-01T00:01", "2024-01-01T00:02", "2024-01-01T00:03"], dtype="datetime64[ns]").astype(
        np.int64
    )
    np.testing.assert_array_equal(cache.open(tmp_path / "m.fxcache").ts, want)


@pytest.mark.filterwarnings("error")  # and no overflow RuntimeWarning either
def test_huge_finite_values_are_not_mistaken_for_inf(tmp_path):
    arrays = make_arrays(4)
    arrays["targets"][:] = 1e308  # their sum overflows; each value is finite
    arrays["features"][:] = 3e38
    arrays["ofi"][:, ::2], arrays["ofi"][:, 1::2] = 3e38, -3e38
    write(tmp_path / "m.fxcache", arrays)
    m = cache.open(tmp_path / "m.fxcache")
    for name, want in arrays.items():
        np.testing.assert_array_equal(getattr(m, name), want, err_msg=name)


@pytest.mark.parametrize("row", [0, 299_999, 300_000, 599_999])
def test_non_finite_value_found_in_any_row_of_a_long_column(tmp_path, row):
    """A non-finite value anywhere in a long column is found, naming its row and element."""
    n = 600_000
    arrays = {
        "ts": np.arange(n, dtype=np.int64),
        "features": np.zeros((n, 42), np.float32),
        "ofi": np.zeros((n, 8), np.float32),
        "targets": np.ones((n, 4)),
    }
    arrays["ofi"][row, 7] = np.inf
    with pytest.raises(CacheError) as err:
        write(tmp_path / "m.fxcache", arrays)
    assert_one_line(err, tmp_path / "m.fxcache", "'ofi'", f"row {row}", "element 7")


def test_written_file_respects_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write(tmp_path / "m.fxcache", make_arrays(3))
    finally:
        os.umask(old)
    assert (tmp_path / "m.fxcache").stat().st_mode & 0o777 == 0o644


def test_rewrite_replaces_the_file(tmp_path):
    path = tmp_path / "m.fxcache"
    write(path, make_arrays(10, seed=1))
    second = make_arrays(20, seed=2)
    write(path, second)
    np.testing.assert_array_equal(cache.open(path).features, second["features"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.fxcache"]


# --- a million rows: no per-row cost, no copy --------------------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """~1M rows (240 MB), written once; cheap structured values so building them is fast."""
    n = 1_000_000
    ts = np.arange(n, dtype=np.int64) * MINUTE_NS + 1_600_000_000 * 10**9
    features = np.empty((n, cache.N_FEATURES), np.float32)
    features[:] = np.arange(cache.N_FEATURES, dtype=np.float32)
    features[:, 0] = np.arange(n)
    ofi = np.ones((n, cache.N_OFI), np.float32)
    ofi[:, -1] = -np.arange(n)
    targets = np.ones((n, 4))
    targets[:, 3] = (np.arange(n) + 1) / 7  # prices > 0
    arrays = {"ts": ts, "features": features, "ofi": ofi, "targets": targets}
    path = tmp_path_factory.mktemp("big") / "big.fxcache"
    # the floor any writer pays: hash the columns, write their bytes, fsync (timed alike,
    # so a loaded machine or slow disk moves both)
    t0 = time.perf_counter()
    integrity.content_hash(*arrays.values())
    with open(path.with_suffix(".raw"), "wb") as f:
        for a in arrays.values():
            f.write(a.data)
        f.flush()
        os.fsync(f.fileno())
    write_floor_s = time.perf_counter() - t0
    path.with_suffix(".raw").unlink()
    t0 = time.perf_counter()
    digest = write(path, arrays)
    write_s = time.perf_counter() - t0
    return path, arrays, digest, write_s, write_floor_s


def test_million_rows_round_trip_without_per_row_cost(big):
    path, arrays, digest, write_s, write_floor_s = big
    assert write_s < 3 * write_floor_s + 1.0, (
        f"writing 1M rows took {write_s:.2f}s vs {write_floor_s:.2f}s to hash + dump: per-row work?"
    )
    # the floor for open: one vectorised pass over every mapped value (as the checks make)
    unchecked = cache.open(path, verify=False)
    t0 = time.perf_counter()
    for name in arrays:
        getattr(unchecked, name).sum()
    open_floor_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = cache.open(path)
    open_s = time.perf_counter() - t0
    assert open_s < 5 * open_floor_s + 0.3, (
        f"opening 1M rows took {open_s:.2f}s vs {open_floor_s:.2f}s for one pass: per-row work?"
    )
    for name, want in arrays.items():  # np.array_equal: assert_array_equal is ~30x slower here
        assert np.array_equal(getattr(m, name), want), name
    assert m.content_hash == digest == integrity.content_hash(m.ts, m.features, m.ofi, m.targets)


def _mapped_ranges(path) -> list[tuple[int, int]]:
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_views_point_into_the_memory_mapped_file(big):
    """The strongest proof of zero-copy: each array's bytes lie inside the kernel's
    mapping of this very file (a `.copy()` anywhere would put them on the heap)."""
    path = big[0]
    m = cache.open(path)
    ranges = _mapped_ranges(path)
    assert ranges, "the file is not memory-mapped"
    for name in ("ts", "features", "ofi", "targets"):
        a = getattr(m, name)
        lo = a.__array_interface__["data"][0]
        hi = lo + a.nbytes
        assert any(r_lo <= lo and hi <= r_hi for r_lo, r_hi in ranges), f"{name} is a copy"
        assert not a.flags.owndata and not a.flags.writeable, name


def test_opening_allocates_nothing_the_size_of_the_data(big):
    path = big[0]
    size = os.path.getsize(path)
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        m = cache.open(path)  # verified: the value scans and the content hash included
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrow_allocated = pa.total_allocated_bytes() - arrow_before
    assert m.n_bars == 1_000_000
    # numpy allocations are traced; arrow's memory pool is counted separately.
    assert peak < size / 50, f"open allocated {peak:,} bytes (file {size:,})"
    assert arrow_allocated < size / 50, f"arrow allocated {arrow_allocated:,} bytes"


@pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux page-cache coherence")
def test_views_see_bytes_patched_into_the_file_after_open(tmp_path):
    arrays = make_arrays(100)
    path = tmp_path / "m.fxcache"
    write(path, arrays)
    m = cache.open(path)
    raw = path.read_bytes()
    for name, value in (
        ("ts", np.int64(-7)),
        ("features", np.float32(123.5)),
        ("ofi", np.float32(-9.25)),
        ("targets", np.float64(4242.0)),
    ):
        first = getattr(m, name).reshape(-1)[:2].tobytes()
        offset = raw.find(first)
        assert offset > 0 and raw.count(first) == 1, name
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, value.tobytes(), offset)
        finally:
            os.close(fd)
        assert getattr(m, name).reshape(-1)[0] == value, f"{name} was copied at open"


# --- atomic write ---------------------------------------------------------------------


def _failing_new_file(monkeypatch, directory: Path, exc: BaseException):
    """ipc.new_file whose writer writes one batch into the temp file, then raises."""
    real = ipc.new_file
    seen = {}

    def fake(sink, schema, **kw):
        writer = real(sink, schema, **kw)

        class Writer:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                writer.close()
                return False

            def write_table(self, table, **kw):
                writer.write_batch(table.to_batches()[0].slice(0, 1))
                sink.flush()
                seen["temp"] = [p for p in directory.iterdir() if p.name.endswith(".tmp")]
                seen["temp_size"] = sum(p.stat().st_size for p in seen["temp"])
                raise exc

        return Writer()

    monkeypatch.setattr(cache.ipc, "new_file", fake)
    return seen


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_leaves_nothing(tmp_path, monkeypatch, exc):
    seen = _failing_new_file(monkeypatch, tmp_path, exc)
    with pytest.raises(type(exc)):
        write(tmp_path / "m.fxcache", make_arrays(10))
    assert len(seen["temp"]) == 1 and seen["temp_size"] > 0  # it did fail midway
    assert list(tmp_path.iterdir()) == []


def test_failed_rewrite_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.fxcache"
    write(path, make_arrays(10, seed=1))
    before = path.read_bytes()
    seen = _failing_new_file(monkeypatch, tmp_path, OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        write(path, make_arrays(30, seed=2))
    assert seen["temp_size"] > 0
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.fxcache"]
    monkeypatch.undo()
    np.testing.assert_array_equal(cache.open(path).features, make_arrays(10, seed=1)["features"])


def test_failed_rename_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "m.fxcache"
    write(path, make_arrays(10))
    before = path.read_bytes()

    def no_replace(src, dst):
        raise PermissionError("read-only")

    monkeypatch.setattr(cache.os, "replace", no_replace)
    with pytest.raises(PermissionError):
        write(path, make_arrays(12, seed=5))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.fxcache"]


def test_bad_arrays_do_not_touch_an_existing_file(tmp_path):
    path = tmp_path / "m.fxcache"
    write(path, make_arrays(10))
    before = path.read_bytes()
    bad = make_arrays(10)
    bad["features"][3, 4] = np.nan
    with pytest.raises(CacheError):
        write(path, bad)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.fxcache"]


# --- reader errors: files built with raw pyarrow -------------------------------------------


def _valid(tmp_path, n=20) -> tuple[Path, dict]:
    arrays = make_arrays(n)
    path = tmp_path / "good.fxcache"
    write(path, arrays)
    return path, arrays


def test_missing_file(tmp_path):
    open_error(tmp_path / "nope.fxcache", "no such file")


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "d.fxcache").mkdir()
    with pytest.raises(CacheError) as err:
        cache.open(tmp_path / "d.fxcache")
    assert_one_line(err, tmp_path / "d.fxcache")


@pytest.mark.parametrize("content", [b"", b"ts,close\n1,2.0\n2,2.5\n", b"ARROW1"], ids=["empty", "text", "magic-only"])
def test_not_an_arrow_file(tmp_path, content):
    path = tmp_path / "bad.fxcache"
    path.write_bytes(content)
    open_error(path, "not an Arrow IPC file")


@pytest.mark.parametrize("keep", ["half", "minus-3-bytes", "minus-1-byte", "header-only"])
def test_truncated_file(tmp_path, keep):
    path, _ = _valid(tmp_path)
    raw = path.read_bytes()
    cut = {"half": len(raw) // 2, "minus-3-bytes": len(raw) - 3, "minus-1-byte": len(raw) - 1, "header-only": 8}[keep]
    bad = tmp_path / "cut.fxcache"
    bad.write_bytes(raw[:cut])
    open_error(bad, "truncated")


def test_parquet_instead_of_ipc(tmp_path):
    arrays = make_arrays(20)
    path = tmp_path / "m.parquet"
    pq.write_table(raw_table(arrays), path)
    open_error(path, "not an Arrow IPC file")


def test_ipc_stream_instead_of_file(tmp_path):
    table = raw_table(make_arrays(20))
    path = tmp_path / "m.arrows"
    with ipc.new_stream(path, table.schema) as w:
        w.write_table(table)
    open_error(path, "not an Arrow IPC file")


@pytest.mark.parametrize("column", ["ts", "features", "ofi", "targets"])
def test_missing_column(tmp_path, column):
    path = raw_write(tmp_path / "m.fxcache", raw_table(make_arrays(20), **{column: None}))
    open_error(path, "missing column", column)


def test_duplicated_column(tmp_path):
    arrays = make_arrays(20)
    table = raw_table(arrays).append_column("ts", pa.array(arrays["ts"]))
    path = raw_write(tmp_path / "m.fxcache", table)
    open_error(path, "ts", "more than once")


def _wrong_type_cases(arrays):
    n = len(arrays["ts"])
    return {
        "features-41": ("features", fixed_list(arrays["features"][:, :41])),
        "features-43": ("features", fixed_list(np.zeros((n, 43), np.float32))),
        "ofi-7": ("ofi", fixed_list(arrays["ofi"][:, :7])),
        "targets-3": ("targets", fixed_list(arrays["targets"][:, :3])),
        "ts-float64": ("ts", pa.array(arrays["ts"].astype(np.float64))),
        "ts-int32": ("ts", pa.array((arrays["ts"] // 10**12).astype(np.int32))),
        "ts-timestamp": ("ts", pa.array(arrays["ts"], type=pa.timestamp("ns"))),
        "targets-float32": ("targets", fixed_list(arrays["targets"].astype(np.float32))),
        "features-float64": ("features", fixed_list(arrays["features"].astype(np.float64))),
        "features-variable-list": ("features", pa.array(arrays["features"].tolist(), type=pa.list_(pa.float32()))),
        "ofi-scalar": ("ofi", pa.array(arrays["ofi"][:, 0])),
    }


@pytest.mark.parametrize("case", list(_wrong_type_cases(make_arrays(2))))
def test_wrong_column_type_or_width(tmp_path, case):
    arrays = make_arrays(20)
    column, values = _wrong_type_cases(arrays)[case]
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, **{column: values}))
    open_error(path, f"column '{column}'", "expected")


@pytest.mark.parametrize("how", ["equal", "decreasing"])
def test_non_increasing_ts_in_file(tmp_path, how):
    arrays = make_arrays(20)
    arrays["ts"][11] = arrays["ts"][10] if how == "equal" else arrays["ts"][10] - 1
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays))
    open_error(path, "not strictly increasing", "row 11")


@pytest.mark.parametrize("how", ["equal", "decreasing"])
def test_non_increasing_ts_in_write(tmp_path, how):
    arrays = make_arrays(20)
    arrays["ts"][5] = arrays["ts"][4] if how == "equal" else arrays["ts"][4] - MINUTE_NS
    with pytest.raises(CacheError) as err:
        write(tmp_path / "m.fxcache", arrays)
    assert_one_line(err, tmp_path / "m.fxcache", "not strictly increasing", "row 5")
    assert list(tmp_path.iterdir()) == []


NON_FINITE = [(c, v) for c in ("features", "ofi", "targets") for v in (np.nan, np.inf, -np.inf)]


@pytest.mark.parametrize("column,value", NON_FINITE)
def test_non_finite_values_in_file(tmp_path, column, value):
    arrays = make_arrays(20)
    arrays[column][13, 2] = value
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays))
    open_error(path, "NaN/Inf", f"'{column}'", "row 13", "element 2")


@pytest.mark.parametrize("column,value", NON_FINITE)
def test_non_finite_values_in_write(tmp_path, column, value):
    arrays = make_arrays(20)
    arrays[column][0, 1] = value
    with pytest.raises(CacheError) as err:
        write(tmp_path / "m.fxcache", arrays)
    assert_one_line(err, tmp_path / "m.fxcache", "NaN/Inf", f"'{column}'", "row 0")
    assert list(tmp_path.iterdir()) == []


def test_verify_false_skips_only_the_value_and_hash_checks(tmp_path):
    arrays = make_arrays(20)
    arrays["features"][3, 3] = np.nan
    arrays["ts"][7] = arrays["ts"][6]
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays))
    m = cache.open(path, verify=False)
    assert np.isnan(m.features[3, 3]) and m.ts[7] == m.ts[6]
    bad = raw_write(tmp_path / "w.fxcache", raw_table(arrays, features=fixed_list(arrays["features"][:, :41])))
    with pytest.raises(CacheError):
        cache.open(bad, verify=False)


@pytest.mark.parametrize("column", ["ts", "features", "targets"])
def test_nulls(tmp_path, column):
    arrays = make_arrays(20)
    if column == "ts":
        values = pa.array(arrays["ts"], mask=np.arange(20) == 4)
    else:  # a null inside the list's values: top-level null_count is 0
        flat = arrays[column].reshape(-1)
        inner = pa.array(flat, mask=np.arange(flat.size) == 9)
        values = pa.FixedSizeListArray.from_arrays(inner, arrays[column].shape[1])
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, **{column: values}))
    open_error(path, f"'{column}'", "null")


def test_null_list_entry(tmp_path):
    arrays = make_arrays(20)
    values = pa.FixedSizeListArray.from_arrays(
        pa.array(arrays["ofi"].reshape(-1)), 8, mask=pa.array(np.arange(20) == 2)
    )
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, ofi=values))
    open_error(path, "'ofi'", "null")


@pytest.mark.parametrize("version", ["2", "0", "", '"2"', "1.0", "true"])
def test_unknown_version(tmp_path, version):
    arrays = make_arrays(20)
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta=good_meta(arrays, **{"fxray.version": version})))
    open_error(path, "version")


@pytest.mark.parametrize("key", cache.REQUIRED_META)
def test_missing_metadata_key(tmp_path, key):
    arrays = make_arrays(20)
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta=good_meta(arrays, **{key: None})))
    open_error(path, "lacks", key)


def test_no_metadata_at_all(tmp_path):
    arrays = make_arrays(20)
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta={}))
    open_error(path, "not an fxcache")


def test_metadata_not_json(tmp_path):
    arrays = make_arrays(20)
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta=good_meta(arrays, feature_names="[feat_0,")))
    open_error(path, "feature_names", "not JSON")


def test_metadata_not_utf8(tmp_path):
    arrays = make_arrays(20)
    meta = {k.encode(): v.encode() for k, v in good_meta(arrays).items()}
    meta[b"instrument"] = b"\xff\xfe"
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays).replace_schema_metadata(meta))
    open_error(path, "utf-8")


def test_multiple_record_batches(tmp_path):
    path = raw_write(tmp_path / "m.fxcache", raw_table(make_arrays(20)), max_chunksize=7)
    assert ipc.open_file(pa.memory_map(str(path))).num_record_batches == 3
    open_error(path, "expected 1 record batch", "found 3")


def test_zero_record_batches(tmp_path):
    table = raw_table(make_arrays(20))
    path = tmp_path / "m.fxcache"
    with ipc.new_file(path, table.schema):
        pass
    open_error(path, "found 0")


def test_zero_rows(tmp_path):
    table = raw_table(make_arrays(20))
    path = tmp_path / "m.fxcache"
    with ipc.new_file(path, table.schema) as w:
        w.write_batch(table.to_batches()[0].slice(0, 0))
    open_error(path, "no rows")


def test_sliced_batch_is_read_at_its_offset(tmp_path):
    arrays = make_arrays(20)
    table = raw_table(arrays, meta=good_meta({k: v[5:15] for k, v in arrays.items()})).slice(5, 10)
    path = raw_write(tmp_path / "m.fxcache", table)
    m = cache.open(path)
    for name, want in arrays.items():
        np.testing.assert_array_equal(getattr(m, name), want[5:15], err_msg=name)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_file_is_refused(tmp_path, codec):
    if not pa.Codec.is_available(codec):
        pytest.skip(f"{codec} not built into pyarrow")
    path = raw_write(
        tmp_path / "m.fxcache", raw_table(make_arrays(200)), options=ipc.IpcWriteOptions(compression=codec)
    )
    open_error(path, "compressed")


# --- writer argument errors -------------------------------------------------------------


def _bad_args(arrays):
    n = len(arrays["ts"])
    return {
        "features-41": dict(features=arrays["features"][:, :41]),
        "features-1d": dict(features=arrays["features"][:, 0]),
        "features-short": dict(features=arrays["features"][:-1]),
        "ofi-7": dict(ofi=arrays["ofi"][:, :7]),
        "ofi-3d": dict(ofi=arrays["ofi"][None]),
        "targets-3": dict(targets=arrays["targets"][:, :3]),
        "targets-none": dict(targets=None),
        "targets-long": dict(targets=np.vstack([arrays["targets"], arrays["targets"][:1]])),
        "ts-2d": dict(ts=arrays["ts"].reshape(n, 1)),
        "ts-scalar": dict(ts=arrays["ts"][0]),
        "ts-float": dict(ts=arrays["ts"].astype(np.float64)),
        "ts-strings": dict(ts=[str(t) for t in arrays["ts"]]),
        "features-ragged": dict(features=[[1.0] * 42] * (n - 1) + [[1.0]]),
        "features-text": dict(features=[["x"] * 42] * n),
        "empty": dict(
            ts=arrays["ts"][:0], features=arrays["features"][:0], ofi=arrays["ofi"][:0], targets=arrays["targets"][:0]
        ),
        "feature-names-41": dict(feature_names=FEATURE_NAMES[:41]),
        "ofi-names-9": dict(ofi_names=OFI_NAMES + ["extra"]),
        "reserved-meta-version": dict(extra_meta={"fxray.version": "2"}),
        "reserved-meta-hash": dict(extra_meta={"content_hash": "0" * 32}),
    }


@pytest.mark.parametrize("case", list(_bad_args(make_arrays(2))))
def test_write_argument_errors(tmp_path, case):
    arrays = make_arrays(6)
    kw = _bad_args(arrays)[case]
    merged = {**arrays, **{k: v for k, v in kw.items() if k in arrays}}
    meta = {k: v for k, v in kw.items() if k not in arrays}
    path = tmp_path / "m.fxcache"
    with pytest.raises(CacheError) as err:
        write(path, merged, **meta)
    assert_one_line(err, path)
    assert list(tmp_path.iterdir()) == []


# --- integrity: the O(N) checks and the content hash (fxray.data.integrity) --------------


def test_blake3_content_hash_is_the_plain_single_threaded_digest_of_the_columns():
    """The multi-threaded hash against an independent one: hashlib's BLAKE2 cannot check it,
    but BLAKE3 of the concatenated column bytes on one thread can."""
    import blake3

    arrays = make_arrays(3000)
    joined = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    assert integrity.content_hash(*arrays.values()) == blake3.blake3(joined).hexdigest()[:32]
    import hashlib

    assert integrity.content_hash(*arrays.values(), algo="sha256") == hashlib.sha256(joined).hexdigest()[:32]


def test_a_new_file_names_its_hash_and_an_old_sha256_file_still_verifies(tmp_path):
    arrays = make_arrays(50)
    write(tmp_path / "new.fxcache", arrays)
    assert cache.open(tmp_path / "new.fxcache").meta["content_hash_algo"] == "blake3"  # open recomputes it
    old = cache.open(raw_write(tmp_path / "old.fxcache", raw_table(arrays)))  # no algo key: sha256
    assert "content_hash_algo" not in old.meta


def _flip_a_close_byte(path: Path, arrays: dict) -> None:
    raw = path.read_bytes()
    offset = raw.find(arrays["targets"][7].tobytes()) + 3 * 8 + 5  # row 7's close, a middle byte
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([raw[offset] ^ 0x01]), offset)
    finally:
        os.close(fd)


def test_a_flipped_byte_is_detected(tmp_path):
    arrays = make_arrays(100)
    path = tmp_path / "m.fxcache"
    write(path, arrays)
    _flip_a_close_byte(path, arrays)
    open_error(path, "do not match its stored content hash")


def test_a_file_cut_down_to_one_row_under_the_old_metadata_is_detected(tmp_path):
    arrays = make_arrays(100)
    one = {k: v[:1] for k, v in arrays.items()}
    path = raw_write(tmp_path / "m.fxcache", raw_table(one, meta=good_meta(arrays)))
    open_error(path, "do not match its stored content hash")


@pytest.mark.parametrize("column", [0, 3])
@pytest.mark.parametrize("price", [0.0, -1.5])
def test_prices_at_or_below_zero_are_refused_naming_the_row(tmp_path, column, price):
    arrays = make_arrays(30)
    arrays["targets"][11, column] = price
    with pytest.raises(CacheError) as err:
        write(tmp_path / "w.fxcache", arrays)
    assert_one_line(err, tmp_path / "w.fxcache", "price <= 0", "row 11", ("open", "high", "low", "close")[column])
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays))
    open_error(path, "price <= 0", "row 11")


def test_plain_string_metadata_as_other_programs_write_it(tmp_path):
    arrays = make_arrays(20)
    meta = good_meta(arrays, instrument="ES", bar="1min", source="rust pipeline", **{"fxray.version": "1"})
    meta["content_hash"] = json.loads(meta["content_hash"])  # the hex digest, unquoted
    meta["pipeline.note"] = "not json, kept as written"
    m = cache.open(raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta=meta)))
    assert (m.meta["instrument"], m.meta["bar"], m.meta["source"]) == ("ES", "1min", "rust pipeline")
    assert m.meta["fxray.version"] == "1" and m.meta["pipeline.note"] == "not json, kept as written"
    quoted = good_meta(arrays, **{"fxray.version": '"1"', "instrument": "1"})  # JSON "1"; a name "1"
    m = cache.open(raw_write(tmp_path / "q.fxcache", raw_table(arrays, meta=quoted)))
    assert m.meta["fxray.version"] == "1" and m.meta["instrument"] == "1"


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("feature_names", json.dumps({"a": 1}), "must be a JSON list of 42 strings"),
        ("feature_names", json.dumps([1] * 42), "must be a JSON list of 42 strings"),
        ("feature_names", json.dumps(FEATURE_NAMES[:41]), "has 41 names for the 42 columns"),
        ("ofi_names", json.dumps(OFI_NAMES + ["x"]), "has 9 names for the 8 columns"),
        ("content_hash_algo", json.dumps("md5"), "content_hash_algo: 'md5' is not a hash fxray knows"),
    ],
)
def test_a_wrong_metadata_value_names_its_key(tmp_path, key, value, needle):
    arrays = make_arrays(20)
    path = raw_write(tmp_path / "m.fxcache", raw_table(arrays, meta=good_meta(arrays, **{key: value})))
    open_error(path, key, needle)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "m.fxcache"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    open_error(fifo, "is a FIFO, not an fxcache file")
    assert time.perf_counter() - t0 < 1.0


def test_atomic_path_writes_whole_or_nothing_under_the_umask(tmp_path):
    """The one way fxray writes a file (fxcache, checkpoints, sweep.json, results.json, --json):
    the file appears whole, under the umask's mode, or not at all, with no temporary left."""
    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "new" / "x.json") as tmp:
            tmp.write_text("{}")
        with pytest.raises(RuntimeError), atomic_path(tmp_path / "new" / "y.json") as tmp:
            tmp.write_text('{"half": ')
            raise RuntimeError("killed mid-write")
    finally:
        os.umask(old)
    assert (tmp_path / "new" / "x.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["x.json"]
