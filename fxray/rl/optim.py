"""Clipping and Adam per member of stacked parameters (a leading member axis K), state in place.

Member k's slices get what torch.nn.utils.clip_grad_norm_ and torch.optim.Adam (AdamW's
decoupled decay with weight_decay, Loshchilov & Hutter 2019) compute for its parameters
alone. No torch.optim class: building one imports torch._dynamo, ~4 s in a fresh process
on the GPU machine, paid by every sweep worker before its first fold.
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def clip_grad_norms_(params: list[torch.Tensor], max_norm: torch.Tensor) -> None:
    """clip_grad_norm_ of each member's gradients, in place: member k's total norm over its
    slices of every parameter, scaled by min(max_norm_k / (norm + 1e-6), 1)."""
    K = params[0].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(p.grad.reshape(K, -1), dim=1) for p in params], 1)  # (K, P)
    total = torch.linalg.vector_norm(norms, dim=1)  # (K,)
    coef = torch.clamp((total + 1e-6).reciprocal() * max_norm, max=1.0)  # float / tensor is reciprocal * float
    for p in params:
        p.grad.mul_(coef.view(-1, *([1] * (p.ndim - 1))))


class Adam:
    """Adam (Kingma & Ba, 2015) per member: member k with its own lr, weight decay and step count,
    which only an active member advances.

    On the CPU, member by member with torch.optim.Adam's per-element formula on its slices
    (tests/test_learner.py checks it against torch.optim.AdamW). On CUDA, one stacked formula
    for all members (a handful of kernels whatever K, graph-safe; torch's fused kernel takes
    one lr), masked by `active`: the same maths to float rounding (tests/test_gpu.py)."""

    betas, eps = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults

    def __init__(self, params: list, lrs: list[float], weight_decays: list[float], active):
        dev = params[0].device
        self.params, self.active = params, active
        self.exp_avg, self.exp_avg_sq = ([torch.zeros_like(p) for p in params] for _ in range(2))
        self.steps = torch.zeros(len(lrs), dtype=torch.float32, device=dev)
        self.stacked = dev.type != "cpu"
        self.lr = torch.zeros(len(lrs), dtype=torch.float64, device=dev)
        self.decay = torch.zeros(len(lrs), device=dev)
        self.configure(lrs, weight_decays)

    def configure(self, lrs: list[float], weight_decays: list[float]) -> None:
        """Each member's lr and weight decay, in place."""
        self.lrs, self.weight_decays = list(lrs), list(weight_decays)
        self.lr.copy_(torch.tensor(lrs, dtype=torch.float64))
        self.decay.copy_(torch.tensor([1 - lr * wd for lr, wd in zip(lrs, weight_decays)]))

    def reset(self) -> None:
        """Forget moments and step counts, in place (a captured graph keeps its pointers)."""
        for t in (*self.exp_avg, *self.exp_avg_sq, self.steps):
            t.zero_()

    @torch.no_grad()
    def step(self) -> None:
        (self._step_stacked if self.stacked else self._step_members)()

    def _step_members(self) -> None:
        beta1, beta2 = self.betas
        for k in torch.nonzero(self.active).flatten().tolist():  # a CPU tensor: no device sync
            self.steps[k] += 1.0
            t = float(self.steps[k])
            bias1, bias2_sqrt = 1 - beta1**t, math.sqrt(1 - beta2**t)
            lr, wd = self.lrs[k], self.weight_decays[k]
            for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
                p, g, m, v = p[k], p.grad[k], m[k], v[k]
                if wd:
                    p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                p.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(self.eps), value=-lr / bias1)

    def _step_stacked(self) -> None:
        beta1, beta2 = self.betas
        self.steps.add_(self.active.to(torch.float32))
        t = self.steps.double()
        alpha = (-self.lr / (1 - beta1**t)).float()  # (K,)
        bias2_sqrt = (1 - beta2**t).sqrt().float()
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            view = (-1, *([1] * (p.ndim - 1)))
            on = self.active.view(view)
            g = p.grad
            m.copy_(torch.where(on, torch.lerp(m, g, 1 - beta1), m))
            v.copy_(torch.where(on, (v * beta2).addcmul_(g, g, value=1 - beta2), v))
            new = p * self.decay.view(view)
            new = new + alpha.view(view) * (m / ((v.sqrt() / bias2_sqrt.view(view)).add_(self.eps)))
            p.copy_(torch.where(on, new, p))
