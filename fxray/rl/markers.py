"""The marker a fold the learner abstained on leaves in its checkpoint folder (torch-free).

dqn.abstain: a fold whose checked screen keeps no input is not trained and its policy is flat
(fxray.rl.trainer.flat_fold). With a checkpoint folder it writes no weights but
fold<k>.abstained.json (the config, the fold, its val and test), so that readers of the folder
(the sweep's vote, fxray export) know the fold said "flat" rather than lost its weights.
"""

from __future__ import annotations

from pathlib import Path

ABSTAINED = ".abstained.json"


def marker(folder, k: int) -> Path:
    """The marker's path for fold k of a checkpoint folder."""
    return Path(folder) / f"fold{k}{ABSTAINED}"


def abstained(folder, k: int) -> bool:
    """Whether fold k of a checkpoint folder is a fold the learner abstained on."""
    return marker(folder, k).exists()


def abstained_folds(folder) -> tuple[int, ...]:
    """Every fold of a checkpoint folder that the learner abstained on, in order."""
    return tuple(sorted(int(p.name[4 : -len(ABSTAINED)]) for p in Path(folder).glob(f"fold*{ABSTAINED}")))
