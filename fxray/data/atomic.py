"""The one way fxray writes a file whole: fxcache files, checkpoints and markers, sweep.json,
results.json and every --json. Standard library only: every command imports it (through
fxray.cli), the live process included, and none of them should pay for pyarrow to write JSON.

    with atomic_path(out) as tmp:
        tmp.write_text(text)
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """A temporary path beside `path` to write; renamed to `path` when the block ends without an
    error, removed otherwise: a reader never sees half a file. Made by os.open, so the umask
    applies (mkstemp's 0600 would survive the rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
