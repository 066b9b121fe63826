#!/usr/bin/env bash
# The learner on the planted markets, linear (flow, session) and nonlinear (interaction, regime,
# threshold, hold), each beside its shuffled twin, in the default experiment's profile for this
# machine (GPU where there is one, else CPU): `fxray train` of the base config (MODE=train) or the
# chosen trial of `fxray tune --trials $TRIALS` (MODE=tune); one JSON a market, then the table.
#   [MODE=train|tune] [TRIALS=8] [TUNE_TIMEOUT=S] [BETA=0.04] [CPU_DQN="screen_t: 3.0, abstain: true"] [MARKETS="flow interaction"] [TWINS=true|false] [TUNE_ARGS="--set seeds=1"] bash lab/nonlinear_probe.sh [DIR]
# CPU, train: ~40 s a market on 2 cores (76 pooled test days).
set -u
dir=${1:-/tmp/nonlinear_probe}; mkdir -p "$dir"
here=$(cd "$(dirname "$0")/.." && pwd)
export FXRAY_CACHE_DIR=${FXRAY_CACHE_DIR:-$dir/cache} PYTHONUNBUFFERED=1
mode=${MODE:-train}; mkdir -p "${RUNS:-$dir}"
shuffles=false; [ "${TWINS:-true}" = true ] && shuffles="false true"
for s in ${MARKETS:-flow session interaction regime threshold hold}; do
  for sh in $shuffles; do
    name=${s}$([ "$sh" = true ] && echo _twin)
    printf 'base: %s\nname: %s\ndata:\n  synth: {structure: %s, shuffle: %s%s}\n' \
      "$here/experiments/default.yaml" "$name" "$s" "$sh" "${BETA:+, beta: $BETA}" > "$dir/$name.yaml"
    [ -n "${CPU_DQN:-}" ] && printf 'cpu:\n  dqn: {%s}\n' "$CPU_DQN" >> "$dir/$name.yaml"
    t0=$(date +%s)
    if [ "$mode" = tune ]; then
      timeout "${TUNE_TIMEOUT:-1800}" python3 -m fxray.tune --experiment "$dir/$name.yaml" --trials "${TRIALS:-8}" ${TUNE_ARGS:-} --storage "${RUNS:-$dir}/runs_$name" \
        --tracking-uri "sqlite:///${RUNS:-$dir}/mlflow.db" --json "$dir/$name.json" > "$dir/$name.log" 2>&1
    else
      python3 -m fxray.train --experiment "$dir/$name.yaml" --json "$dir/$name.json" > "$dir/$name.log" 2>&1
    fi
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s"
    rm -rf "${RUNS:-$dir}/runs_$name/checkpoints"
  done
done
python3 "$here/lab/nonlinear_table.py" "$dir"/*.json
