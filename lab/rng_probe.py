"""What a learner step's per-member random draws cost on CUDA, and what a counter-based draw
would (issue 50): a probe, its numbers go to the notes.

    python lab/rng_probe.py --device cuda        # ~20 s on one GPU
    python lab/rng_probe.py --device cpu --ks 2  # the script itself

fxray.rl.dqn draws each member's numbers from its own torch.Generator (a member trains what it
trains alone, whatever K): per step 3 uniform and 3 randint draws of E or B values per member,
each a kernel, then a stack. The alternative timed here: one hash of (member seed, member counter,
index) over (K, n) for all members (lowbias32, C. Wellons), the same numbers whatever K, in a
dozen kernels whatever K. Both captured in a CUDA graph, as the learner step is.
"""

from __future__ import annotations

import argparse
import time

import torch

M32 = 0xFFFFFFFF


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """x (int64 holding uint32) -> its hash, uint32 in int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, n: int) -> torch.Tensor:
    """(K, n) uniforms in [0, 1): member k's from (seeds[k], counters[k], index); counters += 1."""
    idx = torch.arange(n, device=seeds.device)
    x = lowbias32((seeds.unsqueeze(1) ^ lowbias32(counters.unsqueeze(1) * n + idx)) & M32)
    counters.add_(1)
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


def per_member(gens, n, dev):
    u = torch.stack([torch.rand(n, generator=g, device=dev) for g in gens])
    i = torch.stack([torch.randint(0, 3, (n,), generator=g, device=dev) for g in gens])
    return u, i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ks", default="24,72,128")
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()
    dev = torch.device(a.device)
    E, B = 2048, 4096
    print(f"{'K':>4} {'per-member ms/step':>19} {'counter ms/step':>16}  (3 x (uniform + randint) of E={E}, B={B}, B)")
    for k in [int(x) for x in a.ks.split(",")]:
        gens = [torch.Generator(dev).manual_seed(s) for s in range(k)]
        seeds = torch.arange(k, device=dev, dtype=torch.int64) * 2654435761 & M32
        counters = torch.zeros(k, dtype=torch.int64, device=dev)

        def old(gens=gens):
            for n in (E, E, B):
                per_member(gens, n, dev)

        def new(seeds=seeds, counters=counters):
            for n in (E, E, B):
                counter_uniform(seeds, counters, n)
                (counter_uniform(seeds, counters, n) * 3).to(torch.int64)

        row = []
        for fn in (old, new):
            if dev.type == "cuda":
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                for gen in gens if fn is old else ():  # as fxray.rl.trainer captures: each member's generator
                    g.register_generator_state(gen)
                with torch.cuda.graph(g):
                    fn()
                run = g.replay
                torch.cuda.synchronize()
            else:
                run = fn
            run()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                run()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            row.append((time.perf_counter() - t0) / a.steps * 1e3)
        print(f"{k:>4} {row[0]:>19.3f} {row[1]:>16.3f}")
    u = counter_uniform(torch.tensor([1, 2], device=dev), torch.zeros(2, dtype=torch.int64, device=dev), 1 << 20)
    print(
        f"counter uniforms: mean {u.mean():.4f} (0.5), var {u.var():.4f} (0.0833), "
        f"corr(k0, k1) {torch.corrcoef(u)[0, 1]:+.4f}"
    )


if __name__ == "__main__":
    main()
