"""The `fxray` command: one entry point whose subcommands are the package's CLIs.

    fxray tune --experiment experiments/smoke.yaml      # = python -m fxray.tune ...
    fxray train --data my.fxcache --epochs 3            # = python -m fxray.train ...
    fxray data build --bars my_bars.csv --out my.fxcache
    fxray compare smoke
    fxray --version

Each subcommand is a module with a `main(argv) -> int`; the rest of the command line
goes to it unchanged, so `fxray tune --help` is `python -m fxray.tune --help`. A module
that is not installed (a later issue's command) is simply not offered. Adding a command
is one line of COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from contextlib import contextmanager, suppress
from pathlib import Path

from fxray import __version__
from fxray.data.atomic import atomic_path

# name -> (module with main(argv), one line of help); listed in this order
COMMANDS = {
    "tune": ("fxray.tune", "sweep hyperparameters over walk-forward folds (Ray Tune + Optuna + ASHA, MLflow)"),
    "train": ("fxray.train", "train one config over every fold, no Ray; re-train a logged trial (--from-run)"),
    "data": ("fxray.data_cmd", "make and inspect fxcache files (synth, build, info)"),
    "compare": ("fxray.compare", "judge sweeps logged in MLflow: pooled out-of-sample Sharpe, DSR, plots"),
    "export": ("fxray.export", "export a sweep's best policy"),
    "backtest": ("fxray.backtest", "backtest an exported policy on an fxcache"),
    "live": ("fxray.live", "run an exported policy on a live feed"),
}


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose error is one line (the usage block is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_parser(name: str, doc: str, label: str = "examples:\n") -> argparse.ArgumentParser:
    """A command's parser: its module docstring's first paragraph is the description, the
    rest (the examples) the epilog, kept as written. An error is one line on stderr, exit 2."""
    return Parser(
        prog=f"fxray {name}",
        description=doc.split("\n\n")[0],
        epilog=label + doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def bounded_int(low: int, high: float, what: str):
    """An argparse type: an integer in [low, high); argparse's error then names the flag and
    says `what` it must be (`argument --seed: '-1' is not a seed: ...`)."""

    def parse(text: str) -> int:
        with suppress(ValueError):
            if low <= (value := int(text)) < high:
                return value
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")

    return parse


positive_int = bounded_int(1, math.inf, "an integer >= 1")
nonnegative_int = bounded_int(0, math.inf, "an integer >= 0")
seed = bounded_int(0, 2**32, "a seed: use an integer in [0, 4294967295]")  # what numpy and Optuna take


def fail(e: BaseException) -> int:
    """A command's error as one line on stderr (its message's first line); exit status 2."""
    print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2


def stdout_closed() -> int:
    """The end of a command whose stdout its reader closed (`fxray backtest ... | head -1`): exit
    status 1 and nothing on stderr. Python's advice (docs, sys, "Note on SIGPIPE"): point stdout at
    devnull, or the exit's flush of what is still buffered raises BrokenPipeError again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def run_command(work, args, announce: bool = False, status=lambda result: 0) -> int:
    """A command's main after its flags: `work(args)`; its ValueError or OSError as one line, exit
    status 2 (nothing else written: outputs are checked before the work and written atomically),
    else its result dict to --json (`announce`: then "wrote PATH" said), exit status `status(result)`.
    A stdout closed by its reader: stdout_closed (met here, by a flush: not at the exit of a
    `python -m fxray.<command>`, which would print Python's own complaint)."""
    try:
        result = work(args)
        write_json(args.json, result)
        if announce and args.json:
            print(f"wrote {args.json}")
        sys.stdout.flush()
    except BrokenPipeError:  # an OSError, but not the command's: its reader has gone
        return stdout_closed()
    except (ValueError, OSError) as e:  # BundleError, ExportError, StreamError are ValueErrors
        return fail(e)
    return status(result)


def write_json(path: Path | None, result: dict) -> None:
    """A command's --json: `result` at `path` (its folder made; numpy scalars as floats), if given,
    written whole or not at all (atomic_open)."""
    if path is not None:
        with atomic_open(Path(path)) as f:
            f.write(json.dumps(result, indent=1, default=float))


@contextmanager
def atomic_open(path: Path):
    """A text file for writing at `path` that appears there only whole: nothing if the block fails."""
    with atomic_path(Path(path)) as tmp, open(tmp, "w") as f:
        yield f


def check_file_out(path, flag: str) -> None:
    """ValueError (one line) unless `path` can be written as a file: not a directory, under a
    directory that exists (or can be made) and is writable (None: no file, nothing to check).
    Commands call it before any work."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; name a file to write")
    if path.exists() and not path.is_file():
        raise ValueError(f"{flag} {path}: exists and is not a regular file; name a new file")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is not a directory")
    read_only = False  # a read-only mount: os.access says yes to root there
    with suppress(OSError):
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    if not os.access(parent, os.W_OK) or read_only:
        raise ValueError(f"{flag} {path}: {parent} is not writable")


def same_data(path, content_hash: str, run_id: str, trained_on: str) -> None:
    """ValueError (one line) unless `content_hash`, the hash of the data at `path`, is `trained_on`,
    that of the data MLflow run `run_id` trained on (fxray export RUN_ID, fxray train --from-run)."""
    if content_hash != trained_on:
        raise ValueError(
            f"{path}: content hash {content_hash} differs from the data run {run_id} trained on ({trained_on}); "
            "pass --data with that file"
        )


def iso(ns: int) -> str:
    """A time in int ns since epoch as ISO 8601 UTC to the second: 2017-04-03T12:00:00Z."""
    import numpy as np  # here: `fxray --help` and the commands that print no time need none

    return str(np.datetime64(int(ns), "ns").astype("datetime64[s]")) + "Z"


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
    intro = __doc__.split("\n\n")[0]
    return (
        f"usage: fxray [--version] COMMAND [ARGS ...]\n\n{intro}\n\ncommands:\n{rows}\n\n"
        "`fxray COMMAND --help` shows a command's flags and examples; "
        "each is also `python -m <module>` (e.g. python -m fxray.tune)."
    )


def main(argv: list[str] | None = None) -> int:
    """`fxray ARGS`; a stdout its reader closed (`fxray backtest ... | head -1`, any command): exit
    status 1, nothing on stderr (stdout_closed), as `head` readers expect of a Unix command."""
    try:
        try:
            code = dispatch(argv)
        finally:  # not at exit (nor past argparse's --help, a SystemExit): here, a closed pipe is caught
            sys.stdout.flush()
    except BrokenPipeError:
        return stdout_closed()
    return leave(code) if argv is None else code


def leave(code: int) -> int:
    """The end of a command run as a process: when it started a local Ray (a sweep), the process
    ends here, its output flushed: ray.shutdown and Python's teardown would add seconds to
    every sweep (~3 s on the 2-core box), and the session's reaper (fxray.sweep.reaper) ends
    Ray's processes after us, as it does however we end. Otherwise `code` comes back."""
    cluster = sys.modules.get("fxray.sweep.cluster")
    if cluster is None or not cluster.REAPERS:
        return code
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"fxray {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"fxray: error: {name!r} is not a command; known: {', '.join(COMMANDS)} (fxray --help)", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[name][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
