"""The nonlinear planted markets (fxray.data.synth NONLINEAR): on one draw each, a ridge rule
on all 50 inputs fitted on the first 60 % earns ~0 on the rest while the oracle (the same rule
on the planted form of the planted columns, fxray.eval.baselines) earns clearly > 0; their
shuffled twins and placebo copies carry no oracle and the oracle's form earns nothing there;
and the default market is what it was, bit for bit."""

import math

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.calendar import HOUR_NS
from fxray.data.placebo import write_placebo
from fxray.data.synth import NONLINEAR, SynthSpec, oracle_columns, simulate, to_cache
from fxray.eval import baselines, pooled

COST = 4e-5  # 0.4 bp, the synthetic market's cost
PPY = 6261.0
BETA, N_BARS, SEED = 0.04, 100_000, 1


def hourly_sharpe(rule, x, fresh, hours):
    """The rule's pooled hourly net Sharpe on these bars (annualised) and its standard error."""
    net = baselines.net_returns(rule.positions(x), fresh, COST).numpy()
    _, h = np.unique(hours, return_inverse=True)
    r = np.bincount(h, weights=net)
    sr = pooled.sharpe_per_period(r)
    se = pooled.sharpe_se_per_period(r, sr)
    return sr * math.sqrt(PPY), (se or 0.0) * math.sqrt(PPY)


def ridge_and_oracle(path, form_from=None):
    """{name: (test Sharpe, se)} of the ridge rule and the oracle, fitted on the first 60 %."""
    m = cache.open(path)
    x = np.concatenate([np.asarray(m.features), np.asarray(m.ofi)], axis=1).astype(np.float64)
    close = np.asarray(m.targets)[:, 3]
    fresh = np.zeros(len(close))
    fresh[:-1] = np.diff(np.log(close))
    hours = (np.asarray(m.ts) - 1) // HOUR_NS
    cut = int(len(x) * 0.6)
    sd = x[:cut].std(0)
    x = torch.from_numpy((x - x[:cut].mean(0)) / np.where(sd > 0, sd, 1.0))  # train-slice normalisation
    fresh = torch.from_numpy(fresh)
    cols, _, form = oracle_columns(form_from or m.meta, m.features.shape[1])
    fits = {"ridge": {}, "oracle": {"columns": torch.tensor(cols), "form": form}}
    return {
        name: hourly_sharpe(baselines.fit_rule(x[:cut], fresh[:cut], COST, **kw), x[cut:], fresh[cut:], hours[cut:])
        for name, kw in fits.items()
    }


@pytest.mark.parametrize("structure", NONLINEAR)
def test_a_linear_rule_earns_nothing_where_the_oracle_earns(tmp_path, structure):
    path = tmp_path / f"{structure}.fxcache"
    to_cache(SynthSpec(n_bars=N_BARS, seed=SEED, structure=structure, beta=BETA), path)
    meta = cache.open(path).meta
    assert meta["oracle"]["form"] and all(i.startswith("ofi:planted_") for i in meta["oracle"]["inputs"])
    got = ridge_and_oracle(path)
    (ridge, se_r), (oracle, se_o) = got["ridge"], got["oracle"]
    assert oracle > 2.5 * se_o, got  # clearly > 0: ~1 month of test hours, se ~3
    assert ridge < se_r and ridge < oracle / 2, got  # ~0 (or below, after costs): no linear part to find

    # its shuffled twin: the same inputs, no edge; no oracle claimed, and the oracle's form earns nothing
    twin = tmp_path / f"{structure}-twin.fxcache"
    to_cache(SynthSpec(n_bars=N_BARS, seed=SEED, structure=structure, beta=BETA, shuffle=True), twin)
    assert cache.open(twin).meta.get("oracle") is None
    oracle_twin, se_t = ridge_and_oracle(twin, form_from=meta)["oracle"]
    assert abs(oracle_twin) <= 2 * se_t, oracle_twin  # (flat: 0 and 0)
    # and a placebo copy (fxray.data.placebo) drops the oracle as it does a linear market's
    placebo = tmp_path / f"{structure}-placebo.fxcache"
    write_placebo(cache.open(path), placebo, 0, 0)
    assert "oracle" not in cache.open(placebo).meta


def test_the_planted_edge_is_the_nonlinear_function_of_the_inputs():
    """f from the written columns, by the form the oracle is told (fxray.eval.baselines.form_inputs)."""
    for structure in NONLINEAR:
        m = simulate(SynthSpec(n_bars=20_000, seed=2, structure=structure), 20_000)
        assert np.all(m.gate == 0) and abs(float(m.edge.mean())) < 0.3  # z drives nothing; f ~ mean 0
        cols = [4 + i for i in range(2 if structure in ("interaction", "regime") else 1)]
        meta_form = {"interaction": ["product"], "regime": ["signed"]}.get(structure)
        if meta_form:
            f = baselines.form_inputs(torch.from_numpy(m.ofi[:, cols].astype(np.float64)), meta_form)[:, 0].numpy()
            assert np.allclose(f, m.edge, atol=1e-5)
    with pytest.raises(ValueError, match="oracle form 'square' must be one of product, signed"):
        baselines.form_inputs(torch.zeros(3, 1), ["square"])
    with pytest.raises(ValueError, match="data.synth.structure: 'cubic' must be one of flow, session, interaction"):
        simulate(SynthSpec(structure="cubic"), 1000)


def test_the_default_markets_are_unchanged(tmp_path):
    """The content hashes of the default market and its session and twin variants, as written
    before the nonlinear family existed (generator v3)."""
    assert to_cache(SynthSpec(), tmp_path / "d.fxcache") == "c3340caa1b1cdb84c873f6fdc7f105af"
    assert to_cache(SynthSpec(n_bars=30000, structure="session", seed=3), tmp_path / "s.fxcache") == (
        "46475e91e446d942bf73f8cc56db04dc"
    )
    assert to_cache(SynthSpec(n_bars=30000, shuffle=True), tmp_path / "t.fxcache") == "2ecc5d401a2f031ffa3bc58d3bab7a6a"


def test_a_fold_on_a_nonlinear_market_reports_its_oracle_beside_the_ridge_rule(tmp_path):
    """Through the trainer's references (fxray.rl.trainer): the oracle is the rule on the planted
    form, fitted on the fold's train slice, and out of sample it earns more than the ridge rule."""
    from fxray.data.folds import FoldSpec, make_folds
    from fxray.rl.device import DeviceData
    from fxray.rl.references import references

    path = tmp_path / "interaction.fxcache"
    to_cache(SynthSpec(n_bars=N_BARS, seed=SEED, structure="interaction", beta=BETA), path)
    market = cache.open(path)
    data = DeviceData(market)
    assert data.oracle is not None and data.oracle[2] == ["product"]
    fold = make_folds(market.ts, FoldSpec(train="40d", val="5d", test="20d", max_folds=1))[0]
    data.set_fold(fold)
    table, _ = references(data, fold, COST, "next_open")
    assert table["oracle"]["sharpe"] > table["ridge"]["sharpe"] + 1.0, table


def hc0_t(col: np.ndarray, y: np.ndarray) -> float:
    """White's HC0 t of the slope of y on col alone, as textbook matrices (numpy)."""
    X = np.column_stack([np.ones_like(col), col])
    beta = np.linalg.solve(X.T @ X, X.T @ y)
    e = y - X @ beta
    bread = np.linalg.inv(X.T @ X)
    cov = bread @ (X.T * e**2) @ X @ bread
    return float(beta[1] / np.sqrt(cov[1, 1]))


def test_the_screen_keeps_products_and_squares_and_no_product_an_input_explains():
    """baselines.screen_terms against numpy: a product of two inputs and the square of a third
    pass at pair_t (whose two-sided tail is t_min's times inputs / pairs), with the terms as
    (x_i - m_i)(x_j - m_j) centred and scaled on the rows; an input that carries a linear edge
    is kept alone, and its square, which a skewed input's edge leaks into, is judged on the
    return less the inputs' fit and is not kept (it would pass on the return itself)."""
    rng = np.random.default_rng(0)
    n, t_min = 40_000, 3.0
    x = rng.standard_normal((n, 5))
    x[:, 3] = rng.chisquare(3, n) / np.sqrt(6)  # skewed: its square leaks its linear edge
    x[:, :] += 0.3  # means the products must take off
    y = 0.03 * (x[:, 0] - 0.3) * (x[:, 1] - 0.3) + 0.03 * ((x[:, 2] - 0.3) ** 2 - 1) + 0.06 * x[:, 3]
    y += rng.standard_normal(n)
    bar = baselines.pair_t(t_min, 5, 15)
    assert math.isclose(math.erfc(bar / math.sqrt(2)), math.erfc(t_min / math.sqrt(2)) * 5 / 15, rel_tol=1e-9)
    terms = baselines.screen_terms(torch.from_numpy(x), torch.from_numpy(y), t_min)
    assert terms.index.tolist() == [[3, -1], [0, 1], [2, 2]], terms.index
    assert terms.nonlinear_inputs() == [0, 1, 2] and terms.linear_inputs().tolist() == [3]
    m = x.mean(0)
    p01, p22 = (x[:, 0] - m[0]) * (x[:, 1] - m[1]), (x[:, 2] - m[2]) ** 2
    want = np.column_stack([x[:, 3], (p01 - p01.mean()) / p01.std(ddof=1), (p22 - p22.mean()) / p22.std(ddof=1)])
    np.testing.assert_allclose(terms(torch.from_numpy(x)).numpy(), want, atol=1e-12)
    resid = y - y.mean() - (x[:, 3] - m[3]) * np.polyfit(x[:, 3] - m[3], y - y.mean(), 1)[0]
    for col in (p01, p22):
        assert abs(hc0_t(col, resid)) > bar
    p33 = (x[:, 3] - m[3]) ** 2
    assert abs(hc0_t(p33, y)) > bar > abs(hc0_t(p33, resid))  # passes on y, not on what x_3 leaves


@pytest.mark.parametrize("structure", ["interaction", "regime", "threshold"])
def test_the_screened_rule_earns_the_nonlinear_edge_the_ridge_misses(tmp_path, structure):
    """Through the trainer's references on one fold: with a screen (screen_t 3) the screened rule
    (its inputs and products) earns out of sample where the ridge on every input does not."""
    from fxray.data.folds import FoldSpec, make_folds
    from fxray.rl.device import DeviceData
    from fxray.rl.references import references

    path = tmp_path / f"{structure}.fxcache"
    to_cache(SynthSpec(n_bars=N_BARS, seed=SEED, structure=structure, beta=BETA), path)
    market = cache.open(path)
    data = DeviceData(market)
    fold = make_folds(market.ts, FoldSpec(train="40d", val="5d", test="20d", max_folds=1))[0]
    data.set_fold(fold)
    table, _ = references(data, fold, COST, "next_open", screen_t=3.0)
    print(structure, {k: round(v["sharpe"], 2) for k, v in table.items() if k != "flat"})
    assert table["screened"]["sharpe"] > max(table["ridge"]["sharpe"] + 3.0, 3.0), table
