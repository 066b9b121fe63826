"""Export a trained policy as a self-contained bundle (docs/policy.md).

    python -m fxray.export RUN_ID --out policy/                    # an MLflow trial run of a sweep
    python -m fxray.export RUN_ID --out policy/ --model ensemble   # last | best | ensemble | fold:K
    python -m fxray.export runs/ckpt/seed0 --data eurusd.fxcache --out policy/   # fxray.train --checkpoint-dir
    python -m fxray.export runs/ckpt/seed0/fold1.safetensors --data eurusd.fxcache --out policy/

RUN_ID: the trial's fold checkpoints (<storage>/checkpoints/<trial_id>/fold<k>.safetensors)
and its data file come from the run's tags (the data's content hash is checked against the
run's). CHECKPOINT: a fold<k>.safetensors (that fold), or a
directory of them (--model picks); --data names the fxcache it was trained on.
Every failure is one line on stderr and exit 2, and nothing at --out.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from fxray.cli import Parser, check_file_out, run_command, same_data
from fxray.data import cache
from fxray.policy.bundle import need_export_extra
from fxray.policy.export import MODELS, ExportError, check_out, choose, export_bundle, load_candidate, load_folder
from fxray.track.results import fmt_s


def run_candidates(run_id: str, tracking_uri: str | None) -> tuple[list, dict, tuple]:
    """(candidates, source, abstained folds) of an MLflow trial run: its fold checkpoints and the
    folds it abstained on."""
    from fxray.track.runs import trial_run

    needed = ("fxray.trial_id", "fxray.storage", "fxray.dataset_hash")
    _, run, uri = trial_run(run_id, tracking_uri, needed, run_id)  # ValueError: one line, main's
    tags = run.data.tags
    folder = Path(tags["fxray.storage"]) / "checkpoints" / tags["fxray.trial_id"]
    candidates, abstained = load_folder(folder)
    if not candidates and not abstained:
        raise ExportError(f"{folder}: no fold checkpoints of run {run_id} (the sweep's run directory moved?)")
    source = {
        "kind": "mlflow run",
        "run_id": run_id,
        "tracking_uri": uri,
        "trial_id": tags["fxray.trial_id"],
        "dataset_hash": tags["fxray.dataset_hash"],
        "data_path": tags.get("fxray.data_path"),
    }
    return candidates, source, abstained


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fxray export", description=__doc__.splitlines()[0])
    p.add_argument(
        "source", metavar="RUN_ID|PATH", help="an MLflow trial run id, a fold<k>.safetensors, or a directory of them"
    )
    p.add_argument("--out", metavar="DIR", required=True, type=Path, help="the bundle directory to write")
    p.add_argument(
        "--model", metavar="WHICH", default="last", help=f"which network(s): {', '.join(MODELS)} (default last)"
    )
    p.add_argument(
        "--data", metavar="FXCACHE", type=Path, help="the fxcache it was trained on (default: the run's data file)"
    )
    p.add_argument(
        "--tracking-uri", metavar="URI", help="MLflow store of RUN_ID (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the manifest here")
    return p


def main(argv=None) -> int:
    return run_command(export, build_parser().parse_args(argv))


def export(args) -> dict:
    need_export_extra("fxray export")  # it writes ONNX (onnx) and checks it (onnxruntime)
    check_out(args.out, args.force)  # before any work: what is at --out is replaced only if a bundle
    check_file_out(args.json, "--json")
    source_path = Path(args.source)
    if source_path.exists():
        candidates, abstained = (
            load_folder(source_path) if source_path.is_dir() else ([load_candidate(source_path)], ())
        )
        if not candidates and not abstained:
            raise ExportError(f"{source_path}: no fold<k>.safetensors checkpoints in this directory")
        source = {"kind": "checkpoint", "path": str(source_path)}
        if args.data is None:
            raise ExportError(
                f"{source_path}: a checkpoint does not name its data; pass --data with the fxcache it was trained on"
            )
    elif re.fullmatch(r"[0-9a-f]{32}", args.source):
        candidates, source, abstained = run_candidates(args.source, args.tracking_uri)
        if args.data is None and not (source["data_path"] and Path(source["data_path"]).is_file()):
            raise ExportError(
                f"{args.source}: its data file {source['data_path'] or '(not recorded)'} is not here; "
                "pass --data with a copy"
            )
    else:
        raise ExportError(
            f"{args.source}: no such checkpoint file or directory, and not an MLflow run id (32 hex digits)"
        )
    data_path = args.data or Path(source["data_path"])
    market = cache.open(data_path)
    if "dataset_hash" in source:  # a run's; a checkpoint names no data
        same_data(data_path, market.content_hash, args.source, source["dataset_hash"])
    members, t0 = choose(candidates, args.model, abstained), time.time()

    def progress(done: int, n: int) -> None:  # an ensemble (folds x seeds) takes a while
        if n > 1:
            spent = time.time() - t0
            eta = f"; ETA ~{fmt_s(spent / done * (n - done))}" if done < n else ""
            print(f"fxray.export: member {done}/{n} written and checked ({fmt_s(spent)}{eta})", flush=True)

    manifest = export_bundle(members, market, args.out, model=args.model, source=source, progress=progress)
    names = ", ".join(f"{m['name']} (val score {m['val_score']:+.2f})" for m in manifest["members"])
    net, graph, read = manifest["network"], manifest["onnx"], manifest["inputs"]["ofi_read"]
    print(
        f"wrote {args.out}: {args.model} = {names}; {net['hidden']}x{net['depth']} QNetwork, ONNX opset "
        f"{graph['opset']} (max |ONNX - torch| {graph['max_abs_diff_vs_torch']:.2g}), "
        f"cost {manifest['trading']['cost']:g}, fill {manifest['trading']['fill']}, data {market.content_hash}; "
        f"reads {'order flow ' + ', '.join(read) if read else 'bars alone (no order flow)'}"
    )
    return manifest


if __name__ == "__main__":
    sys.exit(main())
