"""Fault-injection FoldWorkers for the crash-recovery tests: not part of fxray.

    FXRAY_WORKER_CLASS=faults:FaultyWorker  FXRAY_FAULT=W:N     worker W's first incarnation exits
                                                                  hard on its N-th fold
                                            FXRAY_FAULT=W:load  worker W's constructor raises
                                            FXRAY_FAULT=disk:N  every worker's N-th and later folds
                                                                  raise ENOSPC, as a checkpoint written
                                                                  to a full disk does
                                            FXRAY_FAULT=diverge:G  every fold of a config with
                                                                  gamma >= G comes back diverged,
                                                                  as the Trainer returns one
(tests/ must be on PYTHONPATH: see `fault_env` in test_tune.py)
"""

from __future__ import annotations

import errno
import os

from fxray.sweep.workers import DeviceWorker


class FaultyWorker(DeviceWorker):
    def __init__(self, arrays_ref, index, *args, **kwargs):
        worker, _, when = os.environ.get("FXRAY_FAULT", "").partition(":")
        mine = worker.isdigit() and int(worker) == index
        if mine and when == "load":
            raise RuntimeError(f"worker {index}: injected load failure (FXRAY_FAULT)")
        super().__init__(arrays_ref, index, *args, **kwargs)
        # a worker Ray restarted after the injected exit runs normally
        self.exit_on_call = int(when) if mine and when.isdigit() and not self.restarted else 0

    def train_fold(self, config, *args, **kwargs):
        if self.n_calls + 1 == self.exit_on_call:
            os._exit(1)
        kind, _, threshold = os.environ.get("FXRAY_FAULT", "").partition(":")
        if kind == "disk" and self.n_calls + 1 >= int(threshold):
            self.n_calls += 1
            raise OSError(errno.ENOSPC, "No space left on device (injected: FXRAY_FAULT)", "/run/best.safetensors")
        result = super().train_fold(config, *args, **kwargs)
        if kind == "diverge" and config["gamma"] >= float(threshold) and result["status"] == "ok":
            # what rl/trainer.py returns for a fold whose loss or |Q| blew up: no val/test result
            result.update(
                status="diverged", best_epoch=-1, val={}, test={}, val_score=None, checkpoint="",
                val_periods={}, test_periods={},
            )  # fmt: skip
        return result
