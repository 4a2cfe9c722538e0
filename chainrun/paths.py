"""Where chainrun keeps its files: ``CHAINRUN_HOME`` if set, else platformdirs' data dir.

Folders are created 0700 and files 0600: the store holds job scripts and cluster names,
which are nobody else's business on a shared login node.
"""

from __future__ import annotations

import os
from pathlib import Path

from chainrun.errors import HomeError


def home_path() -> Path:
    """Where the home is, without creating it."""
    override = os.environ.get("CHAINRUN_HOME")
    if override:
        return Path(override).expanduser()
    import platformdirs  # small, but only needed once a path is wanted

    return Path(platformdirs.user_data_dir("chainrun", appauthor=False))


def home() -> Path:
    """The home folder, created 0700 if missing; HomeError (exit 6) if it cannot be created or written."""
    base = home_path()
    try:
        ensure_private_dir(base)
    except OSError as e:
        raise home_error(e, base) from None
    if not os.access(base, os.W_OK | os.X_OK):
        raise home_error(PermissionError(13, "Permission denied (not writable)", str(base)), base)
    return base


def home_error(e: OSError, path: Path | str | None = None) -> HomeError:
    """One line naming the home, what went wrong with ``path`` inside it, and what to do."""
    base = home_path()
    where = Path(e.filename) if getattr(e, "filename", None) else Path(path or base)
    what = "a file is in the way, not a folder" if isinstance(e, FileExistsError) else (e.strerror or str(e))
    inside = "" if where == base else f" ({where}: {what})"
    origin = "CHAINRUN_HOME" if os.environ.get("CHAINRUN_HOME") else "the chainrun home"
    msg = f"cannot use {origin} {base}" + (inside or f": {what}")
    return HomeError(msg, hint="set CHAINRUN_HOME to a folder you can create and write, "
                     "e.g. `export CHAINRUN_HOME=$HOME/.chainrun`")


def is_in_home(path: str | os.PathLike | None) -> bool:
    if not path:
        return False
    try:
        base = home_path().resolve()
        p = Path(path).resolve()
    except (OSError, RuntimeError, ValueError, TypeError):
        return False
    return p == base or base in p.parents


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
    return _private_sub("models")


def logs_dir() -> Path:
    return _private_sub("logs")


def _private_sub(name: str) -> Path:
    path = home() / name
    try:
        return ensure_private_dir(path)
    except OSError as e:
        raise home_error(e, path) from None
