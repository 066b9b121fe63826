"""A member's Q-network as ONNX, and an onnxruntime session to run it (CPU).

    export_q(q_network, "members/fold3.onnx")     # market (T, 50) normalised -> q (T, 3, 3)
    sess = session("members/fold3.onnx")
    q = run(sess, market)                          # (T, 3, 3) float32 numpy

Exporter: torch.onnx.export with dynamo=False (the TorchScript tracer). torch 2.13's
default dynamo exporter needs the `onnxscript` package, which fxray does not otherwise
use; the traced graph of QNetwork.q_all is a handful of Gemm/Add/Relu/ReduceMean nodes
either way. Opset 17: read by every onnxruntime since 1.12. The batch axis is dynamic.
Parity (tests/test_policy.py): |onnxruntime - torch| <= ONNX_ATOL + ONNX_RTOL |Q| on CPU
(float32 GEMMs that sum in another order; measured ~1e-6 here).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from fxray.rl.network import Member, QNetwork

OPSET = 17
EXPORTER = "torch.onnx.export(dynamo=False), TorchScript tracer"
INPUT, OUTPUT = "market", "q"
ONNX_ATOL = ONNX_RTOL = 1e-5


def export_q(q_network: QNetwork, path) -> None:
    """Write member 0's q_all, normalised market inputs (T, n_inputs) -> Q for all 3 previous
    positions (T, 3, 3), as an ONNX graph at `path` (CPU, float32, dynamic T)."""
    n_inputs = q_network.params[1].shape[2]
    model = Member(q_network).eval()
    with warnings.catch_warnings(action="ignore"):  # the TorchScript exporter announces its own deprecation
        torch.onnx.export(
            model,
            (torch.zeros(2, n_inputs),),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "bars"}, OUTPUT: {0: "bars"}},
        )


def session(path: Path, threads: int = 1):
    """An onnxruntime CPU session; one intra-op thread: a bar is one row, threads only add latency."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run(sess, market: np.ndarray) -> np.ndarray:
    """(T, n_inputs) float32 normalised inputs -> (T, 3, 3) float32 Q-values."""
    return sess.run([OUTPUT], {INPUT: np.ascontiguousarray(market, dtype=np.float32)})[0]
