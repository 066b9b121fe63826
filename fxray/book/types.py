"""The two shapes order-flow data takes inside fxray, and the one error it raises.

    BookSnapshots  the top 10 levels of a book after each event that changed them
    Trades         the trade tape with aggressor side

Both are plain numpy arrays in time order (ns since epoch, UTC, the time the data
was received). Readers live in `book_dbn.py` / `book_binance.py`; the public entry
points are in `book.py`.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, fields

import numpy as np

N_LEVELS = 10  # levels per side kept in a snapshot
PRICE_SCALE = 1e9  # DBN fixed-point prices: int64 units of 1e-9


class BookError(ValueError):
    """Bad book or trade input; the message is one line naming the file and the record."""


class _Rows:
    """Arrays with one row per event (`ts` first), in time order: their length, their concatenation."""

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def concat(cls, parts):
        """One from many (e.g. all chunks of a `BookStream`), field by field; an empty one from none."""
        parts = list(parts) or [cls.empty()]
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))


@dataclass(frozen=True)
class BookSnapshots(_Rows):
    """Consecutive book states; row n is the book right after event n.

    Empty levels have price -inf (bid) / +inf (ask) and size 0, so the OFI
    indicator rules (Cont et al. 2014) treat a vanished level as all size removed.
    """

    ts: np.ndarray  # (n,) int64 ns, non-decreasing
    bid_px: np.ndarray  # (n, 10) float64 price, best first; -inf where empty
    bid_sz: np.ndarray  # (n, 10) float64 resting size (contracts / base units)
    ask_px: np.ndarray  # (n, 10) float64 price, best first; +inf where empty
    ask_sz: np.ndarray  # (n, 10) float64
    reset: np.ndarray  # (n,) bool: book rebuilt here (snapshot, clear, new file): no flow across it

    @staticmethod
    def empty() -> BookSnapshots:
        z = np.zeros((0, N_LEVELS))
        return BookSnapshots(np.zeros(0, np.int64), z, z, z, z, np.zeros(0, bool))

    def select(self, rows) -> BookSnapshots:
        return BookSnapshots(*(getattr(self, f.name)[rows] for f in fields(self)))


@dataclass(frozen=True)
class Trades(_Rows):
    """The trade tape, in time order."""

    ts: np.ndarray  # (T,) int64 ns receive time, non-decreasing
    price: np.ndarray  # (T,) float64
    size: np.ndarray  # (T,) float64 contracts / base units
    side: np.ndarray  # (T,) int8: +1 buyer was the aggressor, -1 seller, 0 unknown (e.g. auction)
    segments: np.ndarray  # (S, 2) int64 [start, end] ns spans the source files cover (one per file)

    @staticmethod
    def empty() -> Trades:
        return Trades(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, np.int8), np.zeros((0, 2), np.int64))


# --- reading bytes -------------------------------------------------------------------------


def iter_bytes(path: str, block: int = 1 << 22):
    """Decompressed bytes of `path` (zstd, gzip or plain, told by magic bytes), in blocks.

    A zstd file whose last frame is incomplete raises BookError: the zstd library's
    stream reader returns the partial data silently, so we track frames ourselves.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise BookError(f"{path}: cannot open ({e.strerror})") from None
    with f:
        magic = f.read(4)
        f.seek(0)
        if magic == b"\x28\xb5\x2f\xfd":  # zstd
            import zstandard  # the `book` extra; imported only for .zst input

            dobj, done = None, 0  # dobj: the decoder of a frame begun and not yet ended
            while comp := f.read(block):
                try:
                    while comp:
                        dobj = dobj or zstandard.ZstdDecompressor().decompressobj()
                        if out := dobj.decompress(comp):
                            done += len(out)
                            yield out
                        comp = b""
                        if dobj.eof:  # frame done; a file may hold several frames
                            comp, dobj = dobj.unused_data, None
                except zstandard.ZstdError as e:
                    raise BookError(f"{path}: corrupt zstd data ({e})") from None
            if dobj is not None:
                raise BookError(f"{path}: truncated zstd stream: last frame incomplete after {done} decompressed bytes")
        elif magic[:2] == b"\x1f\x8b":  # gzip
            with gzip.open(f) as g:
                try:
                    yield from iter(lambda: g.read(block), b"")
                except (EOFError, OSError) as e:
                    raise BookError(f"{path}: truncated or corrupt gzip data ({e})") from None
        else:
            yield from iter(lambda: f.read(block), b"")


class ByteReader:
    """read(n) -> exactly n bytes, fewer only at the end of the data."""

    def __init__(self, path: str):
        self._it = iter_bytes(path)
        self._pending = bytearray()

    def read(self, n: int) -> bytes:
        while len(self._pending) < n and (nxt := next(self._it, None)) is not None:
            self._pending += nxt
        out = bytes(self._pending[:n])
        del self._pending[:n]
        return out
