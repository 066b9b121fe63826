"""Q-network, index replay and the two hot functions: `collect` and `learn`.

Both functions only touch persistent tensors in place and never read a value back
to the host, so the trainer can run them eagerly or capture them once in a CUDA
graph and replay them: the maths is the same line for line (tests/test_dqn.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxray.config import DQNConfig
from fxray.device import DeviceData
from fxray.env import TradingEnv

N_ACTIONS = 3  # short, flat, long; new position = action - 1


class QNetwork(nn.Module):
    """MLP over [normalised market inputs, one-hot position] -> Q for the 3 actions.

    The position one-hot enters the first layer as three columns of its weight
    (`position_embed`, (3, H)), so Q for all three positions of a bar costs one
    market projection plus three cheap adds (`q_all`, used by the backtest). The
    one-hot is applied as a (B, 3) @ (3, H) product, not an index: the backward of
    indexing with 3 distinct rows is a serialised scatter-add on CUDA (ms at B=8192).
    """

    def __init__(self, n_inputs: int, hidden: int, depth: int, dueling: bool):
        super().__init__()
        self.market_in = nn.Linear(n_inputs, hidden)
        self.position_embed = nn.Parameter(torch.randn(3, hidden) / (n_inputs + 3) ** 0.5)
        self.register_buffer("positions", torch.tensor([-1, 0, 1]), persistent=False)
        self.body = nn.Sequential(*[m for _ in range(depth - 1) for m in (nn.Linear(hidden, hidden), nn.ReLU())])
        self.dueling = dueling
        self.head = nn.Linear(hidden, N_ACTIONS + (1 if dueling else 0))

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(torch.relu(h)))
        if not self.dueling:
            return out
        value, adv = out[..., :1], out[..., 1:]
        return value + adv - adv.mean(-1, keepdim=True)

    def forward(self, market: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """market (..., n_inputs) float32, position (...) in {-1,0,1} -> Q (..., 3)."""
        # (not F.one_hot: its bounds check reads a value back to the host on CUDA)
        one_hot = (position.unsqueeze(-1) == self.positions).to(market.dtype)  # (..., 3)
        return self._q(self.market_in(market) + one_hot @ self.position_embed)

    def q_all(self, market: torch.Tensor) -> torch.Tensor:
        """Q for every previous position: market (T, n_inputs) -> (T, 3 positions, 3 actions)."""
        h = self.market_in(market)  # (T, H)
        return self._q(h.unsqueeze(1) + self.position_embed)  # (T, 3, H) -> (T, 3, 3)


def epsilon(cfg: DQNConfig, step: torch.Tensor, total_steps: int) -> torch.Tensor:
    """Linear decay from eps_start to eps_end over eps_decay of all steps (device scalar)."""
    decay_steps = max(cfg.eps_decay * total_steps, 1.0)
    frac = (1.0 - step.to(torch.float32) / decay_steps).clamp(0.0, 1.0)
    return cfg.eps_end + (cfg.eps_start - cfg.eps_end) * frac


class Replay:
    """Ring of the last `buffer_steps` collect steps x num_envs transitions, as indices.

    Row i % S holds collect step i of every env: the bar t, the position p before
    acting, the action a, the reward and whether the episode ended there. A sample
    (i, env) rebuilds states from the resident dataset and forms the n-step return
    from rows i .. i+n-1 of the same env, cut at an episode end.
    """

    def __init__(self, cfg: DQNConfig, num_envs: int, device):
        S, B = cfg.buffer_steps, num_envs
        self.S, self.B, self.n, self.gamma = S, B, cfg.n_step, cfg.gamma
        self.t = torch.zeros(S, B, dtype=torch.int64, device=device)
        self.position = torch.zeros(S, B, dtype=torch.int64, device=device)
        self.action = torch.zeros(S, B, dtype=torch.int64, device=device)
        self.reward = torch.zeros(S, B, dtype=torch.float32, device=device)
        self.done = torch.zeros(S, B, dtype=torch.bool, device=device)
        self.steps = torch.zeros((), dtype=torch.int64, device=device)  # collect steps written
        self.discounts = cfg.gamma ** torch.arange(cfg.n_step + 1, dtype=torch.float32, device=device)

    def reset(self) -> None:
        self.steps.zero_()

    def add(self, t, position, action, reward, done) -> None:
        row = self.steps % self.S
        for buf, value in ((self.t, t), (self.position, position), (self.action, action),
                           (self.reward, reward), (self.done, done)):
            buf.index_copy_(0, row.view(1), value.unsqueeze(0))
        self.steps.add_(1)

    def sample_indices(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform (step, env) pairs whose n rows are all written: (batch,), (batch,)."""
        dev = self.steps.device
        hi = self.steps - self.n  # last start step with n rows after it (needs steps >= n)
        lo = (self.steps - self.S).clamp_min(0)
        u = torch.rand(batch, device=dev)
        step = lo + (u * (hi - lo + 1).to(torch.float32)).to(torch.int64).clamp_max(hi - lo)
        env = torch.randint(0, self.B, (batch,), device=dev)
        return step, env

    def n_step_batch(self, step: torch.Tensor, env: torch.Tensor):
        """-> t, position, action, return_n, next_t, next_position, discount; each (batch,)."""
        offsets = torch.arange(self.n, device=step.device)
        rows = (step.unsqueeze(1) + offsets) % self.S            # (batch, n)
        envs = env.unsqueeze(1).expand_as(rows)
        reward, done = self.reward[rows, envs], self.done[rows, envs]
        # keep step j only if no episode ended at steps 0..j-1 (an unrolled scan over the
        # n <= ~10 columns: torch.cumsum over a tiny inner dim is a slow kernel on CUDA)
        alive = torch.ones_like(reward[:, 0])
        keep_cols = []
        for j in range(self.n):
            keep_cols.append(alive)
            alive = alive * (~done[:, j]).to(torch.float32)
        keep = torch.stack(keep_cols, 1)                          # (batch, n)
        return_n = (reward * keep * self.discounts[: self.n]).sum(1)
        k = keep.sum(1).to(torch.int64)                           # steps included, 1..n
        last_row = rows.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
        t0 = self.t[rows[:, 0], env]
        next_position = self.action[last_row, env] - 1
        return (t0, self.position[rows[:, 0], env], self.action[rows[:, 0], env],
                return_n, t0 + k, next_position, self.discounts[k])


@torch.no_grad()
def collect(env: TradingEnv, q_network: QNetwork, replay: Replay, eps: torch.Tensor) -> None:
    """One epsilon-greedy step of every env, written to the replay."""
    t, position = env.t.clone(), env.position.clone()
    q = q_network(env.data.states(t), position)                           # (B, 3)
    explore = torch.rand(env.num_envs, device=t.device) < eps
    random_action = torch.randint(0, N_ACTIONS, (env.num_envs,), device=t.device)
    action = torch.where(explore, random_action, q.argmax(1))
    reward, done = env.step(action)
    replay.add(t, position, action, reward, done)


class Adam:
    """Adam (Kingma & Ba, 2015) over a fixed list of parameters, state kept in place.

    The update of `torch.optim.Adam` (no weight decay, no amsgrad), without its class:
    building a torch.optim optimizer imports torch._dynamo, ~4 s in a fresh process on
    the GPU machine, paid by every sweep worker before its first fold. On CUDA the step
    is torch's fused Adam kernel (one launch for all parameters) with the step count on
    device, so it can be captured in a CUDA graph; on the CPU, the same per-element
    formula as torch.optim.Adam's default. tests/test_trainer.py (CPU) and
    tests/test_gpu.py (CUDA) check it against torch.optim.Adam.
    """

    def __init__(self, params: list, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
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
            torch._fused_adam_(self.params, grads, self.exp_avg, self.exp_avg_sq, [], self.steps,
                               lr=self.lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=self.eps,
                               amsgrad=False, maximize=False)
            return
        t = float(self.steps[0])  # a CPU tensor: reading it is no device sync
        bias1, bias2_sqrt = 1 - beta1 ** t, math.sqrt(1 - beta2 ** t)
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(self.eps), value=-self.lr / bias1)

    def reset(self) -> None:
        """Forget moments and step count, in place (a captured graph keeps its pointers)."""
        for t in (*self.exp_avg, *self.exp_avg_sq, *self.steps):
            t.zero_()


class Learner:
    """Online and target networks, Adam, and the Double-DQN n-step update."""

    def __init__(self, cfg: DQNConfig, n_inputs: int, device):
        self.cfg = cfg
        self.q_network = QNetwork(n_inputs, cfg.hidden, cfg.depth, cfg.dueling).to(device)
        self.target_network = QNetwork(n_inputs, cfg.hidden, cfg.depth, cfg.dueling).to(device)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.target_network.requires_grad_(False)
        self.params = list(self.q_network.parameters())
        self.target_params = list(self.target_network.parameters())
        self.optimizer = Adam(self.params, lr=cfg.lr)  # fused and graph-safe on CUDA
        # Inductor fuses the loss's forward and backward into fewer kernels (compiled once,
        # on the first call; inside a CUDA graph capture its kernels are recorded like any other)
        self.loss_fn = torch.compile(self.td_loss) if cfg.compile else self.td_loss
        self.updates = torch.zeros((), dtype=torch.int64, device=device)
        # epoch accumulators, read once at epoch end
        self.loss_sum = torch.zeros((), device=device)
        self.q_abs_max = torch.zeros((), device=device)

    def td_loss(self, data: DeviceData, replay: Replay, step: torch.Tensor, env: torch.Tensor):
        """Huber TD loss of the batch (step, env) and max |Q| over it: the maths of an update
        (no randomness, no side effects: what `cfg.compile` hands to torch.compile)."""
        cfg = self.cfg
        t, position, action, return_n, next_t, next_position, discount = replay.n_step_batch(step, env)
        B = t.shape[0]
        # One online forward over [s, s_next] (2B rows): at these sizes a step is bound by
        # kernel launches, not flops, so one pass of twice the rows is nearly free.
        market = data.states(torch.cat([t, next_t]))                      # (2B, n_inputs)
        q_both = self.q_network(market, torch.cat([position, next_position]))  # (2B, 3)
        q = q_both[:B]
        with torch.no_grad():  # Double DQN: online picks the next action, target evaluates it
            next_action = q_both[B:].argmax(1, keepdim=True)
            next_q = self.target_network(market[B:], next_position).gather(1, next_action).squeeze(1)
            td_target = return_n * cfg.reward_scale + discount * next_q
        q_sa = q.gather(1, action.unsqueeze(1)).squeeze(1)
        return F.huber_loss(q_sa, td_target, delta=cfg.huber_delta), q.detach().abs().max()

    def learn(self, data: DeviceData, replay: Replay, step=None, env=None) -> None:
        """One gradient step on a replay batch (sampled unless (step, env) are given)."""
        cfg = self.cfg
        if step is None:
            step, env = replay.sample_indices(cfg.batch_size)
        loss, q_max = self.loss_fn(data, replay, step, env)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip, foreach=True)
        self.optimizer.step()
        self.updates.add_(1)
        with torch.no_grad():
            if cfg.target_every > 0:  # hard copy every N updates, as a 0/1 weight: no branch, no sync
                weight = (self.updates % cfg.target_every == 0).to(torch.float32)
                for tp, p in zip(self.target_params, self.params):
                    tp.lerp_(p, weight)
            else:
                torch._foreach_lerp_(self.target_params, self.params, cfg.tau)
            self.loss_sum.add_(loss.detach())
            self.q_abs_max.copy_(torch.maximum(self.q_abs_max, q_max))

    def reset(self, seed: int) -> None:
        """Fresh weights (drawn on the CPU from `seed`: same on every device) and optimizer."""
        cpu_gen = torch.Generator().manual_seed(seed)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=cpu_gen)))
            fresh = QNetwork(self.q_network.market_in.in_features, self.cfg.hidden, self.cfg.depth, self.cfg.dueling)
            for p, f in zip(self.params, fresh.parameters()):
                p.copy_(f)
            for tp, f in zip(self.target_params, fresh.parameters()):
                tp.copy_(f)
        self.optimizer.reset()
        self.updates.zero_()
        self.reset_accumulators()

    def reset_accumulators(self) -> None:
        self.loss_sum.zero_()
        self.q_abs_max.zero_()
