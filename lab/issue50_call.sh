#!/usr/bin/env bash
# Issue 50's open figures in device calls (each under 10 minutes), this tree beside a base tree:
#   here:    ../shared/device/bundle-wheels; mkdir .base; git archive REV fxray experiments lab scripts | tar -x -C .base
#   device:  bash lab/issue50_call.sh 1     test_gpu.py, the default sweep interleaved base / this / base / this,
#                                           the equal work (137d152's: 3 seeds, 12 folds of 60d / 5d / 5d, no
#                                           rung) this / base (~8 min)
#                                           (with .cand/, a candidate tree, beside both, and no test_gpu: ~8 min)
#            bash lab/issue50_call.sh cand  a candidate tree in .cand/ (with its tests/) against this one:
#                                           its test_gpu.py, then the default and the equal work interleaved
#                                           this / cand / this / cand (~6.5 min). The candidate of 2026-12-08:
#                                           mkdir .cand && cp -r fxray experiments lab scripts tests .cand/ &&
#                                           patch -d .cand -p1 < lab/candidates/two_device_threads.patch
#            bash lab/issue50_call.sh 2     137d152's default (the issue's base: the equal work there) beside
#                                           this tree's equal work and default, in one call (~9.5 min;
#                                           .t/old from `git archive 137d152 fxray experiments scripts`)
# Figures: GPU busy first -> last (fold) population, wall from the command's start, wall_s, the chosen
# trial's Sharpe and share (lab/gpu_ab.sh), the val-test gap (lab/val_test_gap.py); results under $OUT.
set -u
part=${1:?1, 2 or cand}; here=$(cd "$(dirname "$0")/.." && pwd); cd "$here"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$here/.site:$here FXRAY_CACHE_DIR=$here/.cache
out=${OUT:-$here/issue50}; mkdir -p "$out"
market='from fxray.rl import experiment; from fxray.data import synth; synth.ensure_default(experiment.load("experiments/default.yaml", "gpu").synth)'
python3 -c "$market"
F="--set seeds=3 --set folds.val=5d --set folds.test=5d --set folds.max_folds=12 --set sweep.grace_folds=12"
if [ "$part" = 1 ]; then
  [ -d .base/fxray ] || { echo ".base/ is missing: git archive REV fxray experiments lab scripts | tar -x -C .base"; exit 2; }
  RUNS="base:.base:;new:.:;base:.base:;new:.:;new:.:$F;base:.base:$F"
  [ -d .cand/fxray ] && RUNS="base:.base:;new:.:;cand:.cand:;new:.:;cand:.cand:;new:.:$F;cand:.cand:$F;base:.base:$F"
  [ -d .cand/fxray ] || python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -2
elif [ "$part" = cand ]; then
  [ -d .cand/tests ] || { echo ".cand/ (with tests/) is missing: see this file's header"; exit 2; }
  (cd .cand && PYTHONPATH=$here/.site:$PWD python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -3)
  RUNS="new:.:;cand:.cand:;new:.:;cand:.cand:;new:.:$F;cand:.cand:$F"
else
  [ -d .t/old/fxray ] || { echo ".t/old is missing: git archive 137d152 fxray experiments scripts | tar -x -C .t/old"; exit 2; }
  (cd .t/old && PYTHONPATH=$here/.site:$PWD python3 -c "$market")  # its own generator's market
  RUNS="old:.t/old:;new:.:$F;new:.:"
fi
OUT=$out/ab PLAIN=1 TUNE_TIMEOUT=460 RUNS=$RUNS bash lab/gpu_ab.sh 2>&1 | grep -v "^  runs:"
for d in "$out"/ab/*/; do
  python3 lab/val_test_gap.py "$d/small.json" 2>&1 | tail -1
  rm -f "$d/debug.log" "$d/results.json" "$d/tune.log"  # the device's output limits: small.json stays
done
