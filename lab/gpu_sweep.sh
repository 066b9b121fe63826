#!/usr/bin/env bash
# One device call: the default sweep as a user runs it, with the GPU's busy share sampled, and
# where its wall time went (results.json time_breakdown via scripts/bench.py --sweep).
#   [TUNE_TIMEOUT=S] [TUNE_ARGS="--population 8"] [RUNS=DIR] bash lab/gpu_sweep.sh [TRIALS]   results under $OUT (default ./gpu_sweep)
# The run directory and the MLflow store go to $RUNS (default $OUT/runs), the market to $FXRAY_CACHE_DIR (default a new one).
set -u
out=${OUT:-$PWD/gpu_sweep}; mkdir -p "$out"
export FXRAY_CACHE_DIR=${FXRAY_CACHE_DIR:-$(mktemp -d)} PYTHONUNBUFFERED=1
runs=${RUNS:-$out/runs}; mkdir -p "$runs"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 2 > "$out/smi.csv" &
smi=$!
t0=$(date +%s.%N)
timeout "${TUNE_TIMEOUT:-560}" python3 -m fxray.tune --trials "${1:-64}" ${TUNE_ARGS:-} --storage "$runs/sweep" --tracking-uri "sqlite:///$runs/mlflow.db" \
  --json "$out/results.json" > "$out/tune.log" 2>&1
rc=$?
t1=$(date +%s.%N)
kill $smi
echo "tune exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s from the command's start"
python3 - "$out/smi.csv" <<'PY'
import sys
rows = [l.split(",") for l in open(sys.argv[1]) if l.strip()]
u = [float(r[0]) for r in rows]
busy = [x for x in u if x > 0]
print(f"GPU util: mean {sum(u)/len(u):.0f} % over {len(u)} samples (2 s), mean {sum(busy)/max(len(busy),1):.0f} % while >0; peak mem {max(float(r[1]) for r in rows):.0f} MiB")
PY
python3 scripts/bench.py --sweep "$runs/sweep" 2>&1 | tail -25
tail -40 "$out/tune.log"
rm -rf "$runs/sweep/checkpoints"
