"""Double DQN: the Q-network, the two hot functions `collect` and `learn`, and `DQN`,
the fxray.rl.algorithm.Algorithm the trainer runs.

Both functions only touch persistent tensors in place and never read a value back
to the host, so the trainer can run them eagerly or capture them once in a CUDA
graph and replay them: the maths is the same line for line (tests/test_gpu.py
compares the two; tests/test_trainer.py checks the update against a reference).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxray.rl import demo, frontend
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.env import TradingEnv
from fxray.rl.optim import Adam
from fxray.rl.replay import Replay

N_ACTIONS = 3  # short, flat, long; new position = action - 1


class QNetwork(nn.Module):
    """MLP over [normalised market inputs, one-hot position] -> Q for the 3 actions.

    The position one-hot enters the first layer as three columns of its weight
    (`position_embed`, (3, H)), so Q for all three positions of a bar costs one
    market projection plus three cheap adds (`q_all`, used by the backtest). The
    one-hot is applied as a (B, 3) @ (3, H) product, not an index: the backward of
    indexing with 3 distinct rows is a serialised scatter-add on CUDA (ms at B=8192).
    """

    def __init__(self, n_inputs: int, hidden: int, depth: int, dueling: bool, front: int | None = None):
        super().__init__()
        # front (dqn.inputs: ridge, fxray.rl.frontend): a fixed affine map of the inputs to
        # `front` features, set per fold, before the first layer; its buffers are not weights
        width = n_inputs if front is None else front
        if front is not None:
            self.register_buffer("front_w", torch.zeros(front, n_inputs), persistent=False)
            self.register_buffer("front_b", torch.zeros(front), persistent=False)
        self.front = front is not None
        self.market_in = nn.Linear(width, hidden)
        self.position_embed = nn.Parameter(torch.randn(3, hidden) / (width + 3) ** 0.5)
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
        return self._q(self.market_in(self._front(market)) + one_hot @ self.position_embed)

    def q_all(self, market: torch.Tensor) -> torch.Tensor:
        """Q for every previous position: market (T, n_inputs) -> (T, 3 positions, 3 actions)."""
        h = self.market_in(self._front(market))  # (T, H)
        return self._q(h.unsqueeze(1) + self.position_embed)  # (T, 3, H) -> (T, 3, 3)

    def _front(self, market: torch.Tensor) -> torch.Tensor:
        return market @ self.front_w.T + self.front_b if self.front else market

    def plain_state(self) -> dict[str, torch.Tensor]:
        """The state_dict of the plain QNetwork (no front) that computes the same Q: the front
        folded into the first layer, W1 (A z + c) + b1 = (W1 A) z + (W1 c + b1)."""
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        return frontend.fold_in(state, self.front_w, self.front_b) if self.front else state


def initial_network(cfg: DQNConfig, n_inputs: int, seed: int) -> QNetwork:
    """A fresh QNetwork on the CPU, its weights drawn from `seed` (the same on every device).

    The draws run under torch.manual_seed of a seed derived from `seed`, inside a fork of
    the CPU generator only: the CPU generator is left as it was, the CUDA generators are
    left re-seeded with the derived seed (fxray.rl.population.draw_seed accounts for it)."""
    cpu_gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=cpu_gen)))
        return network(cfg, n_inputs)


def network(cfg: DQNConfig, n_inputs: int) -> QNetwork:
    """QNetwork of `cfg` (module-level, so a probe that swaps the class is used); with inputs:
    ridge its front end (fxray.rl.frontend), whose buffers each fold sets."""
    if cfg.inputs == "ridge":
        return QNetwork(n_inputs, cfg.hidden, cfg.depth, cfg.dueling, front=frontend.N_FRONT)
    return QNetwork(n_inputs, cfg.hidden, cfg.depth, cfg.dueling)


def epsilon(cfg: DQNConfig, step: torch.Tensor, total_steps: int) -> torch.Tensor:
    """Linear decay from eps_start to eps_end over eps_decay of all steps (device scalar)."""
    decay_steps = max(cfg.eps_decay * total_steps, 1.0)
    frac = (1.0 - step.to(torch.float32) / decay_steps).clamp(0.0, 1.0)
    return cfg.eps_end + (cfg.eps_start - cfg.eps_end) * frac


@torch.no_grad()
def collect(env: TradingEnv, q_network: QNetwork, replay: Replay, eps: torch.Tensor) -> None:
    """One epsilon-greedy step of every env, written to the replay."""
    t, position = env.t.clone(), env.position.clone()
    q = q_network(env.data.states(t), position)  # (B, 3)
    explore = torch.rand(env.num_envs, device=t.device) < eps
    random_action = torch.randint(0, N_ACTIONS, (env.num_envs,), device=t.device)
    action = torch.where(explore, random_action, q.argmax(1))
    reward, done = env.step(action)
    replay.add(t, position, action, reward, done)


class Learner:
    """Online and target networks, Adam, and the Double-DQN n-step update."""

    def __init__(self, cfg: DQNConfig, n_inputs: int, device):
        self.cfg, self.n_inputs = cfg, n_inputs
        self.q_network = network(cfg, n_inputs).to(device)
        self.target_network = network(cfg, n_inputs).to(device)
        # inputs: ridge: input noise on the clock only (the front end's predictions read clean)
        self.noise_keep = frontend.clock_mask(n_inputs, device) if cfg.inputs == "ridge" else None
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.target_network.requires_grad_(False)
        self.params = list(self.q_network.parameters())
        self.target_params = list(self.target_network.parameters())
        self.optimizer = Adam(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)  # fused, graph-safe on CUDA
        # Inductor fuses the loss's forward and backward into fewer kernels (compiled once,
        # on the first call; inside a CUDA graph capture its kernels are recorded like any other)
        self.loss_fn = torch.compile(self.td_loss) if cfg.compile else self.td_loss
        self.updates = torch.zeros((), dtype=torch.int64, device=device)
        # epoch accumulators, read once at epoch end
        self.loss_sum = torch.zeros((), device=device)
        self.q_abs_max = torch.zeros((), device=device)
        self.fresh = self.carry = None  # the env's return arrays, for all_actions, hold, rollout (set by DQN)
        self.demo_table = None  # with demo > 0: (n_bars, 3) the ridge rule's moves (set by DQN.begin)
        # the online network's forward over [s, s_next] in one pass where a step is bound by
        # launches (CUDA); in two where it is bound by flops (CPU): there the joint pass's
        # backward multiplies the next states' zero gradients too, 2/7 of a step's matmul flops
        self.joint_forward = torch.device(device).type == "cuda"

    def td_loss(self, data: DeviceData, replay: Replay, step: torch.Tensor, env: torch.Tensor, noise=None):
        """Huber TD loss of the batch (step, env) and max |Q| over it: the maths of an update
        (no randomness, no side effects: what `cfg.compile` hands to torch.compile; the input
        noise is drawn by `learn` and added to the states of the batch here: (2B, n_inputs))."""
        if self.cfg.update == "all_actions":
            return self.all_actions_loss(data, replay, step, env, noise)
        if self.cfg.update == "hold":
            return self.hold_loss(data, replay, step, env, noise)
        if self.cfg.update == "rollout":
            return self.rollout_loss(data, replay, step, env, noise)
        cfg = self.cfg
        t, position, action, return_n, next_t, next_position, discount = replay.n_step_batch(step, env)
        B = t.shape[0]
        # On CUDA one online forward over [s, s_next] (2B rows): at these sizes a step is bound
        # by kernel launches, not flops, so one pass of twice the rows is nearly free.
        market = data.states(torch.cat([t, next_t]))  # (2B, n_inputs)
        if noise is not None:  # the states and next states alike: a bar is never seen twice the same
            market = market + noise
        if self.joint_forward:
            q_both = self.q_network(market, torch.cat([position, next_position]))  # (2B, 3)
            q, q_next = q_both[:B], q_both[B:].detach()
        else:  # the next states without autograd: the backward's matmuls over B rows, not 2B
            q = self.q_network(market[:B], position)
            with torch.no_grad():
                q_next = self.q_network(market[B:], next_position)
        with torch.no_grad():  # Double DQN: online picks the next action, target evaluates it
            next_action = q_next.argmax(1, keepdim=True)
            next_q = self.target_network(market[B:], next_position).gather(1, next_action).squeeze(1)
            td_target = return_n * cfg.reward_scale + discount * next_q
        q_sa = q.gather(1, action.unsqueeze(1)).squeeze(1)
        loss = F.huber_loss(q_sa, td_target, delta=cfg.huber_delta)
        return loss + self.demo_loss(q, t, position), q.detach().abs().max()

    def demo_loss(self, q: torch.Tensor, t: torch.Tensor, position: torch.Tensor):
        """cfg.demo x the large-margin loss toward the ridge rule's move at the batch's states
        (fxray.rl.demo); 0 (a Python number: nothing computed) with demo 0."""
        if self.cfg.demo == 0:
            return 0.0
        expert = self.demo_table[t, position + 1].long()
        return self.cfg.demo * demo.margin_loss(q, expert, self.cfg.demo_margin)

    def all_actions_loss(self, data: DeviceData, replay: Replay, step: torch.Tensor, env: torch.Tensor, noise=None):
        """The 1-step Double-DQN loss of all three actions of each sampled state at once.

        The market does not react to the agent, so the reward and the next state of every
        action at (t, p) are known, not only of the action the agent took: p' = a - 1
        earns p' fresh[t] + p carry[t] - cost |p' - p| and leads to (t + 1, p'). Updating
        the three Q-values together ("action augmentation", Huang 2018, "Financial
        trading as a game") triples the information per sample and does not depend on
        what exploration happened to try. n_step is not used (the later actions of an
        n-step return would depend on the first): update 'hold' is the n-step form."""
        return self._every_action_loss(data, replay, step, env, noise, hold=1)

    def hold_loss(self, data: DeviceData, replay: Replay, step: torch.Tensor, env: torch.Tensor, noise=None):
        """all_actions with an n-step target: action a at (t, p) against the return of holding
        p' = a - 1 for n = n_step bars (known, as the 1-step reward is: holding costs nothing
        and earns p' r[t+k]), bootstrapped at (t + n, p'), n cut at the train range's end.

        Holding is one feasible policy for the n - 1 bars after t, so the target is a lower
        bound of Q*(t, p, a), as an uncorrected n-step return of any behaviour policy is; it
        carries the reward n bars back in one update, which the 1-step form needs n updates
        for. n_step 1 is all_actions, exactly."""
        return self._every_action_loss(data, replay, step, env, noise, hold=self.cfg.n_step)

    def rollout_loss(self, data: DeviceData, replay: Replay, step: torch.Tensor, env: torch.Tensor, noise=None):
        """all_actions with an n-step target of the greedy policy: after the first action, each
        of the three branches follows the online network's greedy action for n_step - 1 bars
        on the bars that followed (the market does not react to the agent, so this rollout is
        exact, not a model), then bootstraps Double-DQN. The three targets share the same
        future returns: where the branches come together their returns cancel in the
        contrast between actions, which is what the policy acts on. n_step 1 is all_actions,
        exactly."""
        return self._every_action_loss(data, replay, step, env, noise, hold=self.cfg.n_step, rollout=True)

    def _every_action_loss(self, data, replay, step, env, noise, hold: int, rollout: bool = False):
        row = step % replay.S
        t, position = replay.t[row, env], replay.position[row, env]  # (B,), (B,)
        market = data.states(t)
        if noise is not None:  # the sampled states only (the rows of `noise` past B are unused)
            market = market + noise[: t.shape[0]]
        q = self.q_network(market, position)  # (B, 3)
        with torch.no_grad():
            targets = self.rollout_targets if rollout else self.hold_targets
            td_target = targets(data, t, position, hold, q.dtype)
        loss = F.huber_loss(q, td_target, delta=self.cfg.huber_delta)
        return loss + self.demo_loss(q, t, position), q.detach().abs().max()

    def move_reward(self, t: torch.Tensor, previous: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The environment's reward of moving from `previous` to `new` at bars t (fxray.rl.env),
        broadcast: t (B,), previous (B, 1) or (B, 3), new (3,) or (B, 3) -> (B, 3)."""
        reward = new * self.fresh[t].unsqueeze(1) - self.cfg.cost * (new - previous).abs()
        if self.carry is not None:
            reward = reward + previous * self.carry[t].unsqueeze(1)
        return reward

    def hold_targets(self, data: DeviceData, t: torch.Tensor, position: torch.Tensor, hold: int, dtype):
        """(B, 3): each new position's target at (t, p) when held `hold` bars (1: the 1-step
        target), Double DQN (the online network picks the action at the bootstrap state, the
        target network values it). Bars t .. t+m are in the train range: m = min(hold,
        train_end - 1 - t), and the environment's bars t have t + 1 < train_end."""
        cfg = self.cfg
        new_position = self.q_network.positions.to(dtype)  # (3,) = a - 1
        reward = self.move_reward(t, position.to(dtype).unsqueeze(1), new_position)  # (B, 3)
        if hold == 1:
            m, discount = t.new_ones(()), cfg.gamma
        else:  # bars t+1 .. t+m-1 held: p' (gap + bar) = p' r of each, at no cost
            end = data.bounds[1]
            m = (end - 1 - t).clamp(1, hold)  # (B,)
            k = torch.arange(1, hold, device=t.device)  # (hold - 1,)
            alive = (k.unsqueeze(0) < m.unsqueeze(1)).to(dtype)  # (B, hold - 1)
            held = data.returns[(t.unsqueeze(1) + k).clamp_max(end - 1)]  # (B, hold - 1)
            held = (held * alive * cfg.gamma ** k.to(dtype)).sum(1, keepdim=True)  # (B, 1)
            reward = reward + new_position * held
            discount = (cfg.gamma ** m.to(dtype)).unsqueeze(1)  # (B, 1)
        market_next = data.states(t + m)  # (B, n_inputs)
        next_action = self.q_network.q_all(market_next).argmax(-1, keepdim=True)  # (B, 3 p', 1)
        next_q = self.target_network.q_all(market_next).gather(-1, next_action).squeeze(-1)  # (B, 3)
        return reward * cfg.reward_scale + discount * next_q

    def rollout_targets(self, data: DeviceData, t: torch.Tensor, position: torch.Tensor, n: int, dtype):
        """(B, 3): each first action's n-step target at (t, p) when the online network's greedy
        policy acts after it, Double-DQN at (t + m, the branch's position); m = min(n,
        train_end - 1 - t) as in hold_targets. No host sync: n is a Python int, the cut a mask."""
        cfg = self.cfg
        end = data.bounds[1]
        held = self.q_network.positions.to(dtype).expand(t.shape[0], N_ACTIONS)  # (B, 3): each branch's p'
        ret = self.move_reward(t, position.to(dtype).unsqueeze(1), held)  # (B, 3)
        m = (end - 1 - t).clamp(1, n)  # (B,) bars rolled, the first included
        for k in range(1, n):  # bar t + k: each branch's greedy move from the position it holds
            alive = (k < m).unsqueeze(1)  # (B, 1)
            tk = (t + k).clamp_max(end - 1)
            new = (self.greedy_moves(data, tk, held) - 1).to(dtype)
            ret = ret + alive * cfg.gamma**k * self.move_reward(tk, held, new)
            held = torch.where(alive, new, held)
        market_next = data.states(t + m)  # (B, n_inputs)
        rows = (held.long() + 1).unsqueeze(-1).expand(-1, -1, N_ACTIONS)  # (B, 3, 3): the branch's position
        next_action = self.q_network.q_all(market_next).gather(1, rows).argmax(-1, keepdim=True)  # (B, 3, 1)
        next_q = self.target_network.q_all(market_next).gather(1, rows).gather(-1, next_action).squeeze(-1)
        discount = (cfg.gamma ** m.to(dtype)).unsqueeze(1)  # (B, 1)
        return ret * cfg.reward_scale + discount * next_q

    def greedy_moves(self, data: DeviceData, t: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """(B, 3) action indices: the online network's greedy action at bars t (B,) from each
        branch's position held (B, 3)."""
        q = self.q_network.q_all(data.states(t))  # (B, 3 previous, 3 actions)
        return q.gather(1, (held.long() + 1).unsqueeze(-1).expand(-1, -1, N_ACTIONS)).argmax(-1)

    def learn(self, data: DeviceData, replay: Replay, step=None, env=None) -> None:
        """One gradient step on a replay batch (sampled unless (step, env) are given)."""
        cfg = self.cfg
        if step is None:
            step, env = replay.sample_indices(cfg.batch_size)
        noise = None
        if cfg.input_noise > 0:  # N(0, input_noise^2) on the normalised inputs (config: input_noise)
            noise = cfg.input_noise * torch.randn(2 * step.shape[0], data.n_inputs, device=step.device)
            if not cfg.noise_calendar:  # the clock left clean (dqn.noise_calendar: false)
                noise = noise * data.noise_mask
            if self.noise_keep is not None:  # inputs: ridge: the front end's predictions read clean
                noise = noise * self.noise_keep
        loss, q_max = self.loss_fn(data, replay, step, env, noise)
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
        fresh = initial_network(self.cfg, self.n_inputs, seed)
        with torch.no_grad():
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

    def set_front(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """The fold's front end (fxray.rl.frontend.fit) into both networks, in place."""
        frontend.load((self.q_network, self.target_network), weight, bias)


class DQN:
    """Agents in the train range, the index replay and the Learner: one fold's DQN state."""

    def __init__(self, data: DeviceData, cfg: DQNConfig):
        self.data, self.cfg = data, cfg
        self.env = TradingEnv(data, cfg.num_envs, cfg.episode_len, cfg.cost, cfg.fill)
        self.replay = Replay(cfg, cfg.num_envs, data.device)
        # the same (fused, graph-safe) Adam on every CUDA run, graphed or not
        self.learner = Learner(cfg, data.n_inputs, data.device)
        self.learner.fresh, self.learner.carry = self.env.fresh, self.env.carry
        self.params = self.learner.params
        self.global_step = torch.zeros((), dtype=torch.int64, device=data.device)
        self.total_steps = cfg.epochs * cfg.steps_per_epoch
        self.warmup = cfg.n_step + 1  # collect steps before the first update
        if cfg.demo > 0:  # filled in place by begin: a captured CUDA graph keeps reading this tensor
            self.learner.demo_table = torch.ones(data.n_bars, 3, dtype=torch.int8, device=data.device)

    def epsilon(self) -> torch.Tensor:
        return epsilon(self.cfg, self.global_step, self.total_steps)

    def begin(self, seed: int) -> None:
        """Fresh weights (and with inputs: ridge the fold's front end, fitted on its train
        slice), replay and agents; then fill n replay rows (no learning)."""
        self.learner.reset(seed)
        if self.cfg.inputs == "ridge":
            self.learner.set_front(
                *frontend.fit(self.data, self.data.fold, self.cfg.fill, screen_t=self.cfg.screen_t, cost=self.cfg.cost)
            )
        if self.cfg.demo > 0:  # the fold's demonstrations: the ridge rule fitted on its train slice
            table = demo.fit(self.data, self.data.fold, self.cfg.cost, self.cfg.fill, screen_t=self.cfg.screen_t)
            self.learner.demo_table.copy_(table)
        self.replay.reset()
        self.env.reset()
        self.global_step.zero_()
        for _ in range(self.warmup):
            collect(self.env, self.learner.q_network, self.replay, self.epsilon())

    def step(self) -> None:
        """One collect step of every env, then updates_per_step learner steps (no host sync)."""
        collect(self.env, self.learner.q_network, self.replay, self.epsilon())
        for _ in range(self.cfg.updates_per_step):
            self.learner.learn(self.data, self.replay)
        self.global_step.add_(1)

    def q_all(self, market: torch.Tensor) -> torch.Tensor:
        return self.learner.q_network.q_all(market)

    def epoch_stats(self) -> torch.Tensor:
        return torch.stack([self.learner.loss_sum, self.learner.q_abs_max, self.epsilon()])

    def reset_epoch_stats(self) -> None:
        self.learner.reset_accumulators()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The Q-network's weights, as a plain QNetwork's (a front end folded into its first layer)."""
        net = self.learner.q_network
        return net.plain_state() if net.front else net.state_dict()
