"""Optuna's TPE as Tune's searcher, keyed by fxray's own trial ids, resumable from the study.

    searcher = StudySearch(storage, space, seed, round_name, plan.resumed, plan.n_new)

Unlike ray.tune.search.optuna.OptunaSearch (whose state Tune pickles, and unpickles on
`Tuner.restore`), everything this searcher knows is in the Optuna RDB study: a trial it
asks for is named at once (user attrs fxray.trial_id, fxray.round), its config travels in
the Tune config with that id (TRIAL_KEY), and it is told its value when Tune ends it. So a
round interrupted in any way is resumed by a fresh searcher over the same study: the
round's RUNNING trials first (same configs, same ids), then new samples (TPE sees every
trial told so far). Nothing of it is ever saved by or restored from Tune.

A trial that errors stays RUNNING (not told): `--resume` runs it again under its id.

With `ahead` (one worker training populations, no ASHA rung before the last fold) new trials
are asked a population at a time, their folds queued on the worker in one call, and handed to
Tune in the order the worker trains them (`soonest`): Tune's few trial processes collect trials
as they are trained, and trained trials do not queue behind one that is trained last.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ray.tune.search import Searcher

from fxray.sweep.rounds import ROUND_ATTR, TRIAL_ATTR, load_study, trial_id_of

TRIAL_KEY = "fxray_trial_id"  # the trial's id inside its Tune config (not a config field)


def split_config(config: dict) -> tuple[str, dict]:
    """A Tune config -> (fxray trial id, the sampled config)."""
    return config[TRIAL_KEY], {k: v for k, v in config.items() if k != TRIAL_KEY}


class StudySearch(Searcher):
    def __init__(self, storage: Path, space: dict, seed: int, round_name: str, resumed: list, n_new: int, ahead=None):
        super().__init__(metric="score", mode="max")
        self.storage, self.space, self.seed, self.round_name = Path(storage), space, seed, round_name
        self.resumed, self.n_new = list(resumed), n_new  # (study number, trial id, sampled config): run first
        # fxray.sweep.tuner.Ahead, or None; the new trials asked ahead and not handed to Tune yet
        self.ahead, self.next = ahead, []
        self.live: dict[str, int] = {}  # Tune trial id -> study number

    @functools.cached_property
    def study(self):
        import optuna

        return load_study(self.storage, optuna.samplers.TPESampler(seed=self.seed))

    def __getstate__(self):  # Tune pickles its searcher into its own files: no live database handle
        return {k: v for k, v in self.__dict__.items() if k not in ("study", "ahead")}

    def suggest(self, trial_id: str):
        if self.resumed:
            number, tid, params = self.resumed.pop(0)
        elif self.next or self.n_new > 0:
            if not self.next:
                self.next = [self.ask_new() for _ in range(min(self.ahead.size if self.ahead else 1, self.n_new))]
                self.n_new -= len(self.next)
                if self.ahead:  # their folds train on the worker before their processes ask for them
                    self.ahead.queue([(tid, params) for _, tid, params in self.next])
            number, tid, params = self.next.pop(self.soonest())
        else:
            return Searcher.FINISHED
        self.live[trial_id] = number
        return {**params, TRIAL_KEY: tid}

    def soonest(self) -> int:
        """The index in `next` of the trial whose folds the worker will have trained first (those it
        has: the first), so that Tune's few processes collect trials as they are trained and none
        waits long for a trial trained last (in ask order without `ahead`, or when the worker cannot
        say: a restarted one lost its queue, and each trial's own calls train its folds)."""
        try:
            due = self.ahead.pending() if self.ahead else {}
        except Exception:  # noqa: BLE001 - a worker Ray is restarting
            due = {}
        return min(range(len(self.next)), key=lambda i: (*due.get(self.next[i][1], (0, 0)), i))

    def ask_new(self) -> tuple[int, str, dict]:
        """A new trial of the study, named at once (a kill from here on leaves a trial a resume
        finds and runs again): (study number, trial id, sampled config)."""
        trial = self.study.ask(fixed_distributions=self.space)
        tid, params = trial_id_of(trial.number), dict(trial.params)
        trial.set_user_attr(TRIAL_ATTR, tid)
        trial.set_user_attr(ROUND_ATTR, self.round_name)
        return trial.number, tid, params

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        number, score = self.live.pop(trial_id, None), (result or {}).get("score")
        # an errored trial stays RUNNING: --resume runs it again; one that reported nothing this
        # session (Tune stopped it first) is not told
        if number is not None and score is not None and not error:
            self.study.tell(number, float(score))

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        """Nothing: the study is the searcher's state, and Tune's copy would never be read back
        (Tune's default tries save(), which a Searcher does not implement, and warns on every
        sweep); save() and restore() stay Searcher's (NotImplementedError)."""
