"""The optimizer every learner uses: Adam with its state in place (CUDA-graph safe)."""

from __future__ import annotations

import math

import torch


class Adam:
    """Adam (Kingma & Ba, 2015) over a fixed list of parameters, state kept in place.

    The update of `torch.optim.Adam` (no amsgrad; with `weight_decay`, torch.optim.AdamW's
    decoupled decay: p <- p (1 - lr wd) before the step, Loshchilov & Hutter 2019), without its class:
    building a torch.optim optimizer imports torch._dynamo, ~4 s in a fresh process on
    the GPU machine, paid by every sweep worker before its first fold. On CUDA the step
    is torch's fused Adam kernel (one launch for all parameters) with the step count on
    device, so it can be captured in a CUDA graph; on the CPU, the same per-element
    formula as torch.optim.Adam's default. tests/test_trainer.py (CPU) and
    tests/test_gpu.py (CUDA) check it against torch.optim.Adam.
    """

    def __init__(self, params: list, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        self.params, self.lr, self.betas, self.eps, self.weight_decay = params, lr, betas, eps, weight_decay
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in params]
        self.fused = params[0].device.type == "cuda"

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None  # backward then writes the gradient instead of adding to one

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        grads = [p.grad for p in self.params]
        torch._foreach_add_(self.steps, 1.0)
        if self.fused:
            fused = torch._fused_adamw_ if self.weight_decay else torch._fused_adam_
            fused(
                self.params,
                grads,
                self.exp_avg,
                self.exp_avg_sq,
                [],
                self.steps,
                lr=self.lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=self.weight_decay,
                eps=self.eps,
                amsgrad=False,
                maximize=False,
            )
            return
        t = float(self.steps[0])  # a CPU tensor: reading it is no device sync
        bias1, bias2_sqrt = 1 - beta1**t, math.sqrt(1 - beta2**t)
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            if self.weight_decay:
                p.mul_(1 - self.lr * self.weight_decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(self.eps), value=-self.lr / bias1)

    def reset(self) -> None:
        """Forget moments and step count, in place (a captured graph keeps its pointers)."""
        for t in (*self.exp_avg, *self.exp_avg_sq, *self.steps):
            t.zero_()
