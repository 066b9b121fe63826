"""Greedy-policy backtest on device: Q-values of a window -> positions -> metrics.

    q_all = (T, 3, 3) Q-values, one batched forward of the Q-network over the
            window's states with all three previous positions
    result = backtest(q_all, returns[start:end], day[start:end], cost)
    result.metrics.sharpe

The policy is exactly sequential -- p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 --
but each bar is a map on the 3-element set of positions, so the whole path is a
prefix composition of T maps: ceil(log2 T) doubling rounds of a (T, 3) gather
(Hillis-Steele scan), no loop over bars, no host sync. Everything stays on the
tensors' device (CPU or CUDA) until the single transfer of a handful of scalars
and the daily-return vector; metrics are then computed on the host by
fxray.metrics, the one definition of every metric.

Conventions
- Initial position before the window: flat (0). No forced exit at the end.
- Ties: torch.argmax returns the FIRST maximal action, so equal Q-values prefer
  short (a=0) over flat (a=1) over long (a=2). NaN Q-values win the argmax.
- Per-bar net log return: p_t * r[t] - cost * |p_t - p_{t-1}|, in the dtype of
  `returns`; r[t] = log(close[t+1] / close[t]), so the window must stop one
  bar before the last close.
- Daily returns: net returns summed (in float64) per UTC day having at least one
  bar in the window; `day` must be non-decreasing (it is, ts strictly increase).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fxray.eval.metrics import Metrics, summarize

N_SCALARS = 6  # leading entries of the packed host transfer, see _device_pack


@dataclass(frozen=True)
class BacktestResult:
    position: torch.Tensor  # (T,) int8 in {-1, 0, +1}, on the input device
    net_returns: torch.Tensor  # (T,) per-bar net log returns, dtype of `returns`, on device
    daily_returns: np.ndarray  # (n_days,) float64 daily sums, on the host
    metrics: Metrics


# --- the position path: prefix composition of per-bar maps -------------------


def greedy_positions(q_all: torch.Tensor) -> torch.Tensor:
    """(T,) int8 positions of the greedy policy from flat; exact, no host loop over bars.

    step[t, i] = argmax_a q_all[t, i, a] is bar t's map from the previous
    position index i = p + 1 to the new one (action a = new position + 1).
    After the round with shift s, table[t] = step[t] o ... o step[max(0, t-2s+1)],
    so after ceil(log2 T) rounds table[t] = step[t] o ... o step[0] and the
    position is table[t, 1] - 1 (start flat, index 1).
    """
    if q_all.ndim != 3 or q_all.shape[1:] != (3, 3):
        raise ValueError(f"q_all must be (T, 3, 3) [bar, previous position + 1, action], got {tuple(q_all.shape)}")
    n_bars = q_all.shape[0]
    table = q_all.argmax(dim=-1)  # (T, 3) int64: previous index -> new index
    spare = torch.empty_like(table)  # ping-pong buffer: no allocation per round
    shift = 1
    while shift < n_bars:  # ~log2(T) rounds (19 for 500K); T is host-known
        spare[:shift] = table[:shift]  # prefixes shorter than the shift are complete
        # spare[t, i] = table[t, table[t - shift, i]]: apply the earlier block first
        torch.gather(table[shift:], 1, table[:-shift], out=spare[shift:])
        table, spare = spare, table
        shift *= 2
    return (table[:, 1] - 1).to(torch.int8)


# --- evaluation of a position path -------------------------------------------


def _check_window(returns: torch.Tensor, day: torch.Tensor, n_bars: int, cost: float) -> None:
    if n_bars == 0:
        raise ValueError("empty backtest window (T = 0)")
    if returns.shape != (n_bars,) or day.shape != (n_bars,):
        raise ValueError(f"returns and day must be ({n_bars},), got {tuple(returns.shape)} and {tuple(day.shape)}")
    if not returns.is_floating_point() or day.is_floating_point():
        raise ValueError(f"returns must be float and day integer, got {returns.dtype}, {day.dtype}")
    if returns.device != day.device:
        raise ValueError(f"returns on {returns.device} but day on {day.device}")
    if not cost >= 0:
        raise ValueError(f"cost must be >= 0 (return units per unit of position change), got {cost}")


def count_days(day: torch.Tensor | np.ndarray) -> int:
    """Number of distinct days of a non-decreasing day index. A host sync on device tensors:
    call it once per window (outside the epoch loop) and pass `n_days=` to `backtest`."""
    day = torch.as_tensor(day)
    return int((day[1:] != day[:-1]).sum()) + 1 if day.numel() else 0


def _device_pack(
    position: torch.Tensor, returns: torch.Tensor, day: torch.Tensor, cost: float, n_days: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(net_returns (T,), packed (N_SCALARS + n_days,) float64) on device; no host sync."""
    pos = position.to(returns.dtype)  # (T,)
    change = (pos - torch.cat((pos.new_zeros(1), pos[:-1]))).abs()  # (T,) |p_t - p_{t-1}|, p_-1 = 0
    net_returns = pos * returns - cost * change  # (T,) net log returns

    # Dense day ids 0..D-1 in order of appearance: days without bars (weekends,
    # holidays) get no entry, so they neither dilute nor inflate the Sharpe.
    new_day = day[1:] != day[:-1]  # (T-1,) bool
    day_id = torch.cat((day.new_zeros(1), new_day.cumsum(0)))  # (T,) int64
    # Clamp so that a too-small n_days cannot index out of bounds (a device
    # assert on CUDA); the mismatch is reported after the transfer instead.
    # float64 accumulation: 1e3+ bars a day, and atomics' order noise stays ~1e-17.
    daily = torch.zeros(n_days, dtype=torch.float64, device=returns.device)
    daily.index_add_(0, day_id.clamp(max=n_days - 1), net_returns.double())

    in_market = pos != 0
    scalars = torch.stack(
        (
            change.double().mean(),  # turnover per bar
            (change != 0).sum().double(),  # n_trades
            in_market.sum().double(),  # bars in the market
            (in_market & (net_returns > 0)).sum().double(),  # of which net winners
            (day_id[-1] + 1).double(),  # true number of days
            (day[1:] < day[:-1]).sum().double(),  # day index going backwards
        )
    )
    return net_returns, torch.cat((scalars, daily))


def evaluate(
    position: torch.Tensor, returns: torch.Tensor, day: torch.Tensor, cost: float, *, n_days: int | None = None
) -> BacktestResult:
    """Net returns, daily sums and metrics of any (T,) position path in {-1, 0, +1}.

    n_days: the window's number of distinct days (`count_days`); without it one
    extra host sync finds it. A wrong value is detected and raises ValueError.
    """
    n_bars = position.shape[0] if position.ndim else 0
    _check_window(returns, day, n_bars, cost)
    if position.shape != (n_bars,):
        raise ValueError(f"position must be (T,), got {tuple(position.shape)}")
    if n_days is None:
        n_days = count_days(day)  # extra host sync (documented)
    if n_days < 1:
        raise ValueError(f"n_days must be >= 1, got {n_days}")
    net_returns, packed = _device_pack(position, returns, day, cost, n_days)
    packed = packed.cpu().numpy()  # the one host sync of an evaluation

    turnover, n_trades, n_in, n_hits, true_days, backwards = packed[:N_SCALARS]
    if backwards:
        raise ValueError("day must be non-decreasing over the window")
    if true_days != n_days:
        raise ValueError(f"n_days={n_days} but the window has {int(true_days)} distinct days")
    daily_returns = packed[N_SCALARS:]
    metrics = summarize(
        daily_returns, turnover=turnover, n_trades=int(n_trades), hit_rate=n_hits / n_in if n_in else 0.0
    )
    return BacktestResult(position.to(torch.int8), net_returns, daily_returns, metrics)


def backtest(
    q_all: torch.Tensor, returns: torch.Tensor, day: torch.Tensor, cost: float, *, n_days: int | None = None
) -> BacktestResult:
    """Greedy policy of `q_all` over one window; one host sync when `n_days` is given.

    q_all: (T, 3, 3) Q[t, previous position + 1, action]; returns: (T,) float per-bar
    log returns r[t] = log(close[t+1] / close[t]); day: (T,) int64 UTC day number;
    cost: return units per unit of position change. All on one device; pass views
    of the window (returns[start:end]), nothing is copied to the host but the result.
    """
    if q_all.device != returns.device:
        raise ValueError(f"q_all on {q_all.device} but returns on {returns.device}")
    return evaluate(greedy_positions(q_all), returns, day, cost, n_days=n_days)


def baselines(
    returns: torch.Tensor, day: torch.Tensor, cost: float, *, n_days: int | None = None
) -> dict[str, Metrics]:
    """Metrics of the two reference policies of a window, for per-fold tables.

    buy_and_hold: long every bar, pays `cost` once to enter (no exit cost).
    flat: never in the market; every daily return is 0.
    """
    hold = evaluate(torch.ones_like(returns, dtype=torch.int8), returns, day, cost, n_days=n_days)
    flat = summarize(np.zeros(hold.metrics.n_days))
    return {"buy_and_hold": hold.metrics, "flat": flat}
