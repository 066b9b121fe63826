"""Vectorised trading environment on device: B agents walking the train range.

Agent i at bar t holds position p in {-1, 0, +1}; action a in {0, 1, 2} sets the
new position p' = a - 1 and earns, from bar t's close to bar t+1's close,

    reward = p' * r[t] - cost * |p' - p|                     filled at the close (fill "close")
    reward = p * gap[t] + p' * bar[t] - cost * |p' - p|      filled at bar t+1's open ("next_open")

(log-return units; gap + bar = r: see fxray.rl.device), the same as the backtest.

The market does not react to the agent, so (t, p, a) describes a transition fully.
Episodes are time limits (not terminals): an agent restarts at a random bar of the
train range, with a random position, after `episode_len` steps or at the range's
end. Every update is an in-place tensor op on persistent tensors, so the step can
be captured in a CUDA graph and replayed across folds (bounds live on device).
"""

from __future__ import annotations

import torch

from fxray.rl.device import DeviceData


class TradingEnv:
    def __init__(self, data: DeviceData, num_envs: int, episode_len: int, cost: float, fill: str = "next_open"):
        self.data, self.num_envs, self.episode_len, self.cost = data, num_envs, episode_len, cost
        # (what the new position earns, what the old one earns before the fill)
        self.fresh, self.carry = (data.returns, None) if fill == "close" else (data.bar, data.gap)
        dev = data.device
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=dev)  # (B,) current bar
        self.position = torch.zeros(num_envs, dtype=torch.int64, device=dev)  # (B,) in {-1,0,1}
        self.ep_step = torch.zeros(num_envs, dtype=torch.int64, device=dev)  # (B,) steps this episode

    def _random_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.data.bounds[0], self.data.bounds[1]
        span = (end - 1 - start).to(torch.float32)  # start bars with a next bar in range
        u = torch.rand(self.num_envs, device=self.data.device)
        t = start + (u * span).to(torch.int64).clamp_max(end - 2 - start)
        p = torch.randint(-1, 2, (self.num_envs,), device=self.data.device)
        return t, p

    def reset(self) -> None:
        t, p = self._random_starts()
        self.t.copy_(t)
        self.position.copy_(p)
        self.ep_step.zero_()

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply actions (B,) in {0,1,2}; returns (reward (B,) float32, done (B,) bool).

        `done` marks the last step of an episode (a time limit); the agents that
        finished are already restarted when this returns.
        """
        new_position = action - 1
        reward = new_position * self.fresh[self.t] - self.cost * (new_position - self.position).abs()
        if self.carry is not None:
            reward = reward + self.position * self.carry[self.t]
        self.ep_step.add_(1)
        done = (self.ep_step >= self.episode_len) | (self.t + 1 >= self.data.bounds[1] - 1)
        t0, p0 = self._random_starts()
        self.t.copy_(torch.where(done, t0, self.t + 1))
        self.position.copy_(torch.where(done, p0, new_position))
        self.ep_step.masked_fill_(done, 0)
        return reward, done
