#!/usr/bin/env bash
# Paired check of dqn.keep (issue 53): the trials of a sweep that ran every fold (RESULTS, its
# results.json) trained again by `fxray train` (this machine's profile) with keep=won and keep=best,
# then their pooled val and test Sharpe, share of the oracle and test-minus-val gap side by side.
#   bash lab/keep_paired.sh runs/default/results.json        (OUT: where the JSONs go, /tmp/keep)
set -u
res=$1 out=${OUT:-/tmp/keep}; mkdir -p "$out"
export OMP_NUM_THREADS=1
python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
n = max(t['folds_done'] for t in r['trials'])
for t in r['trials']:
    if t['folds_done'] == n:
        print(t['trial_id'], ' '.join(f'--set {k}={v}' for k, v in t['sampled'].items()))
" "$res" > "$out/cfgs.txt"
for keep in won best; do
  while read -r id sets; do
    fxray train --experiment experiments/default.yaml $sets --set keep=$keep --json "$out/$id.$keep.json" > "$out/$id.$keep.log" 2>&1 || echo "$id $keep failed"
  done < "$out/cfgs.txt" &
done
wait
python3 - "$out" <<'PY'
import glob, json, math, statistics as st, sys
out, rows = sys.argv[1], []
for path in sorted(glob.glob(f"{out}/*.won.json")):
    i = path.split("/")[-1].split(".")[0]
    r = {}
    for keep in ("best", "won"):
        p = json.load(open(f"{out}/{i}.{keep}.json"))["pooled"]
        o = p["baselines"]["oracle"]["sharpe"]
        r[keep] = (p["val"]["sharpe"], p["test"]["sharpe"], p["test"]["sharpe"] / o, p["test"]["sharpe"] - p["val"]["sharpe"])
        print(i, keep, "val %+.2f test %+.2f share %.2f gap %+.2f" % r[keep])
    rows.append(r)
for j, name in ((2, "share of the oracle"), (3, "test - val")):
    d = [r["won"][j] - r["best"][j] for r in rows]
    se = st.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    print(f"{name}: best {st.mean(r['best'][j] for r in rows):.2f}, won {st.mean(r['won'][j] for r in rows):.2f}, won - best {st.mean(d):+.3f} ± {se:.3f} (n={len(d)})")
PY
