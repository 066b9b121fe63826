"""Shared fixtures: small synthetic markets written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SHARED_DATA = Path(os.environ.get("FXRAY_SHARED_DATA", SHARED / "data"))

# Tests run on the CPU with a fixed thread count: results do not depend on the box.
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def synth_cache(tmp_path_factory) -> Path:
    """60k bars (~8 weeks of a 24x5 market) of the planted-signal market, seed 0."""
    from fxray.data.synth import SynthSpec, to_cache

    path = tmp_path_factory.mktemp("synth") / "synth60k.fxcache"
    to_cache(SynthSpec(n_bars=60_000, seed=0), path)
    return path


STRONG = dict(beta=0.10, persistence=0.95, ofi_noise=0.0, ofi_span=1)  # ofi[:, 0] is the signal itself


@pytest.fixture(scope="session")
def strong_cache(tmp_path_factory) -> Path:
    """60k bars of a market whose signal is strong and observed directly (the pre-2 default):
    for tests that a learner learns at all, in seconds."""
    from fxray.data.synth import SynthSpec, to_cache

    path = tmp_path_factory.mktemp("strong") / "strong60k.fxcache"
    to_cache(SynthSpec(n_bars=60_000, seed=0, **STRONG), path)
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
