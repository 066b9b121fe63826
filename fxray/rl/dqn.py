"""Double DQN with n-step returns: K members of one shape trained side by side in stacked tensors.

    dqn = DQN(data, [cfg_a, cfg_b, ...])   # K members; shapes equal (SHAPE_FIELDS)
    dqn.begin([seed_a, seed_b, ...])       # fresh weights, replay, agents per member
    dqn.step()                              # one collect + learn of every member (no host sync)
    dqn.q_network.q_all(market)             # (K, T, n_inputs) -> (K, T, 3, 3): every member's Q-values

This is fxray's one learner: a solo trial is K = 1, a seed ensemble K = seeds, a sweep's
population the trials in flight times their seeds. Every per-member tensor carries a leading
member axis K: the Q-network's weights are (K, out, in) (fxray.rl.network), the target
network, Adam's moments, the replay ring (K, S, E), the agents (K, E), the epsilon schedule
and the epoch accumulators (K,) likewise. Members may differ in every field that leaves the
shapes alone and is not a SHAPE_FIELD (lr, gamma, tau, eps schedule, huber_delta,
reward_scale, episode_len, n_step up to the largest via masks, input_noise, weight_decay,
grad_clip, demo, seed; patience and select_from are the trainer's).

Member k draws its random numbers from its own torch.Generator (`draw_seed`), so what it
learns does not depend on the other members: on the CPU a member is bit-identical whatever
K and whoever its neighbours (tests/test_learner.py); on CUDA the batched kernels agree to
float rounding. The fold's solo results are those of the two-implementation tree before it,
bit for bit on the CPU (tests/test_solo_reference.py).

A member that stops (patience, divergence) is masked: `active[k]` False keeps its
weights, target, Adam state and step count where they are; its agents and replay keep
being computed and are ignored. The mask is a device tensor, so a captured CUDA graph
stays valid when it changes.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from fxray.rl import demo, frontend
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.network import N_ACTIONS, QNetwork, initial_weights
from fxray.rl.optim import Adam, clip_grad_norms_

# fields every member of a population shares: they set the loop, the data, a tensor shape or the step
SHAPE_FIELDS = (
    *("num_envs", "buffer_steps", "updates_per_step", "epochs", "steps_per_epoch", "fill", "cost"),
    *("dtype", "graphs", "matmul", "hidden", "depth", "batch_size", "seeds", "inputs", "screen_t", "abstain"),
)


def check_members(cfgs: list[DQNConfig]) -> None:
    """ConfigError naming the first field where a member's shape differs from member 0's."""
    if not cfgs:
        raise ConfigError("population: no members")
    for k, cfg in enumerate(cfgs):
        for key in SHAPE_FIELDS:
            if getattr(cfg, key) != getattr(cfgs[0], key):
                raise ConfigError(
                    f"dqn.{key}: member {k} has {getattr(cfg, key)!r}, member 0 {getattr(cfgs[0], key)!r}; "
                    "members of one population share it (split them into populations)"
                )


def _col(values, dtype, device, dims: int = 1) -> torch.Tensor:
    """(K, 1, ..., 1) tensor of per-member values, broadcasting against (K, ...) with `dims` trailing dims."""
    return torch.tensor(values, dtype=dtype, device=device).view(-1, *([1] * dims))


def draw_seed(seed: int, device: torch.device) -> int:
    """The seed of member generator for `seed` on `device`: on the CPU `seed`, on CUDA the seed
    network.initial_weights derives from it (the draws of the single-network learner this one
    replaced, which seeded the global generators and then drew the weights: kept so that a fold's
    results did not change when it was replaced)."""
    if device.type == "cpu":
        return seed
    return int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(seed)))


class DQN:
    """K members' agents, index replay, networks and Adam, stacked (see the module doc)."""

    def __init__(self, data: DeviceData, cfgs: list[DQNConfig]):
        check_members(cfgs)
        self.data, self.cfgs, self.cfg = data, list(cfgs), cfgs[0]
        dev, K, E, S = data.device, len(cfgs), cfgs[0].num_envs, cfgs[0].buffer_steps
        self.K, self.E, self.S, self.B = K, E, S, cfgs[0].batch_size
        f32, i64 = torch.float32, torch.int64
        self.total_steps = cfgs[0].epochs * cfgs[0].steps_per_epoch
        self.fresh, self.carry = (data.returns, None) if cfgs[0].fill == "close" else (data.bar, data.gap)
        # --- state -----------------------------------------------------------------------
        self.generators = [torch.Generator(dev) for _ in cfgs]
        self.active = torch.ones(K, dtype=torch.bool, device=dev)
        # agents: bar, position, steps this episode
        self.t, self.position, self.ep_step = (torch.zeros(K, E, dtype=i64, device=dev) for _ in range(3))
        # the replay ring: row i % S holds collect step i
        self.replay = tuple(torch.zeros(K, S, E, dtype=d, device=dev) for d in (i64, i64, i64, f32, torch.bool))
        self.replay_t, self.replay_position, self.replay_action, self.replay_reward, self.replay_done = self.replay
        self.replay_steps, self.global_step = (torch.zeros(K, dtype=i64, device=dev) for _ in range(2))
        self.loss_sum, self.q_abs_max = torch.zeros(K, device=dev), torch.zeros(K, device=dev)
        cfg = cfgs[0]
        front = frontend.width(cfg.screen_t) if cfg.inputs == "ridge" else None  # one front end for all: the fold's
        self.q_network = QNetwork(K, data.n_inputs, cfg.hidden, cfg.depth, dev, front)
        self.target_network = QNetwork(K, data.n_inputs, cfg.hidden, cfg.depth, dev, front)
        self.params = self.q_network.params
        for p in self.params:
            p.requires_grad_(True)
        self.target_params = self.target_network.params
        self.optimizer = Adam(self.params, [c.lr for c in cfgs], [c.weight_decay for c in cfgs], self.active)
        self.structure = self.demo_table = None
        self.configure(cfgs)

    def configure(self, cfgs: list[DQNConfig]) -> bool:
        """Give the K slots these members' settings, in place (a captured graph keeps reading the
        same tensors). True if the step's structure changed with them (n_max, which members draw
        input noise): a graph captured before must be captured again."""
        check_members([self.cfg, *cfgs])  # (Trainer.configure keeps the number of members)
        self.cfgs, dev, f32, i64 = list(cfgs), self.data.device, torch.float32, torch.int64
        n_max, n_inputs = max(c.n_step for c in cfgs), self.data.n_inputs
        # inputs: ridge: noise on the clock only (the front end's predictions read clean)
        keep = frontend.clock_mask(n_inputs, dev) if self.cfg.inputs == "ridge" else torch.ones(n_inputs, device=dev)
        powers = [c.gamma ** torch.arange(c.n_step + 1, dtype=f32) for c in cfgs]  # gamma_k^j, j = 0..n_k
        # (K, 1...) tensors of the float32 (int64) values
        settings = {
            "eps_end": _col([c.eps_end for c in cfgs], f32, dev, 0),
            "eps_span": _col([c.eps_start - c.eps_end for c in cfgs], f32, dev, 0),
            "eps_decay_steps": _col([max(c.eps_decay * self.total_steps, 1.0) for c in cfgs], f32, dev, 0),
            "cost": _col([c.cost for c in cfgs], f32, dev),  # (K, 1)
            "episode_len": _col([c.episode_len for c in cfgs], i64, dev),
            "n": _col([c.n_step for c in cfgs], i64, dev),
            "discounts": pad_sequence(powers, batch_first=True).to(dev),  # (K, n_max + 1): zero past n_k
            "reward_scale": _col([c.reward_scale for c in cfgs], f32, dev),
            "huber_delta": _col([c.huber_delta for c in cfgs], f32, dev),
            # (K, 1, n_inputs): member k's noise std per input
            "noise_std": torch.stack([c.input_noise * keep for c in cfgs]).unsqueeze(1),
            "grad_clip": _col([c.grad_clip for c in cfgs], f32, dev, 0),
            "tau": _col([c.tau for c in cfgs], f32, dev, 0),
            "demo_weight": _col([c.demo for c in cfgs], f32, dev, 0),  # (K,)
            "demo_margin": _col([c.demo_margin for c in cfgs], f32, dev, 2),  # (K, 1, 1)
        }
        structure = (n_max, tuple(c.input_noise > 0 for c in cfgs), any(c.demo > 0 for c in cfgs))
        changed = structure != self.structure
        for name, value in settings.items():  # in place where the structure stays: a captured graph reads them
            if changed:
                setattr(self, name, value)
            else:
                getattr(self, name).copy_(value)
        self.structure, self.n_max = structure, n_max
        if changed:  # (n_bars, 3) int8, the fold's demonstrations (one rule: cost, fill, screen_t are shared)
            self.demo_table = torch.ones(self.data.n_bars, 3, dtype=torch.int8, device=dev) if structure[2] else None
        self.noisy = structure[1]  # the members that draw input noise
        self.warmup = [c.n_step + 1 for c in cfgs]  # collect steps before a member's first update
        self.optimizer.configure([c.lr for c in cfgs], [c.weight_decay for c in cfgs])
        return changed

    # --- random draws: member k from its own generator ------------------------------------
    def _draw(self, fn, members=None) -> torch.Tensor:
        """stack of fn(generator_k) over the members (zeros of the same shape where `members[k]` is False)."""
        out = [fn(g) if members is None or members[k] else None for k, g in enumerate(self.generators)]
        like = next(o for o in out if o is not None)
        return torch.stack([o if o is not None else torch.zeros_like(like) for o in out])

    def _rand(self, n: int, members=None) -> torch.Tensor:
        return self._draw(lambda g: torch.rand(n, generator=g, device=self.data.device), members)

    def _randint(self, low: int, high: int, n: int, members=None) -> torch.Tensor:
        return self._draw(lambda g: torch.randint(low, high, (n,), generator=g, device=self.data.device), members)

    # --- agents and replay ---------------------------------------------------------------
    def _random_starts(self, members=None) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.data.bounds[0], self.data.bounds[1]
        span = (end - 1 - start).to(torch.float32)
        u = self._rand(self.E, members)
        t = start + (u * span).to(torch.int64).clamp_max(end - 2 - start)
        return t, self._randint(-1, 2, self.E, members)

    def epsilon(self) -> torch.Tensor:
        """(K, 1) each member's exploration rate: linear from eps_start to eps_end over eps_decay of all steps."""
        frac = (1.0 - self.global_step.to(torch.float32) / self.eps_decay_steps).clamp(0.0, 1.0)
        return (self.eps_end + self.eps_span * frac).unsqueeze(1)

    @torch.no_grad()
    def collect(self, members=None) -> None:
        """One epsilon-greedy step of every member's agents into its replay.
        `members` (host list of bools): only those step; the others draw nothing, change nothing."""
        t, position = self.t.clone(), self.position.clone()
        q = self.q_network(self.data.states(t), position)  # (K, E, 3)
        explore = self._rand(self.E, members) < self.epsilon()
        random_action = self._randint(0, N_ACTIONS, self.E, members)
        action = torch.where(explore, random_action, q.argmax(2))
        # --- the env step: the new position's return at the fill, less the cost of the change;
        # an episode ends after episode_len bars or at the train range's end, then a random restart
        new_position = action - 1
        reward = new_position * self.fresh[t] - self.cost * (new_position - position).abs()
        if self.carry is not None:
            reward = reward + position * self.carry[t]
        ep_step = self.ep_step + 1
        done = (ep_step >= self.episode_len) | (t + 1 >= self.data.bounds[1] - 1)
        t0, p0 = self._random_starts(members)
        keep = None if members is None else torch.tensor(members, device=t.device).unsqueeze(1)  # (K, 1)
        news = (torch.where(done, t0, t + 1), torch.where(done, p0, new_position), ep_step.masked_fill(done, 0))
        for state, new in zip((self.t, self.position, self.ep_step), news):
            state.copy_(new if keep is None else torch.where(keep, new, state))
        # --- the replay write: row steps_k % S of member k (indices into the data, not states)
        row = (self.replay_steps % self.S).view(-1, 1, 1).expand(-1, 1, self.E)  # (K, 1, E)
        for buf, value in zip(self.replay, (t, position, action, reward, done)):
            value = value.unsqueeze(1)
            if keep is not None:
                value = torch.where(keep.unsqueeze(2), value, buf.gather(1, row))
            buf.scatter_(1, row, value)
        self.replay_steps.add_(1 if keep is None else keep.squeeze(1).to(torch.int64))

    def sample_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, B) uniform (step, env) pairs of each member's replay, among the rows whose n-step
        return is complete (the newest n_k rows are not yet)."""
        hi = (self.replay_steps.unsqueeze(1) - self.n).expand(-1, 1)  # (K, 1)
        lo = (self.replay_steps.unsqueeze(1) - self.S).clamp_min(0)
        u = self._rand(self.B)
        step = lo + (u * (hi - lo + 1).to(torch.float32)).to(torch.int64).clamp_max(hi - lo)
        return step, self._randint(0, self.E, self.B)

    def n_step_batch(self, step: torch.Tensor, env: torch.Tensor):
        """The n-step transitions of (step, env), per member over n_max columns, column j kept only
        where j < n_k and no episode ended before it: (t, position, action, discounted return,
        next t, next position, gamma^k), each (K, B)."""
        K = self.K
        offsets = torch.arange(self.n_max, device=step.device)
        rows = (step.unsqueeze(2) + offsets) % self.S  # (K, B, n_max)
        envs = env.unsqueeze(2).expand_as(rows)
        member = torch.arange(K, device=step.device).view(K, 1, 1).expand_as(rows)
        reward, done = self.replay_reward[member, rows, envs], self.replay_done[member, rows, envs]
        # column j alive: no episode ended in columns < j, i.e. j <= the first done column (a
        # cumprod over n_max columns is the same 0/1 numbers, but a slow scan kernel on CUDA)
        first_done = torch.where(done.any(2), done.to(torch.uint8).argmax(2), self.n_max).unsqueeze(2)
        keep = ((offsets <= first_done) & (offsets < self.n.unsqueeze(2))).to(torch.float32)  # (K, B, n_max)
        return_n = (reward * keep * self.discounts[:, None, : self.n_max]).sum(2)
        k = keep.sum(2).to(torch.int64)  # (K, B) steps included, 1..n_k
        last_row = rows.gather(2, (k - 1).unsqueeze(2)).squeeze(2)
        m = member[..., 0]
        t0, position, action = (buf[m, rows[..., 0], env] for buf in self.replay[:3])
        next_position = self.replay_action[m, last_row, env] - 1
        return t0, position, action, return_n, t0 + k, next_position, self.discounts.gather(1, k)

    # --- learning ------------------------------------------------------------------------
    def td_loss(self, step: torch.Tensor, env: torch.Tensor, noise):
        """(K,) Huber TD losses and (K,) max |Q| of the batch: Double DQN (the online network picks
        the next action, the target network values it), plus the demonstration margin loss."""
        t, position, action, return_n, next_t, next_position, discount = self.n_step_batch(step, env)
        B = t.shape[1]
        market = self.data.states(torch.cat([t, next_t], 1))  # (K, 2B, n_inputs)
        if noise is not None:
            market = market + noise
        # the online network's Q of the next states only picks an action: computed without a graph,
        # so the backward runs over the B rows the loss reads, not 2B (half of them zero gradient)
        q = self.q_network(market[:, :B], position)  # (K, B, 3)
        with torch.no_grad():
            next_action = self.q_network(market[:, B:], next_position).argmax(2, keepdim=True)
            next_q = self.target_network(market[:, B:], next_position).gather(2, next_action).squeeze(2)
            td_target = return_n * self.reward_scale + discount * next_q
        q_sa = q.gather(2, action.unsqueeze(2)).squeeze(2)  # (K, B)
        # F.huber_loss's formula with a per-member delta (same forward and gradient, element by element)
        z, delta = (q_sa - td_target).abs(), self.huber_delta
        loss = torch.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)).mean(1)
        if self.demo_table is not None:  # DQfD's margin toward the rule's move (weight 0: adds exactly 0)
            expert = self.demo_table[t, position + 1].long()  # (K, B)
            loss = loss + self.demo_weight * demo.margin_loss(q, expert, self.demo_margin)
        return loss, q.detach().abs().amax((1, 2))

    def learn(self) -> None:
        """One gradient step of every member; masked members keep their state."""
        step, env = self.sample_indices()
        noise = None
        if any(self.noisy):  # members without noise draw none (as alone) and add 0
            shape = (2 * self.B, self.data.n_inputs)
            noise = self.noise_std * self._draw(
                lambda g: torch.randn(shape, generator=g, device=step.device), self.noisy
            )
        loss, q_max = self.td_loss(step, env, noise)
        for p in self.params:
            p.grad = None
        loss.sum().backward()  # members are independent: d sum / d loss_k = 1
        clip_grad_norms_(self.params, self.grad_clip)
        self.optimizer.step()
        with torch.no_grad():
            weight = self.tau * self.active  # soft target update; 0: target unchanged
            for tp, p in zip(self.target_params, self.params):
                tp.lerp_(p, weight.view(-1, *([1] * (p.ndim - 1))))
            self.loss_sum.add_(torch.where(self.active, loss.detach(), 0.0))
            self.q_abs_max.copy_(torch.where(self.active, torch.maximum(self.q_abs_max, q_max), self.q_abs_max))

    # --- what the trainer calls ------------------------------------------------------------
    def begin(self, seeds: list[int]) -> None:
        """Fresh weights (each from its seed, network.initial_weights), Adam, replay and agents,
        all members active, with inputs: ridge the fold's front end (fitted on its train slice, one
        for all members); then each member's n_k + 1 warm-up collect steps."""
        dev = self.data.device
        for g, seed in zip(self.generators, seeds):
            g.manual_seed(draw_seed(seed, dev))
        fresh = [initial_weights(self.q_network.width, self.cfg.hidden, self.cfg.depth, seed) for seed in seeds]
        self.q_network.load_members(fresh)
        self.target_network.load_members(fresh)
        if self.q_network.front:  # the fold's, in place (a captured CUDA graph keeps reading the same tensors)
            weight, bias = frontend.fit(
                self.data, self.data.fold, self.cfg.fill, screen_t=self.cfg.screen_t, cost=self.cfg.cost
            )
            for net in (self.q_network, self.target_network):
                net.front_w.copy_(weight)
                net.front_b.copy_(bias)
        if self.demo_table is not None:  # the fold's demonstrations
            self.demo_table.copy_(demo.fit(self.data, self.data.fold, self.cfg.cost, self.cfg.fill, self.cfg.screen_t))
        self.active.fill_(True)
        self.optimizer.reset()
        for x in (self.replay_steps, self.global_step, self.ep_step):
            x.zero_()
        self.reset_epoch_stats()
        for state, start in zip((self.t, self.position), self._random_starts()):
            state.copy_(start)
        w_max = max(self.warmup)
        for i in range(w_max):  # member k collects in the last warmup_k of these rounds
            self.collect([i >= w_max - w for w in self.warmup])

    def step(self) -> None:
        self.collect()
        for _ in range(self.cfg.updates_per_step):
            self.learn()
        self.global_step.add_(self.active.to(torch.int64))

    def epoch_stats(self) -> torch.Tensor:
        """(K, 3): summed loss, max |Q|, epsilon of each member."""
        return torch.stack([self.loss_sum, self.q_abs_max, self.epsilon().squeeze(1)], 1)

    def reset_epoch_stats(self) -> None:
        self.loss_sum.zero_()
        self.q_abs_max.zero_()
