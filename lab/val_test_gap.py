"""The chosen trial's share of the oracle and the full trials' val-test gap (mean val Sharpe less mean
test Sharpe, ± its error) of each results.json given: python3 lab/val_test_gap.py A.json B.json"""
import json, sys, statistics as st
for p in sys.argv[1:]:
    r = json.load(open(p)); n = len(r["folds"])
    full = [t for t in r["trials"] if t["status"] == "ok" and t["folds_done"] >= n and t["test"].get("sharpe") is not None]
    gap = [t["val"]["sharpe"] - t["test"]["sharpe"] for t in full]
    t = r["best"]["test"]
    print(p, "days", t["n_days"], "share %.2f ± %.2f" % (t["oracle_share"], t["oracle_share_se"]),
          "full", len(full), "val-test gap mean %+.2f ± %.2f" % (st.mean(gap), st.stdev(gap) / len(gap) ** 0.5 if len(gap) > 1 else float("nan")),
          "chosen val %+.2f test %+.2f" % (r["best"]["val"]["sharpe"], t["sharpe"]))
