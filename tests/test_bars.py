"""fxray.bars: every shared bar file loads to UTC close times and builds an fxcache;
each supported format's conventions; every bad input is a one-line BarsError."""

import gzip
import io
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SHARED_DATA

from fxray.data import cache
from fxray.data.bars import Bars, BarsError, build_cache, load_bars
from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK
from fxray.data.schema import OFI_NAMES

DATA = SHARED_DATA / "bars"
SIXE = DATA / "6EH4.XCME_1min_bars_20240101_20240131.csv.gz"
EURUSD = DATA / "eurusd_m1_2017q1"
ES = DATA / "es_lean_minute"
MIN = 60 * 10**9


def utc(s: str) -> int:
    return int(np.datetime64(s, "ns").astype(np.int64))


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def ohlc_rows(n, start="2024-03-04T00:01:00", step_s=60):
    """n rows of (naive ISO stamp, open, high, low, close, volume) one step apart."""
    t0 = np.datetime64(start, "s")
    rows = []
    for i in range(n):
        c = 100 + np.sin(i / 7) + i * 0.01
        stamp = str(t0 + np.timedelta64(i * step_s, "s")).replace("T", " ")
        rows.append((stamp, c - 0.05, c + 0.2, c - 0.2, c, 10 + i % 5))
    return rows


def csv_text(header, rows, stamp=lambda r: r[0], volume=True):
    body = "".join(f"{stamp(r)},{r[1]},{r[2]},{r[3]},{r[4]}" + (f",{r[5]}" if volume else "") + "\n" for r in rows)
    return header + "\n" + body


# --- the shared real data ------------------------------------------------------------------


def test_cme_6e_csv_gz_is_close_stamped_utc():
    b = load_bars(need(SIXE))
    assert len(b) == 29_996
    assert b.ts[0] == utc("2024-01-01T23:01") and b.ts[-1] == utc("2024-01-31T23:59")
    assert (b.close[0], b.volume[0]) == (1.1078, 205.0)
    assert (np.diff(b.ts) > 0).all() and (b.high >= np.maximum(b.open, b.close)).all()


def test_histdata_dir_is_est_open_stamps_to_utc_close():
    b = load_bars(need(EURUSD))
    assert len(b) == 92_939 and b.volume is None  # HistData volume is always 0
    # "20170102 020000" EST (UTC-5, no DST), stamped at the bar open -> closes 07:01 UTC
    assert b.ts[0] == utc("2017-01-02T07:01") and b.close[0] == 1.0519
    # "20170331 165800" -> closes 21:59 UTC, the last bar before the 22:00 UTC weekly close
    assert b.ts[-1] == utc("2017-03-31T21:59") and b.close[-1] == 1.06528
    one = load_bars(EURUSD / "DAT_ASCII_EURUSD_M1_201701.csv", tz="UTC")
    assert one.ts[0] == utc("2017-01-02T02:01")  # an explicit tz overrides the default
    assert load_bars(EURUSD / "DAT_ASCII_EURUSD_M1_201701.csv", fmt="histdata").ts[0] == b.ts[0]


def test_lean_dir_takes_the_front_month_per_day():
    b = load_bars(need(ES))
    assert len(b) == 17_658 and b.volume is not None
    # Sunday 2013-10-06 opens 22:00 UTC (17:00 CDT): first bar 201312 closes 22:01.
    assert b.ts[0] == utc("2013-10-06T22:01") and b.close[0] == 1675.25
    # On 2013-12-18 the March contract (2.26M) out-trades December (0.28M): its bars are used.
    i = np.searchsorted(b.ts, utc("2013-12-18T00:01"))
    assert b.ts[i] == utc("2013-12-18T00:01") and b.close[i] == 1773.75
    assert 1600 < b.close.min() and b.close.max() < 1900  # index points, not scaled
    single = load_bars(ES / "20131007_trade.zip")
    assert len(single) == 1344 and single.ts[-1] == utc("2013-10-08T00:00")


@pytest.mark.parametrize("path", [SIXE, EURUSD, ES], ids=["6E", "eurusd", "es"])
def test_build_cache_on_shared_bars(tmp_path, path):
    b = load_bars(need(path))
    out = tmp_path / "m.fxcache"
    digest = build_cache(b, out, instrument=path.name[:6], source=str(path))
    m = cache.open(out)
    assert m.n_bars == len(b) - MAX_LOOKBACK and m.content_hash == digest
    assert m.feature_names == list(FEATURE_NAMES) and m.ofi_names == list(OFI_NAMES)
    assert np.array_equal(m.ts, b.ts[MAX_LOOKBACK:])
    assert np.array_equal(m.targets, np.stack([b.open, b.high, b.low, b.close], 1)[MAX_LOOKBACK:])
    assert not m.ofi.any() and m.features[:, 40].mean() > 5  # ADX is live after the warm-up
    assert build_cache(b, tmp_path / "again.fxcache", instrument=path.name[:6], source=str(path)) == digest


# --- format conventions on small files ---------------------------------------------------------


def test_header_csv_variants_agree(tmp_path):
    rows = ohlc_rows(5)
    want = utc("2024-03-04T00:01") + MIN * np.arange(5)
    epoch = dict(zip((r[0] for r in rows), want // 10**9))

    def iso_t(r):
        return r[0].replace(" ", "T")

    variants = {
        "iso.csv": csv_text("timestamp_utc,open,high,low,close,volume", rows),
        "isoz.csv": csv_text("Timestamp,Open,High,Low,Close,Volume", rows, lambda r: iso_t(r) + "Z"),
        "offset.csv": csv_text("time,o,h,l,c", rows, lambda r: iso_t(r) + "+01:00", volume=False),
        "secs.csv": csv_text("ts,open,high,low,close", rows, lambda r: epoch[r[0]], volume=False),
        "ms.csv": csv_text("ts,open,high,low,close", rows, lambda r: epoch[r[0]] * 1000, volume=False),
        "ns.csv": csv_text("ts,open,high,low,close", rows, lambda r: epoch[r[0]] * 10**9, volume=False),
        # stamped at the open (Binance-style ms): one bar later is the close
        "opentime.csv": csv_text(
            "open_time,open,high,low,close", rows, lambda r: (epoch[r[0]] - 60) * 1000, volume=False
        ),
    }
    for name, text in variants.items():
        b = load_bars(write_csv(tmp_path / name, text))
        expect = want - 3600 * 10**9 if name == "offset.csv" else want  # +01:00 is an instant
        assert np.array_equal(b.ts, expect), name
        assert np.allclose(b.close, [r[4] for r in rows]), name
        assert (b.volume is not None) == name.startswith("iso"), name
    naive_ny = load_bars(tmp_path / "iso.csv", tz="America/New_York")
    assert np.array_equal(naive_ny.ts, want + 5 * 3600 * 10**9)  # EST in March before DST


def test_gzip_parquet_and_directory(tmp_path):
    text = csv_text("timestamp_utc,open,high,low,close,volume", ohlc_rows(300))
    plain = load_bars(write_csv(tmp_path / "a.csv", text))
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write(text)
    assert np.array_equal(load_bars(tmp_path / "b.csv.gz").close, plain.close)
    table = pa.table(
        {
            "timestamp": pa.array(plain.ts, pa.timestamp("ns", "UTC")),
            "open": plain.open,
            "high": plain.high,
            "low": plain.low,
            "close": plain.close,
        }
    )
    pq.write_table(table, tmp_path / "c.parquet")
    from_pq = load_bars(tmp_path / "c.parquet")
    assert np.array_equal(from_pq.ts, plain.ts) and from_pq.volume is None
    # A directory: two halves (overlapping by one stamp: the later file wins) + a README.
    d = tmp_path / "dir"
    d.mkdir()
    lines = text.splitlines()
    write_csv(d / "1.csv", "\n".join(lines[:151]) + "\n")
    second = [lines[0], lines[150].replace(",10", ",99", 1), *lines[151:]]
    write_csv(d / "2.csv", "\n".join(second) + "\n")
    write_csv(d / "README.md", "not bars")
    both = load_bars(d)
    assert np.array_equal(both.ts, plain.ts)
    assert both.close[149] == plain.close[149]


def test_cleaning_sorts_dedups_drops_and_repairs(tmp_path):
    text = (
        "timestamp_utc,open,high,low,close,volume\n"
        "2024-01-01 00:03:00,1.0,1.1,0.9,1.05,5\n"
        "2024-01-01 00:01:00,1.0,1.1,0.9,1.00,5\n"
        "2024-01-01 00:02:00,1.0,1.1,0.9,,5\n"  # missing close: dropped
        "2024-01-01 00:02:00,1.0,1.1,0.9,nan,5\n"  # missing close: dropped
        "2024-01-01 00:01:00,1.0,1.1,0.9,1.01,5\n"  # duplicate stamp: the last row wins
        "2024-01-01 00:04:00,1.0,1.02,0.99,1.2,-3\n"  # close above high: high repaired
        "2024-01-01 00:05:00,1.0,1.1,0.9,1.0,nan\n"
    )
    b = load_bars(write_csv(tmp_path / "messy.csv", text))
    assert np.array_equal(b.ts, utc("2024-01-01T00:01") + MIN * np.array([0, 2, 3, 4]))
    assert list(b.close) == [1.01, 1.05, 1.2, 1.0] and b.high[2] == 1.2
    assert list(b.volume) == [5, 5, 0, 0]


def test_lean_equity_prices_are_descaled(tmp_path):
    d = tmp_path / "equity" / "usa" / "minute" / "spy"
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / "20240102_trade.zip", "w") as z:
        z.writestr("20240102_spy_minute_trade.csv", "34200000,4700000,4710000,4690000,4705000,1000\n")
    b = load_bars(d / "20240102_trade.zip", tz="America/New_York")
    assert b.close[0] == 470.5 and b.ts[0] == utc("2024-01-02T14:31")  # 09:30 EST open + 1 min


def test_bars_from_elsewhere_build_too(tmp_path):
    """build_cache takes anything with ts/open/high/low/close/volume (fxray.book's bars)."""
    from collections import namedtuple

    b = load_bars(need(SIXE))
    Plain = namedtuple("Plain", "ts open high low close volume")
    plain = Plain(b.ts[:400], b.open[:400], b.high[:400], b.low[:400], b.close[:400], b.volume[:400])
    ofi = np.arange(400 * 8, dtype=np.float32).reshape(400, 8)
    build_cache(plain, tmp_path / "p.fxcache", instrument="6E", source="test", ofi=ofi)
    assert np.array_equal(cache.open(tmp_path / "p.fxcache").ofi, ofi[MAX_LOOKBACK:])


# --- bad inputs: one line, naming the file ------------------------------------------------


def _bad(tmp_path, name, content, **kw):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(BarsError) as e:
        load_bars(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_bad_inputs_are_one_line_errors(tmp_path):
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as z:
        z.writestr("x.csv", "0,1,1,1,1,1\n")
    head, row = "timestamp,open,high,low,close\n", "2024-01-01 00:00:00"
    cases = [
        ("missing.csv", "timestamp,open,high,close\n2024-01-01 00:00:00,1,1,1\n", {}, "missing column(s) low"),
        ("nots.csv", "open,high,low,close\n1,1,1,1\n", {}, "missing column(s) timestamp"),
        ("nohead.csv", "2024-01-01 00:00:00,1.5,1.6,1.4,1.5,3\n", {}, "no header line"),
        ("badts.csv", head + "yesterday,1,1,1,1\n", {}, "unparseable timestamp 'yesterday'"),
        ("empty.csv", "", {}, "empty file"),
        ("header.csv", head, {}, "no rows"),
        ("text.csv", head + row + ",1,1,1,abc\n", {}, "column 'close' is not numeric"),
        ("allbad.csv", head + row + ",,,,\n", {}, "no valid bars"),
        ("zero.csv", head + row + ",1,1,1,1\n" + row[:-1] + "1,1,1,1,0\n", {}, "close 0.0 at data row 2 "),
        (
            "neg.csv",
            head + row + ",1,1,-1.5,1\n",
            {},
            "low -1.5 at data row 1 (1 = the first after the header) (and 0 more)",
        ),
        ("text2.csv", head + row + ",1,1,1,1.5\n" + row + ",1,1,1,x1\n", {}, "'x1' at data row 2 "),
        ("badts2.csv", head + row + ",1,1,1,1\nnot a time,1,1,1,1\n", {}, "'not a time' at data row 2 "),
        ("bars.xlsx", "whatever", {}, "unknown bar file format"),
        ("x.csv", "t,o,h,l,c\n", {"fmt": "excel"}, "unknown format 'excel'"),
        ("nothere.csv", None, {}, "no such file"),
        ("tz.csv", head + row + ",1,1,1,1\n", {"tz": "Mars/Olympus"}, "time zone 'Mars/Olympus'"),
        ("hd.csv", "20170102 020000;1;1;1;1;0\n2017-01-02 02:01;1;1;1;1;0\n", {}, "unparseable HistData time"),
        ("20240101_quote.zip", zbuf.getvalue(), {}, "quote bars are not supported"),
        ("trades.zip", zbuf.getvalue(), {}, "start with the date"),
        ("20240101_trade.zip", b"PK not really a zip", {}, "not a readable zip"),
        ("bad.parquet", b"PAR1 nope", {}, "not a readable Parquet"),
    ]
    for name, content, kw, expect in cases:
        assert expect in _bad(tmp_path, name, content, **kw), name
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(BarsError, match="no bar files"):
        load_bars(tmp_path / "emptydir")


def test_build_cache_refuses_short_history(tmp_path):
    b = load_bars(need(SIXE))
    short = Bars(
        b.ts[: MAX_LOOKBACK + 5],
        b.open[: MAX_LOOKBACK + 5],
        b.high[: MAX_LOOKBACK + 5],
        b.low[: MAX_LOOKBACK + 5],
        b.close[: MAX_LOOKBACK + 5],
        None,
        source="short.csv",
    )
    with pytest.raises(BarsError, match=r"short.csv: 125 bars, need at least 130"):
        build_cache(short, tmp_path / "s.fxcache", instrument="6E", source="t")
    assert not list(tmp_path.iterdir())  # nothing half-written
