"""The run directory of a sweep: finding it, checking the flags against it, creating it.

    runs/<name>/sweep.json       experiment, profile, data path + hash, folds, base config,
                                 MLflow ids, rounds (what --resume and extensions run from)
    runs/<name>/experiment.yaml  the experiment file the sweep started with (its base: chain resolved)

Everything here runs before anything is started, and either refuses with one line
(`UsageError`, exit 2) or writes sweep.json atomically (`prepare_storage`, last of all). One
sweep at a time in a run directory: `with hold(storage, expected_sweep)` (an flock on
<storage>/.lock, below).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from pathlib import Path

import yaml

from fxray.data.atomic import atomic_path
from fxray.data.folds import FoldError, make_folds
from fxray.rl import experiment as expmod
from fxray.rl.config import make_config
from fxray.track.records import BASELINES_NAME


class UsageError(ValueError):
    """A bad flag combination or run directory state; one line, exit code 2."""


class NothingToResume(Exception):
    """--resume of a sweep whose last round finished: one line, exit code 0, nothing touched."""


def finished_at(storage: Path, rnd: dict) -> str:
    """When a round finished, as local time (sweeps before the `finished` field: results.json's mtime)."""
    t = rnd.get("finished")
    if t is None and (storage / "results.json").exists():
        t = (storage / "results.json").stat().st_mtime
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "an unrecorded time"


def locate(args, overrides) -> tuple[str, Path, dict | None]:
    """(experiment file, run directory, its sweep.json or None). A sweep that exists
    runs from its saved copy of the experiment file, so a resume is the same sweep."""
    storage = Path(args.storage).absolute() if args.storage else None
    sweep = read_sweep(storage) if storage else None
    if sweep is None:
        file = args.experiment or expmod.default_experiment()
        storage = storage or (Path("runs") / expmod.load(file, "gpu", overrides).name).absolute()
        sweep = read_sweep(storage)
    holder = held_by(storage)
    if holder is not None:  # first: what it holds is changing under us
        raise UsageError(refusal(storage, holder))
    if args.resume and sweep is None:
        raise UsageError(f"{storage}: no sweep to resume (no sweep.json); run without --resume")
    if sweep is None:
        return file, storage, None
    if (storage / "optuna.db").exists():  # an SQLite study: fxray before its journal
        raise UsageError(
            f"{storage / 'optuna.db'}: the study of an earlier fxray's sweep (SQLite), which this one "
            "cannot resume or extend: start a new sweep with --storage DIR"
        )
    check_logs(storage)
    if args.resume and sweep["rounds"][-1]["done"] and not args.same_trials:  # before Ray starts
        raise NothingToResume(
            f"nothing to resume: the sweep in {storage} finished at {finished_at(storage, sweep['rounds'][-1])} "
            f"(results: {storage / 'results.json'}; run without --resume to extend it)"
        )
    saved = storage / "experiment.yaml"
    if args.experiment:
        # a missing or bad file: its own error first; then the same settings, base: chain resolved
        if expmod.read_yaml(args.experiment) != expmod.read_yaml(saved):
            raise UsageError(
                f"{args.experiment}: differs from the file this sweep started with ({saved}); "
                "use --storage DIR for a new sweep"
            )
    if not args.resume and not sweep["rounds"][-1]["done"]:
        raise UsageError(
            f"{storage}: the last sweep was interrupted; pass --resume to finish it, or --storage DIR to start another"
        )
    return str(saved), storage, sweep


def same_trials(args, storage: Path, sweep: dict | None, overrides: dict) -> dict | None:
    """--same-trials RESULTS, read and checked against the flags; it sets the trials and
    (unless --seed) the training seed of the new sweep. None without the flag."""
    if not args.same_trials:
        return None
    if args.resume:
        raise UsageError("--same-trials: drop it with --resume (a resumed sweep runs what it started with)")
    if sweep is not None:
        raise UsageError(f"--same-trials starts a new sweep and {storage} holds one: pass --storage DIR")
    same = read_same_trials(args.same_trials)
    n = len(same["trials"])
    if args.trials not in (None, n):
        raise UsageError(
            f"--trials {args.trials}: --same-trials runs the trials of {args.same_trials} ({n}); drop --trials"
        )
    if args.profile not in ("auto", same["profile"]):
        raise UsageError(
            f"--profile {args.profile}: {args.same_trials} ran the {same['profile']} profile; drop --profile"
        )
    overrides["sweep.trials"] = n
    overrides.setdefault("sweep.seed", same["seed"])
    return same


def read_same_trials(path: str) -> dict:
    """What `--same-trials RESULTS` replays: a finished one-round sweep's trials, in the
    order they started there, each with the folds it trained there (ASHA's stops become
    fixed lengths), and what the new sweep must match to do the same work (profile,
    data, folds, base config). UsageError with one line naming the file otherwise."""
    try:
        res = json.loads(Path(path).read_text())
        trials, rounds = res["trials"], res["rounds"]
        order = sorted(trials, key=lambda t: (t["folds"][0]["timings"]["trial_start"] or 0, t["trial_id"]))
        same = [[t["sampled"], t["folds_done"]] for t in order]
        out = {
            "from": str(Path(path).absolute()),
            "trials": same,
            "profile": res["profile"],
            "seed": rounds[-1]["seed"],
            "data": res["data"],
            "folds": res["folds"],
            "base": res["base_config"],
        }
    except FileNotFoundError:
        raise UsageError(f"--same-trials {path}: no such file (a sweep's results.json)") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:  # JSON errors are ValueErrors
        raise UsageError(f"--same-trials {path}: not a sweep's results.json ({type(e).__name__}: {e})") from None
    if len(rounds) != 1:
        raise UsageError(
            f"--same-trials {path}: that sweep ran {len(rounds)} rounds with their own seeds; replay a one-round sweep"
        )
    if not same:
        raise UsageError(f"--same-trials {path}: no trial finished a fold there")
    return out


def check_same_work(same: dict, exp, folds: list[dict], content_hash: str, data_path) -> None:
    """--same-trials: the new sweep must train on what that sweep trained on (UsageError)."""
    where = f"--same-trials {same['from']}"
    if content_hash != same["data"]["content_hash"]:
        raise UsageError(
            f"{where}: ran on other data ({same['data']['path']}), not {data_path}: pass that file as --data"
        )
    for what, mine, theirs in (
        ("folds", folds, same["folds"]),
        ("dqn config", exp.config.as_dict(), make_config(same["base"], f"{where}: base_config").as_dict()),
        ("search space", sorted(exp.space()), sorted(same["trials"][0][0])),
    ):
        if mine != theirs:
            raise UsageError(
                f"{where}: not the same {what} as {exp.name} here ({exp.profile} profile): pass the --experiment it ran"
            )


ROUND_KEYS = {"sweep.trials": "--trials", "sweep.seed": "--seed"}  # what an extension round may set anew


def reuse_overrides(storage: Path, sweep: dict, given: dict, resume: bool) -> dict:
    """The overrides a sweep that exists runs with: those its first round stored (--set, --population,
    ...), so that a resumed or extended sweep searches the same space with the same ASHA and
    population; `given` (this command line's) may repeat them, never change them. An extension
    may set its round's trials and seed; a resume runs the round's own."""
    stored, rnd = sweep.get("overrides") or {}, sweep["rounds"][-1]
    for key, value in given.items():
        if key in ROUND_KEYS:
            field = key.split(".")[1]
            if resume and value != rnd.get(field):
                raise UsageError(
                    f"{ROUND_KEYS[key]} {value}: the interrupted round of {storage} runs {field} = {rnd.get(field)}; "
                    f"drop {ROUND_KEYS[key]} to resume it (or extend the sweep once it is done)"
                )
        # otherwise any change is refused (--name with the sweep's own experiment name is none)
        elif stored.get(key, "(not set)") != value and (key, value) != ("name", sweep.get("experiment")):
            raise UsageError(
                f"{key}={value}: the sweep in {storage} started with {key}={stored.get(key, '(not set)')}; "
                "a resumed or extended sweep keeps its settings: drop it, or pass --storage DIR for a new sweep"
            )
    keep = {k: v for k, v in given.items() if k in ROUND_KEYS and not resume}
    return {**stored, **keep}


def read_sweep(storage: Path) -> dict | None:
    """The run directory's sweep.json, None if there is none; UsageError if it is not one."""
    if storage.exists() and not storage.is_dir():
        raise UsageError(f"--storage {storage}: is a file, not a run directory; pass a directory")
    path = storage / "sweep.json"
    if not path.exists():
        return None
    try:
        sweep = json.loads(path.read_text())
        check_record(sweep)
    except (ValueError, KeyError, IndexError, TypeError, OSError) as e:  # JSON errors are ValueErrors
        raise UsageError(
            f"{path}: not a sweep's record ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "restore it, or pass --storage DIR for a new sweep"
        ) from None
    return sweep


def check_record(sweep) -> None:
    """What a resume reads of sweep.json, checked before anything starts (ValueError/KeyError/
    TypeError naming the key): a driver writes it whole (atomically), so anything else was edited."""
    if not isinstance(sweep, dict):
        raise TypeError(f"a JSON {type(sweep).__name__}, not a mapping")
    rounds = sweep["rounds"]
    if not isinstance(rounds, list) or not rounds:
        raise ValueError("rounds: must be a non-empty list")
    for i, r in enumerate(rounds):
        if not isinstance(r, dict):
            raise TypeError(f"rounds[{i}]: a JSON {type(r).__name__}, not a mapping")
        # what a round does not record is not checked (an old round's seed is the sweep's); JSON's
        # types are exact (a bool is no int)
        for key, kind in (("name", str), ("trials", int), ("seed", int), ("done", bool)):
            if key in r and type(r[key]) is not kind:
                raise ValueError(f"rounds[{i}].{key}: {r[key]!r} is not a {kind.__name__}")
        if "trials" in r and r["trials"] < 1:
            raise ValueError(f"rounds[{i}].trials: {r['trials']} is below 1")
        if "seed" in r and not 0 <= r["seed"] < 2**32:  # what Optuna's sampler and numpy take
            raise ValueError(f"rounds[{i}].seed: {r['seed']} is outside [0, 2**32)")
    resumable = not all(r.get("done") for r in rounds)  # a finished sweep's record is read for its rounds
    if resumable or "data" in sweep:
        data = sweep["data"]
        if not (isinstance(data, dict) and isinstance(data.get("path"), str) and "content_hash" in data):
            raise ValueError("data: must hold the data file's path and content_hash")
    if resumable or "mlflow" in sweep:
        if not (isinstance(sweep["mlflow"], dict) and isinstance(sweep["mlflow"].get("uri"), str)):
            raise ValueError("mlflow: must hold the store's uri")
    if not (isinstance(sweep.get("folds", []), list) and isinstance(sweep.get("base", {}), dict)):
        raise ValueError("folds / base: must be a list / a mapping")
    if "base" in sweep:
        make_config(sweep["base"], "base")  # ConfigError (a ValueError) naming the field


# --- the sweep's logs: a crash's torn last line is dropped, anything else refused -------------

LOGS = {"folds.jsonl": ("trial_id", "fold", "status"), "events.jsonl": ("kind",), "optuna.journal": ("op_code",)}


def check_logs(storage: Path) -> None:
    """UsageError naming the file and line of a complete line of a log (folds.jsonl, events.jsonl,
    the Optuna journal) that is not a record the driver writes (a crash cannot make one; a torn LAST line, without its
    newline, is what a kill in mid-write leaves: `drop_torn_lines` drops it, and its fold runs again)."""
    for name, keys in LOGS.items():
        path = storage / name
        if not path.exists():
            continue
        try:
            lines = path.read_bytes().split(b"\n")[:-1]  # the last piece is torn (or empty)
        except OSError as e:
            raise UsageError(f"{path}: cannot be read ({e.strerror})") from None
        files = set()  # folds.jsonl's baselines files (fxray.track.records.put_baselines)
        for number, line in enumerate(lines, start=1):
            if not line.strip():  # a blank line passes
                continue
            try:
                rec = json.loads(line)
                ok = set(keys) <= rec.keys()
            except (ValueError, AttributeError):  # not JSON, or not a JSON object
                ok = False
            if not ok:
                raise UsageError(
                    f"{path} line {number}: not a record of the sweep's log (needs a JSON object with "
                    f"{', '.join(keys)}); a crash cannot leave one: restore the file, or pass --storage DIR"
                )
            if rec.get("baselines_file"):
                files.add(rec["baselines_file"])
        for name in files:
            try:
                ok = bool(BASELINES_NAME.fullmatch(name)) and isinstance(json.loads((storage / name).read_text()), dict)
            except (OSError, ValueError, TypeError):
                ok = False
            if not ok:
                raise UsageError(
                    f"{storage / str(name)}: missing or not the JSON {path} names (baselines_file); "
                    "restore the run directory, or pass --storage DIR"
                )


def drop_torn_lines(storage: Path) -> None:
    """Cut a log's torn last line (no newline: a kill in mid-write), so that the next append starts
    a line of its own. Called with the run directory's lock held."""
    for name in LOGS:
        path = storage / name
        data = path.read_bytes() if path.exists() else b""
        if data and not data.endswith(b"\n"):
            os.truncate(path, data.rfind(b"\n") + 1)


def write_sweep(storage: Path, sweep: dict) -> None:
    with atomic_path(storage / "sweep.json") as tmp:  # a reader never sees half a file
        tmp.write_text(json.dumps(sweep, indent=1))


def make_fold_dicts(file, exp, market) -> list[dict]:
    try:
        return [f.as_dict() for f in make_folds(market.ts, exp.folds)]
    except FoldError as e:
        raise UsageError(f"{file}: folds: {e} ({market.path})") from None


def prepare_storage(plan, exp, profile: str, folds: list[dict], device: str | None = None) -> dict:
    """Create the run directory (first run) or open a new round (an extension) or keep
    the last one (a resume) of `plan` (fxray.sweep.driver.Plan, its market and data path
    known). Everything here is validated already: nothing is half-written. A new sweep
    records `plan.mlflow_extra` ({"tags": more parent tags, "run_name": the parent's name,
    "sweep": more sweep.json keys}: what a placebo sweep says it is, fxray.sweep.placebo),
    `device` ("gpu" or "cpu": what the FoldWorkers train on) and the command line's
    overrides (a resume reuses them)."""
    from fxray.track import runs as mlruns

    storage, sweep, file, market, same = plan.storage, plan.sweep, plan.file, plan.market, plan.same
    if sweep is None:
        data_path = str(Path(plan.data_path).absolute())
        storage.mkdir(parents=True, exist_ok=True)
        # its base: chain resolved: the copy a resume or an extension runs from stands alone
        (storage / "experiment.yaml").write_text(yaml.safe_dump(expmod.read_yaml(file), sort_keys=False))
        tags = {
            "fxray.experiment": exp.name,
            "fxray.dataset_hash": market.content_hash,
            "fxray.profile": profile,
            "fxray.storage": str(storage),
            "fxray.folds": json.dumps([list(f.values()) for f in folds]),  # k, train, val, test[, holdout]
            "fxray.device": device,
            "mlflow.source.git.commit": mlruns.git_commit(),
        }
        tags = {k: v for k, v in tags.items() if v}  # no device given, no git checkout: no tag
        sweep = {
            "id": uuid.uuid4().hex,
            "experiment": exp.name,
            "profile": profile,
            "device": device,
            "experiment_file": str(storage / "experiment.yaml"),  # the copy above (logged to MLflow)
            "data": {"path": data_path, "content_hash": market.content_hash, "n_bars": market.n_bars},
            "folds": folds,
            "base": exp.config.as_dict(),
            "rounds": [],
            "mlflow": {"uri": mlruns.tracking_uri(), "experiment": exp.name, "tags": tags},
            # every override of the experiment file (--set, --population, ...): a resume or an
            # extension runs with them (reuse_overrides); the round keys live in the rounds
            "overrides": {k: v for k, v in plan.overrides.items() if k not in ROUND_KEYS},
        }
        tags.update(plan.mlflow_extra.get("tags", {}))
        if plan.mlflow_extra.get("run_name"):
            sweep["mlflow"]["run_name"] = plan.mlflow_extra["run_name"]
        sweep.update(plan.mlflow_extra.get("sweep", {}))
    if not plan.args.resume:
        name = f"tune-{len(sweep['rounds']) + 1}" if sweep["rounds"] else "tune"
        sweep["rounds"].append(
            {"name": name, "trials": exp.sweep.trials, "seed": exp.sweep.seed, "done": False, "started": time.time()}
        )
        if same:  # the parent run says so too (its tags are the sweep's: the first round's)
            sweep["rounds"][-1]["same_trials"] = {"from": same["from"], "trials": same["trials"]}
            sweep["mlflow"]["tags"].setdefault("fxray.same_trials", same["from"])
    write_sweep(storage, sweep)
    return sweep


# --- one sweep at a time in a run directory ----------------------------------------------
# An flock on <storage>/.lock, held for the driver's life (`with hold(storage, expected_sweep)`).
# The kernel releases an flock when its process dies, however it dies, so a lock left by a
# killed sweep is stale by construction: the next driver simply takes it (the pid in the file is
# only for the message). A driver that took the lock on a run directory it had to create, and
# then started nothing (no sweep.json), removes what it created on the way out.

LOCK = ".lock"


def held_by(storage: Path) -> str | None:
    """The pid (as written) of the driver holding the run directory's lock now, else None.
    Writes nothing: a probe before anything else is checked."""
    try:
        fd = os.open(Path(storage) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        return lock(fd)
    finally:
        os.close(fd)  # (releases our probe's lock, if it got it)


def lock(fd: int) -> str | None:
    """Take the flock of the lock file `fd`: None, or the pid (as written) of the driver holding it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
    return None


def refusal(storage: Path, pid: str) -> str:
    return (
        f"{storage}: another sweep (pid {pid}) is running in this run directory; "
        "wait for it to end, or pass --storage DIR for a separate sweep"
    )


@contextlib.contextmanager
def hold(storage: Path, expected: dict | None):
    """Hold the run directory's lock; `expected` is the sweep.json the caller validated against
    (None: no sweep there): if another driver changed it before we got the lock, refuse."""
    storage = Path(storage)
    created = [p for p in (storage, *storage.parents) if not p.exists()]
    try:
        storage.mkdir(parents=True, exist_ok=True)
        fd = os.open(storage / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # read-only storage, a full disk: before anything is started
        raise UsageError(
            f"--storage {storage}: cannot be written ({e.strerror}); a sweep keeps its records there: "
            "make it writable, or pass --storage DIR"
        ) from None
    holder = lock(fd)
    if holder is not None:
        os.close(fd)
        raise UsageError(refusal(storage, holder))
    try:
        if read_sweep(storage) != expected:
            raise UsageError(f"{storage}: its sweep.json changed while this sweep was being checked; run it again")
        if expected is not None:
            drop_torn_lines(storage)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        if not (storage / "sweep.json").exists():  # nothing was started here: leave no trace of us
            with contextlib.suppress(OSError):
                os.unlink(storage / LOCK)
            for d in created:  # deepest first
                with contextlib.suppress(OSError):
                    d.rmdir()
        os.close(fd)  # releases the flock
