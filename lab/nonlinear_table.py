"""The table of lab/nonlinear_probe.sh: each market's learner (fxray train's pooled test, or a
sweep's chosen trial) beside its oracle, the ridge rule on every input and the screened rule
(inputs and products the screen keeps), pooled test Sharpe ± se, and the share of the oracle.

    python lab/nonlinear_table.py DIR/*.json
"""

import json
import sys
from pathlib import Path


def cell(m: dict | None) -> str:
    if not m:
        return "-"
    if m.get("sharpe") is None or m.get("sharpe_se") is None:
        return "no trades"
    return f"{m['sharpe']:+.2f} ± {m['sharpe_se']:.2f}"


print("| market | learner | oracle | ridge | screened | share of the oracle | verdict |")
print("|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    d = json.loads(Path(path).read_text())
    test, refs = (
        (d["best"]["test"], d["best"]["baselines"]) if "best" in d else (d["pooled"]["test"], d["pooled"]["baselines"])
    )
    share = test.get("oracle_share")
    se = test.get("oracle_share_se")
    share = "-" if share is None else f"{share:.2f}" + (f" ± {se:.2f}" if se is not None else "")
    verdict = (d.get("verdict") or {}).get("answer") or "-"
    row = [Path(path).stem, cell(test), *(cell(refs.get(k)) for k in ("oracle", "ridge", "screened")), share, verdict]
    print("| " + " | ".join(row) + " |")
