"""Columns of a bar file -> numpy: timestamps of any common form to UTC ns, numeric
columns, the bar length of open-stamped data; and `BarsError`, the one-line error every
bad bar input raises (fxray.data.bars reads the files, this turns their columns into arrays)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NS = 10**9


class BarsError(ValueError):
    """A bar file that cannot be read as bars; the message is one line naming the file."""


def _fail(path, msg: str):
    raise BarsError(f"{path}: {' '.join(str(msg).split())}") from None


TIMESTAMP_FORMATS = (
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S",
    "%Y%m%d %H%M%S",
    "%Y.%m.%d %H:%M",
    "%Y-%m-%d %H:%M",
    "%d.%m.%Y %H:%M:%S",
)


def data_row(i: int) -> str:
    """Index i of the data (0 = the first row after any header) as a person counts rows."""
    return f"data row {i + 1} (1 = the first after the header)"


def _first_bad(col: pa.Array, parse) -> tuple[int, object]:
    """(index, value) of the first non-empty value `parse` refuses (0 = the first data row)."""
    for i, v in enumerate(col.to_pylist()):
        if v in (None, ""):
            continue
        try:
            parse(v)
        except (TypeError, ValueError):
            return i, v
    return 0, None


def _numeric(path, table: pa.Table, name: str) -> np.ndarray:
    col = table[name].combine_chunks()
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)):
        row, bad = _first_bad(col, lambda v: float(v))
        _fail(path, f"column {name!r} is not numeric: {bad!r} at {data_row(row)}; fix or remove those rows")
    return col.cast(pa.float64()).to_numpy(zero_copy_only=False)  # nulls -> NaN


def _to_utc_ns(path, col: pa.Array, name: str, tz: str) -> np.ndarray:
    """A timestamp column (ISO strings parsed by Arrow, dates, epoch numbers) -> UTC ns."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        for f in TIMESTAMP_FORMATS:
            parsed = pc.strptime(col, format=f, unit="s", error_is_null=True)
            if parsed.null_count == col.null_count:
                col, t = parsed, parsed.type
                break
        else:
            # the format that reads most of the column names the value it cannot read
            best = max(
                (pc.strptime(col, format=f, unit="s", error_is_null=True) for f in TIMESTAMP_FORMATS),
                key=lambda parsed: len(parsed) - parsed.null_count,
            )
            values = col.to_pylist()
            row = next((i for i, (v, p) in enumerate(zip(values, best.to_pylist())) if v and p is None), 0)
            _fail(
                path,
                f"unparseable timestamp {values[row]!r} at {data_row(row)} in column {name!r}; use ISO 8601 "
                "(YYYY-MM-DD HH:MM:SS[Z]) or epoch seconds/ms/us/ns",
            )
    if col.null_count:
        _fail(path, f"{col.null_count} empty timestamp(s) in column {name!r}; fill or drop those rows")
    if pa.types.is_date(t):
        col, t = col.cast(pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(t):
        ns = col.cast(pa.timestamp("ns", t.tz)).cast(pa.int64()).to_numpy()
        return ns if t.tz else _localize(path, ns, tz)  # aware stamps are instants already
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        x = col.to_numpy(zero_copy_only=False)
        med = float(np.median(np.abs(x)))  # epoch unit by magnitude: 1e9 s ~ 2001
        scale = 10**9 if med < 1e11 else 10**6 if med < 1e14 else 10**3 if med < 1e17 else 1
        if pa.types.is_integer(t):
            return x.astype(np.int64) * scale  # exact: ns fit int64 until 2262
        if not np.isfinite(x).all():
            _fail(path, f"non-finite epoch value in column {name!r}; fill or drop those rows")
        return np.round(x * scale).astype(np.int64)
    _fail(path, f"column {name!r} has type {t}, not a timestamp; use ISO 8601 or epoch numbers")


def _localize(path, naive_ns: np.ndarray, tz: str) -> np.ndarray:
    """Wall-clock ns in `tz` -> UTC ns (vectorised through Arrow's tz database)."""
    if tz.upper() in ("UTC", "Z", "ETC/UTC", "GMT"):
        return naive_ns
    try:
        aware = pc.assume_timezone(
            pa.array(naive_ns, pa.timestamp("ns")), tz, ambiguous="earliest", nonexistent="earliest"
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        _fail(
            path,
            f"time zone {tz!r} not usable ({str(e).splitlines()[0]}); use an IANA name "
            "such as UTC, Etc/GMT+5 or America/New_York",
        )
    return aware.cast(pa.int64()).to_numpy()


def _bar_ns(ts: np.ndarray) -> int:
    """Bar length for open-stamped data: the most common positive gap between stamps."""
    d = np.diff(np.unique(ts))
    if len(d) == 0:
        return 60 * _NS  # a single bar: assume a minute
    vals, counts = np.unique(d, return_counts=True)
    return int(vals[np.argmax(counts)])
