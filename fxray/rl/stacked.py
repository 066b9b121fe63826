"""Stacked members: K copies of the Q-network as stacked tensors (one `baddbmm` a layer), and
clipping and Adam per member over them, what fxray.rl.population trains with. Member k's
slices compute what fxray.rl.dqn.QNetwork, torch.nn.utils.clip_grad_norm_ and
fxray.rl.optim.Adam compute for it alone (tests/test_population.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fxray.rl.dqn import N_ACTIONS


def _col(values, dtype, device, dims: int = 1) -> torch.Tensor:
    """(K, 1, ..., 1) tensor of per-member values, broadcasting against (K, ...) with `dims` trailing dims."""
    return torch.tensor(values, dtype=dtype, device=device).view(-1, *([1] * dims))


# --- the stacked Q-network -----------------------------------------------------------


class StackedQNetwork:
    """K copies of fxray.rl.dqn.QNetwork as stacked tensors; member k's slices are its weights.

    `params` is in QNetwork.parameters() order (position_embed, market_in W, b, body W, b..., head W, b:
    the order matters, the clipping norm sums over it);
    a weight is (K, out, in), a bias (K, out), position_embed (K, 3, H)."""

    def __init__(self, k: int, n_inputs: int, hidden: int, depth: int, dueling: bool, device, front: int | None = None):
        # front (dqn.inputs: ridge, fxray.rl.frontend): the fold's affine map of the inputs to
        # `front` features, shared by every member (one fold, one train slice), set in place
        width = n_inputs if front is None else front
        self.front = front is not None
        if self.front:
            self.front_w = torch.zeros(front, n_inputs, device=device)
            self.front_b = torch.zeros(front, device=device)
        shapes = [(3, hidden), (hidden, width), (hidden,)]
        shapes += [s for _ in range(depth - 1) for s in ((hidden, hidden), (hidden,))]
        shapes += [(N_ACTIONS + (1 if dueling else 0), hidden), (N_ACTIONS + (1 if dueling else 0),)]
        self.params = [torch.zeros((k, *s), device=device) for s in shapes]
        self.dueling = dueling
        self.positions = torch.tensor([-1, 0, 1], device=device)
        # CUDA: weight gradients by SplitKMatmul (float rounding apart, the same maths). The CPU runs
        # each member through the kernels its network runs alone (addmm, mm and their autograd
        # backward), bit for bit what it computes alone on any CPU: a bmm's reduction order is
        # its own (on an AVX-512 CPU the (K, in, N) x (K, N, out) weight gradient differs from
        # mm's in the last bit), and a CPU step is bound by flops, not launches
        self.split_k = torch.device(device).type == "cuda"
        self.per_member = torch.device(device).type == "cpu"

    def requires_grad_(self, flag: bool) -> StackedQNetwork:
        for p in self.params:
            p.requires_grad_(flag)
        return self

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """x (K, N, in) -> (K, N, out): addmm per member, as nn.Linear computes it (b None: no bias)."""
        if self.per_member:
            return torch.stack([F.linear(x[k], w[k], None if b is None else b[k]) for k in range(w.shape[0])])
        if self.split_k and torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return SplitKMatmul.apply(x, w, b)
        if b is None:
            return torch.bmm(x, w.transpose(1, 2))
        return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))

    def _q(self, h: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """h (K, N, H) pre-activation of the first layer -> Q (K, N, 3)."""
        h = torch.relu(h)
        body = params[3:-2]
        for w, b in zip(body[0::2], body[1::2]):
            h = torch.relu(self._linear(h, w, b))
        out = self._linear(h, params[-2], params[-1])
        if not self.dueling:
            return out
        value, adv = out[..., :1], out[..., 1:]
        return value + adv - adv.mean(-1, keepdim=True)

    def forward(self, market: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """market (K, N, n_inputs), position (K, N) in {-1,0,1} -> Q (K, N, 3)."""
        one_hot = (position.unsqueeze(-1) == self.positions).to(market.dtype)  # (K, N, 3)
        return self._q(
            self._linear(self._front(market), self.params[1], self.params[2]) + self._embed(one_hot), self.params
        )

    def _front(self, market: torch.Tensor) -> torch.Tensor:
        """market (K, N, n_inputs) -> (K, N, front): QNetwork._front of each member (per member on
        the CPU, as its network computes it alone)."""
        if not self.front:
            return market
        if self.per_member:
            return torch.stack([m @ self.front_w.T + self.front_b for m in market])
        return market @ self.front_w.T + self.front_b

    def _embed(self, one_hot: torch.Tensor) -> torch.Tensor:
        """one_hot (K, N, 3) @ position_embed (K, 3, H), per member as QNetwork's matmul on the CPU."""
        embed = self.params[0]
        if self.per_member:
            return torch.stack([one_hot[k] @ embed[k] for k in range(embed.shape[0])])
        return self._linear(one_hot, embed.mT, None)

    __call__ = forward

    def q_all(self, market: torch.Tensor, members: list[int] | None = None) -> torch.Tensor:
        """market (M, T, n_inputs) -> (M, T, 3 previous positions, 3 actions) of `members` (M of them;
        default all K)."""
        params = self.params if members is None else [p[members] for p in self.params]
        k, t = market.shape[:2]
        h = self._linear(self._front(market), params[1], params[2])  # (M, T, H)
        h = (h.unsqueeze(2) + params[0].unsqueeze(1)).reshape(k, 3 * t, -1)  # (M, 3T, H)
        return self._q(h, params).view(k, t, 3, -1)


# --- the weight gradient, split along the batch ---------------------------------------

SPLIT_TARGET = 64  # members x chunks to aim for: enough independent GEMMs to fill an H200's 132 SMs
MIN_CHUNK = 512  # rows per chunk at least


def split_chunks(n: int, k: int) -> int:
    """Chunks to cut a weight gradient's n-row reduction into, for k members: powers of two while
    k x chunks < SPLIT_TARGET, each chunk >= MIN_CHUNK rows and n divisible."""
    c = 1
    while k * c < SPLIT_TARGET and n % (2 * c) == 0 and n // (2 * c) >= MIN_CHUNK:
        c *= 2
    return c


class SplitKMatmul(torch.autograd.Function):
    """y = x @ w^T (+ b) per member, x (K, N, in), w (K, out, in), b (K, out) or None.

    The weight gradient g^T x sums over the N = 2 x batch rows. cuBLAS's batched GEMM does that
    sum in one pass per output tile when K is small: at K = 2..4, batch 8192, hidden 256 it
    picked a 32x32-tile kernel that took ~0.6 ms a layer on an H200, most of a population step
    (docs/benchmarks.md, "Populations"), where the single-member mm of the Trainer splits the
    sum. Here the rows are cut into `split_chunks` chunks, each chunk's product is one more
    batch of the bmm, and the chunks are summed: the same gradient to float rounding."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        if b is None:
            return torch.bmm(x, w.transpose(1, 2))
        return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        grad_x = torch.bmm(g, w) if ctx.needs_input_grad[0] else None
        grad_w = grad_b = None
        if ctx.needs_input_grad[1]:
            k, n, _ = x.shape
            c = split_chunks(n, k)
            gc = g.reshape(k * c, n // c, g.shape[2]).transpose(1, 2)
            grad_w = torch.bmm(gc, x.reshape(k * c, n // c, x.shape[2])).view(k, c, *w.shape[1:]).sum(1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(1)
        return grad_x, grad_w, grad_b


# --- the population ------------------------------------------------------------------


# --- clipping and Adam, per member ----------------------------------------------------


@torch.no_grad()
def clip_grad_norms_(params: list[torch.Tensor], max_norm: torch.Tensor) -> None:
    """torch.nn.utils.clip_grad_norm_ of each member's gradients, in place: member k's total
    norm over its slices of every parameter, scaled by min(max_norm_k / (norm + 1e-6), 1)."""
    K = params[0].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(p.grad.reshape(K, -1), dim=1) for p in params], 1)  # (K, P)
    total = torch.linalg.vector_norm(norms, dim=1)  # (K,)
    coef = torch.clamp((total + 1e-6).reciprocal() * max_norm, max=1.0)  # float / tensor is reciprocal * float
    for p in params:
        p.grad.mul_(coef.view(-1, *([1] * (p.ndim - 1))))


class StackedAdam:
    """fxray.rl.optim.Adam per member over stacked parameters: member k with its own lr and weight
    decay and its own step count, which only an active member advances.

    On the CPU, member by member with exactly Adam's CPU code on its slices (bit-identical
    to the member alone). On CUDA, one stacked formula for all members (a handful of
    kernels whatever K; no per-member lr in torch's fused kernel), masked by `active`:
    the same maths to float rounding."""

    def __init__(
        self, params: list, lrs: list[float], weight_decays: list[float], active, betas=(0.9, 0.999), eps=1e-8
    ):
        dev = params[0].device
        self.params, self.active = params, active
        self.betas, self.eps = betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
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
