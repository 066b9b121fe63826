"""A fold's checkpoint folder: each member's kept weights, or the marker of a fold left flat.

    <dir>/fold<k>.safetensors + fold<k>.json          a solo trial's fold: weights + sidecar
    <dir>/fold<k>.m<i>.safetensors + .json            member i of a seed ensemble's fold
    <dir>/fold<k>.abstained.json                      a fold the learner abstained on (no weights)

The sidecar holds the config, the fold, the kept epoch, its val and test metrics and the
fold's train-slice normalisation the weights expect (a policy needs it to run). Every file is
written to a temporary name beside it and renamed: never half a file. The marker tells the
folder's readers (the sweep's vote, fxray export) that the fold said "flat" rather than lost
its weights. Importing this module imports no torch (the vote's and export's refusals run
before any data or network is opened).
"""

from __future__ import annotations

import json
from pathlib import Path

from fxray.data.atomic import atomic_path

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


def write_marker(folder, fold, cfg, result) -> None:
    """The marker of a flat fold (a Fold), where its weights would be: its config, fold, and the
    val and test metrics of its FoldResult."""
    meta = {"abstained": True, "config": cfg.as_dict(), "fold": fold.as_dict(), "val": result.val, "test": result.test}
    with atomic_path(marker(folder, fold.k)) as tmp:
        Path(tmp).write_text(json.dumps(meta, indent=1))


def write_checkpoint(folder, name: str, state: dict, meta: dict, mean, inv_std) -> Path:
    """<folder>/<name>.safetensors (`state`: a plain network's weights by name) and its sidecar
    <name>.json (`meta`, and the normalisation `mean` and `inv_std`, float32 values as JSON floats:
    an exact round trip). Returns the weights' path."""
    from safetensors.torch import save_file

    stem = Path(folder) / name  # not with_suffix below: a member's stem fold<k>.m<i> has a dot
    meta = {**meta, "normalisation": {"mean": mean.tolist(), "inv_std": inv_std.tolist()}}
    with atomic_path(Path(f"{stem}.safetensors")) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, tmp)
    with atomic_path(Path(f"{stem}.json")) as tmp:
        Path(tmp).write_text(json.dumps(meta, indent=1))
    return Path(f"{stem}.safetensors")


def write_fold(folder, fold, cfg, result, members, seeds, weights, mean, inv_std, n_inputs) -> str | None:
    """A trial's fold (its FoldResult `result`, of a trial of `cfg`): the marker where it is flat;
    fold<k> of a single seed; or each "ok" member's (`members`: their FoldResults, `seeds`, host
    `weights` as `write_checkpoint` takes them) as fold<k>.m<i> with the ensemble's scores (fxray
    export takes them together: its policy is their mean Q). Returns the first weights' path."""
    if result.abstained:  # flat: no weights
        return write_marker(folder, fold, cfg, result)
    member_cfg = cfg.replace(seeds=1).as_dict()

    def save(name, i, member, ensemble=None):
        meta = {"config": member_cfg, "fold": fold.as_dict(), "best_epoch": member.best_epoch, "val": member.val}
        meta |= {"test": member.test, "n_inputs": n_inputs, "val_score": member.val_score}
        meta |= {"ensemble": ensemble} if ensemble else {}
        return write_checkpoint(folder, name, weights[i], meta, mean, inv_std)

    if cfg.seeds == 1:
        return str(save(f"fold{fold.k}", 0, result)) if result.status == "ok" and result.best_epoch >= 0 else None
    scores = {"seeds": cfg.seeds, "val_score": result.val_score, "val": result.val, "test": result.test}
    paths = [
        save(f"fold{fold.k}.m{i}", i, m, {**scores, "member": i, "member_seed": seed})
        for i, (m, seed) in enumerate(zip(members, seeds))
        if m.status == "ok" and not m.abstained
    ]
    return str(paths[0]) if paths else None


def load_checkpoint(path) -> tuple[dict, dict]:
    """(state tensors, sidecar metadata) of a checkpoint written by write_checkpoint."""
    from safetensors.torch import load_file

    path = Path(path)
    return load_file(str(path)), json.loads(path.with_suffix(".json").read_text())
