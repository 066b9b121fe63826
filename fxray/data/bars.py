"""Raw OHLC(V) bars from files -> `Bars` (UTC close times), and `Bars` -> an fxcache.

Formats (`fmt="auto"` picks one from the name and the first line):
- "csv": header CSV (optionally .gz), e.g. `timestamp_utc,open,high,low,close,volume`;
  timestamps ISO 8601 (an explicit offset or Z wins over `tz`) or epoch numbers (s/ms/us/ns,
  told apart by magnitude).
- "parquet": the same columns in a Parquet file.
- "histdata": headerless HistData.com M1 `YYYYMMDD HHMMSS;open;high;low;close;volume`,
  times in EST without DST (default tz "Etc/GMT+5").
- "lean": QuantConnect Lean minute/second `*_trade.zip` (one CSV per contract, rows
  `ms_since_midnight,open,high,low,close,volume`, date from the file name, data time zone
  UTC for futures). Per day the most-traded contract (the front month) is kept, so a
  roll shows as a price jump. Lean equity prices are deci-cents (x 10000) and are scaled
  back when the path has an `equity` folder; futures/forex/crypto are in price units.
  `*_quote.zip` files are skipped in a directory.
- a directory: every data file in it (not recursive, in name order), concatenated.

Time-stamp conventions (all converted to the bar CLOSE time, ns since epoch, UTC):
- header CSV / Parquet: the timestamp is the close time (checked on the CME 6E file: bars
  end at 22:00 and restart at 23:01 UTC around the daily halt) unless the column says
  open (`open_time`, `ts_open`, `time_open`, `ts_event`, `bar_start`) or holds dates only;
  then one bar length (the most common gap between stamps) is added.
- HistData and Lean stamp bars at their open: + 1 bar (60 s for minute data).
- `tz` is the zone of naive (offset-less) times; None means the format's own zone (UTC,
  or Etc/GMT+5 for HistData). DST ambiguities resolve to the earliest instant.

Cleaning: rows with a missing, non-finite or non-positive
price are dropped; NaN/negative volume becomes 0; rows are sorted by time and duplicate
stamps keep the last row; high/low are widened to contain open and close (vendor bars,
e.g. bid bars, are sometimes inconsistent; dropping them would punch holes instead).
Volume is None when the source has none or it is all zero (HistData).

Every bad input raises `BarsError`, one line naming the file and the fix.
"""

from __future__ import annotations

import gzip
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from fxray.data import cache
from fxray.data.barcols import _NS, BarsError, _bar_ns, _fail, _localize, _numeric, _to_utc_ns, data_row
from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK, compute_features
from fxray.data.schema import OFI_NAMES

FORMATS = ("auto", "csv", "parquet", "histdata", "lean")
MIN_BARS_AFTER_WARMUP = 10
_CLOSE_TS = "timestamp_utc timestamp ts datetime date_time time date close_time ts_close time_close bar_end".split()
_OPEN_TS = ("open_time", "ts_open", "time_open", "ts_event", "bar_start")
_PRICE = {"open": ("open", "o"), "high": ("high", "h"), "low": ("low", "l"), "close": ("close", "c")}
_VOLUME = ("volume", "vol", "v")
_SKIP_PREFIXES = (".", "_", "readme")
_SKIP_SUFFIXES = (".md", ".txt", ".json", ".yaml", ".yml", ".pdf", ".html", "_quote.zip")
_HISTDATA_LINE = re.compile(rb"^\d{8} \d{6};")

__all__ = ["Bars", "BarsError", "build_cache", "load_bars"]  # BarsError lives in barcols, raised by both


@dataclass(frozen=True)
class Bars:
    """Clean bars: strictly increasing UTC close times, positive finite prices."""

    ts: np.ndarray  # (N,) int64 ns since epoch, UTC, bar close time
    open: np.ndarray  # (N,) float64
    high: np.ndarray  # (N,) float64, >= max(open, close)
    low: np.ndarray  # (N,) float64, <= min(open, close)
    close: np.ndarray  # (N,) float64
    volume: np.ndarray | None = None  # (N,) float64 or None (no volume in the source)
    source: str = ""  # the path it was read from

    def __len__(self) -> int:
        return len(self.ts)


# --- public API ------------------------------------------------------------------------


def load_bars(path, fmt: str = "auto", tz: str | None = None) -> Bars:
    """Read a bar file or a directory of them (see the module docstring) into clean Bars."""
    path = Path(path)
    if fmt not in FORMATS:
        _fail(path, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not path.exists():
        _fail(path, "no such file or directory")
    files = [p for p in sorted(path.iterdir()) if p.is_file() and not _skipped(p)] if path.is_dir() else [path]
    if not files:
        _fail(path, "directory has no bar files (.csv, .csv.gz, .parquet, Lean *_trade.zip)")
    parts = [_read_file(p, fmt, tz) for p in files]
    raw = {k: np.concatenate([p[k] for p in parts]) for k in ("ts", *_PRICE)}
    vols = [p["volume"] if p["volume"] is not None else np.zeros(len(p["ts"])) for p in parts]
    raw["volume"] = None if all(p["volume"] is None for p in parts) else np.concatenate(vols)
    return _clean(path, raw)


def build_cache(
    bars: Bars,
    out,
    *,
    instrument: str,
    source: str,
    bar: str = "1min",
    ofi=None,
    ofi_names=OFI_NAMES,  # zero and real order-flow columns are named alike
    extra_meta: dict | None = None,
) -> str:
    """Compute the 42 features, drop the first MAX_LOOKBACK rows (warm-up) and write an
    fxcache at `out`; targets = OHLC. `ofi`: (N, 8) aligned with the bars, or None (zeros);
    `extra_meta` adds schema metadata (e.g. the synthetic market's parameters).
    `bars`: a Bars, or anything with ts/open/high/low/close/volume (e.g. fxray.book's bars
    from trades). Returns the content hash."""
    n, where = len(bars.ts), getattr(bars, "source", "") or str(out)
    need = MAX_LOOKBACK + MIN_BARS_AFTER_WARMUP
    if n < need:
        _fail(
            where,
            f"{n} bars, need at least {need} ({MAX_LOOKBACK} feature warm-up + "
            f"{MIN_BARS_AFTER_WARMUP}); give it a longer history",
        )
    features = compute_features(bars.ts, bars.open, bars.high, bars.low, bars.close, bars.volume)
    keep = slice(MAX_LOOKBACK, None)
    targets = np.stack([bars.open, bars.high, bars.low, bars.close], axis=1)[keep]
    return cache.write(
        out,
        bars.ts[keep],
        features[keep],
        None if ofi is None else ofi[keep],
        targets,
        feature_names=FEATURE_NAMES,
        ofi_names=ofi_names,
        instrument=instrument,
        bar=bar,
        source=source,
        extra_meta=extra_meta,
    )


# --- format detection --------------------------------------------------------------------


def _skipped(p: Path) -> bool:
    name = p.name.lower()
    return name.startswith(_SKIP_PREFIXES) or name.endswith(_SKIP_SUFFIXES)


def _detect(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".zip"):
        return "lean"
    if not name.endswith((".csv", ".gz")):
        _fail(
            path,
            "unknown bar file format (expected .csv, .csv.gz, .parquet or a Lean "
            "*_trade.zip); pass fmt=csv|parquet|histdata|lean",
        )
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        _fail(path, f"cannot read ({e})")
    return "histdata" if _HISTDATA_LINE.match(head) else "csv"


def _read_file(path: Path, fmt: str, tz: str | None) -> dict:
    fmt = _detect(path) if fmt == "auto" else fmt
    readers = {"csv": _read_table_file, "parquet": _read_table_file, "histdata": _read_histdata, "lean": _read_lean}
    raw = readers[fmt](path, fmt, tz)
    # A price at or below zero is a broken row, not a gap (a missing price is one: dropped
    # later): refused naming the file, the row and the value; its log return would be NaN.
    for k in _PRICE:
        v = np.asarray(raw[k], np.float64)
        bad = np.flatnonzero(np.isfinite(v) & (v <= 0))
        if len(bad):
            row = int(bad[0])
            _fail(
                path,
                f"{k} {float(v[row])!r} at {data_row(row)} (and {len(bad) - 1} more) is not a positive price; "
                "fix or remove those rows",
            )
    return raw


# --- readers: each returns {"ts": close ns UTC, "open".."close": float64, "volume": or None} -


def _read_csv(path, source, **kw) -> pa.Table:
    try:
        return pcsv.read_csv(source, **kw)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, EOFError) as e:
        msg = cache.first_line(e)
        if "Empty CSV file" in msg:
            _fail(path, "empty file (no header, no rows)")
        _fail(path, f"not a readable CSV ({msg})")


def _read_table_file(path: Path, fmt: str, tz: str | None) -> dict:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            _fail(path, f"not a readable Parquet file ({cache.first_line(e)})")
    else:
        table = _read_csv(path, path)
    cols = {name.strip().lower(): name for name in table.column_names}
    ts_name = next((cols[k] for k in _CLOSE_TS if k in cols), None)
    stamped_at_open = ts_name is None
    ts_name = ts_name or next((cols[k] for k in _OPEN_TS if k in cols), None)
    prices = {k: next((cols[a] for a in aliases if a in cols), None) for k, aliases in _PRICE.items()}
    missing = [k for k, v in prices.items() if v is None] + ([] if ts_name else ["timestamp"])
    if missing:
        if not any(ch.isalpha() for ch in "".join(table.column_names).replace("e", "")):
            _fail(path, "no header line (the first row is data); add timestamp_utc,open,high,low,close,volume")
        _fail(
            path,
            f"missing column(s) {', '.join(missing)}; found {', '.join(table.column_names)} "
            "(need timestamp_utc (or timestamp/time), open, high, low, close[, volume])",
        )
    if table.num_rows == 0:
        _fail(path, "no rows after the header")
    column = table[ts_name].combine_chunks()
    stamped_at_open |= pa.types.is_date(column.type)  # a date labels the bar that starts on it
    ts = _to_utc_ns(path, column, ts_name, tz or "UTC")
    out = {k: _numeric(path, table, v) for k, v in prices.items()}
    vol_name = next((cols[a] for a in _VOLUME if a in cols), None)
    out["volume"] = None if vol_name is None else _numeric(path, table, vol_name)
    out["ts"] = ts + _bar_ns(ts) if stamped_at_open else ts
    return out


def _read_histdata(path: Path, fmt: str, tz: str | None) -> dict:
    names = ["time", "open", "high", "low", "close", "volume"]
    table = _read_csv(
        path,
        path,
        read_options=pcsv.ReadOptions(column_names=names),
        parse_options=pcsv.ParseOptions(delimiter=";"),
        convert_options=pcsv.ConvertOptions(column_types={"time": pa.string()}),
    )
    if table.num_rows == 0:
        _fail(path, "empty file")
    stamps = table["time"].combine_chunks()
    parsed = pc.strptime(stamps, format="%Y%m%d %H%M%S", unit="s", error_is_null=True)
    if parsed.null_count:
        bad = stamps[int(np.flatnonzero(parsed.is_null().to_numpy(zero_copy_only=False))[0])]
        _fail(path, f"unparseable HistData time {bad}; expected 'YYYYMMDD HHMMSS;o;h;l;c;v' lines")
    ts = _localize(path, parsed.cast(pa.int64()).to_numpy() * _NS, tz or "Etc/GMT+5")
    out = {k: _numeric(path, table, k) for k in names[1:]}
    out["ts"] = ts + _bar_ns(ts)  # HistData stamps the bar's open
    return out


def _read_lean(path: Path, fmt: str, tz: str | None) -> dict:
    if path.name.lower().endswith("_quote.zip"):
        _fail(path, "Lean quote bars are not supported; load the matching *_trade.zip")
    m = re.match(r"(\d{4})(\d{2})(\d{2})_", path.name)
    if not m:
        _fail(path, "Lean zip names start with the date (YYYYMMDD_trade.zip); rename it or pass another fmt")
    try:
        with zipfile.ZipFile(path) as z:
            members = [(i.filename, z.read(i)) for i in z.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError) as e:
        _fail(path, f"not a readable zip ({e})")
    if not members:
        _fail(path, "empty zip (no CSV inside)")
    names = ["ms", "open", "high", "low", "close", "volume"]
    contracts = []  # (volume traded, member, table) of each contract's trade-bar CSV
    for member, data in members:
        if "_tick_" not in member and "_quote" not in member:
            where = f"{path}!{member}"
            table = _read_csv(where, pa.BufferReader(data), read_options=pcsv.ReadOptions(column_names=names))
            contracts.append((np.nansum(_numeric(where, table, "volume")), member, table))
    if not contracts:
        _fail(path, "no trade-bar CSV inside the zip")
    _, member, table = max(contracts, key=lambda contract: contract[0])  # the most traded: the front month
    where = f"{path}!{member}"
    period_ns = 1 * _NS if "_second_" in member else 60 * _NS  # Lean stamps the bar's open
    day = np.datetime64("-".join(m.groups()), "ns").astype(np.int64)  # midnight, data tz
    local = day + _numeric(where, table, "ms").astype(np.int64) * 10**6
    out = {k: _numeric(where, table, k) for k in names[1:]}
    if "equity" in (p.lower() for p in path.parts):  # Lean equity prices are deci-cents
        out.update({k: out[k] / 10_000.0 for k in _PRICE})
    out["ts"] = _localize(path, local, tz or "UTC") + period_ns
    return out


def _clean(path: Path, raw: dict) -> Bars:
    ts = np.asarray(raw["ts"], np.int64)
    o, h, l, c = (np.asarray(raw[k], np.float64) for k in ("open", "high", "low", "close"))
    v = raw["volume"]
    ok = np.isfinite(o) & np.isfinite(h) & np.isfinite(l) & np.isfinite(c)  # finite prices are > 0 (refused else)
    if not ok.any():
        _fail(path, f"no valid bars ({len(ts)} rows read, none with finite positive prices)")
    keep = np.flatnonzero(ok)[np.argsort(ts[ok], kind="stable")]
    ts = ts[keep]
    last = np.r_[ts[1:] != ts[:-1], True]  # of equal stamps keep the last row (stable sort: file order)
    keep, ts = keep[last], ts[last]
    o, h, l, c = o[keep], h[keep], l[keep], c[keep]
    hi = np.maximum(np.maximum(o, c), np.maximum(h, l))
    lo = np.minimum(np.minimum(o, c), np.minimum(h, l))
    if v is not None:
        v = np.asarray(v, np.float64)[keep]
        v = np.where(np.isfinite(v) & (v > 0), v, 0.0)
        if not v.any():
            v = None
    return Bars(ts=ts, open=o, high=hi, low=lo, close=c, volume=v, source=str(path))
