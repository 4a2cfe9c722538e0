"""Runner for the machine chainrun runs on: subprocess with argv lists, never a shell."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from chainrun.runner.base import RunResult

log = logging.getLogger(__name__)


def with_env(base: Mapping[str, str], env: Mapping[str, str | None]) -> dict[str, str]:
    """``base`` with ``env`` applied: a value sets the variable, ``None`` removes it."""
    out = dict(base)
    for k, v in env.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


class LocalRunner:
    name = "local"

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 60.0,
        *,
        env: Mapping[str, str | None] | None = None,
        stdin: str | None = None,
    ) -> RunResult:
        argv = tuple(str(a) for a in argv)
        full_env = with_env(os.environ, env) if env else None
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=full_env,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            res = RunResult(argv, -1, out, f"timed out after {timeout:.0f}s", time.monotonic() - t0, timed_out=True)
        except FileNotFoundError:
            res = RunResult(argv, 127, "", f"{argv[0]}: command not found", time.monotonic() - t0)
        except PermissionError:
            res = RunResult(argv, 126, "", f"{argv[0]}: permission denied", time.monotonic() - t0)
        else:
            res = RunResult(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        log.debug("run %s -> rc=%s in %.2fs", argv, res.returncode, res.duration_s)
        return res

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def close(self) -> None:
        pass
