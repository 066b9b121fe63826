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
import re
import warnings
from itertools import chain

import numpy as np

from fxray.book import engine as eng
from fxray.book.types import PRICE_SCALE, BookError, Trades, iter_bytes

DIFFS_PER_CHUNK = 1 << 15


_MARKERS = {"snapshot": rb"lastUpdateId", "diff": rb"@depth", "trade": rb"@trade"}


def iter_lines(path: str, kinds: tuple):
    """(line_number, kind, local_ns, json_text) for lines of the given kinds, in time order.

    The wanted lines are found by a C-level substring search for their marker (which
    must sit in a line's first 72 bytes), so the many other lines (66k bookTickers in
    a 94k-line capture) cost no Python at all. A line's kind is its first marker's. The last
    item is (lines, "eof", None, b"").
    """
    markers = [_MARKERS[k] for k in kinds]
    tail, lineno, last, last_line = b"", 0, None, 0
    for block in chain(iter_bytes(path), [b"\n"]):  # a last newline ends an unterminated last line
        data = tail + block
        cut = data.rfind(b"\n") + 1  # complete lines only; the rest waits for the next block
        data, tail = data[:cut], data[cut:]
        pos = 0  # data[:pos] is counted in lineno
        nxt = [data.find(m) for m in markers]
        while (hit := min((p for p in nxt if p >= 0), default=-1)) >= 0:
            kind = kinds[nxt.index(hit)]
            start = data.rfind(b"\n", 0, hit) + 1
            end = data.find(b"\n", hit)
            nxt = [data.find(m, end) if 0 <= p < end else p for m, p in zip(markers, nxt)]
            if hit - start > 72:
                continue
            lineno += data.count(b"\n", pos, start) + 1
            pos = end + 1
            raw = data[start:end]
            ts, _, js = raw.partition(b" ")
            try:
                ts = int(ts)
            except ValueError:
                raise BookError(f"{path}: line {lineno}: expected '<local_ns> <json>', got {raw[:60]!r}") from None
            if last is not None and ts < last:
                raise BookError(
                    f"{path}: line {lineno}: local time {ts} is earlier than line "
                    f"{last_line} ({last}); lines must be in arrival order"
                )
            last, last_line = ts, lineno
            yield lineno, kind, ts, js
        lineno += data.count(b"\n", pos)
    yield lineno, "eof", None, b""  # always last: lets callers count every line


def _parse(path: str, lineno: int, js: bytes) -> dict:
    try:
        return json.loads(js)
    except json.JSONDecodeError as e:
        raise BookError(f"{path}: line {lineno}: bad JSON ({e.msg} at column {e.colno})") from None


def _numbers(texts: list) -> np.ndarray:
    """b"1.5,2" texts -> their numbers, float64, parsed at C speed; a malformed number ends the
    parse early (numpy 1) or raises (numpy 2): either way the caller's count check fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return np.fromstring(b",".join(texts), sep=",")
        except ValueError:
            return np.empty(0)


_IDS = re.compile(rb'"U":(\d+),"u":(\d+),"pu":(\d+)')


def _levels_text(seg: bytes) -> tuple[int, bytes]:
    """'[["1.5","2"],["1.4","3"]]' -> (2, b'1.5,2,1.4,3')."""
    if seg == b"[]":
        return 0, b""
    return seg.count(b"],[") + 1, seg.translate(None, b'[]" ')


def _levels_json(levels: list) -> tuple[int, bytes]:
    return len(levels), ",".join(f"{p},{q}" for p, q in levels).encode()


def parse_diff(path: str, lineno: int, js: bytes) -> tuple:
    """(U, u, pu, (n_bid, bids, n_ask, asks)): a depth diff's update-id range and its levels, each
    side's as cleaned text 'px,qty,px,qty,...'. Read from the canonical Binance layout by byte
    search (3-4x faster than JSON, which dominates a capture's cost); anything else by JSON."""
    m = _IDS.search(js)
    ib = js.find(b'"b":[')
    ia = js.find(b',"a":[', ib)
    if m and ib > 0 and ia > 0:
        a_end = ia + 7 if js[ia + 6 : ia + 7] == b"]" else js.find(b"]]", ia) + 2
        if js[a_end:].strip() == b"}}":
            U, u, pu = (int(x) for x in m.groups())
            return U, u, pu, (*_levels_text(js[ib + 4 : ia]), *_levels_text(js[ia + 5 : a_end]))
    d = _parse(path, lineno, js)["data"]
    return int(d["U"]), int(d["u"]), int(d["pu"]), (*_levels_json(d["b"]), *_levels_json(d["a"]))


class _Sync:
    """Binance's book-sync procedure over the lines of one file, and the batch of level updates
    (one event = the snapshot or one diff) not yet applied to the book."""

    def __init__(self, path: str, st: dict):
        self.path, self.st = path, st
        self.ts, self.counts, self.texts = [], [], []  # the batch
        self.buffered = []  # (lineno, diff) seen before the snapshot
        # the snapshot's line and lastUpdateId once seen; the final update id of the last applied diff
        self.snap_line = self.last_id = self.last_u = None

    def snapshot(self, lineno: int, ts: int, js: bytes) -> None:
        if self.snap_line is not None:
            raise BookError(
                f"{self.path}: line {lineno}: a second depth snapshot (first at line "
                f"{self.snap_line}); split the capture into one file per snapshot"
            )
        snap = _parse(self.path, lineno, js)
        self.snap_line, self.last_id = lineno, int(snap["lastUpdateId"])
        eng.clear(self.st["orders"], self.st["state"])
        self.add_event(ts, *_levels_json(snap["bids"]), *_levels_json(snap["asks"]))
        for b_line, d in self.buffered:  # buffered diffs apply at the snapshot's time
            self._apply(b_line, ts, d)

    def diff(self, lineno: int, ts: int, js: bytes) -> None:
        d = parse_diff(self.path, lineno, js)
        if self.snap_line is None:
            self.buffered.append((lineno, d))
        else:
            self._apply(lineno, ts, d)

    def _apply(self, lineno: int, ts: int, diff: tuple) -> None:
        U, u, pu, levels = diff
        if self.last_u is None and u < self.last_id:
            return  # older than the snapshot: Binance says drop it
        if self.last_u is None and not U <= self.last_id <= u:  # Binance's continuity rules, the first diff
            raise BookError(
                f"{self.path}: line {lineno}: first diff after the snapshot has "
                f"U={U} u={u}, which does not bridge lastUpdateId={self.last_id} "
                "(diffs missing between snapshot and stream)"
            )
        elif self.last_u is not None and pu != self.last_u:  # and every next one
            raise BookError(
                f"{self.path}: line {lineno}: depth diff pu={pu} does not continue the "
                f"previous diff's u={self.last_u} (sequence gap); recapture or split the file here"
            )
        self.last_u = u
        self.add_event(ts, *levels)

    def add_event(self, ts: int, n_bid: int, bids: bytes, n_ask: int, asks: bytes) -> None:
        self.ts.append(ts)
        self.counts += (n_bid, n_ask)
        self.texts += [t for t in (bids, asks) if t]

    def run(self):
        """Apply the batch to the book (levels_apply), yield what that emits; start a new batch."""
        if not self.ts:
            return
        counts = np.array(self.counts, np.int64)  # (2 * events,) bid, ask, bid, ...
        offsets = np.r_[0, np.cumsum(counts.reshape(-1, 2).sum(1))]
        is_bid = np.repeat(np.tile([True, False], len(self.ts)), counts)
        flat = _numbers(self.texts)
        if len(flat) != 2 * counts.sum():
            raise BookError(
                f"{self.path}: a depth level is not a [price, qty] pair of numbers "
                f"(parsed {len(flat)} numbers, expected {2 * counts.sum()})"
            )
        pq = flat.reshape(-1, 2)
        key = np.rint(pq[:, 0] * PRICE_SCALE).astype(np.int64)  # price in 1e-9 units, exact up to 9 decimals
        ts = np.array(self.ts, np.int64)
        self.ts, self.counts, self.texts = [], [], []
        levels = (ts, offsets, is_bid, key, pq[:, 1].copy())
        yield from eng.run(eng.levels_apply, levels, len(ts), self.st, slack=2)


def iter_book(path: str, st: dict, stats: dict):
    """Yield BookSnapshots for one capture file (one symbol); `st` is the engine state.
    stats["end"]: the last line's time."""
    sync = _Sync(path, st)
    for lineno, kind, ts, js in iter_lines(path, ("snapshot", "diff")):
        if kind == "eof":
            break
        stats["end"] = ts
        try:
            (sync.snapshot if kind == "snapshot" else sync.diff)(lineno, ts, js)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise BookError(f"{path}: line {lineno}: malformed {kind} message ({type(e).__name__}: {e})") from None
        if len(sync.ts) >= DIFFS_PER_CHUNK:
            yield from sync.run()
    stats["messages"] += lineno  # every line read counts, skipped ones too
    if sync.snap_line is None:
        raise BookError(
            f"{path}: line {lineno}: no depth snapshot (lastUpdateId) in the file; cannot build a book from diffs alone"
        )
    yield from sync.run()


_TRADE = re.compile(rb'"p":"([0-9.eE+-]+)","q":"([0-9.eE+-]+)"[^{}]*"m":(true|false)')


def read_trades(path: str) -> Trades:
    """All `@trade` lines (one symbol); side from `m` (buyer is maker => the seller was the
    aggressor).

    Canonical lines are read by one regex (JSON parsing would dominate); others by JSON.
    """
    ts, nums, side = [], [], []  # nums: b"price,qty" per trade
    for lineno, kind, t, js in iter_lines(path, ("trade",)):
        if kind == "eof":
            break
        if m := _TRADE.search(js):
            p, q, maker = m.group(1), m.group(2), m.group(3) == b"true"
        else:
            try:
                d = _parse(path, lineno, js)["data"]
                p, q, maker = str(d["p"]).encode(), str(d["q"]).encode(), bool(d["m"])
            except (KeyError, TypeError) as e:
                raise BookError(f"{path}: line {lineno}: malformed trade ({type(e).__name__}: {e})") from None
        ts.append(t)
        nums.append(p + b"," + q)
        side.append(-1 if maker else 1)
    pq = _numbers(nums)
    if len(pq) != 2 * len(ts):
        raise BookError(f"{path}: a trade price or quantity is not a number")
    pq = pq.reshape(-1, 2)
    segments = np.array([ts[0], ts[-1]] if ts else [], np.int64).reshape(-1, 2)
    return Trades(np.array(ts, np.int64), pq[:, 0].copy(), pq[:, 1].copy(), np.array(side, np.int8), segments)
