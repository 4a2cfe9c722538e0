"""Where chainrun keeps its files: ``CHAINRUN_HOME`` if set, else platformdirs' data dir.

Folders are created 0700 and files 0600: the store holds job scripts and cluster names,
which are nobody else's business on a shared login node.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    override = os.environ.get("CHAINRUN_HOME")
    if override:
        base = Path(override).expanduser()
    else:
        import platformdirs  # small, but only needed once a path is wanted

        base = Path(platformdirs.user_data_dir("chainrun", appauthor=False))
    return ensure_private_dir(base)


def ensure_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except PermissionError:  # not ours (e.g. a shared override): leave it
        pass
    return path


def state_db() -> Path:
    return home() / "state.sqlite"


def models_dir() -> Path:
    return ensure_private_dir(home() / "models")


def logs_dir() -> Path:
    return ensure_private_dir(home() / "logs")
