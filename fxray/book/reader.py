"""Order books and trade tapes from real feeds -> the fxcache's 8 order-flow (`ofi`) features.

    from fxray.book.reader import load_book, load_trades, ofi_features, bars_from_trades, OFI_NAMES

    trades = load_trades(["esh4-glbx-mdp3-20231225.mbo.dbn.zst"])   # Trades(ts, price, size, side)
    bars = bars_from_trades(trades, bar="1min")                      # when no bar file is given
    book = load_book(["esh4-glbx-mdp3-20231225.mbo.dbn.zst"])        # lazy, streamed
    ofi, covered = ofi_features(bars.ts, book=book, trades=trades)   # (N, 8) float32, (N,) bool

Inputs, told apart by content (not by file name):
  - Databento DBN (.dbn / .dbn.zst, v1-v3): MBO (the book is rebuilt from orders),
    MBP-10 (10-level snapshots as sent); trades from trades / MBO / MBP-1 / TBBO / MBP-10.
  - Binance USD-M futures depth captures (`<local_ns> <json>` lines, gzip / zstd / plain).
Every timestamp is the receive time (DBN ts_recv, Binance local ns), ns since epoch, UTC.
Every input problem is a one-line `BookError` naming the file and the record / line;
nothing here writes files, so a failed build leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from fxray.book import binance as book_binance
from fxray.book import dbn as book_dbn
from fxray.book import engine as eng
from fxray.book.features import OFI_NAMES, OfiParams, bars_from_trades, ofi_features
from fxray.book.types import BookError, BookSnapshots, ByteReader, Trades

# the documented API (docs/ofi.md) in one import: these four are re-exported from .features
__all__ = ["OFI_NAMES", "OfiParams", "bars_from_trades", "ofi_features"]


def reader_of(path: str):
    """The module that reads `path` (book_dbn or book_binance), from the file's decompressed first bytes."""
    head = ByteReader(str(path)).read(24)
    if head[:3] == b"DBN":
        return book_dbn
    ts, _, rest = head.partition(b" ")
    if ts.isdigit() and rest.startswith(b"{"):
        return book_binance
    raise BookError(f"{path}: record 0: neither a DBN file nor a '<ns> <json>' capture (starts {head[:16]!r})")


def _paths(paths: Sequence[str] | str) -> list[str]:
    return [str(p) for p in ([paths] if isinstance(paths, str) else paths)]


class BookStream:
    """A lazy, re-iterable order book over files read in the order given.

    Iterating yields `BookSnapshots` chunks (at most engine.OUT_ROWS rows each); memory
    stays O(chunk + resting orders), not O(messages). After a full iteration:
      segments  (S, 2) int64 [start, end] ns each file's book covers (coverage of bars)
      stats     {'messages': records / lines read, 'unknown_orders': MBO cancels/modifies of unseen ids}
    The book carries over from one DBN file to the next (a day's MBO continues the
    previous day's snapshot file); each Binance file is its own snapshot + diffs.
    """

    def __init__(self, paths: Sequence[str]):
        self.paths = _paths(paths)
        if not self.paths:
            raise BookError("load_book: no files given")
        self.segments = np.zeros((0, 2), np.int64)
        self.stats: dict = {}

    def __iter__(self) -> Iterator[BookSnapshots]:
        st = eng.new_state()
        stats = {"messages": 0}
        segments, last_ts = [], None
        for path in self.paths:
            first = None
            for snap in reader_of(path).iter_book(path, st, stats):
                if last_ts is not None and snap.ts[0] < last_ts:
                    raise BookError(
                        f"{path}: record 0 (ts {snap.ts[0]}) is earlier than the end "
                        f"of the previous file ({last_ts}); give files in time order"
                    )
                first = int(snap.ts[0]) if first is None else first
                last_ts = int(snap.ts[-1])
                yield snap
            if first is not None:  # DBN: the file's requested end; Binance: its last diff
                segments.append((first, max(last_ts, stats["end"] or last_ts)))
        self.stats = {"messages": stats["messages"], "unknown_orders": int(st["state"][eng.UNKNOWN])}
        self.segments = np.array(segments, np.int64).reshape(-1, 2)


def load_book(paths: Sequence[str] | str) -> BookStream:
    """Open book files (DBN MBO / MBP-10, Binance captures), in time order, lazily.

    Headers are checked on iteration, not here: nothing is read until `ofi_features`
    iterates. A DBN file must hold one instrument.
    """
    return BookStream(paths)


def load_trades(paths: Sequence[str] | str) -> Trades:
    """The trade tape of the given files, concatenated in the order given.

    DBN: action 'T' records of trades / MBO / MBP-1 / TBBO / MBP-10 files, side =
    aggressor ('B' -> +1, 'A' -> -1, 'N' -> 0). Binance: `@trade` lines, m=true -> -1.
    `Trades.segments` holds one [start, end] span per file (bar coverage).
    """
    parts = []
    for path in _paths(paths):
        parts.append(reader_of(path).read_trades(path))
        if len(parts) > 1 and len(parts[-1]) and len(parts[-2]) and parts[-1].ts[0] < parts[-2].ts[-1]:
            raise BookError(
                f"{path}: trade 0 (ts {parts[-1].ts[0]}) is earlier than the last "
                f"trade of the previous file ({parts[-2].ts[-1]}); give files in time order"
            )
    return Trades.concat(parts)
