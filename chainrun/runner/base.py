"""The Runner protocol, its result object, and what both SSH transports share.

The remote errors and the command line live here, not in runner/ssh.py, so the OpenSSH
transport (runner/openssh.py) raises the same types without importing paramiko.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from chainrun.errors import RemoteError


class RemoteUnreachable(RemoteError):
    """The login node cannot be reached right now; the watcher retries on a later tick."""


class HostKeyError(RemoteError):
    """The server's host key is unknown or has changed."""


def command_line(argv: Sequence[str], env: Mapping[str, str | None] | None = None, *, login_shell: bool = False) -> str:
    """The single string sshd hands to the remote shell; every argument stays one literal word.
    ``env``: ``K=V`` sets a variable, ``K: None`` removes it (``env -u K``) from what the remote
    profile left in the environment."""
    words = [str(a) for a in argv]
    if env:
        unset = [w for k, v in env.items() if v is None for w in ("-u", k)]
        words = ["env", *unset, *(f"{k}={v}" for k, v in env.items() if v is not None), *words]
    line = shlex.join(words)
    return shlex.join(["bash", "-lc", line]) if login_shell else line


@dataclass(frozen=True)
class RunResult:
    """What a command did. A runner never raises for a non-zero exit; callers decide."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def first_error_line(self) -> str:
        for line in (self.stderr or self.stdout).splitlines():
            if line.strip():
                return line.strip()
        return f"exit code {self.returncode}" if not self.timed_out else "timed out"


class Runner(Protocol):
    """Runs argv lists on one machine (this one, or a cluster's login node)."""

    name: str

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 60.0,
        *,
        env: Mapping[str, str | None] | None = None,
        stdin: str | None = None,
    ) -> RunResult:
        """Run ``argv`` (no shell), with extra environment ``env``, and return its result.
        A ``None`` value in ``env`` removes that variable from the command's environment.

        Raises :class:`chainrun.errors.RemoteError` only when the machine cannot be reached
        at all; a command that runs and fails is a RunResult with a non-zero returncode.
        """
        ...

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        """Write a text file atomically on the runner's machine (parents created)."""
        ...

    def close(self) -> None: ...


def innermost(runner):
    """The runner under any wrappers (the acting watcher's FencedRunner keeps it as ``_inner``): what
    decides the transport. Calls still go through the wrapper, so its checks hold."""
    seen = 0
    while hasattr(runner, "_inner") and seen < 8:
        runner, seen = runner._inner, seen + 1
    return runner
