"""The policy bundle: one directory holding everything a frozen policy needs.

    bundle = load("policy/")       # BundleError (one line naming the file and the fix)
    bundle.members                 # [Member]: name, fold, weights (numpy), mean, inv_std, onnx path
    bundle.feature_names, bundle.ofi_names, bundle.cost, bundle.fill, bundle.warmup_bars

    policy/
      manifest.json                format "fxray.policy", version, and every fact below
      members/<name>.safetensors   the Q-network's state dict (fxray.rl.dqn.QNetwork), float32
      members/<name>.onnx          normalised market (T, 50) -> Q (T, 3 previous positions, 3 actions)
      normalisation.safetensors    <name>.mean, <name>.inv_std: (50,) float32, the member's train slice

The policy's Q-values at bar t are the mean over its members of
member.q_all((x_t - member.mean) * member.inv_std), x_t = features ++ ofi (float32); the
greedy policy is p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 from flat (docs/policy.md).
Every file's sha256 is in the manifest: a changed or missing file is refused, not used.

numpy and safetensors only: a live process needs no torch (fxray.policy.live).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "fxray.policy"
VERSION = 1
MANIFEST = "manifest.json"
NORMALISATION = "normalisation.safetensors"
REQUIRED = ("format", "version", "model", "members", "network", "onnx", "inputs", "trading", "data", "config", "files")


class BundleError(ValueError):
    """A bundle that cannot be used; the message is one line naming the file and the fix."""


@dataclass(frozen=True)
class Member:
    """One Q-network of a policy with its own normalisation (a fold's train slice)."""

    name: str
    fold: dict  # Fold.as_dict() of the fold it was trained on
    weights: dict  # {state-dict key: np.ndarray float32}
    mean: np.ndarray  # (n_inputs,) float32
    inv_std: np.ndarray  # (n_inputs,) float32
    onnx: Path


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: its manifest, its members, and the manifest's facts the policy runs on."""

    path: Path
    manifest: dict
    members: list[Member]
    feature_names: list[str]  # the input columns, in order: features, then ofi
    ofi_names: list[str]
    cost: float  # return units per unit of position change
    fill: str  # next_open | close
    warmup_bars: int
    input_dtype: str  # float32 | bfloat16: the inputs' precision in training
    content_hash: str  # the training data's


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


FILLS = ("next_open", "close")
INPUT_DTYPES = ("float32", "bfloat16")  # fxray.rl.device.DTYPES (no torch here)
MAX_COST = 0.1  # return units per unit of position change: above it is a typo, not a market


def load(path) -> Bundle:
    """Read and check a bundle directory: manifest format and version; every file in the
    directory listed in the manifest with its sha256 and none outside it; every value the
    policy uses of the right type and finite (cost, fill, dtype, warm-up, the tensors).
    Raises BundleError (one line naming the file and the fix)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    root = Path(path)
    manifest_path = root / MANIFEST
    if not root.is_dir():
        raise BundleError(f"{root}: no such bundle directory (make one with `python -m fxray.export`)")
    if not manifest_path.is_file():
        raise BundleError(f"{manifest_path}: missing; not a policy bundle (make one with `python -m fxray.export`)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, OSError) as e:  # JSON, UTF-8 and read errors
        raise BundleError(f"{manifest_path}: not JSON ({str(e).splitlines()[0]}); export the bundle again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"{manifest_path}: not an {FORMAT} manifest (format {got!r})")
    if manifest.get("version") != VERSION:
        raise BundleError(
            f"{manifest_path}: bundle version {manifest.get('version')!r} is unknown to this fxray "
            f"(reads {VERSION}); export it again with this fxray's `python -m fxray.export`"
        )
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise BundleError(f"{manifest_path}: lacks {', '.join(missing)}; export the bundle again")
    try:
        check_manifest(manifest)
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{manifest_path}: {_says(e)}; export the bundle again") from None
    check_files(root, manifest["files"])
    n_inputs = manifest["network"]["n_inputs"]
    try:
        norm = load_file(str(root / NORMALISATION))
        members = []
        for m in manifest["members"]:
            weights = load_file(str(root / m["weights"]))
            mean, inv_std = norm[f"{m['name']}.mean"], norm[f"{m['name']}.inv_std"]
            if mean.shape != (n_inputs,) or inv_std.shape != (n_inputs,):
                raise BundleError(f"{root / NORMALISATION}: {m['name']} statistics are not ({n_inputs},)")
            if weights["market_in.weight"].shape[1] != n_inputs:
                raise BundleError(f"{root / m['weights']}: the network does not take {n_inputs} inputs")
            for where, arrays in (
                (root / NORMALISATION, {"mean": mean, "inv_std": inv_std}),
                (root / m["weights"], weights),
            ):
                bad = next((k for k, a in arrays.items() if not np.all(np.isfinite(a))), None)
                if bad is not None:
                    raise BundleError(f"{where}: {m['name']} {bad} holds NaN or Inf; export the bundle again")
            members.append(Member(m["name"], m["fold"], weights, mean, inv_std, root / m["onnx"]))
    except (KeyError, SafetensorError, OSError) as e:
        raise BundleError(f"{root}: a tensor file lacks {e} or is unreadable; export the bundle again") from None
    inputs, trading = manifest["inputs"], manifest["trading"]
    names = inputs["feature_names"], inputs["ofi_names"]
    dtype = manifest["network"].get("input_dtype", "float32")
    facts = float(trading["cost"]), trading["fill"], int(inputs["warmup_bars"]), dtype, manifest["data"]["content_hash"]
    return Bundle(root, manifest, members, *names, *facts)


def _says(e: Exception) -> str:
    return f"lacks {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]


def check_manifest(m: dict) -> None:
    """The manifest's values, typed (ValueError/TypeError/KeyError naming the key)."""

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ValueError(f"{key}: {what}")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)

    net, inputs, trading = m["network"], m["inputs"], m["trading"]
    need(isinstance(m["files"], dict) and all(isinstance(v, str) for v in m["files"].values()), "files",
         "must map each file to its sha256")  # fmt: skip
    need(isinstance(m["members"], list) and len(m["members"]) > 0, "members", "must be a non-empty list")
    for i, mem in enumerate(m["members"]):
        need(isinstance(mem, dict) and all(isinstance(mem.get(k), str) for k in ("name", "weights", "onnx")),
             f"members[{i}]", "needs name, weights and onnx (strings)")  # fmt: skip
        for k in ("weights", "onnx"):
            need(mem[k] in m["files"], f"members[{i}].{k}", f"{mem[k]!r} is not among the manifest's files")
    need(isinstance(net, dict) and isinstance(net.get("n_inputs"), int) and net["n_inputs"] > 0, "network.n_inputs",
         "must be a positive integer")  # fmt: skip
    need(net.get("input_dtype", "float32") in INPUT_DTYPES, "network.input_dtype",
         f"{net.get('input_dtype')!r} is not one of {', '.join(INPUT_DTYPES)}")  # fmt: skip
    for k in ("feature_names", "ofi_names"):
        names = inputs[k]
        need(
            isinstance(names, list) and all(isinstance(n, str) for n in names), f"inputs.{k}", "must be a list of names"
        )
    n_names = len(inputs["feature_names"]) + len(inputs["ofi_names"])
    need(n_names == net["n_inputs"], "inputs", f"{n_names} input names for a network of {net['n_inputs']} inputs")
    warm = inputs["warmup_bars"]
    need(isinstance(warm, int) and not isinstance(warm, bool) and warm >= 0, "inputs.warmup_bars",
         f"{warm!r} is not a count of bars")  # fmt: skip
    need(number(trading["cost"]) and 0 <= trading["cost"] < MAX_COST, "trading.cost",
         f"{trading['cost']!r} is not a cost in [0, {MAX_COST})")  # fmt: skip
    need(trading["fill"] in FILLS, "trading.fill", f"{trading['fill']!r} is not one of {', '.join(FILLS)}")
    need(isinstance(m["data"].get("content_hash"), str), "data.content_hash", "missing")


def check_files(root: Path, files: dict) -> None:
    """Every file of the bundle is in the manifest with its sha256, and the manifest names
    nothing outside the bundle (no `..`, no absolute path, no link out)."""
    inside = root.resolve()
    for rel in files:
        target = (root / rel).resolve()
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not target.is_relative_to(inside):
            raise BundleError(f"{root / MANIFEST}: file {rel!r} is outside the bundle; export the bundle again")
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()} - {MANIFEST}
    extra = sorted(present - set(files))
    if extra:
        raise BundleError(
            f"{root / extra[0]}: not in {MANIFEST} (a file the export did not write); remove it or export again"
        )
    for rel, digest in files.items():
        file = root / rel
        if not file.is_file():
            raise BundleError(f"{file}: missing from the bundle ({MANIFEST} lists it); export the bundle again")
        if sha256(file) != digest:
            raise BundleError(f"{file}: sha256 differs from {MANIFEST}'s: changed after export; export it again")


def check_inputs(bundle: Bundle, feature_names, ofi_names, where: str) -> None:
    """BundleError unless `where`'s feature and ofi names are the bundle's, in its order."""
    for kind, ours, theirs in (("feature", bundle.feature_names, feature_names), ("ofi", bundle.ofi_names, ofi_names)):
        theirs = list(theirs)
        if theirs == ours:
            continue
        if len(theirs) != len(ours):
            raise BundleError(f"{where}: {len(theirs)} {kind} columns, the policy reads {len(ours)} ({bundle.path})")
        j = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        raise BundleError(
            f"{where}: {kind} names differ from the policy's at column {j} (data {theirs[j]!r}, policy {ours[j]!r}); "
            "build the data with the fxray that made the policy"
        )
