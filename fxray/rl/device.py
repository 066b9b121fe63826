"""The dataset resident on one device, uploaded once; per-fold stats on device.

The upload streams the host columns (zero-copy mmap or Ray object-store views)
through two small pinned buffers into device tensors: never a whole host copy.

`DeviceData` holds, for all N bars of an fxcache:
    x        (N, 50)  features ++ ofi, float32 or bfloat16 (raw, not normalised)
    returns  (N,)     float32 r[t] = ln(close[t+1] / close[t]), from float64 closes; r[N-1] = 0
    gap, bar (N,)     float32 ln(open[t+1] / close[t]) and ln(close[t+1] / open[t+1]): a fill at
                      the next bar's open splits r[t] into what the old and the new position earn
    day      (N,)     int64 session day (fxray.data.calendar), for daily sums
    period   (N,)     int64 period (hour) number, for the pooled statistics
and, for the active fold, persistent device tensors that a fold switch updates in
place (so a captured CUDA graph stays valid across folds):
    mean, inv_std (50,)  normalisation from the fold's TRAIN slice only
    bounds        (2,)   int64 [train_start, train_end) the environment samples from
A fold switch is a mean/std reduction over the train slice: milliseconds, no copy.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import torch

from fxray.data.arrays import host_arrays
from fxray.data.cache import Market
from fxray.data.calendar import HOUR_NS, Calendar
from fxray.data.folds import Fold
from fxray.eval.backtest import Window

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _upload_rows(x: torch.Tensor, features: torch.Tensor, ofi: torch.Tensor, chunk_rows: int = 1 << 18) -> None:
    """x[:, :nf] = features, x[:, nf:] = ofi, from host views, at DMA speed on CUDA.

    A pageable host-to-device copy runs at ~5-7 GB/s (one memcpy through the driver's
    staging buffer). Instead: two pinned buffers of `chunk_rows` interleaved rows,
    filled by torch's multi-threaded CPU copy while the copy engine drains the other
    one. (Page-locking the mmap itself with cudaHostRegister hung on the H200 host.)
    """
    nf = features.shape[1]
    if x.device.type != "cuda":
        x[:, :nf].copy_(features)
        x[:, nf:].copy_(ofi)
        return
    n, rows = features.shape[0], min(chunk_rows, features.shape[0])
    staging = [torch.empty((rows, x.shape[1]), dtype=torch.float32, pin_memory=True) for _ in range(2)]
    drained: list[torch.cuda.Event | None] = [None, None]
    stream = torch.cuda.current_stream(x.device)
    for i, start in enumerate(range(0, n, rows)):
        end = min(start + rows, n)
        buf = staging[i % 2][: end - start]
        if drained[i % 2] is not None:
            drained[i % 2].synchronize()  # the DMA that last read this buffer is done
        buf[:, :nf].copy_(features[start:end])
        buf[:, nf:].copy_(ofi[start:end])
        x[start:end].copy_(buf, non_blocking=True)
        drained[i % 2] = torch.cuda.Event()
        drained[i % 2].record(stream)
    stream.synchronize()  # the staging buffers are freed on return


class DeviceData:
    """An fxcache resident on `device`; one upload, per-fold views and stats."""

    def __init__(self, arrays: dict[str, np.ndarray] | Market, device="cpu", dtype: str = "float32"):
        if isinstance(arrays, Market):
            arrays = host_arrays(arrays)
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        ts, features, ofi, open_, close = (np.asarray(arrays[k]) for k in ("ts", "features", "ofi", "open", "close"))
        n, nf = features.shape
        self.n_bars = n
        self.n_inputs = nf + ofi.shape[1]
        # Straight from the (read-only, zero-copy) host views into one device tensor: no
        # host-side staging copy of the dataset. torch.from_numpy warns on read-only
        # arrays because it cannot promise immutability; we only read them.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            host = [torch.from_numpy(a) for a in (features, ofi, close, open_)]
        x = torch.empty((n, self.n_inputs), dtype=torch.float32, device=self.device)
        _upload_rows(x, host[0], host[1])
        log_close, log_open = (torch.log(h.to(self.device)) for h in host[2:])  # float64 on device: before the cast
        self.returns, self.gap, self.bar = (torch.zeros(n, dtype=torch.float32, device=self.device) for _ in range(3))
        self.returns[:-1] = torch.diff(log_close).float()
        self.gap[:-1] = (log_open[1:] - log_close[:-1]).float()
        self.bar[:-1] = (log_close[1:] - log_open[1:]).float()
        self.calendar = Calendar.of(ts)
        cols = np.asarray(arrays.get("oracle_columns", []), dtype=np.int64)
        hours = np.asarray(arrays.get("oracle_hours", []), dtype=np.int64)
        form = str(np.asarray(arrays.get("oracle_form", "")))
        # the planted market's oracle: the input columns that carry its signal, the hours of its
        # edge and, on a nonlinear market, the form of the rule on them (None: no oracle)
        self.oracle = (
            (torch.from_numpy(cols).to(self.device), tuple(hours.tolist()) or None, json.loads(form) if form else None)
            if len(cols)
            else None
        )
        # (fold, cost, fill, screen_t) -> the reference rules' results and the demonstrator's moves (rl.references)
        self.references: dict = {}
        self.screens: dict = {}  # (fold, cost, fill, screen_t) -> the checked screen's inputs (fxray.rl.frontend)
        # host copies for counting a window's days and hours without a device sync
        self.day_host, self.period_host = self.calendar.session_day(ts), self.calendar.period(ts)
        self.day, self.period = (torch.from_numpy(h).to(self.device) for h in (self.day_host, self.period_host))
        self.x = x if self.dtype == torch.float32 else x.to(self.dtype)
        del x, log_close, log_open
        # --- the active fold's persistent state (updated in place) ---------------------
        self.mean = torch.zeros(self.n_inputs, device=self.device)
        self.inv_std = torch.ones(self.n_inputs, device=self.device)
        self.bounds = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.fold: Fold | None = None

    def set_fold(self, fold: Fold) -> None:
        """Make `fold` active: train-slice normalisation and train bounds, on device."""
        a, b = fold.train
        if not (0 <= a < b <= self.n_bars):
            raise ValueError(f"fold {fold.k}: train range {fold.train} outside 0..{self.n_bars}")
        train = self.x[a:b].float()
        std = train.std(0, unbiased=False)
        self.mean.copy_(train.mean(0))
        # Constant columns (e.g. zero OFI on bar-only data) get 1, not 1/0.
        self.inv_std.copy_(torch.where(std > 1e-8, 1.0 / std, torch.ones_like(std)))
        self.bounds.copy_(torch.tensor([a, b], dtype=torch.int64), non_blocking=True)
        self.fold = fold

    def states(self, t: torch.Tensor) -> torch.Tensor:
        """Normalised market inputs at bar indices t: (..., 50) float32 (no position part)."""
        return (self.x[t].float() - self.mean) * self.inv_std

    def window(self, window: tuple[int, int], fill: str = "next_open") -> Window:
        """The bars of `window` that have a next bar, as the backtest takes them (no host sync).

        fill "close": positions fill at the close the features saw (returns r);
        "next_open": at the next bar's open (the old position earns the gap)."""
        start, end = window[0], window[1] - 1
        hours = np.unique(self.period_host[start:end])
        days = len(np.unique(self.day_host[start:end]))  # distinct session days
        fresh, carry = (self.returns, None) if fill == "close" else (self.bar, self.gap[start:end])
        return Window(fresh[start:end], self.day[start:end], days, self.period[start:end], len(hours), hours, carry)

    def bar_hours(self, start: int, end: int) -> torch.Tensor:
        """(end - start,) int64 on the host: the UTC hour of each bar's close (its hourly period)."""
        return torch.from_numpy((self.period_host[start:end] * self.calendar.period_ns // HOUR_NS) % 24)

    def hour_gate(self, start: int, end: int, hours: tuple | None) -> torch.Tensor | None:
        """(end - start,) bool: bars whose close hour (UTC) lies in [hours[0], hours[1])."""
        if hours is None:
            return None
        hour = self.bar_hours(start, end)
        return ((hour >= hours[0]) & (hour < hours[1])).to(self.device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
