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
    path: Path
    manifest: dict
    members: list[Member]

    @property
    def feature_names(self) -> list[str]:
        return self.manifest["inputs"]["feature_names"]

    @property
    def ofi_names(self) -> list[str]:
        return self.manifest["inputs"]["ofi_names"]

    @property
    def input_names(self) -> list[str]:
        return self.feature_names + self.ofi_names

    @property
    def cost(self) -> float:
        return float(self.manifest["trading"]["cost"])

    @property
    def fill(self) -> str:
        return self.manifest["trading"]["fill"]

    @property
    def warmup_bars(self) -> int:
        return int(self.manifest["inputs"]["warmup_bars"])

    @property
    def network(self) -> dict:
        return self.manifest["network"]

    @property
    def content_hash(self) -> str:
        return self.manifest["data"]["content_hash"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load(path) -> Bundle:
    """Read and check a bundle directory: manifest format and version, every listed file
    present with its sha256, the tensors' names and shapes. Raises BundleError."""
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
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{manifest_path}: not JSON ({e}); export the bundle again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{manifest_path}: not an {FORMAT} manifest (format {manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise BundleError(
            f"{manifest_path}: bundle version {manifest.get('version')!r} is unknown to this fxray "
            f"(reads {VERSION}); export it again with this fxray's `python -m fxray.export`"
        )
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise BundleError(f"{manifest_path}: lacks {', '.join(missing)}; export the bundle again")
    for rel, digest in manifest["files"].items():
        file = root / rel
        if not file.is_file():
            raise BundleError(f"{file}: missing from the bundle ({MANIFEST} lists it); export the bundle again")
        if sha256(file) != digest:
            raise BundleError(f"{file}: sha256 differs from {MANIFEST}'s: changed after export; export it again")
    n_inputs = int(manifest["network"]["n_inputs"])
    names = manifest["inputs"]["feature_names"] + manifest["inputs"]["ofi_names"]
    if len(names) != n_inputs:
        raise BundleError(f"{manifest_path}: {len(names)} input names for a network of {n_inputs} inputs")
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
            members.append(Member(m["name"], m["fold"], weights, mean, inv_std, root / m["onnx"]))
    except (KeyError, SafetensorError, OSError) as e:
        raise BundleError(f"{root}: a tensor file lacks {e} or is unreadable; export the bundle again") from None
    if not members:
        raise BundleError(f"{manifest_path}: no members; export the bundle again")
    return Bundle(root, manifest, members)


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
