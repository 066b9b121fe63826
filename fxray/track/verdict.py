"""The verdict of a sweep: one answer ("edge", "no edge", "inconclusive") in one sentence, and
the statistics behind it, each with the question it answers: DSR, Reality Check / SPA / StepM,
PBO and the placebo sweeps; and its plot.

    v = snooping_verdict(trials, n_folds, ppy, chosen)   # trials as results.py or compare.py hold them
    add_placebo(v, snooping.placebo_pvalue(real_best, placebo_bests))   # when placebos ran
    v["answer"], v["sentence"], v["days_needed"]; print(text(v)); json_ready(v); verdict_png(...)

`trials`: [{"trial_id", "status", "folds": [{"fold", "status", "val_periods", "test_periods",
"baseline_periods"}]}]: the fold records of fxray.track.results (folds.jsonl) and of
fxray.compare (MLflow) have that shape. `chosen`: the chosen trial's block, results.json's
`best` ({"trial_id", "test": pooled test statistics, and fxray.eval.selection.deflated's keys}).
The statistics are fxray.eval.snooping and fxray.eval.cscv; the decision table `decide` is
documented in docs/metrics.md ("One verdict"). The sweep's last screen, `fxray compare` and
results.json all read the verdict from here.
"""

from __future__ import annotations

import math

from fxray.eval import cscv, pooled, snooping
from fxray.track.report import pyplot, save

KEYS = ("spa_pvalue", "reality_check_pvalue", "stepm_kept", "pbo", "placebo_pvalue")  # compare --json


def eval_trials(trials: list[dict]) -> tuple[list[dict], dict]:
    """(trials as fxray.eval.snooping takes them, buy-and-hold's test windows {fold: periods})."""
    out, bh = [], {}
    for t in trials:
        folds = {}
        for f in t["folds"]:
            if f["status"] != "ok" or not f.get("val_periods"):
                continue  # a diverged or cancelled fold ends what the trial ran
            folds[f["fold"]] = {"val": f["val_periods"], "test": f["test_periods"]}
            if ref := (f.get("baseline_periods") or {}).get("buy_and_hold"):
                bh.setdefault(f["fold"], ref["test"])
        out.append({"trial_id": t["trial_id"], "folds": folds})
    return out, bh


def snooping_verdict(trials: list[dict], n_folds: int, periods_per_year: float, chosen: dict | None = None) -> dict:
    """The verdict of a sweep's trials: the data-snooping statistics per rung and at the headline
    rung, and the answer that combines them with the chosen trial's DSR (`decide`).

    Rung k: the trials that ran folds 0..k-1, on those folds' windows. Headline: the
    deepest rung (SPA, RC, StepM on the test hours; the trials that ran every fold when
    any did), and for PBO the deepest rung with at least two trials (on the val hours,
    where the sweep selected). `_cscv_logits` (not JSON) is for the plot."""
    ev, bh = eval_trials(trials)
    ks = snooping.rungs(ev)
    v = {
        **{k: (chosen or {}).get(k) for k in ("dsr", "n_trials_counted")},
        "n_folds": n_folds,
        "rungs": [],
        "placebo": None,
        **{k: None for k in KEYS},
        "stepm_kept": [],
        "chosen": chosen_inputs(chosen),
    }
    if not ks:
        return answer(v)
    pbo_rung = None
    for k in ks:
        test = snooping.rung_matrix(ev, k, "test", bh)
        flat = snooping.superior_ability(test.returns, None, test.trial_ids)
        p = cscv.pbo(snooping.rung_matrix(ev, k, "val").returns, periods_per_year=periods_per_year)
        if p is not None:
            pbo_rung = (k, p)
        sizes = {"k": k, "n_trials": len(test.trial_ids), "n_test_periods": int(test.returns.shape[0])}
        pvalues = {key: flat[key] for key in ("spa_pvalue", "reality_check_pvalue")}
        v["rungs"].append({**sizes, **pvalues, "n_stepm_kept": len(flat["stepm_kept"]), "pbo": p["pbo"] if p else None})
    top = ks[-1]  # the headline: the deepest rung, whose matrix and test against flat are the loop's last
    v["spa"] = {"k": top, **flat}
    v["spa_buy_and_hold"] = None
    if test.benchmark is not None:
        v["spa_buy_and_hold"] = {"k": top, **snooping.superior_ability(test.returns, test.benchmark, test.trial_ids)}
    v.update({k: v["spa"][k] for k in ("spa_pvalue", "reality_check_pvalue", "stepm_kept")})
    if pbo_rung is not None:
        k, p = pbo_rung
        v.update(cscv={"k": k, **cscv.json_safe(p)}, pbo=p["pbo"], _cscv_logits=p["logits"])
    return answer(v)


def add_placebo(v: dict, placebo: dict) -> dict:
    """The placebo sweeps' result (fxray.eval.snooping.placebo_pvalue) into the verdict, and the
    answer decided again with it."""
    v.update(placebo=placebo, placebo_pvalue=placebo.get("pvalue"))
    return answer(v)


# --- one answer ---------------------------------------------------------------------------------

DSR_LEVEL = 0.95  # DSR at or above: the chosen trial beats the luckiest of N skill-less trials
ALPHA = 0.05  # SPA / StepM family-wise error; the placebo p-value's level (where N allows it)
PLACEBO_NO = 0.5  # placebo p above: at least half of the signal-free sweeps reached the real one
HORIZON = 3  # inconclusive only when at most HORIZON x the pooled test days more would decide it


def chosen_inputs(chosen: dict | None) -> dict | None:
    """What the answer reads of the chosen trial (results.json's `best`, or compare's)."""
    if not chosen or "test" not in chosen:
        return None
    t = chosen["test"]
    return {
        "trial_id": chosen.get("trial_id"),
        **{k: t.get(k) for k in ("sharpe", "sharpe_se", "evidence", "n_days", "n_periods")},
        **{k: chosen.get(k) for k in ("dsr", "z", "z0", "n_trials_counted")},
    }


def days_to_decide(c: dict) -> float | None:
    """More test days after which the chosen trial's DSR would reach DSR_LEVEL at its present
    Sharpe, skewness and kurtosis: the minimum track record length (Bailey & Lopez de Prado
    2012) against a Sharpe of 0 at the critical value z_0.95 + z0. DSR = Phi(z - z0), z = SR /
    se grows as sqrt(T) while z0 (from N and the trials' spread of z) does not move, so DSR >=
    0.95 once SR / se(T) >= z_0.95 + z0, which is MinTRL's condition with that critical value.
    Without a DSR (fewer than two trials with an error) z0 = 0: PSR(0). Session days: periods
    x n_days / n_periods. 0 when already decided; math.inf when SR <= 0; None without an error."""
    z0 = c.get("z0") if c.get("dsr") is not None else 0.0
    periods = pooled.min_track_record(c["sharpe"], c.get("sharpe_se"), c["n_periods"] or 0, 0.0, pooled.Z_95 + z0)
    if periods is None or not math.isfinite(periods):
        return periods
    return max(math.ceil(periods * c["n_days"] / c["n_periods"]) - c["n_days"], 0)


def decide(c: dict | None, spa: dict | None, pbo: float | None, placebo: dict | None) -> dict:
    """The answer, its sentence and the days that would decide it, from the chosen
    trial's pooled test statistics and DSR (`c`, chosen_inputs), SPA / StepM against flat on the
    test hours of the trials that ran every fold (`spa`), PBO, and the placebo sweeps. The
    table (docs/metrics.md, "One verdict"), first row that applies:

    1. the chosen trial made no trade out of sample                      no_edge
    2. its pooled test Sharpe <= 0 (it lost after costs)                 no_edge
    3. placebo p > PLACEBO_NO (signal-free sweeps reached it)            no_edge
    4. DSR >= 0.95, or StepM keeps it (beats flat, 5 % family-wise):
       a. placebo ran and the real sweep is not above every placebo
          (p > max(ALPHA, 1 / (N + 1)))                                  inconclusive (more placebos)
       b. else                                                           edge
    5. otherwise, with d = days_to_decide:
       a. d <= HORIZON x the pooled test days                             inconclusive (d more days)
       b. SPA finds trials that beat flat (StepM keeps some), not it    inconclusive
       c. else                                                           no_edge
    PBO never decides: it says whether the val windows' choice carries over, which a family of
    equally good trials does not need; an edge's sentence notes it (`overfit`)."""
    out = {"answer": None, "sentence": "verdict: n/a (no chosen trial)", "days_needed": None}
    if c is None:
        return out
    s, se, days, n = c["sharpe"], c.get("sharpe_se"), c.get("n_days") or 0, c.get("n_trials_counted")
    record = f"{s:+.2f} ± {_p(se, '.2f')} over {days} test days"
    kept, spa_p = list((spa or {}).get("stepm_kept") or []), (spa or {}).get("spa_pvalue")
    by_stepm = c.get("trial_id") in kept
    dsr, overfit = c.get("dsr"), pbo is not None and pbo >= 0.5  # overfit: the val windows' choice does not carry
    pl_p, pl_n = (placebo or {}).get("pvalue"), (placebo or {}).get("n") or 0

    def done(answer, sentence, days_needed=None):
        out.update(answer=answer, sentence=sentence, days_needed=days_needed)
        return out

    if c.get("evidence") in (None, "none"):
        return done("no_edge", f"no edge: the chosen trial made no trade in its {days} test days")
    if s <= 0:
        return done("no_edge", f"no edge: the chosen trial lost after costs out of sample ({record})")
    if pl_p is not None and pl_p > PLACEBO_NO:
        reached = round(pl_p * (pl_n + 1)) - 1  # p = (1 + #{placebo >= real}) / (N + 1)
        return done(
            "no_edge",
            f"no edge: {reached} of {pl_n} sweeps on signal-free copies of the data reached the chosen trial's "
            f"{s:+.2f} (placebo p {pl_p:.3f})",
        )
    why = [f"DSR {dsr:.3f}"] if dsr is not None and dsr >= DSR_LEVEL else []
    why = "; ".join(why + (["StepM keeps it among the trials that beat flat"] if by_stepm else []))
    if why:
        if pl_p is not None and pl_p > max(ALPHA, 1 / (pl_n + 1)):
            return done(
                "inconclusive",
                f"inconclusive: the chosen trial earns {record} ({why}), but a sweep on signal-free data came as "
                f"high (placebo p {pl_p:.3f}): more placebo sweeps (--placebo N) would decide it",
            )
        caveat = "; the val windows did not pick the better trials (PBO >= 0.5)" if overfit else ""
        return done(
            "edge", f"edge: the chosen trial earns {record} out of sample, more than luck explains ({why}){caveat}"
        )
    more = days_to_decide(c)
    more = more if more is not None and math.isfinite(more) else None  # None: no number of days would do
    if more is not None and more <= HORIZON * days:
        return done(
            "inconclusive",
            f"inconclusive: about {more} more test days would decide it (the chosen trial's {record}; "
            f"DSR {_p(dsr)} < {DSR_LEVEL})",
            more,
        )
    tell = f"; at this Sharpe about {more} more test days would tell" if more is not None else ""
    if kept and spa_p is not None and spa_p <= ALPHA:
        return done(
            "inconclusive",
            f"inconclusive: StepM finds {len(kept)} trial(s) that beat flat out of sample, but not the chosen "
            f"trial ({record}; DSR {_p(dsr)}){tell}",
            more,
        )
    return done(
        "no_edge",
        f"no edge: the chosen trial's {record} is within what the luckiest of {n} skill-less trials would show "
        f"(DSR {_p(dsr)}){tell}",
    )


def answer(v: dict) -> dict:
    """`decide` on the verdict's own statistics, into it."""
    v.update(decide(v.get("chosen"), v.get("spa"), v.get("pbo"), v.get("placebo")))
    return v


def json_ready(v: dict) -> dict:
    return {k: val for k, val in v.items() if not k.startswith("_")}


def metrics(v: dict) -> dict:
    """The verdict's numbers for the parent run's summary (MLflow gets no point for None)."""
    out = {k: v.get(k) for k in ("spa_pvalue", "reality_check_pvalue", "pbo", "placebo_pvalue")}
    out["stepm_kept"] = len(v.get("stepm_kept") or [])
    out["spa_pvalue_vs_buy_and_hold"] = (v.get("spa_buy_and_hold") or {}).get("spa_pvalue")
    return {k: x for k, x in out.items() if x is not None}


def _p(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def sentence(v: dict | None) -> str:
    """'verdict: <the answer in words>': the line the last screen and fxray compare show."""
    return "verdict: " + ((v or {}).get("sentence") or "n/a")


def text(v: dict, indent: str = "   ", with_sentence: bool = True) -> str:
    """The verdict's sentence (unless the caller shows it elsewhere: the sweep's last screen ends
    with it), then the evidence: one statistic a line, with the question it answers."""
    n = v.get("n_trials_counted")
    lines = [f"{indent}{sentence(v)}"] if with_sentence else []
    lines += [
        f"{indent}is it real? the evidence, each for the question it answers (docs/metrics.md, 'One verdict'):",
        f"{indent}  DSR        {_p(v.get('dsr'))}  is the chosen trial's pooled test Sharpe above what the luckiest of "
        f"{n if n is not None else 'N'} skill-less trials would show? (yes at >= {DSR_LEVEL})",
    ]
    spa, bh = v.get("spa"), v.get("spa_buy_and_hold")
    if spa and spa.get("spa_pvalue") is not None:
        where = f"{spa['n_trials']} trials that ran {spa['k']} of {v['n_folds']} folds, {spa['n_periods']} test hours"
        kept = ", ".join(spa["stepm_kept"][:4]) + (" ..." if len(spa["stepm_kept"]) > 4 else "")
        lines += [
            f"{indent}  SPA p      {_p(spa['spa_pvalue'])}  does any trial beat flat out of sample? P(this much "
            f"| none has an edge) (Hansen; {where}; block {spa['block_size']}h); "
            f"Reality Check p {_p(spa['reality_check_pvalue'])}",
            f"{indent}  StepM      {len(spa['stepm_kept'])} trial(s)  which trials beat flat, at {ALPHA:.0%} "
            "family-wise error" + (f": {kept}" if kept else ""),
        ]
        if bh and bh.get("spa_pvalue") is not None:
            lines.append(
                f"{indent}  vs B&H     SPA p {_p(bh['spa_pvalue'])}, Reality Check p "
                f"{_p(bh['reality_check_pvalue'])}, StepM keeps {len(bh['stepm_kept'])}: the same against buy-and-hold"
            )
    else:
        lines.append(f"{indent}  SPA p      n/a  no trial's test returns differ from flat (none traded)")
    c = v.get("cscv")
    if c:
        d = c["degradation"]
        lines.append(
            f"{indent}  PBO        {_p(c['pbo'])}  does the val windows' choice carry over? P(a split's top val "
            f"trial lands at or below the median out of sample) (CSCV: {c['n_trials']} trials' val hours, "
            f"{c['n_blocks']} blocks, {c['n_splits']} splits); its OOS Sharpe = {_p(d['intercept'], '+.2f')} + "
            f"{_p(d['slope'], '.2f')} x IS, loses OOS in {c['prob_oos_loss']:.0%} of splits"
        )
    else:
        lines.append(f"{indent}  PBO        n/a  needs two trials with the same val hours whose returns differ")
    if len(v.get("rungs") or []) > 1:  # ASHA stopped trials: the same tests on the trials of each rung
        lines.append(
            f"{indent}  per rung   (trials that ran k folds: SPA p, PBO) "
            + "; ".join(f"{r['n_trials']} x {r['k']}: {_p(r['spa_pvalue'])}, {_p(r['pbo'])}" for r in v["rungs"])
        )
    pl = v.get("placebo")
    if pl and pl.get("pvalue") is not None:
        z = f", z {pl['z']:+.2f}" if pl.get("z") is not None else ""
        lines.append(
            f"{indent}  placebo p  {_p(pl['pvalue'])}  does the whole search find more here than on signal-free data? "
            f"real {pl['real']:+.2f}, rank {pl['rank']} of {pl['n'] + 1}; placebos {pl['mean']:+.2f}"
            + (f" ± {pl['std']:.2f}" if pl.get("std") is not None else "")
            + z
        )
    else:
        lines.append(f"{indent}  placebo p  n/a  no placebo sweep (python -m fxray.tune ... --placebo N)")
    return "\n".join(lines)


def verdict_png(path, rows: list[tuple[str, dict]]):
    """One row per experiment: the placebo sweeps' best test Sharpe with the real one marked,
    and the CSCV logit histogram (the PBO is the mass at or left of 0)."""
    import numpy as np

    fig, axes = pyplot().subplots(len(rows), 2, figsize=(11, 3.4 * len(rows)), squeeze=False)
    for (name, v), (ax_p, ax_c) in zip(rows, axes):
        pl = v.get("placebo")
        if pl and pl.get("placebos"):
            vals = np.asarray(pl["placebos"])
            lo, hi = min(vals.min(), pl["real"]), max(vals.max(), pl["real"])
            pad = 0.1 * max(hi - lo, 1.0)
            ax_p.hist(vals, bins=30, range=(lo - pad, hi + pad), color="0.6", label=f"{len(vals)} placebo sweeps")
            ax_p.plot(vals, np.zeros_like(vals), "|", color="k", ms=18)  # each one, when they are few
            ax_p.axvline(pl["real"], color="tab:red", lw=2, label=f"real {pl['real']:+.2f}")
            ax_p.set_title(f"{name}: the chosen trial's pooled test Sharpe, placebo p = {pl['pvalue']:.3f}", fontsize=9)
            ax_p.legend(fontsize=8)
        else:
            ax_p.text(0.5, 0.5, "no placebo sweeps\n(python -m fxray.tune --placebo N)", ha="center", va="center")
            ax_p.set_title(f"{name}: placebo sweeps", fontsize=9)
        ax_p.set_xlabel("each sweep's chosen trial: pooled test Sharpe (annualised)")
        logits = v.get("_cscv_logits")
        if logits is not None and len(logits):
            finite = np.clip(np.asarray(logits), -8, 8)
            edges = np.linspace(-8, 8, 33)
            ax_c.hist(finite[finite > 0], bins=edges, color="tab:blue", label="above the median OOS")
            ax_c.hist(finite[finite <= 0], bins=edges, color="tab:orange", label="at or below: overfit")
            ax_c.axvline(0, color="k", lw=0.8)
            ax_c.set_title(f"{name}: CSCV logits of each split's top val trial, PBO = {v['pbo']:.2f}", fontsize=9)
            ax_c.legend(fontsize=8)
        else:
            why = "PBO n/a: needs two trials with the\nsame val hours whose returns differ"
            ax_c.text(0.5, 0.5, why, ha="center", va="center")
        ax_c.set_xlabel("logit of the pick's out-of-sample relative rank")
    return save(fig, path, 100)
