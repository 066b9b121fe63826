#!/usr/bin/env bash
# The honest-scoring before/after on the GPU machine (docs/benchmarks.md "Honest scoring").
#
#   lab/before_after.sh OLD_TREE [STAGES]     (run from the repository root)
#
# OLD_TREE: a checkout of the version before (e.g. `git archive 2fdda28 | tar -x -C .before`).
# STAGES (default "old new"): any of
#   gpu-tests  tests/test_gpu.py (CUDA paths of this version)
#   old        OLD_TREE's default sweep, 64 trials, on this version's default market at this
#              version's cost (0.4 bp): its selection (mean of per-fold daily val Sharpe,
#              epochs by a window's daily Sharpe, test windows reused as val windows)
#   new        this version's default sweep, 64 trials, on the same market
#   session    this version's sweep on the second planted structure (experiments/session.yaml)
#   shuffled   this version's sweep on the shuffled twin (experiments/shuffled.yaml)
# Each sweep's results.json is rescored by lab/rescore.py (the chosen trial's saved weights,
# pooled hourly, beside the oracle and the ridge rule on the same windows). Results go to
# $OUT (or ./before_after when OUT is unset) as <stage>.json, <stage>.rescore.json, <stage>.log.
set -u
old=$(cd "$1" && pwd); shift
stages=${*:-old new}
out=${OUT:-$PWD/before_after}
mkdir -p "$out"
here=$PWD
work=$(mktemp -d)
export FXRAY_CACHE_DIR=$work/cache PYTHONUNBUFFERED=1
python3 -m fxray.data synth --bars 300000 --seed 0 --out "$work/default.fxcache" > /dev/null
sweep() {  # sweep NAME TREE EXPERIMENT [ARGS...]
  local name=$1 tree=$2 exp=$3; shift 3
  (cd "$work" && PYTHONPATH="$tree:${PYTHONPATH:-}" MLFLOW_TRACKING_URI="sqlite:///$work/$name.db" \
     timeout 420 python3 -m fxray.tune --experiment "$exp" --storage "$work/$name" --json "$out/$name.json" "$@" \
     > "$out/$name.log" 2>&1)
  echo "$name: exit $? ($(grep -c ' fold ' "$out/$name.log") folds)"
  python3 "$here/lab/rescore.py" "$out/$name.json" --json "$out/$name.rescore.json" | sed "s/^/  $name | /"
}
for stage in $stages; do
  case $stage in
    gpu-tests) timeout 300 python3 -m pytest -q -x tests/test_gpu.py 2>&1 | tail -3 ;;
    old) cat "$old/experiments/default.yaml" \
           | sed 's/dqn: {epochs: 8, steps_per_epoch: 200, num_envs: 2048, batch_size: 8192}/dqn: {epochs: 8, steps_per_epoch: 200, num_envs: 2048, batch_size: 8192, cost: 4.0e-5}/' \
           > "$work/old_default.yaml"
         grep -q "cost: 4.0e-5" "$work/old_default.yaml" || { echo "old: could not set the cost"; continue; }
         sweep old "$old" "$work/old_default.yaml" --trials 64 --data "$work/default.fxcache" ;;
    new) sweep new "$here" "$here/experiments/default.yaml" --trials 64 --data "$work/default.fxcache" ;;
    session) sweep session "$here" "$here/experiments/session.yaml" --trials 64 ;;
    shuffled) sweep shuffled "$here" "$here/experiments/shuffled.yaml" --trials 64 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'sweep':<10} {'wall s':>7} {'1st fold s':>10} {'sel. val':>9} {'mean test':>9} {'pooled val':>10} "
      f"{'pooled test':>16} {'oracle':>7} {'ridge':>7} {'share':>6} {'trades':>6}")
for r in sorted(out.glob("*.rescore.json")):
    name = r.name.split(".")[0]
    s, res = json.loads(r.read_text()), json.loads((out / f"{name}.json").read_text())
    fold_ends = [c for w in res["workers"] for c in w["calls"] if c[4] != "warmup"]  # [start, end, ...]
    t_first = min(c[1] for c in fold_ends) - res["started"] if fold_ends else float("nan")  # first trial fold done
    test, base = s["pooled"]["test"], s["baselines"]
    share = s["oracle_share"]
    print(f"{name:<10} {res['wall_s']:>7.1f} {t_first:>10.1f} {s['selected_on_mean_val_sharpe'] or 0:>+9.2f} "
          f"{s['mean_test_sharpe'] or 0:>+9.2f} {s['pooled']['val']['sharpe']:>+10.2f} "
          f"{test['sharpe']:>+8.2f} ± {test['sharpe_se'] or 0:>5.2f} {base.get('oracle', {}).get('sharpe', float('nan')):>+7.2f} "
          f"{base['ridge']['sharpe']:>+7.2f} {share if share is not None else float('nan'):>6.2f} {test['n_trades']:>6}")
EOF
