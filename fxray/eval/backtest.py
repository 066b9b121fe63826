"""Greedy-policy backtest on device: Q-values of a window -> positions -> metrics.

    q_all = (T, 3, 3) Q-values, one batched forward of the Q-network over the
            window's states with all three previous positions
    window = data.window(fold.val)        # fxray.rl.device: the window's returns, days, hours
    result = backtest(q_all, window, cost)
    result.metrics.sharpe                 # the window's own (daily) numbers: for tables
    result.periods                        # hourly net returns and units traded: what is pooled

The policy is exactly sequential -- p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 --
but each bar is a map on the 3-element set of positions, so the whole path is a
prefix composition of T maps: ceil(log2 T) doubling rounds of a (T, 3) gather
(Hillis-Steele scan), no loop over bars, no host sync. Everything stays on the
tensors' device (CPU or CUDA) until the single transfer of a handful of scalars
and the daily and hourly sums; metrics are then computed on the host by
fxray.eval.metrics and fxray.eval.pooled, the one definition of every metric.

Conventions
- Initial position before the window: flat (0). No forced exit at the end.
- Ties: torch.argmax returns the FIRST maximal action, so equal Q-values prefer
  short (a=0) over flat (a=1) over long (a=2). NaN Q-values win the argmax.
- Per-bar net log return: p_{t-1} carry[t] + p_t fresh[t] - cost |p_t - p_{t-1}|.
  Filled at the close the features saw (carry None): fresh[t] = r[t] =
  log(close[t+1] / close[t]). Filled at the next bar's open: the old position earns
  carry[t] = log(open[t+1] / close[t]) until the fill, the new one fresh[t] =
  log(close[t+1] / open[t+1]). Either way the window stops one bar before the last close.
- Daily returns: net returns summed (in float64) per session day having at least
  one bar in the window (fxray.data.calendar); `day` must be non-decreasing.
- Period returns: net returns and units of position change summed per period
  (an hour) having a bar: fxray.eval.pooled pools them across windows and re-prices
  them at other costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fxray.eval.metrics import Metrics, summarize

N_SCALARS = 3  # leading entries of the packed host transfer, see _device_pack


@dataclass(frozen=True)
class Window:
    """The bars of one window on device, and the counts the host knows without a sync."""

    fresh: torch.Tensor  # (T,) return earned by the position taken at bar t
    day: torch.Tensor  # (T,) int64 session day, non-decreasing
    n_days: int  # distinct values of `day`
    period: torch.Tensor  # (T,) int64 period (hour) number, non-decreasing
    n_periods: int  # distinct values of `period`
    hours: np.ndarray  # (n_periods,) int64 those period numbers, on the host (for dating)
    carry: torch.Tensor | None = None  # (T,) what the previous position earns before a next-open fill


@dataclass(frozen=True)
class PeriodReturns:
    """A window's net returns per period at its cost, and the units traded in each (host)."""

    net: np.ndarray  # (P,) float64 summed net log returns
    units: np.ndarray  # (P,) float64 summed |position change|
    hours: np.ndarray  # (P,) int64 period numbers
    n_bars: int
    n_trades: int
    n_days: int

    def as_dict(self) -> dict:
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(self).items()}


@dataclass(frozen=True)
class BacktestResult:
    position: torch.Tensor  # (T,) int8 in {-1, 0, +1}, on the input device
    net_returns: torch.Tensor  # (T,) per-bar net log returns, dtype of the returns, on device
    daily_returns: np.ndarray  # (n_days,) float64 daily sums, on the host
    metrics: Metrics
    periods: PeriodReturns


# --- the position path: prefix composition of per-bar maps -------------------


def greedy_positions(q_all: torch.Tensor) -> torch.Tensor:
    """(T,) int8 positions of the greedy policy from flat; exact, no host loop over bars.
    q_all (K, T, 3, 3), K policies: (K, T), each policy's path, in the same scan.

    step[t, i] = argmax_a q_all[t, i, a] is bar t's map from the previous
    position index i = p + 1 to the new one (action a = new position + 1).
    After the round with shift s, table[t] = step[t] o ... o step[max(0, t-2s+1)],
    so after ceil(log2 T) rounds table[t] = step[t] o ... o step[0] and the
    position is table[t, 1] - 1 (start flat, index 1).
    """
    return compose(q_all.argmax(dim=-1))


def compose(table: torch.Tensor) -> torch.Tensor:
    """(..., T) int8 positions from flat of step maps table (..., T, 3): bar t's new position
    index from each previous one (greedy_positions' step, the hysteresis rule's moves)."""
    n_bars = table.shape[-2]
    shift = 1
    while shift < n_bars:  # ~log2(T) rounds (19 for 500K); T is host-known
        # table[t, i] <- table[t, table[t - shift, i]]: the earlier block first; the prefixes
        # shorter than the shift are complete
        later = torch.gather(table[..., shift:, :], -1, table[..., :-shift, :])
        table = torch.cat((table[..., :shift, :], later), -2)
        shift *= 2
    return (table[..., 1] - 1).to(torch.int8)


# --- evaluation of a position path -------------------------------------------


def _dense_ids(key: torch.Tensor) -> torch.Tensor:
    """(T,) ids 0..K-1 of a non-decreasing key in order of appearance (gaps get no id)."""
    return torch.cat((key.new_zeros(1), (key[1:] != key[:-1]).cumsum(0)))


def _device_pack(position: torch.Tensor, w: Window, cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(net_returns (K, T), packed (K, N_SCALARS + D + 2P) float64) on device of K position
    paths (K, T) at their costs (K, 1); no host sync."""
    K = position.shape[0]
    pos = position.to(w.fresh.dtype)  # (K, T)
    prev = torch.cat((pos.new_zeros(K, 1), pos[:, :-1]), 1)  # (K, T) p_{t-1}, p_-1 = 0
    change = (pos - prev).abs()  # (K, T) |p_t - p_{t-1}|
    net_returns = pos * w.fresh - cost * change  # (K, T) net log returns
    if w.carry is not None:
        net_returns = net_returns + prev * w.carry

    # Dense ids in order of appearance: days/hours without bars (weekends, holidays)
    # get no entry, so they neither dilute nor inflate a Sharpe. float64 sums: the order
    # noise of the atomics stays ~1e-17.
    day_id, period_id = _dense_ids(w.day), _dense_ids(w.period)
    daily = torch.zeros(K, w.n_days, dtype=torch.float64, device=pos.device)
    daily.index_add_(1, day_id, net_returns.double())
    hourly = torch.zeros(K, 2, w.n_periods, dtype=torch.float64, device=pos.device)  # net, units
    hourly.index_add_(2, period_id, torch.stack((net_returns.double(), change.double()), 1))

    in_market = pos != 0
    scalars = torch.stack(
        (
            (change != 0).sum(1).double(),  # n_trades
            in_market.sum(1).double(),  # bars in the market
            (in_market & (net_returns > 0)).sum(1).double(),  # of which net winners
        ),
        1,
    )
    return net_returns, torch.cat((scalars, daily, hourly.reshape(K, -1)), 1)


def evaluate(position: torch.Tensor, window: Window, cost: float) -> BacktestResult:
    """Net returns, daily and hourly sums, and metrics of any (T,) position path in {-1, 0, +1}.
    One host sync."""
    if position.ndim != 1:
        raise ValueError(f"position must be (T,), got {tuple(position.shape)}")
    return evaluate_many(position[None], window, [cost])[0]


def evaluate_many(position: torch.Tensor, window: Window, costs: list[float]) -> list[BacktestResult]:
    """evaluate of K position paths (K, T), path k at costs[k]: one pass, one host sync for all."""
    K, n_bars = position.shape
    if n_bars == 0:  # a fold's window of one bar: none with a next bar
        raise ValueError("empty backtest window (T = 0)")
    cost = torch.tensor(costs, dtype=window.fresh.dtype, device=position.device).unsqueeze(1)  # (K, 1)
    net_returns, packed = _device_pack(position, window, cost)
    packed = packed.cpu().numpy()  # the one host sync of an evaluation
    d, p = window.n_days, window.n_periods
    out = []
    for k in range(K):
        n_trades, n_in, n_hits = packed[k, :3]
        daily_returns = packed[k, N_SCALARS : N_SCALARS + d]
        net, units = packed[k, N_SCALARS + d :].reshape(2, p)
        hit_rate = n_hits / n_in if n_in else 0.0
        metrics = summarize(
            daily_returns, turnover=float(units.sum() / n_bars), n_trades=int(n_trades), hit_rate=hit_rate
        )
        periods = PeriodReturns(net, units, np.asarray(window.hours, dtype=np.int64), n_bars, int(n_trades), d)
        out.append(BacktestResult(position[k].to(torch.int8), net_returns[k], daily_returns, metrics, periods))
    return out


def backtest(q_all: torch.Tensor, window: Window, cost: float) -> BacktestResult:
    """Greedy policy of `q_all` over one window; one host sync.

    q_all: (T, 3, 3) Q[t, previous position + 1, action]; window: the returns, session
    days and hours of the same T bars, on the same device; cost: return units per unit
    of position change. Nothing is copied to the host but the result.
    """
    return backtest_many(q_all[None], window, [cost])[0]


def buy_and_hold(window: Window, cost: float) -> BacktestResult:
    """Long every bar of the window: pays `cost` once to enter (no exit cost)."""
    return evaluate(torch.ones_like(window.fresh, dtype=torch.int8), window, cost)


def backtest_many(q_all: torch.Tensor, window: Window, costs: list[float]) -> list[BacktestResult]:
    """backtest of K policies over one window, q_all (K, T, 3, 3), policy k at costs[k]: the
    positions in one scan and the sums in one pass, one host sync for all."""
    return evaluate_many(greedy_positions(q_all), window, costs)
