"""Numba kernels: rebuild a price-level book from MBO orders or level updates; emit its top 10.

Why numba: a book rebuild is a sequential state machine (each order event depends on
the orders before it), which numpy cannot vectorise; a plain-Python loop runs at
~0.3M messages/s, these kernels at several M/s (scripts/bench_book.py).

Book layout, one pair of arrays per side, both kept ASCENDING so the best level is
the LAST element (most updates happen near the top, so inserts shift few elements):
    bid_keys[:nb]  int64  price (DBN fixed point, 1e-9 units)
    ask_keys[:na]  int64  -price
    *_sizes        float64 aggregate resting size at that price
The kernels take these as one tuple, `book` (book_arrays), and write into `out` (new_output).
Kernels are resumable: they stop early (returning the record index) when a level
array or the output buffer is nearly full; the caller grows / drains and calls again.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict

from fxray.book.types import N_LEVELS, PRICE_SCALE, BookSnapshots

F_LAST, F_SNAPSHOT = 0x80, 0x20  # DBN record flags
A_ADD, A_CANCEL, A_MODIFY, A_CLEAR = 65, 67, 77, 82  # DBN actions 'A' 'C' 'M' 'R'
S_ASK, S_BID = 65, 66  # DBN sides 'A' 'B'
EMPTY_KEY = np.iinfo(np.int64).min  # key of an absent level in `last_*`

# slots of the int64 `state` vector that persists across calls
NB, NA, IN_SNAP, RESET, SYNCED, PREV_TS, UNKNOWN, N_STATE = range(8)  # N_STATE: their count
LEVEL_CAPACITY = 1024  # initial price levels per side; grown by doubling when needed
OUT_ROWS = 1 << 16  # most rows per emitted chunk of BookSnapshots
LEVELS = ("bid_keys", "bid_sizes", "ask_keys", "ask_sizes")  # the level arrays: int64 keys, float64 sizes


def new_state() -> dict:
    """Fresh book state: level arrays, last emitted top 10, counters, order map."""
    return {
        **{k: np.zeros(LEVEL_CAPACITY, np.int64 if k.endswith("keys") else np.float64) for k in LEVELS},
        "last_keys": np.full(2 * N_LEVELS, EMPTY_KEY, np.int64),  # bid 0..9 then ask 0..9
        "last_sizes": np.zeros(2 * N_LEVELS),
        "state": np.zeros(N_STATE, np.int64),
        "orders": Dict.empty(types.int64, types.UniTuple(types.int64, 3)),  # id -> (px, size, side)
    }


def grow_levels(st: dict) -> None:
    """Double the level arrays' capacity (called when a kernel stopped for room)."""
    for k in LEVELS:
        st[k] = np.concatenate([st[k], np.zeros_like(st[k])])


def book_arrays(st: dict) -> tuple:
    """The kernels' `book` argument: the level arrays, the last emitted top 10, the state."""
    return tuple(st[k] for k in (*LEVELS, "last_keys", "last_sizes", "state"))


def new_output(rows: int) -> tuple:
    """Output buffers for up to `rows` emitted book states."""
    return (np.empty(rows, np.int64), *(np.empty((rows, N_LEVELS)) for _ in range(4)), np.empty(rows, np.bool_))


def run(kernel, inputs: tuple, n: int, st: dict, slack: int):
    """Drive a resumable kernel over its n events: yield what it emits as BookSnapshots (at most
    OUT_ROWS rows each), grow the level arrays when it stopped for room. `slack`: the output
    rows the kernel keeps free (it stops when fewer are left), twice what it may emit at once."""
    i = 0
    while i < n:
        out = new_output(min(OUT_ROWS, n - i + slack))
        i, r = kernel(*inputs, i, book_arrays(st), out)
        if r:
            yield BookSnapshots(*(a[:r] for a in out))
        if i < n and r < len(out[0]) - slack // 2:  # stopped for level room, not output room
            grow_levels(st)


# --- level arrays --------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _update_level(book, is_bid, price, amount, absolute):
    """Add `amount` to (or, if `absolute`, set it as) the size at `price` on the bid or ask side.

    A level whose size drops to <= 0 is removed. Caller guarantees room for one more level.
    """
    keys, sizes, slot = (book[0], book[1], NB) if is_bid else (book[2], book[3], NA)
    key = price if is_bid else -price
    state = book[6]
    n = state[slot]
    if n > 0 and keys[n - 1] <= key:  # fast path: at or above the current best
        lo = n - 1 if keys[n - 1] == key else n
    else:
        lo = np.searchsorted(keys[:n], key)
    if lo < n and keys[lo] == key:
        new = amount if absolute else sizes[lo] + amount
        if new > 0:
            sizes[lo] = new
            return
        for j in range(lo, n - 1):
            keys[j] = keys[j + 1]
            sizes[j] = sizes[j + 1]
        state[slot] = n - 1
        return
    if amount <= 0:  # removing a level that is not there: nothing to do
        return
    for j in range(n, lo, -1):
        keys[j] = keys[j - 1]
        sizes[j] = sizes[j - 1]
    keys[lo] = key
    sizes[lo] = amount
    state[slot] = n + 1


@njit(cache=True)
def _emit(ts, book, out, r):
    """Write the top 10 as output row r if it changed (or the book was reset); returns next r."""
    bid_keys, bid_sizes, ask_keys, ask_sizes, last_keys, last_sizes, state = book
    o_ts, o_bpx, o_bsz, o_apx, o_asz, o_reset = out
    changed = state[RESET] != 0
    nb, na = state[NB], state[NA]
    for j in range(N_LEVELS):  # row r is written whatever happens: the caller keeps it free
        kb = bid_keys[nb - 1 - j] if j < nb else EMPTY_KEY
        sb = bid_sizes[nb - 1 - j] if j < nb else 0.0
        ka = ask_keys[na - 1 - j] if j < na else EMPTY_KEY
        sa = ask_sizes[na - 1 - j] if j < na else 0.0
        if kb != last_keys[j] or sb != last_sizes[j] or ka != last_keys[N_LEVELS + j] or sa != last_sizes[N_LEVELS + j]:
            changed = True
            last_keys[j], last_sizes[j] = kb, sb
            last_keys[N_LEVELS + j], last_sizes[N_LEVELS + j] = ka, sa
        o_bpx[r, j] = kb / PRICE_SCALE if kb != EMPTY_KEY else -np.inf
        o_apx[r, j] = -ka / PRICE_SCALE if ka != EMPTY_KEY else np.inf
        o_bsz[r, j], o_asz[r, j] = sb, sa
    if not changed or state[SYNCED] == 0:
        return r
    o_ts[r] = ts
    o_reset[r] = state[RESET] != 0
    state[RESET] = 0
    return r + 1


@njit(cache=True)
def clear(orders, state):
    """Empty the book and mark the next emitted row as a reset (new snapshot / file)."""
    orders.clear()
    state[NB] = state[NA] = 0
    state[RESET] = state[SYNCED] = 1


# --- MBO -----------------------------------------------------------------------------------


@njit(cache=True)
def mbo_apply(ts, order_id, price, size, flags, action, side, orders, start, book, out):
    """Apply MBO records [start, len) to the book; emit the top 10 at each F_LAST boundary.

    Databento MBO semantics: Add inserts an order; Cancel removes `size` from it
    (partial cancels); Modify replaces its price and size; Clear empties the book;
    Trade / Fill / None leave the book alone (the exchange follows a fill with its
    own Cancel / Modify). A run of F_SNAPSHOT records replaces the book; it ends at
    an F_LAST record or at the first non-snapshot record (Databento's daily files
    end the snapshot without F_LAST). Returns (next record index, rows emitted).
    """
    state = book[6]
    r = 0
    cap = len(book[0]) - 2
    rcap = len(out[0]) - 2
    for i in range(start, len(ts)):
        if state[NB] >= cap or state[NA] >= cap or r >= rcap:
            return i, r
        f = flags[i]
        is_snap = (f & F_SNAPSHOT) != 0
        if is_snap and state[IN_SNAP] == 0:
            clear(orders, state)
            state[IN_SNAP] = 1
        elif not is_snap and state[IN_SNAP] != 0:
            r = _emit(state[PREV_TS], book, out, r)
            state[IN_SNAP] = 0
        a = action[i]
        if a == A_ADD or a == A_MODIFY or a == A_CANCEL:
            oid = np.int64(order_id[i])
            old = orders[oid] if oid in orders else (np.int64(0), np.int64(0), np.int64(-1))
            if old[2] >= 0:  # known order: take its resting size off its level
                _update_level(book, old[2] == S_BID, old[0], -old[1], False)
            elif a != A_ADD:
                state[UNKNOWN] += 1  # cancel / modify of an order we never saw
            sd = old[2] if old[2] >= 0 else np.int64(side[i])  # a known order keeps its side
            if a == A_CANCEL:  # (an unknown one's size goes <= 0: it is not kept)
                new_px, new_sz = old[0], old[1] - np.int64(size[i])
            else:
                new_px, new_sz = np.int64(price[i]), np.int64(size[i])
            if new_sz > 0 and (sd == S_BID or sd == S_ASK):
                orders[oid] = (new_px, new_sz, sd)
                _update_level(book, sd == S_BID, new_px, float(new_sz), False)
            elif old[2] >= 0:
                del orders[oid]
        elif a == A_CLEAR:
            clear(orders, state)
        if f & F_LAST:
            r = _emit(ts[i], book, out, r)
            state[IN_SNAP] = 0
        state[PREV_TS] = ts[i]
    return len(ts), r


def flush_snapshot(st: dict):
    """At the end of a file: emit a snapshot run that was never closed by F_LAST."""
    state = st["state"]
    if state[IN_SNAP] != 0:
        state[IN_SNAP] = 0
        out = new_output(1)
        if _emit(state[PREV_TS], book_arrays(st), out, 0):
            yield BookSnapshots(*out)


# --- absolute level updates (Binance depth) ------------------------------------------------


@njit(cache=True)
def levels_apply(ts, offsets, is_bid, key, qty, start, book, out):
    """Apply events [start, len(ts)): event e sets levels offsets[e]:offsets[e+1] to `qty`.

    `key` is the price in 1e-9 units; qty 0 removes the level. The book is
    consistent after each event, so each may emit. Returns (next event, rows emitted).
    """
    state = book[6]
    r = 0
    rcap = len(out[0]) - 1
    for e in range(start, len(ts)):
        lo, hi = offsets[e], offsets[e + 1]
        if max(state[NB], state[NA]) + (hi - lo) >= len(book[0]) - 1 or r >= rcap:
            return e, r
        for j in range(lo, hi):
            _update_level(book, is_bid[j], key[j], qty[j], True)
        r = _emit(ts[e], book, out, r)
    return len(ts), r
