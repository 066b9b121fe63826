"""fxray.eval.backtest: the parallel scan against a plain loop over bars, on every device we have."""

import numpy as np
import pytest
import torch

from fxray.eval import backtest as bt
from fxray.eval import metrics

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# --- the plain reference: one bar at a time ------------------------------------


def reference(q, returns, day, cost, period=None, carry=None):
    """Positions, net returns, daily sums, hourly (net, units) sums and bar stats by a loop,
    as the DESIGN states them: p_{t-1} carry[t] + p_t returns[t] - cost |p_t - p_{t-1}|."""
    q, returns, day = q.tolist(), np.asarray(returns, np.float64), day.tolist()
    period = day if period is None else period.tolist()
    carry = np.zeros(len(returns)) if carry is None else np.asarray(carry, np.float64)
    position, net, daily, hourly = [], [], [], []
    prev, last_day, last_period = 0, None, None
    for t in range(len(returns)):
        row = q[t][prev + 1]
        best = 0
        for a in (1, 2):  # first maximum wins ties
            if row[a] > row[best]:
                best = a
        p = best - 1
        net.append(prev * carry[t] + p * returns[t] - cost * abs(p - prev))
        if day[t] != last_day:  # a new day with bars
            daily.append(0.0)
            last_day = day[t]
        if period[t] != last_period:
            hourly.append([0.0, 0.0])
            last_period = period[t]
        daily[-1] += net[-1]
        hourly[-1][0] += net[-1]
        hourly[-1][1] += abs(p - prev)
        position.append(p)
        prev = p
    position, net = np.array(position), np.array(net)
    changes = np.abs(np.diff(position, prepend=0))
    n_in = (position != 0).sum()
    stats = dict(
        turnover=changes.mean(),
        n_trades=int((changes > 0).sum()),
        hit_rate=((position != 0) & (net > 0)).sum() / n_in if n_in else 0.0,
    )
    return position, net, np.array(daily), np.array(hourly).reshape(-1, 2), stats


def random_window(seed, n_bars, ties):
    rng = np.random.default_rng(seed)
    if ties:  # few distinct values: many equal maxima
        q = rng.integers(0, 3, (n_bars, 3, 3)).astype(np.float32)
    else:
        q = rng.normal(size=(n_bars, 3, 3)).astype(np.float32)
    returns = rng.normal(0, 1e-3, n_bars).astype(np.float32)
    returns[rng.random(n_bars) < 0.1] = 0.0  # unchanged closes: net 0 is not a hit
    # day breaks at random bars, some skipping days (weekends) or repeating none
    breaks = rng.random(n_bars) < rng.choice([0.002, 0.05, 0.5])
    day = 19000 + np.cumsum(breaks * rng.integers(1, 4, n_bars))
    cost = float(rng.choice([0.0, 1e-4, 5e-4]))
    return q, returns, day.astype(np.int64), cost


def periods_of(seed, day):
    """Hours inside the days: breaks at random bars and at every day break (as UTC hours are)."""
    rng = np.random.default_rng(seed + 77)
    new = (rng.random(len(day)) < 0.2) | np.concatenate(([False], np.diff(day) > 0))
    return (1000 + np.cumsum(new)).astype(np.int64)


def to_device(device, *arrays):
    return [torch.as_tensor(a, device=device) for a in arrays]


def window_of(returns, day, period=None, carry=None) -> bt.Window:
    """A window from tensors alone (its counts found with host syncs); each day is one period
    without `period`."""
    period = day if period is None else period
    hours = np.unique(period.cpu().numpy())
    return bt.Window(returns, day, len(np.unique(day.cpu().numpy())), period, len(hours), hours, carry)


def window(device, returns, day, period=None, carry=None):
    tensors = to_device(device, *[a for a in (returns, day, period, carry) if a is not None])
    it = iter(tensors)
    r, d = next(it), next(it)
    p = next(it) if period is not None else None
    c = next(it) if carry is not None else None
    return window_of(r, d, p, c)


def assert_metrics_close(m, daily, stats):
    expected = metrics.summarize(daily, **stats)
    for name in ("sharpe", "sortino", "max_drawdown", "calmar", "total_return"):
        assert getattr(m, name) == pytest.approx(getattr(expected, name), rel=1e-4, abs=1e-9), name
    assert m.turnover == pytest.approx(expected.turnover, rel=1e-12)
    assert (m.n_trades, m.n_days) == (expected.n_trades, expected.n_days)
    assert m.hit_rate == pytest.approx(expected.hit_rate, rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(24))
def test_scan_matches_loop(device, seed):
    rng = np.random.default_rng(1000 + seed)
    n_bars = int(rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 255, 256, 257, 1000, 4097]))
    q, returns, day, cost = random_window(seed, n_bars, ties=seed % 2 == 0)
    period = periods_of(seed, day)
    carry = rng.normal(0, 5e-4, n_bars).astype(np.float32) if seed % 3 == 0 else None  # next-open fills
    position, net, daily, hourly, stats = reference(q, returns, day, cost, period, carry)

    result = bt.backtest(torch.as_tensor(q, device=device), window(device, returns, day, period, carry), cost)
    assert result.position.device.type == device and result.net_returns.device.type == device
    assert result.position.dtype == torch.int8
    np.testing.assert_array_equal(result.position.cpu().numpy(), position)
    np.testing.assert_allclose(result.net_returns.cpu().numpy(), net, rtol=0, atol=1e-9)
    # float32 per-bar arithmetic: ~1e-10 a bar, summed over up to 4K bars a day
    np.testing.assert_allclose(result.daily_returns, daily, rtol=0, atol=1e-7)
    np.testing.assert_allclose(result.periods.net, hourly[:, 0], rtol=0, atol=1e-7)
    np.testing.assert_array_equal(result.periods.units, hourly[:, 1])
    np.testing.assert_array_equal(result.periods.hours, np.unique(period))
    assert (result.periods.n_trades, result.periods.n_bars) == (stats["n_trades"], n_bars)
    assert_metrics_close(result.metrics, daily, stats)


def test_hand_example():
    # prev index 0 = short, 1 = flat, 2 = long; each row's argmax is the new position index.
    q = torch.zeros(4, 3, 3)
    q[0, 1, 2] = 1.0  # from flat: go long
    q[1, 2, 0] = 1.0  # from long: flip short
    q[2, 0, 0] = 1.0  # from short: stay short
    q[2, 1, 2] = 1.0  #   (from flat it would go long: not taken)
    q[3, 0, 1] = 1.0  # from short: go flat
    returns = torch.tensor([0.01, -0.02, 0.03, 0.04])
    day = torch.tensor([5, 5, 7, 7])
    result = bt.backtest(q, window_of(returns, day), cost=0.001)
    assert result.position.tolist() == [1, -1, -1, 0]
    expected_net = [0.01 - 0.001, 0.02 - 0.002, -0.03, 0.0 - 0.001]
    np.testing.assert_allclose(result.net_returns.numpy(), expected_net, atol=1e-8)
    np.testing.assert_allclose(result.daily_returns, [0.027, -0.031], atol=1e-8)
    m = result.metrics
    assert (m.n_trades, m.n_days) == (3, 2)
    assert m.turnover == pytest.approx((1 + 2 + 0 + 1) / 4)
    assert m.hit_rate == pytest.approx(2 / 3)


def test_evaluate_any_path():
    # hit rate: in-market bars with net > 0; a zero net return is not a hit
    returns = torch.tensor([0.0, 0.01, -0.01, 0.02])
    result = bt.evaluate(torch.tensor([1, 1, 0, -1]), window_of(returns, torch.zeros(4, dtype=torch.int64)), 0.0)
    assert result.position.dtype == torch.int8
    assert result.metrics.hit_rate == pytest.approx(1 / 3)
    np.testing.assert_allclose(result.net_returns.numpy(), [0.0, 0.01, 0.0, -0.02])


def test_ties_take_the_first_action():
    # torch.argmax semantics: equal Q-values prefer short, then flat, then long.
    n_bars = 50
    day = torch.zeros(n_bars, dtype=torch.int64)
    returns = torch.full((n_bars,), 1e-3)
    w = window_of(returns, day)
    assert (bt.backtest(torch.zeros(n_bars, 3, 3), w, 0.0).position == -1).all()
    q = torch.zeros(n_bars, 3, 3)
    q[:, :, 0] = -1.0  # short is worse; flat and long tie
    assert (bt.backtest(q, w, 0.0).position == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_buy_and_hold(device):
    _, returns, day, cost = random_window(3, 2000, ties=False)
    cost = 1e-4
    hold = bt.buy_and_hold(window(device, returns, day), cost).metrics
    net = returns.astype(np.float64).copy()
    net[0] -= cost  # buy and hold pays to enter once
    _, starts = np.unique(day, return_index=True)
    daily = np.add.reduceat(net, starts)
    assert hold.sharpe == pytest.approx(metrics.sharpe(daily), rel=1e-4)
    assert hold.total_return == pytest.approx(daily.sum(), rel=1e-4)
    assert (hold.n_trades, hold.turnover, hold.n_days) == (1, 1 / 2000, len(daily))
    assert hold.hit_rate == pytest.approx((net > 0).mean())


def test_an_empty_window_is_a_clear_error():
    day = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="empty"):
        bt.backtest(torch.zeros(0, 3, 3), bt.Window(torch.zeros(0), day, 1, day, 1, np.zeros(1)), 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="sync debug mode needs CUDA")
def test_no_host_sync_before_the_transfer():
    q, returns, day, cost = random_window(9, 5000, ties=True)
    w = window("cuda", returns, day, periods_of(9, day))
    q = torch.as_tensor(q, device="cuda")
    costs = torch.tensor([[cost]], dtype=w.fresh.dtype, device="cuda")  # (K, 1), as evaluate_many makes it
    torch.cuda.set_sync_debug_mode("error")
    try:
        position = bt.greedy_positions(q)
        bt._device_pack(position[None], w, costs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_scan_is_exact_at_scale():
    # 500K bars (a long window): the path must satisfy the recursion at every bar,
    # p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 from p_-1 = 0, which pins it down uniquely.
    n_bars = 500_000
    rng = np.random.default_rng(0)
    q = torch.as_tensor(rng.normal(size=(n_bars, 3, 3)).astype(np.float32))
    q[rng.random(n_bars) < 0.3] = 0.0  # all-tie bars too
    position = bt.greedy_positions(q).numpy().astype(np.int64)
    step = q.argmax(-1).numpy()  # (T, 3)
    previous = np.concatenate(([0], position[:-1]))
    np.testing.assert_array_equal(position, step[np.arange(n_bars), previous + 1] - 1)
    assert len(np.unique(position)) == 3
