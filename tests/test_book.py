"""Readers and the book rebuild, against independent decoders and plain-Python references."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest

databento_dbn = pytest.importorskip("databento_dbn")
pytest.importorskip("numba")
pytest.importorskip("zstandard")

from fxray.book import dbn as book_dbn  # noqa: E402
from fxray.book import engine as book_engine  # noqa: E402
from fxray.book.reader import BookSnapshots, BookStream, load_book, load_trades  # noqa: E402

ES_DAY = "book/databento/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
ES_SNAP = "book/databento/esh4-glbx-mdp3-20231224.mbo.dbn.zst"
BTC = "book/binance_usdm/btcusdt_20240808.gz"
FIX = "book/dbn_fixtures/test_data.{}.dbn"


def decoded(path):
    """Every record of a DBN file through databento_dbn's own decoder (the reference)."""
    dec = databento_dbn.DBNDecoder()
    dec.write(open(path, "rb").read() if not str(path).endswith(".zst") else _unzstd(path))
    return [r for r in dec.decode() if not isinstance(r, databento_dbn.Metadata)]


def _unzstd(path):
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True).read()


def records(path):
    dbn = book_dbn.DbnFile(str(path))
    return np.concatenate(list(dbn.chunks()))


# --- DBN layout ----------------------------------------------------------------------------


def test_mbp10_fixture_decodes_to_documented_fields(shared_data):
    path = shared_data / FIX.format("mbp-10")
    rec = records(path)
    ref = decoded(path)
    assert len(rec) == len(ref) == 2
    # the values databento_dbn prints for record 0 (DBN docs: 16-byte header, then the body)
    r0 = rec[0]
    assert (r0["rtype"], r0["publisher_id"], r0["instrument_id"]) == (0x0A, 1, 5482)
    assert (r0["ts_event"], r0["ts_recv"]) == (1609160400000429831, 1609160400000704060)
    assert (r0["price"], r0["size"], chr(r0["action"]), chr(r0["side"])) == (3722750000000, 1, "C", "A")
    assert (r0["flags"], r0["depth"], r0["ts_in_delta"], r0["sequence"]) == (128, 9, 22993, 1170352)
    lv0 = r0["levels"][0]
    assert (lv0["bid_px"], lv0["ask_px"], lv0["bid_sz"], lv0["ask_sz"], lv0["bid_ct"], lv0["ask_ct"]) == (
        3720250000000,
        3720500000000,
        24,
        10,
        15,
        8,
    )
    for ours, theirs in zip(rec, ref):  # every field of every level
        for i, lv in enumerate(theirs.levels):
            for f in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
                assert ours["levels"][i][f] == getattr(lv, f), (i, f)
        for f in ("price", "size", "flags", "depth", "ts_recv", "ts_event", "sequence", "ts_in_delta"):
            assert ours[f] == getattr(theirs, f), f
    snap = BookSnapshots.concat(load_book([str(path)]))  # both records end an event (F_LAST)
    assert len(snap) == 2
    assert snap.bid_px[0, 0] == 3720.25 and snap.ask_px[0, 9] == 3722.75
    assert snap.bid_sz[1, 1] == 30 and snap.reset.tolist() == [True, False]


@pytest.mark.parametrize("schema", ["mbo", "trades", "mbp-1", "tbbo"])
def test_record_layouts_match_databento_decoder(shared_data, schema):
    path = shared_data / FIX.format(schema)
    rec, ref = records(path), decoded(path)
    assert len(rec) == len(ref) > 0
    fields = ["price", "size", "flags", "ts_recv", "ts_event", "sequence", "instrument_id"]
    fields += ["order_id"] if schema == "mbo" else ["depth"]
    for ours, theirs in zip(rec, ref):
        for f in fields:
            assert ours[f] == getattr(theirs, f), f
        assert chr(ours["action"]) == str(theirs.action) and chr(ours["side"]) == str(theirs.side)


# --- MBO rebuild ---------------------------------------------------------------------------


def plain_mbo_states(rec):
    """A deliberately simple MBO book (dicts, sort at each event) -> top-10 after each event."""
    orders, levels = {}, {66: defaultdict(int), 65: defaultdict(int)}
    states, in_snap, prev_ts = [], False, 0

    def emit(ts):
        bids = sorted((p for p, q in levels[66].items() if q > 0), reverse=True)[:10]
        asks = sorted(p for p, q in levels[65].items() if q > 0)[:10]
        row = (
            [p / 1e9 for p in bids] + [-np.inf] * (10 - len(bids)),
            [levels[66][p] for p in bids] + [0] * (10 - len(bids)),
            [p / 1e9 for p in asks] + [np.inf] * (10 - len(asks)),
            [levels[65][p] for p in asks] + [0] * (10 - len(asks)),
        )
        if not states or states[-1][1:] != row:
            states.append((ts, *row))

    for r in rec:
        snap = bool(r["flags"] & 0x20)
        if snap and not in_snap:
            orders.clear(), levels[66].clear(), levels[65].clear()
            in_snap = True
        elif not snap and in_snap:
            emit(prev_ts)
            in_snap = False
        a, oid = chr(r["action"]), int(r["order_id"])
        if a in "ACM":
            if oid in orders:
                px, sz, sd = orders.pop(oid)
                levels[sd][px] -= sz
            else:
                px, sz, sd = 0, 0, int(r["side"])
            if a == "C":
                sz -= int(r["size"])
            else:
                px, sz = int(r["price"]), int(r["size"])
            if sz > 0:
                orders[oid] = (px, sz, sd)
                levels[sd][px] += sz
        if r["flags"] & 0x80:
            emit(int(r["ts_recv"]))
            in_snap = False
        prev_ts = int(r["ts_recv"])
    return states


def test_mbo_rebuild_matches_plain_python(shared_data, tmp_path):
    # the snapshot (8,725 records) and the first 11k live records, as their own DBN file
    src = shared_data / ES_DAY
    raw = _unzstd(src)
    meta_end = 8 + int.from_bytes(raw[4:8], "little")
    cut = tmp_path / "es_head.dbn"
    cut.write_bytes(raw[: meta_end + 56 * 20_000])
    fast = BookSnapshots.concat(load_book([str(cut)]))
    ref = plain_mbo_states(records(cut))
    assert len(fast) == len(ref) > 5_000
    assert np.array_equal(fast.ts, [s[0] for s in ref])
    for col, name in enumerate(("bid_px", "bid_sz", "ask_px", "ask_sz"), start=1):
        assert np.array_equal(getattr(fast, name), np.array([s[col] for s in ref], float)), name


def test_chunking_and_level_growth_do_not_change_the_book(shared_data, monkeypatch):
    path = str(shared_data / ES_DAY)
    whole = BookSnapshots.concat(load_book([path]))
    monkeypatch.setattr(book_engine, "LEVEL_CAPACITY", 8)  # forces grow-and-resume steps
    grown = []
    real_grow = book_engine.grow_levels
    monkeypatch.setattr(book_engine, "grow_levels", lambda st: grown.append(1) or real_grow(st))
    monkeypatch.setattr(book_dbn, "CHUNK_RECORDS", 997)
    monkeypatch.setattr(book_engine, "OUT_ROWS", 301)
    pieces = list(BookStream([path]))
    assert len(grown) >= 5
    assert max(len(p) for p in pieces) <= 301 and len(pieces) > 100
    again = BookSnapshots.concat(pieces)
    for f in ("ts", "bid_px", "bid_sz", "ask_px", "ask_sz", "reset"):
        assert np.array_equal(getattr(whole, f), getattr(again, f)), f


def test_es_book_is_crossed_only_in_the_preopen_auction(shared_data):
    stream = load_book([str(shared_data / ES_SNAP), str(shared_data / ES_DAY)])
    book = BookSnapshots.concat(stream)
    assert stream.stats["unknown_orders"] == 0  # every cancel / modify found its order
    first_trade = load_trades(str(shared_data / ES_DAY)).ts[0]  # the 23:00 opening auction print
    crossed = book.bid_px[:, 0] >= book.ask_px[:, 0]
    assert crossed.any()  # the pre-open does cross: the check below has something to bite on
    pre_open = np.datetime64("2023-12-25T22:00", "ns").astype(np.int64)
    assert (book.ts[crossed] >= pre_open).all() and (book.ts[crossed] <= first_trade).all()
    after = book.ts > first_trade
    assert after.sum() > 20_000 and (book.bid_px[after, 0] < book.ask_px[after, 0]).all()
    # the day file's own snapshot replaces the snapshot file's book (no double-counted orders)
    day_only = BookSnapshots.concat(load_book([str(shared_data / ES_DAY)]))
    assert np.array_equal(book.bid_sz[-len(day_only) :], day_only.bid_sz)
    assert book.reset.sum() == 2 and stream.segments.shape == (2, 2)


def test_dbn_trade_counts_match_raw_records(shared_data):
    path = shared_data / ES_DAY
    trades = load_trades(str(path))
    raw = [r for r in decoded(path) if str(r.action) == "T"]
    assert len(trades) == len(raw) == 2973
    for code, sign in (("B", 1), ("A", -1), ("N", 0)):
        mine = trades.side == sign
        theirs = [r for r in raw if str(r.side) == code]
        assert mine.sum() == len(theirs), code
        assert trades.size[mine].sum() == sum(r.size for r in theirs), code
    assert (trades.side == 1).sum() == 1542 and (trades.side == -1).sum() == 1430
    assert np.array_equal(trades.price, [r.price / 1e9 for r in raw])


# --- Binance -------------------------------------------------------------------------------


def _binance_lines(path):
    with gzip.open(path, "rt") as f:
        for line in f:
            ts, js = line.split(" ", 1)
            yield int(ts), json.loads(js)


def test_binance_trade_counts_match_raw_lines(shared_data):
    path = shared_data / BTC
    trades = load_trades(str(path))
    raw = [d["data"] for _, d in _binance_lines(path) if d.get("stream", "").endswith("@trade")]
    assert len(trades) == len(raw) == 21313
    assert (trades.side == -1).sum() == sum(d["m"] for d in raw)  # buyer is maker = sell
    assert (trades.side == 1).sum() == sum(not d["m"] for d in raw)
    assert trades.size.sum() == pytest.approx(sum(float(d["q"]) for d in raw), rel=1e-12)


def test_binance_top_of_book_matches_book_ticker(shared_data):
    """After each diff (final id u) the best bid/ask equal the last bookTicker with id <= u."""
    path = shared_data / BTC
    book = BookSnapshots.concat(load_book([str(path)]))
    diffs, tickers, snap = [], [], None
    for ts, d in _binance_lines(path):
        if "lastUpdateId" in d:
            snap = (ts, d["lastUpdateId"])
        elif d["data"]["e"] == "depthUpdate":
            diffs.append((ts, d["data"]["u"]))
        elif d["data"]["e"] == "bookTicker":
            x = d["data"]
            tickers.append((x["u"], float(x["b"]), float(x["B"]), float(x["a"]), float(x["A"])))
    diffs, tickers = np.array(diffs), np.array(sorted(tickers))
    diffs = diffs[diffs[:, 1] >= snap[1]]
    ts = np.maximum(diffs[:, 0], snap[0])  # buffered diffs apply at snapshot time
    last_at_ts = np.r_[ts[1:] != ts[:-1], True]
    row = np.searchsorted(book.ts, ts, "right") - 1
    tick = np.searchsorted(tickers[:, 0], diffs[:, 1], "right") - 1
    use = last_at_ts & (tick >= 0)
    assert use.sum() > 6000
    got = np.column_stack([book.bid_px[row, 0], book.bid_sz[row, 0], book.ask_px[row, 0], book.ask_sz[row, 0]])[use]
    np.testing.assert_allclose(got, tickers[tick[use], 1:], rtol=0, atol=1e-9)
    assert not (book.bid_px[:, 0] >= book.ask_px[:, 0]).any()
