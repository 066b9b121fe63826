#!/usr/bin/env bash
# One device call: the default sweep (lab/gpu_sweep.sh) under several sets of flags, one after
# another on one market, each with its wall, GPU busy share, time_breakdown and chosen trial.
#   VARIANTS="name:timeout:flags;name:timeout:flags" [TRIALS=64] bash lab/gpu_variants.sh     results under $OUT/<name>
#   e.g. VARIANTS="main:330:;s1p24:150:--set seeds=1 --population 24"
set -u
out=${OUT:-$PWD/gpu_variants}; here=$(cd "$(dirname "$0")/.." && pwd)
export FXRAY_CACHE_DIR=${FXRAY_CACHE_DIR:-$(mktemp -d)}
IFS=';' read -ra vs <<< "${VARIANTS:?name:timeout:flags;...}"
for v in "${vs[@]}"; do
  IFS=: read -r name timeout flags <<< "$v"
  echo "=== $name ($flags)"
  OUT="$out/$name" RUNS="$(mktemp -d)" TUNE_TIMEOUT="$timeout" TUNE_ARGS="$flags" bash "$here/lab/gpu_sweep.sh" "${TRIALS:-64}" 2>&1 | grep -E "^tune exit|^GPU util"
  python3 - "$out/$name/results.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  no results.json ({e})")
t, v = r["best"]["test"], r["verdict"]
tb = r.get("time_breakdown") or {}
print(f"  wall_s {r['wall_s']:.1f}; {r['best']['trial_id']} {t['sharpe']:+.2f} ± {t['sharpe_se']:.2f} over {t['n_days']} days, "
      f"share {t.get('oracle_share') or float('nan'):.2f} ± {t.get('oracle_share_se') or float('nan'):.2f}; "
      f"mean test of all trials {sum(x['mean_test_sharpe'] or 0 for x in r['trials']) / len(r['trials']):.2f}; {v.get('answer')}")
print("  " + ", ".join(f"{k} {tb[k]:.1f}" for k in ("startup_s", "fold_setup_s", "learner_s", "backtest_s", "overhead_s", "idle_s") if k in tb))
for k in ("startup_parts", "fold_setup_parts", "overhead_parts"):
    print(f"  {k}: " + ", ".join(f"{n} {x:.1f}" for n, x in (tb.get(k) or {}).items()))
print(f"  phases: " + ", ".join(f"{n} {x - r['started']:+.1f}" for n, x in (r.get("phases") or {}).items() if isinstance(x, (int, float)) and not n.endswith("_s")))
print(f"  verdict: {v.get('sentence')}")

def small(o):  # results.json without the long per-period lists (the device tool returns small files)
    if isinstance(o, dict):
        return {k: small(x) for k, x in o.items()}
    if isinstance(o, list):
        return [small(x) for x in o] if len(o) <= 64 else f"<{len(o)} values>"
    return o
json.dump(small(r), open(sys.argv[1].replace("results.json", "small.json"), "w"), indent=1)
PY
done
