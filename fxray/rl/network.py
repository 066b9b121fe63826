"""The Q-network: K members of one shape as stacked tensors. A solo policy is K = 1.

    net = QNetwork(K, n_inputs, hidden, depth, device)   # weights (K, out, in): a layer is one baddbmm
    q = net(market, position)                             # (K, N, n_inputs), (K, N) -> (K, N, 3)
    q = net.q_all(market)                                 # (K, T, n_inputs) -> (K, T, 3 positions, 3 actions)
    net = QNetwork.from_states([state, ...], device)      # checkpoints -> a network of their members

Every path builds it from here: training (fxray.rl.dqn), the frozen backtest, the vote, the
export's ONNX graph (via `Member`) and, in numpy, the live engine (checked equal to it).

The network reads [normalised market inputs, one-hot position] and has a dueling head,
Q = V + A - mean(A). The position one-hot enters the first layer as three columns of its
weight (`position_embed`, (3, H)), so Q for all three positions of a bar costs one market
projection plus three cheap adds (`q_all`, used by the backtest). With dqn.inputs: ridge a
fixed affine map (the fold's front end, fxray.rl.frontend) comes before the first layer; a
checkpoint stores the plain network that computes the same Q (the map folded in), and `q_all`,
the evaluation's forward, runs that plain network: a fold's scores are those of the policy it
checkpoints, bit for bit on the CPU (the two forms differ by float32 rounding, ~1e-7 of Q,
enough to flip a near-tie between two actions).

A member's weights are named as a checkpoint names them (`names`): position_embed,
market_in.{weight,bias}, body.{2i}.{weight,bias}, head.{weight,bias}.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

N_ACTIONS = 3  # short, flat, long; new position = action - 1


def names(depth: int) -> list[str]:
    """The checkpoint names of a member's weights, in parameter order (the clipping norm sums in it)."""
    body = [f"body.{2 * i}.{w}" for i in range(depth - 1) for w in ("weight", "bias")]
    return ["position_embed", "market_in.weight", "market_in.bias", *body, "head.weight", "head.bias"]


def initial_weights(width: int, hidden: int, depth: int, seed: int) -> list[torch.Tensor]:
    """One member's fresh weights on the CPU (the same on every device), drawn from `seed`:
    torch.nn.Linear's initialisation, layer by layer in the order above (`width`: the first
    layer's inputs, the front end's outputs where there is one).

    The draws run under torch.manual_seed of a seed derived from `seed`, inside a fork of the
    CPU generator only: the CPU generator is left as it was, the CUDA generators are left
    re-seeded with the derived seed (fxray.rl.dqn.draw_seed accounts for it)."""
    cpu_gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=cpu_gen)))
        first = nn.Linear(width, hidden)
        embed = torch.randn(3, hidden) / (width + 3) ** 0.5
        rest = [nn.Linear(hidden, hidden) for _ in range(depth - 1)] + [nn.Linear(hidden, N_ACTIONS + 1)]
    return [embed, first.weight.data, first.bias.data, *(p.data for layer in rest for p in (layer.weight, layer.bias))]


class QNetwork:
    """K members' weights as stacked tensors; member k's slices are its own network (module doc).

    `params`: position_embed (K, 3, H), market_in W (K, H, in), b (K, H), body W, b..., head W, b."""

    def __init__(self, k: int, n_inputs: int, hidden: int, depth: int, device, front: int | None = None):
        # front (dqn.inputs: ridge): the fold's affine map of the inputs to `front` features,
        # shared by every member (one fold, one train slice), set in place by fxray.rl.dqn.DQN.begin
        width = n_inputs if front is None else front
        self.front = front is not None
        if self.front:
            self.front_w = torch.zeros(front, n_inputs, device=device)
            self.front_b = torch.zeros(front, device=device)
        shapes = [(3, hidden), (hidden, width), (hidden,)]
        shapes += [s for _ in range(depth - 1) for s in ((hidden, hidden), (hidden,))]
        shapes += [(N_ACTIONS + 1, hidden), (N_ACTIONS + 1,)]
        self.params = [torch.zeros((k, *s), device=device) for s in shapes]
        self.depth, self.width = depth, width
        self.positions = torch.tensor([-1, 0, 1], device=device)
        # CUDA: weight gradients by SplitKMatmul (float rounding apart, the same maths). The CPU runs
        # each member through the kernels one member's network runs (addmm, mm and their autograd
        # backward), so a member computes bit for bit what it computes alone, whatever K: a bmm's
        # reduction order is its own (on an AVX-512 CPU the (K, in, N) x (K, N, out) weight
        # gradient differs from mm's in the last bit), and a CPU step is bound by flops, not launches
        self.split_k = torch.device(device).type == "cuda"
        self.per_member = torch.device(device).type == "cpu"

    @classmethod
    def from_states(cls, states: list[dict], device="cpu") -> QNetwork:
        """A network of the members whose checkpoints are `states` (plain networks' weights, by `names`)."""
        first = states[0]
        hidden, width = first["market_in.weight"].shape
        depth = sum(1 for key in first if key.startswith("body.") and key.endswith(".weight")) + 1
        net = cls(len(states), width, hidden, depth, device)
        for i, name in enumerate(names(depth)):
            net.params[i].copy_(torch.stack([torch.as_tensor(s[name], dtype=torch.float32) for s in states]))
        return net

    def load_members(self, weights: list[list[torch.Tensor]]) -> None:
        """Every member's weights (member k's in parameter order: weights[k]), in place: one copy a
        weight for all of them (from the host: one transfer, not one a member)."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(torch.stack([w[i] for w in weights]))

    def state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's weights as a plain network's, by checkpoint name (`plain`)."""
        return dict(zip(names(self.depth), (w[0] for w in self.plain([k]))))

    def host_states(self, members) -> list[dict[str, torch.Tensor]]:
        """`state` of each of `members`, on the host: one device-to-host copy a weight for all of them."""
        stacked = [w.cpu() for w in self.plain(members)]
        return [dict(zip(names(self.depth), (w[i] for w in stacked))) for i in range(len(stacked[0]))]

    @torch.no_grad()
    def plain(self, members=None) -> list[torch.Tensor]:
        """The weights of `members` (default all K, then not copied where there is no front end)
        stacked (M, ...) as the plain networks they checkpoint: with a front end, the map folded
        into the first layer, W1 (A z + c) + b1 = (W1 A) z + (W1 c + b1). The one place the map is
        folded: the checkpoints (`host_states`) and the evaluation (`q_all`) hold the same float32
        numbers. The CPU folds member by member (one network's mm and mv: bit for bit whatever K),
        CUDA every slot in one product and then takes the members (the same numbers for any subset)."""
        if members is None and not self.front:
            return self.params
        idx = list(range(self.params[0].shape[0]) if members is None else members)
        if not self.front:
            return [p[idx] for p in self.params]
        embed, w1, b1, *rest = self.params
        if self.per_member:
            folded = [(w1[k] @ self.front_w, w1[k] @ self.front_b + b1[k]) for k in idx]
            w, b = torch.stack([w for w, _ in folded]), torch.stack([b for _, b in folded])
        else:
            w, b = (w1 @ self.front_w)[idx], (w1 @ self.front_b + b1)[idx]
        return [embed[idx], w, b, *(p[idx] for p in rest)]

    # --- the forward ---------------------------------------------------------------------
    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """x (K, N, in) -> (K, N, out): addmm per member on the CPU, as nn.Linear computes it."""
        if self.per_member:
            return torch.stack([F.linear(x[k], w[k], None if b is None else b[k]) for k in range(w.shape[0])])
        if self.split_k and torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return SplitKMatmul.apply(x, w, b)
        return bmm(x, w, b)

    def _q(self, h: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """h (K, N, H) pre-activation of the first layer -> Q (K, N, 3), the dueling head."""
        h = torch.relu(h)
        body = params[3:-2]
        for w, b in zip(body[0::2], body[1::2]):
            h = torch.relu(self._linear(h, w, b))
        out = self._linear(h, params[-2], params[-1])
        value, adv = out[..., :1], out[..., 1:]
        return value + adv - adv.mean(-1, keepdim=True)

    def _front(self, market: torch.Tensor) -> torch.Tensor:
        """market (K, N, n_inputs) -> (K, N, front) (per member on the CPU)."""
        if not self.front:
            return market
        if self.per_member:
            return torch.stack([m @ self.front_w.T + self.front_b for m in market])
        return market @ self.front_w.T + self.front_b

    def _embed(self, one_hot: torch.Tensor) -> torch.Tensor:
        """one_hot (K, N, 3) @ position_embed (K, 3, H). A matmul, not an index: the backward of
        indexing with 3 distinct rows is a serialised scatter-add on CUDA (ms at B=8192)."""
        return self._linear(one_hot, self.params[0].mT, None)  # per member on the CPU: one_hot[k] @ embed[k]

    def __call__(self, market: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """market (K, N, n_inputs), position (K, N) in {-1,0,1} -> Q (K, N, 3)."""
        # (not F.one_hot: its bounds check reads a value back to the host on CUDA)
        one_hot = (position.unsqueeze(-1) == self.positions).to(market.dtype)  # (K, N, 3)
        x, (embed, w1, b1) = self._front(market), self.params[:3]
        if self.per_member:  # as one member's network computes it (bit for bit)
            return self._q(self._linear(x, w1, b1) + self._embed(one_hot), self.params)
        # batched: one GEMM [x, one_hot, 1] @ [W1, E^T, b1]^T, the same sum: a (K, N, H) pass over
        # the activations is the step's cost at K x batch in the 10^6 (memory-bound), and this saves
        # the embedding's product and its add, and the bias's broadcast copy into the output that
        # baddbmm makes and reads back, in each forward; and the bias gradient's reduction
        ones = one_hot.new_ones(*one_hot.shape[:-1], 1)
        first = torch.cat([w1, embed.mT, b1.unsqueeze(-1)], -1)
        return self._q(self._linear(torch.cat([x, one_hot, ones], -1), first, None), self.params)

    def q_all(self, market: torch.Tensor, members: list[int] | None = None) -> torch.Tensor:
        """market (M, T, n_inputs) -> (M, T, 3 previous positions, 3 actions) of `members` (M of
        them; default all K), by the plain network each member checkpoints (`plain`)."""
        return self.q_plain(market, self.plain(members))

    def q_plain(self, market: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """`q_all` of the weights `plain` gave (an evaluation folds them once, not once a chunk of bars)."""
        k, t = market.shape[:2]
        h = self._linear(market, params[1], params[2])  # (M, T, H)
        h = (h.unsqueeze(2) + params[0].unsqueeze(1)).reshape(k, 3 * t, -1)  # (M, 3T, H)
        return self._q(h, params).view(k, t, 3, -1)


class Member(nn.Module):
    """Member `k` of a QNetwork as an nn.Module whose forward is `q_all` (T, n_inputs) -> (T, 3, 3):
    what torch.onnx traces for a policy bundle (fxray.policy.onnx). The network's tensors, not copies."""

    def __init__(self, net: QNetwork, k: int = 0):
        super().__init__()
        self.net, self.k = net, k

    def forward(self, market: torch.Tensor) -> torch.Tensor:
        return self.net.q_all(market.unsqueeze(0), [self.k])[0]


def bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (K, N, in) @ w (K, out, in)^T (+ b (K, out)) -> (K, N, out), one batched GEMM."""
    if b is None:
        return torch.bmm(x, w.transpose(1, 2))
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


# --- the weight gradient, split along the batch (CUDA) ----------------------------------

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

    The weight gradient g^T x sums over the N = batch rows. cuBLAS's batched GEMM does that
    sum in one pass per output tile when K is small (at K = 2..4, batch 8192, hidden 256, a
    32x32-tile kernel of ~0.6 ms a layer on an H200). Here the rows are cut into `split_chunks`
    chunks, each chunk's product is one more batch of the bmm, and the chunks are summed: the
    same gradient to float rounding."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return bmm(x, w, b)

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
