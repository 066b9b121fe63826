#!/usr/bin/env bash
# Issue 50's open figures in two device calls (each under 10 minutes), this tree beside a base tree:
#   here:    ../shared/device/bundle-wheels; mkdir .base; git archive REV fxray experiments lab scripts | tar -x -C .base
#   device:  bash lab/issue50_call.sh 1     test_gpu.py, a population's boundary (both trees), the default
#                                           sweep interleaved base / this / base / this (~6 min)
#            bash lab/issue50_call.sh 2     the equal work (137d152's: 3 seeds, 12 folds of 60d / 5d / 5d,
#                                           no rung) interleaved this / base / this / this (~7 min)
#            bash lab/issue50_call.sh 3     an experiment: the default sweep with Tune's trial processes
#                                           capped at 4 (.procs: this tree, one line changed) against one a
#                                           core (16), interleaved (~5 min): do the processes' start-up
#                                           imports starve the first populations (2-16 % busy, lab/notes.md)?
# Figures: GPU busy first -> last population, wall from the command's start, wall_s, the chosen trial's
# Sharpe and share (lab/gpu_ab.sh), the val-test gap (lab/val_test_gap.py); results under $OUT.
set -u
part=${1:?1 or 2}; here=$(cd "$(dirname "$0")/.." && pwd); cd "$here"
[ -d .base/fxray ] || { echo ".base/ is missing: git archive REV fxray experiments lab scripts | tar -x -C .base"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$here/.site:$here FXRAY_CACHE_DIR=$here/.cache
out=${OUT:-$here/issue50}; mkdir -p "$out"
python3 -c "from fxray.rl import experiment; from fxray.data import synth; synth.ensure_default(experiment.load('experiments/default.yaml', 'gpu').synth)"
F="--set seeds=3 --set folds.val=5d --set folds.test=5d --set folds.max_folds=12 --set sweep.grace_folds=12"
if [ "$part" = 1 ]; then
  python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -2
  for tree in .base .; do
    echo "--- boundary, $tree"
    (cd "$tree" && PYTHONPATH=$here/.site:$PWD python3 lab/boundary_probe.py --device cuda --trials 41 --seeds 3 --hidden 128)
  done
  RUNS="base:.base:;new:.:;base:.base:;new:.:"
elif [ "$part" = 2 ]; then
  RUNS="new:.:$F;base:.base:$F;new:.:$F;new:.:$F"
else
  rm -rf .procs && mkdir .procs && cp -r fxray experiments lab scripts .procs/
  sed -i 's/min(in_flight, os.cpu_count() or 1)/min(in_flight, 4)/' .procs/fxray/sweep/tuner.py
  grep -q "min(in_flight, 4)" .procs/fxray/sweep/tuner.py || { echo "the line to change is gone"; exit 2; }
  RUNS="procs4:.procs:;new:.:;procs4:.procs:;new:.:"
fi
OUT=$out/ab PLAIN=1 TUNE_TIMEOUT=200 RUNS=$RUNS bash lab/gpu_ab.sh 2>&1 | grep -v "^  runs:"
for d in "$out"/ab/*/; do
  python3 lab/val_test_gap.py "$d/small.json" 2>&1 | tail -1
  rm -f "$d/debug.log" "$d/results.json" "$d/tune.log"  # the device's output limits: small.json stays
done
