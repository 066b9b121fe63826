"""The policy bundle: one directory holding everything a frozen policy needs.

    bundle = load("policy/")       # BundleError (one line naming the file and the fix)
    bundle.members                 # [Member]: name, fold, weights (numpy), mean, inv_std, onnx path
    bundle.feature_names, bundle.ofi_names, bundle.cost, bundle.fill, bundle.warmup_bars
    bundle.ofi_read                # the order-flow columns the policy reads (reads_ofi)
    ofi, unread = ofi_inputs(bundle, market.ofi_names, market.ofi, "new.fxcache")  # the policy's view of them

    policy/
      manifest.json                format "fxray.policy", version, and every fact below
      members/<name>.safetensors   the Q-network's state dict (fxray.rl.dqn.QNetwork), float32
      members/<name>.onnx          normalised market (T, 50) -> Q (T, 3 previous positions, 3 actions)
      normalisation.safetensors    <name>.mean, <name>.inv_std: (50,) float32, the member's train slice

The policy's Q-values at bar t are the mean over its members of
member.q_all((x_t - member.mean) * member.inv_std), x_t = features ++ ofi (float32); the
greedy policy is p_t = argmax_a Q[t, p_{t-1} + 1, a] - 1 from flat (docs/policy.md).
Every file's sha256 is in the manifest: a changed or missing file is refused, not used.

Which inputs a policy needs: the 42 features, which every fxray computes from bars, and the
order-flow columns it reads (`reads_ofi`); every other ofi column is fed 0, its value in every
bar the policy trained on. So a policy trained on bars alone runs on any bars (an OHLCV feed,
another market's fxcache, with or without order flow), and one that reads order flow runs only
where those columns are, by name (`ofi_inputs`, `missing_ofi`).

numpy and safetensors only: a live process needs no torch (fxray.policy.live).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fxray.data.schema import OFI_NAMES

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
    ofi_read: list[str]  # the ofi columns the policy reads (reads_ofi), in ofi_names order


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def need_export_extra(who: str, modules=("onnx", "onnxruntime")) -> None:
    """ValueError, one line naming the extra and its install command, unless `modules` are
    installed (the quick start's `pip install -e .` leaves them out; pyproject.toml's extra)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]  # None: not importable
    if missing:
        extra = "pip install -c constraints.txt -e '.[export]'"
        raise ValueError(f"{who} needs the `export` extra ({', '.join(missing)} not installed): {extra}")


def check_engine(engine: str, engines, flag: str = "engine") -> None:
    """BundleError unless `engine` is one of `engines` (and, for onnxruntime, installed)."""
    if engine not in engines:
        raise BundleError(f"{flag} {engine!r}: use one of {', '.join(engines)}")
    if engine == "onnxruntime":
        need_export_extra(f"{flag} onnxruntime", ("onnxruntime",))


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
    where = manifest_path  # the file an error is about
    try:
        check_manifest(manifest)
        check_files(root, manifest["files"])
        inputs, trading, n_inputs = manifest["inputs"], manifest["trading"], manifest["network"]["n_inputs"]
        names = inputs["feature_names"], inputs["ofi_names"]
        dtype = manifest["network"].get("input_dtype", "float32")
        facts = float(trading["cost"]), trading["fill"], inputs["warmup_bars"], dtype, manifest["data"]["content_hash"]
        listed = [(m["name"], m["fold"], m["weights"], m["onnx"]) for m in manifest["members"]]
        where = root / NORMALISATION
        norm = load_file(str(where))
        members = []
        for name, fold, file, onnx in listed:
            where = root / NORMALISATION
            mean, inv_std = norm[f"{name}.mean"], norm[f"{name}.inv_std"]
            if mean.shape != (n_inputs,) or inv_std.shape != (n_inputs,) or not np.isfinite([mean, inv_std]).all():
                raise ValueError(f"{name} mean and inv_std are not {n_inputs} finite numbers each")
            where = root / file
            weights = load_file(str(where))
            if weights["market_in.weight"].shape[1] != n_inputs:
                raise ValueError(f"the network does not take {n_inputs} inputs")
            bad = next((k for k, a in weights.items() if not np.all(np.isfinite(a))), None)
            if bad is not None:
                raise ValueError(f"{bad} holds NaN or Inf")
            members.append(Member(name, fold, weights, mean, inv_std, root / onnx))
    except BundleError:  # check_files's, naming its file
        raise
    except (KeyError, TypeError, ValueError, AttributeError, SafetensorError, OSError) as e:
        says = f"lacks {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise BundleError(f"{where}: {says}; export the bundle again") from None
    read = reads_ofi([(m.weights["market_in.weight"], m.mean, m.inv_std) for m in members], len(names[0]), names[1])
    return Bundle(root, manifest, members, *names, *facts, read)


def reads_ofi(members, n_features: int, ofi_names) -> list[str]:
    """The ofi columns a policy reads: those that some member weighs (a nonzero column of its
    first layer) and saw other than 0 in training (a column that was 0 on every bar of the
    train slice has mean 0 and inv_std 1, fxray.rl.device.DeviceData.set_fold). Every other
    column the policy is fed 0, its value in training: a policy trained on bars alone (whose
    ofi columns are zeros) reads no order flow, and a column its front end dropped (dqn.inputs:
    ridge with a screen) none at all. `members`: (first-layer weight (H, n_inputs), mean,
    inv_std) per member."""
    return [
        name
        for col, name in enumerate(ofi_names, start=n_features)
        if any(np.any(w[:, col] != 0) and not (mean[col] == 0 and inv_std[col] == 1) for w, mean, inv_std in members)
    ]


def check_manifest(m: dict) -> None:
    """The manifest's values the policy runs on (ValueError/TypeError/KeyError naming the key)."""

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ValueError(f"{key}: {what}")

    net, inputs, trading = m["network"], m["inputs"], m["trading"]
    need(isinstance(m["files"], dict), "files", "must map each file to its sha256")
    need(isinstance(m["members"], list) and len(m["members"]) > 0, "members", "must be a non-empty list")
    for i, mem in enumerate(m["members"]):
        for k in ("weights", "onnx"):
            need(mem[k] in m["files"], f"members[{i}].{k}", f"{mem[k]!r} is not among the manifest's files")
    need(net.get("input_dtype", "float32") in INPUT_DTYPES, "network.input_dtype",
         f"{net.get('input_dtype')!r} is not one of {', '.join(INPUT_DTYPES)}")  # fmt: skip
    n_names = len(inputs["feature_names"]) + len(inputs["ofi_names"])
    need(n_names == net["n_inputs"], "inputs", f"{n_names} input names for a network of {net['n_inputs']!r} inputs")
    warm, cost = inputs["warmup_bars"], trading["cost"]  # JSON's numbers: int or float (a bool is neither here)
    need(type(warm) is int and warm >= 0, "inputs.warmup_bars", f"{warm!r} is not a count of bars")
    need(type(cost) in (int, float) and 0 <= cost < MAX_COST, "trading.cost",
         f"{cost!r} is not a cost in [0, {MAX_COST})")  # fmt: skip
    need(trading["fill"] in FILLS, "trading.fill", f"{trading['fill']!r} is not one of {', '.join(FILLS)}")


def check_files(root: Path, files: dict) -> None:
    """Every file of the bundle is in the manifest with its sha256, and the manifest names
    nothing outside the bundle (no `..`, no absolute path, no link out)."""
    inside = root.resolve()
    for rel in files:
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not (root / rel).resolve().is_relative_to(inside):
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


def check_features(bundle: Bundle, feature_names, where: str) -> None:
    """BundleError unless `where`'s feature names are the bundle's, in its order."""
    theirs, ours = list(feature_names), list(bundle.feature_names)
    if theirs == ours:
        return
    if len(theirs) != len(ours):
        raise BundleError(f"{where}: {len(theirs)} feature columns, the policy reads {len(ours)} ({bundle.path})")
    j = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    raise BundleError(
        f"{where}: feature names differ from the policy's at column {j} (data {theirs[j]!r}, policy {ours[j]!r}); "
        "build the data with the fxray that made the policy"
    )


def ofi_inputs(bundle: Bundle, ofi_names, ofi: np.ndarray, where: str) -> tuple[np.ndarray, list[str]]:
    """(inputs, unread). inputs (N, len(bundle.ofi_names)) float32: the order flow as the policy
    reads it: the columns it reads taken by name from `ofi` (N, len(ofi_names)), 0 in the others
    (reads_ofi); `ofi` itself when that is what it already is. unread: `where`'s columns with
    order flow (not all zeros) that the policy does not read. BundleError (missing_ofi) naming
    the columns it reads that `where` lacks, absent or all zeros (no order flow)."""
    names = list(ofi_names)
    flowing = [n for n, f in zip(names, np.any(ofi != 0, axis=0)) if f]  # the columns not all zeros (one pass)
    has = f"its order flow: {', '.join(flowing)}" if flowing else "its ofi columns are all zeros: bars only"
    missing_ofi(bundle, flowing, where, has)
    unread = [n for n in flowing if n not in bundle.ofi_read]
    if names == list(bundle.ofi_names) and not unread:
        return ofi, unread
    out = np.zeros((len(ofi), len(bundle.ofi_names)), np.float32)
    for n in bundle.ofi_read:
        out[:, bundle.ofi_names.index(n)] = ofi[:, names.index(n)]
    return out, unread


def missing_ofi(bundle: Bundle, have, where: str, what: str, feed: bool = False) -> None:
    """BundleError, one line, if `have` (column names) lacks order flow the policy reads: which
    columns, what `where` has (`what`), and what to do, for an fxcache or (`feed`) a feed of bars."""
    lacks = [n for n in bundle.ofi_read if n not in have]
    if not lacks:
        return
    data = bundle.manifest["data"]
    train_here = "fxray tune --experiment EXPERIMENT.yaml --data " + ("BARS.fxcache" if feed else where)
    if not set(lacks) <= set(OFI_NAMES):  # not fxray's order flow from books (docs/ofi.md): the synthetic market's
        fix = "only fxray's synthetic markets have these columns" + (
            ", no feed of real bars does: run a policy trained on bars"
            if feed
            else ": backtest it on one (fxray data synth), or train a policy on this data"
        )
    elif feed:
        fix = "give them as CSV columns by name (docs/ofi.md), or run a policy trained on bars alone"
    else:
        fix = "build the data with its book or trades (fxray data build --book/--trades), or train a policy on it"
    raise BundleError(
        f"{where}: lacks the order flow this policy reads: {', '.join(lacks)} (it was trained on "
        f"{data.get('instrument')} from {data.get('source')}; {what}); {fix} ({train_here})"
    )
