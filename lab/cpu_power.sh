#!/usr/bin/env bash
# The CPU profile's power (issue: "edge" on >= 4 of 5 draws of a planted market with oracle Sharpe
# ~4-5, "no edge" on >= 19 of 20 shuffled twins): the quick start's `fxray tune --trials 64` on
# draws of the default market at beta $BETA (0.025: oracles ~+3 to +6 over the CPU profile's
# pooled test days) and on shuffled twins, interleaved so that a cut run still has both; one
# JSON each, then the table.
#   [BETA=0.025] [DRAWS="1 2 3 4 5"] [TWINS="0 1 ... 19"] [TRIALS=64] [TUNE_TIMEOUT=1200] bash lab/cpu_power.sh [DIR]
# PAR=N (a many-core machine, e.g. the device's 16): N sweeps at once, each a local Ray of 2 CPUs
# (--profile cpu --num-cpus 2 --num-gpus 0, its own HOME), as on the 2-core box.
set -u
dir=${1:-/tmp/cpu_power}; mkdir -p "$dir"
here=$(cd "$(dirname "$0")/.." && pwd)
export FXRAY_CACHE_DIR=${FXRAY_CACHE_DIR:-$dir/cache} PYTHONUNBUFFERED=1
draws=(${DRAWS:-1 2 3 4 5}); twins=(${TWINS:-$(seq -s ' ' 0 19)})
jobs=()
for i in $(seq 0 $(( ${#twins[@]} - 1 ))); do
  [ $(( i % 4 )) = 0 ] && [ $(( i / 4 )) -lt ${#draws[@]} ] && jobs+=("draw ${draws[$(( i / 4 ))]} false")
  jobs+=("twin ${twins[$i]} true")
done
for k in $(seq ${#twins[@]} $(( ${#draws[@]} * 4 - 1 ))); do
  [ $(( k % 4 )) = 0 ] && jobs+=("draw ${draws[$(( k / 4 ))]} false")
done
if [ "${PAR:-1}" -gt 1 ]; then  # at once: the long draws first, the twins fill the slots
  jobs=(); for d in "${draws[@]}"; do jobs+=("draw $d false"); done
  for t in "${twins[@]}"; do jobs+=("twin $t true"); done
fi
one() {
  set -- $1; name=$1$2
  [ -s "$dir/$name.json" ] && return
  # beta in the cpu: section: the profile's own data.synth.beta is merged over the file's data
  printf 'base: %s\nname: %s\ndata:\n  synth: {seed: %s, shuffle: %s}\ncpu:\n  data:\n    synth: {beta: %s}\n' \
    "$here/experiments/default.yaml" "$name" "$2" "$3" "${BETA:-0.025}" > "$dir/$name.yaml"
  t0=$(date +%s)
  local par=() env=()
  [ "${PAR:-1}" -gt 1 ] && par=(--profile cpu --num-cpus 2 --num-gpus 0) env=(HOME="$(mktemp -d)" OMP_NUM_THREADS=1)
  env "${env[@]}" timeout "${TUNE_TIMEOUT:-1200}" \
    python3 -m fxray.tune --experiment "$dir/$name.yaml" --trials "${TRIALS:-64}" "${par[@]}" \
    --storage "$dir/runs_$name" --tracking-uri "sqlite:///$dir/runs_$name.db" --json "$dir/$name.json" > "$dir/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s"
  rm -rf "$dir/runs_$name/checkpoints"
}
for j in "${jobs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "${PAR:-1}" ]; do wait -n; done
  one "$j" &
  sleep 2  # Ray sessions started apart
done
wait
python3 - "$dir" <<'PY'
import glob, json, os, sys
rows = {"draw": [], "twin": []}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name = os.path.basename(p)[:-5]
    r = json.load(open(p)); v = r.get("verdict") or {}; t = (r.get("best") or {}).get("test") or {}
    kind = "draw" if name.startswith("draw") else "twin"
    rows[kind].append(v.get("answer"))
    f = lambda k: float("nan") if t.get(k) is None else t[k]  # noqa: E731 (undefined: no trade)
    print(f"{name:8s} {v.get('answer') or '-':13s} chosen {f('sharpe'):+6.2f} ± {f('sharpe_se'):.2f}"
          f"  share {f('oracle_share'):+.2f}  days {t.get('n_days')}  wall {r.get('wall_s', 0):.0f} s")
for kind, want in (("draw", "edge"), ("twin", "no_edge")):
    a = rows[kind]
    print(f"{kind}s: {want} on {sum(x == want for x in a)} of {len(a)} ({', '.join(str(x) for x in a)})")
PY
