"""`python -m fxray.tune` as one file, for `ray submit` (which copies a single script to the head).

    ray submit cluster.yaml scripts/sweep.py -- --trials 256 --data data/market.fxcache
    ray submit cluster.yaml scripts/sweep.py -- --wait-gpus 16 --trials 256 --data data/market.fxcache

Every argument goes to `fxray.tune` unchanged (see `python -m fxray.tune --help`), with
`--address auto` added when none is given: on the head node the cluster is already
running. Relative paths are relative to the head's home directory (the checkout is
~/fxray, the data ~/data: see cluster.yaml). One flag is ours:

    --wait-gpus N   ask the autoscaler for N GPUs (one bundle per GPU) and wait until the
                    cluster has them before the sweep sizes itself: it starts one FoldWorker
                    per GPU present at its start, so GPU nodes still booting would be unused.

The code that runs is the fxray installed on the cluster (cluster.yaml's setup_commands),
so the head runs exactly the commit `ray up` synced.
"""

from __future__ import annotations

import argparse
import sys
import time

WAIT_S = 1800  # a cold 8-GPU instance takes 5-15 minutes to boot and run setup_commands


def wait_for_gpus(n: int, address: str, timeout_s: float = WAIT_S) -> int:
    """Request n GPUs from the autoscaler and wait until the cluster has them; 0 or 2 (timeout)."""
    import ray
    from ray.autoscaler.sdk import request_resources

    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # A standing request: the autoscaler keeps these nodes up until another request replaces it.
        request_resources(bundles=[{"GPU": 1}] * n)
        t0 = time.time()
        while (have := int(ray.cluster_resources().get("GPU", 0))) < n:
            if time.time() - t0 > timeout_s:
                print(
                    f"sweep.py: error: --wait-gpus {n}: only {have} GPU(s) after {timeout_s:.0f}s; check "
                    "`ray status` and cluster.yaml's max_workers / instance type",
                    file=sys.stderr,
                )
                return 2
            print(f"waiting for GPUs: {have}/{n} ({time.time() - t0:.0f}s)", flush=True)
            time.sleep(15)
        return 0
    finally:
        ray.shutdown()  # fxray.tune joins the cluster itself, with its own namespace


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--wait-gpus", type=int, default=0)
    args, rest = ours.parse_known_args(argv)
    if not any(a == "--address" or a.startswith("--address=") for a in rest):
        rest = ["--address", "auto", *rest]
    if args.wait_gpus > 0 and "-h" not in rest and "--help" not in rest:
        address = (
            rest[rest.index("--address") + 1]
            if "--address" in rest
            else next(a.split("=", 1)[1] for a in rest if a.startswith("--address="))
        )
        if (rc := wait_for_gpus(args.wait_gpus, address)) != 0:
            return rc
    from fxray import tune  # the same entry as `python -m fxray.tune`

    return tune.main(rest)


if __name__ == "__main__":
    sys.exit(main())
