#!/usr/bin/env bash
# One device call: the default sweep from several source trees (A/B), interleaved, each run with
# its wall from the command's start, the driver's steps (lab/tprof.py), GPU busy share and results.
#   RUNS="name:tree:flags;..." bash lab/gpu_ab.sh      results under $OUT/<i>-<name>/
#   e.g. RUNS="base:.base:;new:.:;base:.base:;new:.:"   (.base: `git archive REV | tar -x -C .base`)
# PLAIN=1: `python3 -m fxray.tune` itself (no step marks, no cProfile): the wall a user sees.
# Needs PYTHONPATH's .site (the wheels) first; the market is generated once into $FXRAY_CACHE_DIR.
set -u
out=${OUT:-$PWD/gpu_ab}; here=$(cd "$(dirname "$0")/.." && pwd)
export FXRAY_CACHE_DIR=${FXRAY_CACHE_DIR:-$(mktemp -d)} PYTHONUNBUFFERED=1 TPROF_FINISH=${TPROF_FINISH:-1}
IFS=';' read -ra rs <<< "${RUNS:?name:tree:flags;...}"
i=0
for r in "${rs[@]}"; do
  IFS=: read -r name tree flags <<< "$r"; i=$((i + 1))
  o="$out/$i-$name"; runs=$(mktemp -d); mkdir -p "$o"
  tree=$(cd "$tree" && pwd)
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$o/smi.csv" &
  smi=$!
  t0=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH="$here/.site:$tree" FXRAY_TUNE_DEBUG_LOG="$o/debug.log" timeout "${TUNE_TIMEOUT:-200}" \
    python3 $([ "${PLAIN:-0}" = 1 ] && echo "-m fxray.tune" || echo "$here/lab/tprof.py $t0") --trials "${TRIALS:-64}" $flags --storage "$runs/sweep" \
    --tracking-uri "sqlite:///$runs/mlflow.db" --json "$o/results.json" > "$o/tune.log" 2>&1)
  rc=$?; t1=$(date +%s.%N); kill $smi
  echo "=== $i $name ($tree $flags): exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s"
  python3 - "$o" "$t0" "$t1" <<'PY'
import json, sys
o, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
from datetime import datetime
smi = [(datetime.strptime(l.split(",")[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(l.split(",")[1]))
       for l in open(f"{o}/smi.csv") if l.strip()]
u = [x for _, x in smi]
print(f"  GPU busy mean {sum(u) / max(len(u), 1):.0f} % over {len(u)} s")
try:
    r = json.load(open(f"{o}/results.json"))
except (OSError, ValueError) as e:
    sys.exit(f"  no results.json ({e})")
small = lambda x: {k: small(v) for k, v in x.items()} if isinstance(x, dict) else ([small(v) for v in x] if isinstance(x, list) and len(x) <= 64 else (f"<{len(x)}>" if isinstance(x, list) else x))
json.dump(small(r), open(f"{o}/small.json", "w"), indent=1)  # first: an older tree's results may lack a key below
def busy(a, b):
    xs = [x for t, x in smi if a <= t <= b]
    return f"{sum(xs) / max(len(xs), 1):.0f} % over {len(xs)} s"
ph, runs = r.get("phases") or {}, [x for w in r["workers"] for x in w.get("population_runs", [])]
folds = [x for x in runs if x[3] != "warmup"]  # the folds' populations (a warm-up is start-up: fxray.track.timing)
if folds and "workers_ready" in ph and "tune_done" in ph:
    print(f"  GPU busy: worker ready -> Tune done {busy(ph['workers_ready'], ph['tune_done'])}; first -> last population "
          f"{busy(min(a for a, *_ in runs), max(b for _, b, *_ in runs))}; first -> last fold population "
          f"{busy(min(a for a, *_ in folds), max(b for _, b, *_ in folds))}; Tune started -> done {busy(ph['tune_started'], ph['tune_done'])}")
print("  warm-ups: " + "; ".join(f"worker {w['index']}: " + ", ".join(f"{a - r['started']:+.1f}..{b - r['started']:+.1f}" for a, b, _, k in w.get("population_runs", []) if k == "warmup")
                                  + (f" ERROR {w['warmup_error']}" if w.get("warmup_error") else "") for w in r["workers"]))
sec = {}  # each second's busy beside the populations that ran in it
for t, x in smi:
    sec[round(t - r["started"])] = x
print("  busy a second (+s from the clock): " + " ".join(f"{s}:{x:.0f}" for s, x in sorted(sec.items()) if folds and min(a for a, *_ in runs) - 1 <= s + r["started"] <= max(b for _, b, *_ in runs) + 1))
t, v, tb = r["best"]["test"], r["verdict"], r.get("time_breakdown") or {}
print(f"  before the clock {r['started'] - t0:.1f} s, after wall_s {t1 - r['started'] - r['wall_s']:.1f} s")
print(f"  wall_s {r['wall_s']:.1f}; chosen {r['best']['trial_id']} {t['sharpe'] or 0:+.2f} ± {t['sharpe_se'] or float('nan'):.2f} over {t['n_days']} days, "
      f"share {t.get('oracle_share') or float('nan'):.2f} ± {t.get('oracle_share_se') or float('nan'):.2f}; {v.get('answer')}")
print("  " + ", ".join(f"{k} {tb[k]:.1f}" for k in ("startup_s", "fold_setup_s", "learner_s", "backtest_s", "overhead_s", "idle_s") if k in tb))
for k in ("startup_parts", "fold_setup_parts", "overhead_parts"):
    print(f"  {k}: " + ", ".join(f"{n} {x:.1f}" for n, x in (tb.get(k) or {}).items()))
print("  phases: " + ", ".join(f"{n} {x - r['started']:+.1f}" for n, x in (r.get("phases") or {}).items() if isinstance(x, (int, float)) and not n.endswith("_s")))
for w in r["workers"]:
    print(f"  worker {w['index']}: populations {w.get('populations')}; folds asked ahead {w.get('n_asked')}, queued and collected {w.get('n_asked_collected')}")
    print("  runs: " + ", ".join(f"{a - r['started']:.1f}-{b - r['started']:.1f}/{n}{k[0]}" for a, b, n, k in w.get("population_runs", [])))
PY
  grep "^@@" "$o/tune.log" | tr '\n' ' ' | sed 's/@@ /| /g'; echo
  python3 - "$o/debug.log" "$t0" <<'PY'
import re, sys
t0 = float(sys.argv[2]); ev = {}
for line in open(sys.argv[1]):
    t, msg = line.split(" ", 1)
    for key, pat in (("added", "Adding trial"), ("actor", "Trying to schedule new ACTOR"), ("running", "to RUNNING"), ("terminated", "to TERMINATED")):
        if pat in msg:
            ev.setdefault(key, []).append(float(t) - t0)
print("  tune: " + ", ".join(f"{k} {min(v):.1f}-{max(v):.1f} ({len(v)})" for k, v in ev.items()))
PY
  rm -rf "$runs"
done
