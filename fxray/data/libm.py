"""exp and log of float64 arrays with the C library's rounding, whatever the CPU.

    from fxray.data.libm import exp, log
    close = price0 * exp(np.cumsum(ret))

numpy's exp and log take an AVX-512 loop on a CPU that has it, for a contiguous input, and
that loop rounds ~5 % of exps and ~0.1 % of logs differently in the last bit from the C
library's `exp` / `log`, which numpy calls everywhere else. The synthetic market and every
feature are made of them: on an AVX-512 machine the same seed made another market (another
content hash, other trained folds) than on an AVX2 one. Read through a reversed view, numpy
takes its plain loop, the C library's, on every x86-64 CPU: the same bits as `math.exp` /
`math.log` (tests/test_features.py checks 200,000 of each), at the same cost on an AVX2
machine, at ~4 ms (log) and ~18 ms (exp) a million values on an AVX-512 one.
"""

from __future__ import annotations

import numpy as np


def _plain(f, x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return np.ascontiguousarray(f(x.ravel()[::-1])[::-1]).reshape(x.shape)


def exp(x) -> np.ndarray:
    """np.exp(x) as float64, the same bits on every CPU (math.exp's)."""
    return _plain(np.exp, x)


def log(x) -> np.ndarray:
    """np.log(x) as float64, the same bits on every CPU (math.log's)."""
    return _plain(np.log, x)
