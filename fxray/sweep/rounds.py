"""A round's state from fxray's own records, never from Tune's pickles.

    unfinished, errored = round_state(storage, sweep)   # counts of the round's trials
    plan = resume_plan(storage, sweep, limits) # what a resumed round runs again, and what it ends at once

The records (all written by fxray, all plain text, nothing that executes):

    sweep.json     rounds: name, trials (the budget), seed, done
    optuna.journal the study "fxray": every trial the searcher asked for, with user attrs
                   fxray.trial_id (the trial's id everywhere: folds.jsonl, MLflow, checkpoints)
                   and fxray.round; RUNNING = not told a value yet
    folds.jsonl    every fold the driver received (trial_id, fold, score, ...), once
    events.jsonl   trial_end (trial_id, status FINISHED|FAILED, folds_done), sweep_end

A resumed round starts a fresh Tuner (fxray.sweep.search.StudySearch): the round's RUNNING
trials run again with their configs and ids, each after its last fold in folds.jsonl;
then the rest of the round's budget is sampled from the study. Tune's own directories
(tune/session-N) are logs: nothing reads them back.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

STUDY = "fxray"  # the Optuna study's name in <storage>/optuna.journal
STUDY_FILE = "optuna.journal"  # Optuna's journal storage: one JSON operation a line, appended
TRIAL_ATTR, ROUND_ATTR = "fxray.trial_id", "fxray.round"


def journal(path: Path):
    """Optuna's JournalStorage on a file. Not SQLite: its asks re-read every RUNNING trial, so a
    round's 64 asks took ~4 s (the journal: ~0.3 s). One driver writes a run directory (its lock):
    a lock file 3 s old is one a kill left, and is broken."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    return JournalStorage(JournalFileBackend(str(path), JournalFileOpenLock(str(path), grace_period=3)))


def load_study(storage: Path, sampler=None):
    """The sweep's study, created if absent: in a file of its own, renamed into place, so that
    the journal exists only with its study in it, whenever a kill comes."""
    import optuna

    path = Path(storage) / STUDY_FILE
    if not path.exists():
        part = path.with_name(f"{STUDY_FILE}.part")  # one sweep per run directory: no one else writes it
        for stale in (part, part.with_name(f"{part.name}.lock")):
            stale.unlink(missing_ok=True)
        optuna.create_study(study_name=STUDY, storage=journal(part), direction="maximize")
        part.replace(path)
    return optuna.load_study(study_name=STUDY, storage=journal(path), sampler=sampler)


def config_key(config: dict) -> str:
    """A sampled config as text, to find it again in --same-trials' fold limits."""
    return json.dumps(config, sort_keys=True)


def fold_limits(same: dict | None) -> dict[str, int]:
    """{config key: folds to train} for fold_trial, from read_same_trials' list ({}: no --same-trials)."""
    limits: dict[str, int] = {}
    for sampled, n in same["trials"] if same else []:
        limits.setdefault(config_key(sampled), n)  # an exact duplicate config: its first length
    return limits


def trial_id_of(number: int) -> str:
    """The fxray id of the study's trial `number` (stable: it survives any resume)."""
    return f"{number:04d}"


def read_jsonl(path: Path, needle: str = "") -> list[dict]:
    """The records of a JSON-lines file on the lines that hold `needle` (a torn last line, from a
    kill mid-write, is skipped)."""
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            if needle in line:  # cheap: skips most lines of a search without parsing them
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def trial_ends(storage: Path) -> dict[str, dict]:
    """{trial_id: its last trial_end event}."""
    return {e["trial_id"]: e for e in read_jsonl(Path(storage) / "events.jsonl") if e.get("kind") == "trial_end"}


def done_folds(storage: Path, trial_id: str) -> list[dict]:
    """The folds.jsonl records of a trial, fold 0.. in order, up to its first missing fold
    (what it has done: a resumed or retried trial continues after them)."""
    by_fold = {}
    for rec in read_jsonl(Path(storage) / "folds.jsonl", json.dumps(trial_id)):
        if rec.get("trial_id") == trial_id:
            by_fold.setdefault(rec["fold"], rec)
    out = []
    while len(out) in by_fold:
        out.append(by_fold[len(out)])
    return out


def round_trials(study, name: str) -> list:
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(ROUND_ATTR) == name]


def round_state(storage: Path, sweep: dict) -> tuple[int, int]:
    """(unfinished, errored) trials of the round: errored ones are RUNNING in the study with a
    FAILED last event (--resume retries them); the unfinished are the rest of the budget but
    those that ended FINISHED (a told trial whose end event a kill lost is unfinished:
    resume_plan writes it)."""
    import optuna

    rnd = sweep["rounds"][-1]
    finished = errored = 0
    if (Path(storage) / STUDY_FILE).exists():
        ends = trial_ends(storage)
        for t in round_trials(load_study(storage), rnd["name"]):
            end = ends.get(t.user_attrs[TRIAL_ATTR], {}).get("status")
            if t.state == optuna.trial.TrialState.RUNNING:
                errored += end == "FAILED"
            else:
                finished += end == "FINISHED"
    return rnd["trials"] - finished - errored, errored


@dataclass
class ResumePlan:
    resumed: list[tuple[int, str, dict]]  # (study number, trial id, sampled config): to run again
    ended: list[str]  # trials whose records say they are done: ended here, not run again
    n_new: int  # trials still to sample from the study


def resume_plan(storage: Path, sweep: dict) -> ResumePlan:
    """Make the study and the event log agree about the round, and say what is left to run.

    A RUNNING trial whose folds.jsonl shows it done (every fold it trains: all of them, or its
    --same-trials length; or a diverged last fold) is told its last score; a told trial without
    its trial_end event gets one; both are then ended (the MLflow writer closes their runs)."""
    import optuna

    from fxray.track.writer import append_event

    rnd, n_folds = sweep["rounds"][-1], len(sweep["folds"])
    limits = fold_limits(rnd.get("same_trials"))
    if not (Path(storage) / STUDY_FILE).exists():
        return ResumePlan([], [], rnd["trials"])
    plan = ResumePlan([], [], 0)
    study = load_study(storage)
    ends = trial_ends(storage)
    mine = round_trials(study, rnd["name"])
    for t in mine:
        tid = t.user_attrs[TRIAL_ATTR]
        folds = done_folds(storage, tid)
        if t.state == optuna.trial.TrialState.RUNNING:
            over = folds and (
                folds[-1]["status"] == "diverged" or len(folds) >= limits.get(config_key(t.params), n_folds)
            )
            if not over:
                plan.resumed.append((t.number, tid, dict(t.params)))
                continue
            study.tell(t.number, folds[-1]["score"])
        if ends.get(tid, {}).get("status") != "FINISHED":
            append_event(storage, kind="trial_end", trial_id=tid, status="FINISHED", folds_done=len(folds))
            plan.ended.append(tid)
    plan.n_new = max(rnd["trials"] - len(mine), 0)
    return plan


def trials_started(storage: Path) -> int:
    """Every trial the study ever started, in any state (the N of the Deflated Sharpe Ratio:
    each was a chance to get lucky, whether ASHA stopped it, it failed or it finished)."""
    import optuna

    waiting = optuna.trial.TrialState.WAITING  # enqueued (--same-trials), not started
    return sum(t.state != waiting for t in load_study(storage).get_trials(deepcopy=False))
