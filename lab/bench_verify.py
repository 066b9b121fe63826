"""How long opening and proving an fxcache takes (docs/benchmarks.md, issue 18).

    python lab/bench_verify.py /tmp/big.fxcache     # make one: python -m fxray.data synth --bars 4000000 --out ...

Prints, page cache warm: the open (structure + metadata: `verify=False`), first call in
a fresh process and warm; the O(N) checks (values; the BLAKE3 content hash; sha256, the
hash of files written before it, for comparison); and the whole open (`verify=True`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def best_of(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(path: str) -> None:
    from fxray.data import cache, integrity

    first = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; from fxray.data import cache; t = time.perf_counter(); "
            f"cache.open({path!r}, verify=False); print(time.perf_counter() - t)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    m = cache.open(path, verify=False)
    cols = [m.ts, m.features, m.ofi, m.targets]
    rows = {
        "bars": m.n_bars,
        "file_mib": round(sum(a.nbytes for a in cols) / 2**20),
        "open_first_call_ms": float(first.stdout) * 1e3,
        "open_warm_ms": best_of(lambda: cache.open(path, verify=False), 20) * 1e3,
        "values_s": best_of(lambda: integrity.check_values(path, dict(zip(integrity.COLUMN_ORDER, cols)))),
        "blake3_s": best_of(lambda: integrity.content_hash(*cols)),
        "sha256_s": best_of(lambda: integrity.content_hash(*cols, algo="sha256"), 3),
        "open_and_verify_s": best_of(lambda: cache.open(path, verify=True), 3),
    }
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
