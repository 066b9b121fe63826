"""Checkpoints -> a policy bundle (fxray.policy.bundle), written atomically.

    candidates = [load_candidate(p) for p in paths]         # fold<k>.safetensors + .json sidecars
    members = choose(candidates, "last")                    # last | best | ensemble | fold:K
    manifest = export_bundle(members, market, out, model="last", source={...})

Which model (`choose`):
- last      the last fold's network: trained on the most recent data, what walk-forward
            deploys (the default).
- best      the fold with the best val score (the kept epoch's fxray.eval.pooled.score on
            its val window). A selection among folds: its own test window is no longer a
            clean out-of-sample number for the choice.
- ensemble  every fold: Q = the mean over the folds' networks, each on its own
            normalisation (folds' train slices differ).
- fold:K    fold K's network.

A flat fold (the learner abstained: dqn.abstain, its checked screen kept no input; or no epoch
won on val behind enough trades: dqn.keep won) has no network, only a marker fold<k>.abstained.json; `last`
refuses a run whose last fold abstained (the newest train slice said stay flat) and names the
fold:K of the last fold that trained.

A fold of a seed ensemble (dqn.seeds S > 1, fxray.rl.trainer) has S member checkpoints,
fold<k>.m<i>.safetensors: every choice above takes a fold's members together (last: the last
fold's S networks, their mean Q, the policy that fold scored), and its val score is the
ensemble's.

The normalisation of a member is the checkpoint's (fxray.rl.checkpoint.write_checkpoint stores
the fold's train-slice mean and 1/std), checked against the data's, which catches a wrong data
file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import fxray
from fxray.cli import check_file_out
from fxray.data.cache import Market, first_line
from fxray.data.calendar import Calendar
from fxray.data.features import MAX_LOOKBACK
from fxray.data.folds import Fold
from fxray.policy import onnx
from fxray.policy.bundle import FORMAT, MANIFEST, NORMALISATION, VERSION, reads_ofi, sha256
from fxray.policy.frozen import q_network
from fxray.rl.checkpoint import abstained_folds, load_checkpoint
from fxray.rl.config import make_config
from fxray.rl.device import DeviceData

MODELS = ("last", "best", "ensemble", "fold:K")
NETWORK_KEYS = ("hidden", "depth", "cost", "fill", "dtype")  # members must agree on these
STATS_RTOL = 1e-4  # stored vs recomputed normalisation: rounding, not another file


class ExportError(ValueError):
    """A checkpoint or data file that cannot become a bundle; one line naming it and the fix."""


@dataclass
class Candidate:
    """A fold checkpoint: its tensors, its JSON sidecar, its val score and its fold."""

    path: Path
    tensors: dict
    meta: dict
    val_score: float
    k: int  # its fold


def load_candidate(path) -> Candidate:
    """A checkpoint written by fxray.rl.checkpoint.write_checkpoint (its .json beside it)."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(
            f"{path}: no such checkpoint (fold<k>.safetensors from a sweep or `fxray.train --checkpoint-dir`)"
        )
    if not path.with_suffix(".json").is_file():
        raise ExportError(f"{path.with_suffix('.json')}: missing; a checkpoint is fold<k>.safetensors + its .json")
    try:
        tensors, meta = load_checkpoint(path)
    except Exception as e:  # safetensors' and json's own errors: a damaged file either way
        raise ExportError(f"{path}: unreadable checkpoint ({first_line(e)})") from None
    missing = [k for k in ("config", "fold", "n_inputs", "val_score", "normalisation") if k not in meta]
    if missing:
        raise ExportError(f"{path.with_suffix('.json')}: lacks {', '.join(missing)}; not an fxray checkpoint")
    # a seed ensemble's member: the ensemble's val score
    return Candidate(path, tensors, meta, float(meta.get("ensemble", meta)["val_score"]), int(meta["fold"]["k"]))


def load_folder(folder: Path) -> tuple[list[Candidate], tuple[int, ...]]:
    """The fold checkpoints in `folder` (fold<k>.safetensors, in name order) and the folds abstained there."""
    return [load_candidate(p) for p in sorted(folder.glob("fold*.safetensors"))], abstained_folds(folder)


def choose(candidates: list[Candidate], model: str, abstained: tuple[int, ...] = ()) -> list[Candidate]:
    """The members of `model` (see the module doc), in fold order (a fold's seed members together).
    `abstained`: the folds the learner abstained on (dqn.abstain: no network, flat); `last` is
    refused when the last fold is one of them, since the newest train slice said stay flat."""
    if not candidates:
        if abstained:
            raise ExportError(
                f"no fold checkpoints to export: every fold is flat ({len(abstained)}; the screen kept no input "
                "or no epoch won on val), so its policy is flat"
            )
        raise ExportError("no fold checkpoints to export")
    ordered = sorted(candidates, key=lambda c: c.k)  # stable: a fold's members stay in path order
    if model == "last" and abstained and max(abstained) > ordered[-1].k:
        raise ExportError(
            f"--model last: fold {max(abstained)}, the last, is flat (the screen kept no input or no epoch "
            f"won on val) and has no network: the newest train slice says stay flat; "
            f"--model fold:{ordered[-1].k} exports the last fold that trained"
        )

    def fold(k: int) -> list[Candidate]:
        return [c for c in ordered if c.k == k]

    if model == "last":
        return fold(ordered[-1].k)
    if model == "ensemble":
        return ordered
    if model == "best":
        return fold(max(ordered, key=lambda c: c.val_score).k)
    if model.startswith("fold:") and model[5:].isdigit():
        chosen = fold(int(model[5:]))
        if not chosen:
            raise ExportError(f"--model {model}: no checkpoint of that fold; have folds {[c.k for c in ordered]}")
        return chosen
    raise ExportError(f"--model {model!r}: use one of {', '.join(MODELS)}")


def _statistics(c: Candidate, data: DeviceData) -> tuple[np.ndarray, np.ndarray]:
    """(mean, inv_std) of the member's train slice: the checkpoint's, checked against the data's."""
    fold = Fold.from_dict(c.meta["fold"])
    if not 0 <= fold.train[0] < fold.train[1] <= data.n_bars:
        raise ExportError(f"{c.path}: its fold's train range {fold.train} is outside the data's {data.n_bars} bars")
    data.set_fold(fold)
    mean, inv_std = data.mean.cpu().numpy().copy(), data.inv_std.cpu().numpy().copy()
    s_mean, s_inv = (np.asarray(c.meta["normalisation"][k], dtype=np.float32) for k in ("mean", "inv_std"))
    if not (np.allclose(s_mean, mean, rtol=STATS_RTOL, atol=1e-6) and np.allclose(s_inv, inv_std, rtol=STATS_RTOL)):
        raise ExportError(
            f"{c.path}: the data's train-slice statistics differ from the checkpoint's: "
            "not the file it was trained on; pass --data with that file"
        )
    return s_mean, s_inv


def check_out(out: Path, force: bool) -> None:
    """ExportError unless `out` may be written: absent, or (with `force`) a bundle fxray wrote
    (a directory whose manifest.json says format fxray.policy). Anything else is never replaced:
    deleting is not a side effect of an export."""
    out = Path(out)
    if not (out.exists() or out.is_symlink()):
        check_file_out(out, "--out")  # ValueError unless it can be made
        return
    if not force:
        raise ExportError(f"--out {out}: exists; pass --force to replace the bundle there, or another --out")
    try:
        ours = (
            out.is_dir() and not out.is_symlink() and json.loads((out / MANIFEST).read_text()).get("format") == FORMAT
        )
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise ExportError(
            f"--out {out}: is not a policy bundle (no {MANIFEST} of format {FORMAT}); --force replaces only "
            "a bundle fxray wrote: name another --out"
        )
    if not os.access(out.parent, os.W_OK):
        raise ExportError(f"--out {out}: its directory {out.parent} is not writable")


def _agree(members: list[Candidate]) -> dict:
    """The shared config; an ensemble of networks of other shapes or costs is refused."""
    first = members[0].meta["config"]
    for c in members[1:]:
        diff = [k for k in NETWORK_KEYS if c.meta["config"].get(k) != first.get(k)]
        if diff or c.meta["n_inputs"] != members[0].meta["n_inputs"]:
            raise ExportError(f"{c.path}: differs from {members[0].path.name} in {', '.join(diff) or 'n_inputs'}")
    return first


def export_bundle(
    members: list[Candidate], market: Market, out, *, model: str, source: dict, progress=lambda i, n: None
) -> dict:
    """Write the bundle of `members` (trained on `market`) at `out`; returns its manifest.
    Nothing is left at `out` if anything fails; what is at `out` is replaced (check_out first).
    `progress(done, n)` is called as each member is written and checked."""
    out = Path(out)
    config = _agree(members)
    cfg = make_config(config)
    n_inputs, have = int(members[0].meta["n_inputs"]), market.features.shape[1] + market.ofi.shape[1]
    if n_inputs != have:
        raise ExportError(f"{market.path}: {have} inputs, the network {n_inputs}")
    data = DeviceData(market, "cpu", dtype=cfg.dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        (tmp / "members").mkdir()
        norm, entries, worst, read_by = {}, [], 0.0, []
        for i, c in enumerate(members):
            name = f"fold{c.k}" if sum(m.k == c.k for m in members) == 1 else f"fold{c.k}_{i}"
            mean, inv_std = _statistics(c, data)
            norm[f"{name}.mean"], norm[f"{name}.inv_std"] = mean, inv_std
            read_by.append((c.tensors["market_in.weight"].numpy(), mean, inv_std))
            weights, graph = f"members/{name}.safetensors", f"members/{name}.onnx"
            shutil.copyfile(c.path, tmp / weights)
            net = q_network({k: v.numpy() for k, v in c.tensors.items()})
            onnx.export_q(net, tmp / graph)
            worst = max(worst, _onnx_gap(net, tmp / graph, data, c, mean, inv_std))
            entries.append(
                {
                    "name": name,
                    "fold": c.meta["fold"],
                    "weights": weights,
                    "onnx": graph,
                    "checkpoint": str(c.path),
                    "best_epoch": c.meta.get("best_epoch"),
                    "val_score": c.val_score,
                    # the fold's policy's, as val_score: a seed ensemble's member holds the ensemble's
                    "val": c.meta.get("ensemble", c.meta).get("val", {}),
                    "test": c.meta.get("ensemble", c.meta).get("test", {}),
                    "normalisation_from": "the checkpoint's",
                }
            )
            progress(i + 1, len(members))
        from safetensors.numpy import save_file

        save_file(norm, str(tmp / NORMALISATION))
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "fxray_version": fxray.__version__,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": {
                "choice": model,
                "combine": "mean of the members' Q" if len(members) > 1 else "one member",
                "source": source,
            },
            "members": entries,
            "network": {
                "class": "fxray.rl.network.QNetwork",
                "n_inputs": n_inputs,
                "hidden": cfg.hidden,
                "depth": cfg.depth,
                "dueling": True,  # always (fxray.rl.network); kept for readers of the format
                "input_dtype": cfg.dtype,
            },
            "onnx": {
                "opset": onnx.OPSET,
                "exporter": onnx.EXPORTER,
                "input": f"{onnx.INPUT}: (bars, {n_inputs}) float32, normalised",
                "output": f"{onnx.OUTPUT}: (bars, 3 previous positions, 3 actions) float32",
                "max_abs_diff_vs_torch": worst,
            },
            "inputs": {
                "feature_names": list(market.feature_names),
                "ofi_names": list(market.ofi_names),
                "ofi_read": reads_ofi(read_by, market.features.shape[1], market.ofi_names),
                "state": "(x - mean) * inv_std, x = features ++ ofi (float32), per member",
                "normalisation": NORMALISATION,
                "warmup_bars": MAX_LOOKBACK,
            },
            "trading": {
                "cost": cfg.cost,
                "fill": cfg.fill,
                "actions": ["short", "flat", "long"],
                "start_position": 0,
                "rule": "p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 (first maximum on ties), p_-1 = 0",
            },
            "data": {
                "path": str(market.path),
                "content_hash": market.content_hash,
                **{k: market.meta.get(k) for k in ("instrument", "bar", "source")},
                "n_bars": market.n_bars,
                "first_ts": int(market.ts[0]),
                "last_ts": int(market.ts[-1]),
                "calendar": Calendar.of(market.ts).as_dict(),
            },
            "config": config,
        }
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        manifest["files"] = {rel: sha256(tmp / rel) for rel in files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _permissions(tmp)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _onnx_gap(net, graph: Path, data: DeviceData, c: Candidate, mean, inv_std) -> float:
    """max |ONNX - torch| over the member's test window (up to 4096 bars): an export check."""
    a, b = c.meta["fold"]["test"]
    data.mean.copy_(torch.from_numpy(mean))
    data.inv_std.copy_(torch.from_numpy(inv_std))
    market = data.states(torch.arange(a, min(b, a + 4096)))
    with torch.no_grad():
        want = net.q_all(market.unsqueeze(0))[0].numpy()
    got = onnx.run(onnx.session(graph), market.numpy())
    gap = float(np.max(np.abs(got - want)))
    if not gap <= onnx.ONNX_ATOL + onnx.ONNX_RTOL * float(np.max(np.abs(want))):
        raise ExportError(f"{graph}: onnxruntime's Q differs from torch's by {gap:.3g}; the export is wrong")
    return gap


def _permissions(root: Path) -> None:
    """mkdtemp and safetensors make private files; a bundle is as readable as the umask lets files be."""
    umask = os.umask(0)
    os.umask(umask)
    for p in [root, *root.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished bundle into place (an old one at `out` goes only once the new one is there;
    `check_out` proved it a bundle)."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old.{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
