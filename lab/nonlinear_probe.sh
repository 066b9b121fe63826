#!/usr/bin/env bash
# Does the learner see an edge that is nonlinear in the features? `fxray train` (the CPU profile's
# learner) on a planted interaction market and a linear (flow) one, each beside its shuffled twin,
# in three learner variants: as shipped (inputs ridge, demo 1), raw inputs, raw inputs without
# demonstrations. 250k bars (beta 0.045), folds 45d/10d/20d x 6: ~90 pooled test days a run.
#   bash lab/nonlinear_probe.sh [DIR]      (~2-4 min a run on 2 cores; 12 runs)
set -u
dir=${1:-/tmp/nonlinear_probe}; mkdir -p "$dir"; cd "$dir" || exit 1
export FXRAY_CACHE_DIR=$dir/cache
for s in interaction flow; do for sh in false true; do cat > "p_${s}_${sh}.yaml" <<Y
base: $OLDPWD/experiments/default.yaml
name: p_${s}_${sh}
data:
  synth: {structure: ${s}, shuffle: ${sh}}
cpu:
  data: {synth: {n_bars: 250000, beta: 0.045, structure: ${s}, shuffle: ${sh}}}
  folds: {train: 45d, val: 10d, test: 20d, max_folds: 6}
Y
done; done
for m in interaction_false flow_false interaction_true flow_true; do
  for v in "base:" "raw:--set inputs=raw" "raw0:--set inputs=raw --set demo=0"; do
    name=${v%%:*}; sets=${v#*:}
    # shellcheck disable=SC2086
    fxray train --experiment "p_${m}.yaml" --device cpu $sets --json "out_${m}_${name}.json" > "log_${m}_${name}.txt" 2>&1
    echo "$m $name: $(grep -E '^  test Sharpe' "log_${m}_${name}.txt" | cut -c3-60) | $(grep -oE 'oracle [^,]+, ridge [^,]+' "log_${m}_${name}.txt")"
  done
done
