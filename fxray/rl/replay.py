"""Index replay: transitions are (bar t, position, action), states rebuilt from the resident data.

Because the market does not react to the agent, a transition is fully described by
(t, p, a): the replay stores indices and rewards, never states, and a sample gathers
its states from fxray.rl.device.DeviceData. In place and sync-free, so the trainer can
capture `add` and `n_step_batch` in a CUDA graph.
"""

from __future__ import annotations

import torch

from fxray.rl.config import DQNConfig


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
        for buf, value in (
            (self.t, t),
            (self.position, position),
            (self.action, action),
            (self.reward, reward),
            (self.done, done),
        ):
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
        rows = (step.unsqueeze(1) + offsets) % self.S  # (batch, n)
        envs = env.unsqueeze(1).expand_as(rows)
        reward, done = self.reward[rows, envs], self.done[rows, envs]
        # keep step j only if no episode ended at steps 0..j-1 (an unrolled scan over the
        # n <= ~10 columns: torch.cumsum over a tiny inner dim is a slow kernel on CUDA)
        alive = torch.ones_like(reward[:, 0])
        keep_cols = []
        for j in range(self.n):
            keep_cols.append(alive)
            alive = alive * (~done[:, j]).to(torch.float32)
        keep = torch.stack(keep_cols, 1)  # (batch, n)
        return_n = (reward * keep * self.discounts[: self.n]).sum(1)
        k = keep.sum(1).to(torch.int64)  # steps included, 1..n
        last_row = rows.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
        t0 = self.t[rows[:, 0], env]
        next_position = self.action[last_row, env] - 1
        return (
            t0,
            self.position[rows[:, 0], env],
            self.action[rows[:, 0], env],
            return_n,
            t0 + k,
            next_position,
            self.discounts[k],
        )
