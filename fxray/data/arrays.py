"""What a device-resident dataset is made of: the fxcache's columns a DeviceData uploads,
as plain numpy (no torch: the sweep driver puts them in Ray's object store as they are).

    arrays = host_arrays(market)    # ts, features, ofi, open, close (+ the oracle's columns)
"""

from __future__ import annotations

import json

import numpy as np

from fxray.data.cache import Market
from fxray.data.synth import oracle_columns


def host_arrays(market: Market) -> dict[str, np.ndarray]:
    """Contiguous arrays (close and open are strided views of targets: copied; the others
    are already contiguous and are not), so every `ray.get` of them is zero-copy."""
    cols, hours, form = oracle_columns(market.meta, market.features.shape[1]) or ([], None, None)
    return {
        **{k: np.ascontiguousarray(getattr(market, k)) for k in ("ts", "features", "ofi", "close")},
        "open": np.ascontiguousarray(market.targets[:, 0]),
        "oracle_columns": np.asarray(cols, dtype=np.int64),
        "oracle_hours": np.asarray(hours or [], np.int64),
        "oracle_form": np.asarray(json.dumps(form) if form else ""),  # a nonlinear market's (JSON)
    }
