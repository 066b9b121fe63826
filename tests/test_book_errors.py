"""Malformed input: a one-line BookError naming the file and the record / line; nothing written."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

pytest.importorskip("databento_dbn")
pytest.importorskip("numba")
zstandard = pytest.importorskip("zstandard")

from fxray.book.reader import OFI_NAMES, BookError, bars_from_trades, load_book, load_trades, ofi_features  # noqa: E402
from fxray.data import cache  # noqa: E402

ES_DAY = "book/databento/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
BTC = "book/binance_usdm/btcusdt_20240808.gz"
FIX = "book/dbn_fixtures/test_data.{}.dbn"


def build(book_file, trade_file, out):
    """What `fxray.data build` does with book files: load, featurise, then write."""
    trades = load_trades(str(trade_file))
    bars = bars_from_trades(trades, "1s")
    ofi, _ = ofi_features(bars.ts, book=load_book([str(book_file)]), trades=trades)
    cache.write(
        out,
        bars.ts,
        np.zeros((len(bars.ts), cache.N_FEATURES), np.float32),
        ofi,
        np.column_stack([bars.open, bars.high, bars.low, bars.close]),
        feature_names=[f"f{i}" for i in range(cache.N_FEATURES)],
        ofi_names=OFI_NAMES,
        instrument="x",
        bar="1s",
        source="test",
    )


def fails(tmp_path, book_file, match, trade_file=None):
    out = tmp_path / "out.fxcache"
    with pytest.raises(BookError, match=match) as err:
        build(book_file, trade_file or book_file, out)
    msg = str(err.value)
    assert "\n" not in msg and (str(book_file) in msg or str(trade_file) in msg)
    assert not out.exists() and list(tmp_path.glob("*.fxcache*")) == []
    return msg


def test_good_small_inputs_do_build(tmp_path, shared_data):
    # the control for every failure below: the same pipeline succeeds on the fixture
    build(shared_data / FIX.format("mbp-10"), shared_data / FIX.format("trades"), tmp_path / "ok.fxcache")
    assert (tmp_path / "ok.fxcache").exists()


def test_truncated_dbn_mid_record(tmp_path, shared_data):
    raw = (shared_data / FIX.format("mbp-10")).read_bytes()
    bad = tmp_path / "cut.mbp-10.dbn"
    bad.write_bytes(raw[:-100])  # 368-byte records: the second loses its last 100 bytes
    fails(tmp_path, bad, r"truncated: record 1 is cut short \(268 of 368 bytes\)")


def test_truncated_dbn_in_metadata(tmp_path, shared_data):
    bad = tmp_path / "head.dbn"
    bad.write_bytes((shared_data / FIX.format("mbp-10")).read_bytes()[:100])
    fails(tmp_path, bad, r"truncated in the metadata header")


def test_truncated_zstd(tmp_path, shared_data):
    raw = (shared_data / ES_DAY).read_bytes()
    bad = tmp_path / "cut.mbo.dbn.zst"
    bad.write_bytes(raw[: len(raw) // 2])
    fails(tmp_path, bad, r"truncated zstd stream")


def test_wrong_schema_for_a_book(tmp_path, shared_data):
    trades_file = shared_data / FIX.format("trades")
    msg = fails(tmp_path, trades_file, r"schema 'trades' cannot give an order book \(record 0\)")
    assert "mbo, mbp-10" in msg


def test_wrong_schema_for_trades(tmp_path, shared_data):
    fails(
        tmp_path,
        shared_data / FIX.format("mbp-10"),
        r"schema 'ohlcv-1m' cannot give trades",
        trade_file=shared_data / FIX.format("ohlcv-1m"),
    )


def test_not_a_dbn_or_capture_file(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, world\n")
    fails(tmp_path, bad, r"record 0: neither a DBN file")


def mbo_records(shared_data) -> tuple[bytearray, int]:
    """The ES MBO fixture's bytes (mutable) and the offset of its first record."""
    raw = bytearray((shared_data / FIX.format("mbo")).read_bytes())
    return raw, 8 + int.from_bytes(raw[4:8], "little")  # 8-byte prefix + metadata length


def test_unsorted_dbn_events(tmp_path, shared_data):
    raw, start = mbo_records(shared_data)
    r0, r1 = raw[start : start + 56], raw[start + 56 : start + 112]
    raw[start : start + 112] = r1 + r0  # swap the two records: ts_recv goes backwards
    bad = tmp_path / "swapped.mbo.dbn"
    bad.write_bytes(bytes(raw))
    fails(tmp_path, bad, r"record 1 \(ts_recv \d+\) is earlier than record 0")


def test_mixed_record_types(tmp_path, shared_data):
    raw, start = mbo_records(shared_data)
    raw[start + 56 + 1] = 0x00  # record 1 claims to be a trade (rtype 0) inside an MBO file
    bad = tmp_path / "mixed.mbo.dbn"
    bad.write_bytes(bytes(raw))
    fails(tmp_path, bad, r"record 1 has rtype 0x00")


def test_two_instruments_in_one_file_are_refused(tmp_path, shared_data):
    raw, start = mbo_records(shared_data)
    first_id = int.from_bytes(raw[start + 4 : start + 8], "little")
    raw[start + 56 + 4 : start + 56 + 8] = (first_id + 1).to_bytes(4, "little")  # record 1: another
    bad = tmp_path / "two.mbo.dbn"
    bad.write_bytes(bytes(raw))
    fails(
        tmp_path,
        bad,
        rf"record 1 is instrument {first_id + 1}, record 0 is {first_id}: "
        r"fxray reads one instrument per file; download one symbol per file",
    )


# --- Binance -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def btc_head(shared_data):
    """The first 400 lines of the capture: snapshot at line 55, diffs before and after it."""
    with gzip.open(shared_data / BTC, "rt") as f:
        return [next(f) for _ in range(400)]


def write_capture(tmp_path, lines, name="cap.gz"):
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        f.writelines(lines)
    return path


def test_binance_head_builds(tmp_path, btc_head):
    build(write_capture(tmp_path, btc_head), write_capture(tmp_path, btc_head, "t.gz"), tmp_path / "ok.fxcache")


def test_binance_sequence_gap(tmp_path, btc_head):
    diffs = [i for i, line in enumerate(btc_head) if "@depth" in line[:60] and i > 60]
    lines = btc_head[: diffs[2]] + btc_head[diffs[2] + 1 :]  # drop one diff after the snapshot
    path = write_capture(tmp_path, lines)
    fails(tmp_path, path, rf"line {diffs[3]}: depth diff pu=\d+ does not continue .* \(sequence gap\)")


def test_binance_snapshot_not_bridged(tmp_path, btc_head):
    # line 42 (U <= lastUpdateId <= u) is the only diff that bridges the snapshot; without it
    # the next one (line 50, now 49) is the first applied and leaves a hole
    lines = btc_head[:41] + btc_head[42:]
    fails(
        tmp_path,
        write_capture(tmp_path, lines),
        r"line 49: first diff after the snapshot .* "
        r"does not bridge lastUpdateId",
    )


def test_binance_unsorted_lines(tmp_path, btc_head):
    t = next(i for i, x in enumerate(btc_head) if i > 60 and "@trade" in x[:60])
    lines = btc_head[:t] + btc_head[t + 1 : 301] + [btc_head[t]] + btc_head[301:]  # now line 301
    fails(tmp_path, write_capture(tmp_path, lines), r"line 301: local time \d+ is earlier than line")


def test_binance_without_snapshot(tmp_path, btc_head):
    lines = [x for x in btc_head if "lastUpdateId" not in x[:60]]
    fails(tmp_path, write_capture(tmp_path, lines), r"no depth snapshot")


def test_binance_truncated_gzip(tmp_path, btc_head):
    path = write_capture(tmp_path, btc_head)
    path.write_bytes(path.read_bytes()[:-2000])
    fails(tmp_path, path, r"truncated or corrupt gzip|bad JSON")


def test_binance_malformed_numbers(tmp_path, btc_head):
    """A price that is not a number (canonical layout) or a level that is not a pair (JSON
    layout): one BookError naming the file, on numpy 1 and 2 alike."""
    d = next(i for i, x in enumerate(btc_head) if i > 60 and "@depth" in x[:60])
    lines = list(btc_head)
    lines[d] = lines[d].replace('"b":[["1000.00"', '"b":[["10x0.00"', 1)
    fails(tmp_path, write_capture(tmp_path, lines), r"a depth level is not a \[price, qty\] pair of numbers")
    lines = list(btc_head)
    lines[d] = lines[d].replace('"b":[["1000.00","606.675"]', '"b": [["1000.00"]', 1)  # not the canonical layout
    fails(tmp_path, write_capture(tmp_path, lines), rf"line {d + 1}: malformed diff message \(ValueError")
    t = next(i for i, x in enumerate(btc_head) if i > 60 and "@trade" in x[:60])
    lines = list(btc_head)
    lines[t] = lines[t].replace('"q":"', '"q":"0.2.4', 1)
    path = write_capture(tmp_path, lines)
    fails(tmp_path, write_capture(tmp_path, btc_head, "book.gz"), "a trade price or quantity is not a number", path)
