"""The Q-network's inputs with `dqn.inputs: ridge`: a supervised front end fitted per fold.

With `inputs: raw` (the default) the Q-network reads the fold's 50 normalised inputs. With
`inputs: ridge` it reads 7 (11 with a screen, `width`): the ridge regression's predictions
of the next 5, 20 and 60 bars' return from the market inputs (every input but the clock),
fitted on the fold's train slice only and normalised there, and the 4 clock inputs as they
are. The least-squares fit finds a weak linear edge among 46 inputs from the whole train slice
at once; the Q-learning then has a low-dimensional state in which to learn when to hold, enter
and leave, and in which hours.

With a screen (`dqn.screen_t` > 0) the forecasts read the inputs it keeps alone, and 4 more
rows pass on, as they are, the inputs of the products of two inputs it keeps (an edge
nonlinear in the inputs: an interaction, a sign set by a regime, a level of |x|), which the
network learns to weigh beside the screened rule's demonstrations.

The front end is an affine map of the normalised inputs z, u = A z + c (A (width, 50), c (width,)),
set in place at each fold's start (no look-ahead: A and c are made of the train slice's
inputs and returns only). Composed with the network's first layer it is a plain 50-input
layer, W1 (A z + c) + b1 = (W1 A) z + (W1 c + b1): a checkpoint stores the network so
(QNetwork.state), and exports and the live policy read a plain network.
"""

from __future__ import annotations

import torch

from fxray.data.folds import Fold
from fxray.data.schema import CALENDAR_INDICES
from fxray.eval import baselines

HORIZONS = (5, 20, 60)  # bars ahead the front end's ridge predictions look
N_FRONT = len(HORIZONS) + len(CALENDAR_INDICES)  # the Q-network's inputs with inputs: ridge and no screen
SLOTS = 4  # with a screen: inputs of its product terms the Q-network reads as they are (rows N_FRONT..)


def width(screen_t: float) -> int:
    """The front end's outputs (the Q-network's first-layer inputs) with inputs: ridge."""
    return N_FRONT + (SLOTS if screen_t > 0 else 0)


def fit(
    data, fold: Fold, fill: str, regressors: torch.Tensor | None = None, screen_t: float = 0.0, cost: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A (N_FRONT, n_inputs), c (N_FRONT,)) float32 on the data's device for `fold`'s train
    slice: rows 0-2 the ridge predictions (fxray.eval.baselines.ridge_gram, the supervised
    baseline's penalty) of the next-h-bar fresh return from the non-clock inputs, scaled to
    mean 0 and std 1 over the train slice; rows 3-6 pick the clock inputs. `data.set_fold(fold)`
    must have run (the inputs' normalisation is the train slice's). `regressors` (n_inputs,)
    bool: the inputs the ridge may use instead of the non-clock ones (scripts/learner_grid.py's
    diagnostics; not with a screen). `screen_t` > 0: only the market inputs the checked screen
    keeps at `cost` (`screened_inputs`); with none kept, the prediction rows read 0. With a
    screen, rows N_FRONT.. (SLOTS of them) pick the inputs of its product terms, first SLOTS in
    its order (the rest read 0): a product, a sign or a level that no forecast row can carry,
    left for the Q-network (an MLP) to weigh, with the screened rule's moves as its
    demonstrations (fxray.rl.demo)."""
    if screen_t > 0 and regressors is not None:
        raise ValueError("frontend.fit: regressors or screen_t > 0, not both (the screen chooses the regressors)")
    a, b = fold.train
    window = data.window(fold.train, fill)  # the train bars that have a next bar, and their fresh returns
    z = data.states(torch.arange(a, b - 1, device=data.device)).double()
    market = clock_mask(data.n_inputs, data.device) == 0 if regressors is None else regressors
    raw = []
    if screen_t > 0:
        terms = screened_inputs(data, fold, cost, fill, screen_t)
        market = torch.zeros_like(market)
        market[terms.linear_inputs()] = True
        raw = terms.nonlinear_inputs()[:SLOTS]
    X = z[:, market]
    Y = torch.stack([baselines.forward_sum(window.fresh, h) for h in HORIZONS], 1)  # (n, 3)
    W = torch.linalg.solve(baselines.ridge_gram(X), X.T @ Y)  # (k, 3): one solve for every horizon (k = 0: (0, 3))
    pred = X @ W
    sd = pred.std(0)
    scale = torch.where(sd > 1e-12, 1.0 / sd, torch.zeros_like(sd))  # no signal to scale: the row reads 0
    rows = width(screen_t)
    A = torch.zeros(rows, data.n_inputs, dtype=torch.float64, device=data.device)
    A[: len(HORIZONS), market] = (W * scale).T
    c = torch.cat((-pred.mean(0) * scale, torch.zeros(rows - len(HORIZONS), dtype=torch.float64, device=data.device)))
    A[torch.arange(len(HORIZONS), N_FRONT), list(CALENDAR_INDICES)] = 1.0
    A[torch.arange(N_FRONT, N_FRONT + len(raw)), raw] = 1.0
    return A.float(), c.float()


def screened_inputs(data, fold: Fold, cost: float, fill: str, screen_t: float) -> baselines.Terms:
    """The terms of the market inputs (every input but the clock: each input, each product of
    two) that the checked screen at `screen_t` keeps on `fold`'s train slice
    (fxray.eval.baselines.checked_screen: White's robust next-bar t, and the screened rule must
    earn at `cost` on the slice's held-out tail). The
    front end, the demonstrator (fxray.rl.demo) and the "screened" reference rule all read it.
    It depends on the fold, the cost, the fill and screen_t only: computed once per data
    (`data.screens`), as the reference rules are. `data.set_fold(fold)` must have run."""
    key = (repr(fold.as_dict()), cost, fill, screen_t)
    if key not in data.screens:
        a, b = fold.train[0], fold.train[1] - 1  # train bars with a next bar
        window = data.window(fold.train, fill)
        x = data.states(torch.arange(a, b, device=data.device))
        market = torch.nonzero(clock_mask(data.n_inputs, data.device) == 0).flatten()
        data.screens[key] = baselines.checked_screen(x, window.fresh, cost, screen_t, market, carry=window.carry)
    return data.screens[key]


def clock_mask(n_inputs: int, device) -> torch.Tensor:
    """(n_inputs,) 1.0 on the clock inputs, 0 elsewhere: with inputs: ridge, the only inputs
    that input noise blurs (the ridge predictions are read clean; noise on the market inputs
    would reach them through A)."""
    mask = torch.zeros(n_inputs, device=device)
    mask[list(CALENDAR_INDICES)] = 1.0
    return mask
