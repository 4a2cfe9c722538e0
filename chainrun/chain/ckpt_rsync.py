"""rsync for checkpoint copies, pure: the argv, what its ``--stats`` say, and its failures as typed errors.

A copy runs rsync on one machine (the driver, or a source site's login node for the direct route)
with ``-e`` the ssh that reaches the other side. ``-rlpt``: files, links, permissions and times, never
owners (a driver running as another user must not hand the files to itself). ``--partial`` keeps a
half-sent file, so the next run sends only the rest. ``-s`` passes paths to the far side as they are
(spaces survive, nothing is expanded by its shell).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from chainrun.errors import CopyError, CopyPermissionDenied, DiskFull, RsyncMissing
from chainrun.runner.base import RunResult

INTERRUPTED = "interrupted"
# runs argv ($0 "$@") and exits with its code, 254 in place of 255 (ssh's own failure code)
NOT_255 = '"$0" "$@"; rc=$?; [ "$rc" -ne 255 ] || rc=254; exit "$rc"'


def rsync_argv(src: str, dst: str, *, rsync: str = "rsync", ssh: Sequence[str] | None = None,
               remote_rsync: str | None = None, bwlimit_kbps: int | None = None) -> list[str]:
    """``rsync`` from ``src`` to ``dst`` (``host:path`` for the far side, reached with ``ssh``)."""
    # --delete: the receiving folder is the copy's own (a partial or staging folder); what a killed
    # receiver left beside the files goes
    argv = [rsync, "-rlpt", "--partial", "--delete", "-s", "--stats"]
    if bwlimit_kbps:
        argv.append(f"--bwlimit={int(bwlimit_kbps)}")
    if ssh:
        words = [str(w) for w in ssh]
        bad = [w for w in words if "'" in w and '"' in w]
        if bad:  # rsync splits -e itself, honouring one kind of quote per word
            raise CopyError(f"an ssh option holds both kinds of quote, which rsync cannot pass: {bad[0]!r}")
        argv += ["-e", " ".join(_rsync_quote(w) for w in words)]
    if remote_rsync and remote_rsync != "rsync":
        argv.append(f"--rsync-path={remote_rsync}")
    return [*argv, src, dst]


def _rsync_quote(word: str) -> str:
    if word and not re.search(r"[\s'\"]", word):
        return word
    return f'"{word}"' if "'" in word else f"'{word}'"


_STAT = re.compile(r"^(Literal data|Total transferred file size|Total file size|Number of regular files transferred)"
                   r":\s*([\d,.' ]+)", re.MULTILINE)


def parse_stats(text: str) -> dict[str, int]:
    """The counts of ``--stats`` we use, by their label (thousands separators of any locale dropped)."""
    out = {}
    for label, num in _STAT.findall(text):
        digits = re.sub(r"[^\d]", "", num.split(" bytes")[0])
        if digits:
            out[label] = int(digits)
    return out


@dataclass(frozen=True)
class Leg:
    """One rsync run of a copy: ``name`` is direct, pull (site to driver) or push (driver to site)."""

    name: str
    bytes_moved: int  # literal data sent (a resumed file sends only its rest)
    seconds: float


def route_throughput(legs: Sequence[Leg], min_bytes: int = 1 << 20) -> float | None:
    """Bytes per second of the route, from the legs that moved enough to measure: sequential legs add
    their times per byte (through the driver, pull then push). None when nothing was measurable."""
    usable = [leg for leg in legs if leg.bytes_moved >= min_bytes and leg.seconds > 0]
    if not usable:
        return None
    return 1.0 / sum(leg.seconds / leg.bytes_moved for leg in usable)


_MISSING = re.compile(r"rsync: (?:command )?not found|rsync: No such file or directory|"
                      r"exec request failed|rsync\S*: not found", re.IGNORECASE)
_LOGIN = re.compile(r"permission denied \((?:publickey|password|keyboard|gssapi|hostbased)|"
                    r"host key verification failed|no .* host key is known", re.IGNORECASE)
_FULL = re.compile(r"no space left on device|disk quota exceeded|\(28\)|\(122\)", re.IGNORECASE)
_DENIED = re.compile(r"permission denied|\(13\)|read-only file system", re.IGNORECASE)
_GONE = re.compile(r"vanished|no such file or directory \(2\)|change_dir .* failed", re.IGNORECASE)


def _reason(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("rsync error: some files")]
    for ln in lines:
        if ln.lower().startswith(("rsync:", "ssh:", "bash:", "sh:")) or "denied" in ln.lower():
            return ln[:200]
    return (lines[0] if lines else "")[:200]


def failure(res: RunResult, *, what: str, runs_on: str, far: str) -> CopyError:
    """The one-line error of a failed rsync run: ``what`` names the copy, ``runs_on`` the machine
    that ran rsync, ``far`` the other side."""
    text = f"{res.stderr}\n{res.stdout}"
    why = _reason(res.stderr) or res.first_error_line()
    if res.timed_out:
        return CopyError(f"{what}: rsync timed out; a re-run resumes what arrived")
    if res.returncode in (126, 127) and not re.search(r"connection unexpectedly closed", text):
        return RsyncMissing(f"{what}: rsync is not installed on {runs_on} ({why})",
                            hint="install rsync there, or set [copy] rsync to its path")
    if _MISSING.search(text):
        return RsyncMissing(f"{what}: rsync is not installed on {far} ({why})",
                            hint="install rsync there, or set its path with [copy] rsync")
    if _LOGIN.search(text):
        return CopyPermissionDenied(f"{what}: {runs_on} cannot log in to {far} without a prompt ({why})",
                                    hint="the direct route needs a key from one site to the other; "
                                    "otherwise copy through the driver")
    if _FULL.search(text):
        return DiskFull(f"{what}: no space left ({why})", hint="free space or quota there; a re-run resumes")
    if _DENIED.search(text):
        return CopyPermissionDenied(f"{what}: permission denied ({why})")
    if res.returncode in (20, -2, -9, -15, 130, 137, 143) or "received sigint" in text.lower():
        return CopyError(f"{what}: rsync was {INTERRUPTED} (exit {res.returncode}); a re-run resumes what arrived")
    if res.returncode in (23, 24) and _GONE.search(text):
        return CopyError(f"{what}: the source checkpoint changed or was removed while it was copied "
                         f"({why}); the next copy takes the newer one")
    return CopyError(f"{what}: rsync failed with exit {res.returncode} ({why})")
