"""Databento DBN files (.dbn, .dbn.zst; DBN v1-v3) -> book snapshots and trades, streamed.

Records are fixed-size C structs, so a chunk of them is one `np.frombuffer` with a
structured dtype: no Python object per message. `databento_dbn` decodes the
metadata header (schema, time range); the record layouts below are the ones
documented for DBN (identical in v1, v2 and v3 for these schemas) and a test checks
them against `databento_dbn`'s own decoder.
"""

from __future__ import annotations

import numpy as np

from fxray.book import engine as eng
from fxray.book.types import N_LEVELS, PRICE_SCALE, BookError, BookSnapshots, ByteReader, Trades

CHUNK_RECORDS = 1 << 17  # records per chunk: ~7 MB of MBO, ~46 MB of MBP-10
UNDEF_PRICE = np.iinfo(np.int64).max


def _struct(fields: str) -> list:
    """A C struct's fields, in order: "price <i8, size <u4" -> [("price", "<i8"), ("size", "<u4")]."""
    return [tuple(field.split()) for field in fields.split(",")]


_HEADER = _struct("length u1, rtype u1, publisher_id <u2, instrument_id <u4, ts_event <u8")
_MBP_BODY = _struct(
    "price <i8, size <u4, action u1, side u1, flags u1, depth u1, ts_recv <u8, ts_in_delta <i4, sequence <u4"
)
_MBO_BODY = _struct(
    "order_id <u8, price <i8, size <u4, flags u1, channel_id u1, action u1, side u1, "
    "ts_recv <u8, ts_in_delta <i4, sequence <u4"
)
_LEVEL = np.dtype(_struct("bid_px <i8, ask_px <i8, bid_sz <u4, ask_sz <u4, bid_ct <u4, ask_ct <u4"))  # BidAskPair, 32 B
DTYPES = {  # schema -> (rtype, record dtype)
    "mbo": (0xA0, np.dtype(_HEADER + _MBO_BODY)),
    "mbp-10": (0x0A, np.dtype(_HEADER + _MBP_BODY + [("levels", _LEVEL, (N_LEVELS,))])),
    "mbp-1": (0x01, np.dtype(_HEADER + _MBP_BODY + [("levels", _LEVEL, (1,))])),
    "trades": (0x00, np.dtype(_HEADER + _MBP_BODY)),
}
DTYPES["tbbo"] = DTYPES["mbp-1"]  # the same record: a trade with the book's top before it
BOOK_SCHEMAS = ("mbo", "mbp-10")
TRADE_SCHEMAS = ("trades", "mbo", "mbp-1", "tbbo", "mbp-10")
ACTION_TRADE = ord("T")


def _first(mask: np.ndarray) -> int | None:
    """The index of the first True in a non-empty `mask`, None if there is none."""
    i = int(np.argmax(mask))
    return i if mask[i] else None


class DbnFile:
    """One DBN file opened for chunked reading: metadata now, records on iteration."""

    def __init__(self, path: str):
        import databento_dbn  # the `book` extra; imported only when DBN input is read

        self.path = path
        self._reader = ByteReader(path)
        head = self._reader.read(8)
        if len(head) < 8 or head[:3] != b"DBN":
            raise BookError(f"{path}: not a DBN file (no 'DBN' magic at byte 0)")
        if head[3] not in (1, 2, 3):
            raise BookError(f"{path}: DBN version {head[3]} is not supported (1-3)")
        meta_len = int.from_bytes(head[4:8], "little")
        meta = self._reader.read(meta_len)
        if len(meta) < meta_len:
            raise BookError(f"{path}: truncated in the metadata header ({len(meta)} of {meta_len} bytes)")
        try:
            self.meta = databento_dbn.Metadata.decode(head + meta)
        except Exception as e:  # the decoder raises its own DBNError / ValueError types
            raise BookError(f"{path}: corrupt DBN metadata ({str(e).splitlines()[0]})") from None
        self.schema = str(self.meta.schema) if self.meta.schema is not None else "mixed"
        self.end = int(self.meta.end) if self.meta.end is not None else None

    def require(self, allowed: tuple, purpose: str) -> None:
        if self.schema not in allowed:
            raise BookError(
                f"{self.path}: DBN schema {self.schema!r} cannot give {purpose} "
                f"(record 0); use one of {', '.join(allowed)}"
            )

    def chunks(self):
        """Yield chunks of CHUNK_RECORDS records (fewer at the end), validated: rtype, size, order, instrument."""
        rtype, base = DTYPES[self.schema]
        first = self._reader.read(1)
        if not first:
            return
        size = first[0] * 4  # header length byte counts 4-byte words; ts_out adds 8 bytes
        if size < base.itemsize:
            raise BookError(f"{self.path}: record 0 is {size} bytes, a {self.schema} record is {base.itemsize}")
        formats, offsets = zip(*(base.fields[name][:2] for name in base.names))
        dtype = np.dtype({"names": base.names, "formats": formats, "offsets": offsets, "itemsize": size})
        data, index, last_ts = first + self._reader.read(CHUNK_RECORDS * size - 1), 0, None
        while data:
            n_full = len(data) // size
            if n_full * size != len(data):
                raise BookError(
                    f"{self.path}: truncated: record {index + n_full} is cut short "
                    f"({len(data) - n_full * size} of {size} bytes)"
                )
            rec = np.frombuffer(data, dtype)
            if (i := _first((rec["rtype"] != rtype) | (rec["length"] != first[0]))) is not None:
                raise BookError(
                    f"{self.path}: record {index + i} has rtype 0x{rec['rtype'][i]:02x} "
                    f"and length {rec['length'][i] * 4}, expected a {self.schema} record "
                    f"(rtype 0x{rtype:02x}, {size} bytes)"
                )
            ts = rec["ts_recv"].view(np.int64)
            before = np.r_[ts[0] if last_ts is None else last_ts, ts[:-1]]  # in receive-time order, across chunks too
            if (i := _first(ts < before)) is not None:
                what = "the record before it" if i == 0 else f"record {index + i - 1}"
                raise BookError(
                    f"{self.path}: record {index + i} (ts_recv {ts[i]}) is earlier than {what} "
                    f"({before[i]}); events must be sorted by ts_recv"
                )
            last_ts = int(ts[-1])
            ids = rec["instrument_id"]
            if (i := _first(ids != ids[0])) is not None:
                raise BookError(
                    f"{self.path}: record {index + i} is instrument {ids[i]}, record {index} is {ids[0]}: "
                    "fxray reads one instrument per file; download one symbol per file (or split this one)"
                )
            yield rec
            index += n_full
            if n_full < CHUNK_RECORDS:
                return
            data = self._reader.read(CHUNK_RECORDS * size)


# --- book ----------------------------------------------------------------------------------


def iter_book(path: str, st: dict, stats: dict):
    """Yield BookSnapshots from an MBO or MBP-10 file; `st` is the engine state (persists).
    stats["end"]: the end of the time range the file's metadata asked for (None if open)."""
    dbn = DbnFile(path)
    dbn.require(BOOK_SCHEMAS, "an order book")
    stats["end"] = dbn.end
    st["state"][eng.IN_SNAP] = 0  # a new file starts a new snapshot run (MBO)
    first = True  # MBP-10: the file's first snapshot is a reset
    for rec in dbn.chunks():
        stats["messages"] += len(rec)
        if dbn.schema == "mbp-10":
            if len(snap := _mbp10_snapshots(rec, first)):
                first = False
                yield snap
        else:
            cols = [rec[k] for k in ("order_id", "price", "size", "flags", "action", "side")]
            inputs = (rec["ts_recv"].view(np.int64), *cols, st["orders"])
            yield from eng.run(eng.mbo_apply, inputs, len(rec), st, slack=4)
    yield from eng.flush_snapshot(st)  # (MBP-10 leaves no snapshot run open: nothing)


def _mbp10_snapshots(rec: np.ndarray, first_of_file: bool) -> BookSnapshots:
    """MBP-10 records carry the top 10 themselves: keep those that end an event (F_LAST)."""
    rec = rec[(rec["flags"] & eng.F_LAST) != 0]
    lv = rec["levels"]  # (n, 10) structured
    bid_px = np.where(lv["bid_px"] == UNDEF_PRICE, -np.inf, lv["bid_px"] / PRICE_SCALE)
    ask_px = np.where(lv["ask_px"] == UNDEF_PRICE, np.inf, lv["ask_px"] / PRICE_SCALE)
    bid_sz = np.where(np.isinf(bid_px), 0.0, lv["bid_sz"])
    ask_sz = np.where(np.isinf(ask_px), 0.0, lv["ask_sz"])
    reset = rec["action"] == ord("R")
    reset[:1] |= first_of_file
    return BookSnapshots(rec["ts_recv"].view(np.int64).copy(), bid_px, bid_sz, ask_px, ask_sz, reset)


# --- trades --------------------------------------------------------------------------------

# DBN trade side = aggressor: 'B' a buyer lifted the offer (+1), 'A' a seller hit the bid (-1);
# 'N' (e.g. auction) and anything else stays 0
SIDE_SIGN = np.zeros(256, np.int8)
SIDE_SIGN[[ord("B"), ord("A")]] = 1, -1


def read_trades(path: str) -> Trades:
    """Trades (action 'T' records) from a trades / MBO / MBP-1 / TBBO / MBP-10 file."""
    dbn = DbnFile(path)
    dbn.require(TRADE_SCHEMAS, "trades")
    parts, spans = [], []  # the trade records and the [first, last] ts_recv of every record, per chunk
    for rec in dbn.chunks():
        if len(rec):
            parts.append(rec[rec["action"] == ACTION_TRADE])
            spans.append(rec["ts_recv"][[0, -1]].astype(np.int64))
    if not parts:
        return Trades.empty()
    t = np.concatenate(parts)
    first, last = spans[0][0], spans[-1][1]
    span = np.array([[first, max(last, dbn.end or last)]], np.int64)
    return Trades(
        t["ts_recv"].view(np.int64).copy(),
        t["price"] / PRICE_SCALE,
        t["size"].astype(np.float64),
        SIDE_SIGN[t["side"]],
        span,
    )
