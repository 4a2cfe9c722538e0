"""Logging: warnings to stderr, everything (with tracebacks) to the log file."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from chainrun.errors import ChainrunError

VERBOSE = 0
_configured = False


def configure(*, verbose: int = 0, quiet: bool = False) -> None:
    global VERBOSE, _configured
    VERBOSE = verbose
    root = logging.getLogger("chainrun")
    if _configured:
        return
    _configured = True
    root.setLevel(logging.DEBUG)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.ERROR if quiet else (logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING))
    console.setFormatter(logging.Formatter("chainrun: %(levelname)s: %(message)s"))
    root.addHandler(console)
    try:
        from chainrun.paths import logs_dir

        fh = logging.FileHandler(logs_dir() / "chainrun.log", encoding="utf-8")
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
        root.addHandler(fh)
        logging.getLogger("paramiko").addHandler(fh)  # its warnings and errors (tracebacks) go to the file only
    except (OSError, ChainrunError):  # an unusable home must not stop a command that does not need it
        pass


def log_exception(exc: BaseException) -> Path | str:
    try:
        from chainrun.paths import logs_dir

        path = logs_dir() / "chainrun.log"
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return path
    except (OSError, ChainrunError):  # the home itself is the problem: nowhere to log
        return "<no log file>"
