"""The checkpoint follows the chain: copy the newest complete checkpoint from one site to another.

A copy lands under a partial name in the destination's checkpoint folder
(``.chainrun-incoming.<name>``), is verified there against the source's manifest (sizes and
sha256, read on the destination by one command), and only then is renamed into place, its marker
written last (the templates' own order): a partial or wrong copy is never the destination's
latest. rsync runs with ``--partial``: a copy that was killed, lost its connection or failed
verification is resumed by the next call (a file that failed verification is removed first,
since rsync's size-and-time check would keep it).

Two routes. **direct**: the source's login node runs rsync to the destination, with the ssh
that site's own configuration provides (``[copy.A.direct]``, chain/ckpt_routes.py): only where keys between sites
are allowed. **driver**: rsync runs here, pulling into a local staging folder and pushing on,
over the OpenSSH transport's own connections (its ControlMaster: a site with MFA needs no second
login). Progress (bytes, throughput) goes to a callback and, optionally, a JSON file for `status`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from chainrun.chain import ckpt_manifest as cm
from chainrun.chain import ckpt_rsync as cr
from chainrun.chain.ckpt_cleanup import cleanup_unused
from chainrun.chain.ckpt_land import land, landed
from chainrun.chain.ckpt_manifest import manifest
from chainrun.chain.ckpt_site import INCOMING, CopySite, DirectRoute, site_for
from chainrun.errors import CopyError, NotFoundError, UsageError
from chainrun.runner.base import Runner, RunResult
from chainrun.runner.local import LocalRunner

DIRECT, DRIVER = "direct", "driver"
# the whole API from one import: the ends (ckpt_site), the manifest, the arrival (ckpt_land), the cleanup
__all__ = ["CopyProgress", "CopyResult", "CopySite", "DirectRoute", "INCOMING", "choose_route", "cleanup_unused",
           "copy_checkpoint", "land", "landed", "manifest", "send", "site_for"]


@dataclass
class CopyProgress:
    """A copy as `status` shows it; ``bytes_done`` of ``bytes_total`` counts every leg's bytes."""

    src: str
    dst: str
    route: str
    state: str = "manifest"  # manifest, copying, verifying, done, failed
    leg: str = ""
    generation: int | None = None
    step: int | None = None
    checkpoint_bytes: int = 0  # the checkpoint's size
    bytes_total: int = 0  # ...times the legs that carry it (two through the driver between two sites)
    bytes_done: int = 0
    throughput_Bps: float | None = None  # of the running leg, live; the route's when done
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CopyResult:
    src: str
    dst: str
    route: str
    manifest: cm.Manifest
    legs: tuple[cr.Leg, ...]
    seconds: float
    throughput_Bps: float | None  # rsync's legs alone (the network and ssh); None if unmeasurable
    already: bool = False  # the destination held this checkpoint already: nothing was sent

    @property
    def copy_Bps(self) -> float | None:
        """The whole copy's rate (manifest, rsync, verification, rename) when every leg sent the whole
        checkpoint: what a move costs, transfer time = size / copy_Bps. None for a resumed or no-op copy."""
        size = self.manifest.total_bytes
        if not self.legs or size < (1 << 20) or any(leg.bytes_moved < 0.9 * size for leg in self.legs):
            return None
        return size / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict:
        return {"src": self.src, "dst": self.dst, "route": self.route, "checkpoint": self.manifest.summary(),
                "legs": [asdict(leg) for leg in self.legs], "seconds": round(self.seconds, 3),
                "throughput_Bps": self.throughput_Bps, "copy_Bps": self.copy_Bps, "already": self.already}


class _Reporter:
    """Calls ``on_progress`` and rewrites ``progress_file`` (atomically) on every change."""

    def __init__(self, prog: CopyProgress, on_progress: Callable[[CopyProgress], None] | None,
                 progress_file: str | os.PathLike | None) -> None:
        self.prog, self.on_progress, self.file = prog, on_progress, progress_file
        self.lock = threading.Lock()

    def __call__(self, **changes) -> None:
        with self.lock:
            for k, v in changes.items():
                setattr(self.prog, k, v)
            self.prog.updated_at = time.time()
            if self.file:
                tmp = Path(f"{self.file}.tmp")
                tmp.write_text(json.dumps(self.prog.to_dict()))
                os.replace(tmp, self.file)
            if self.on_progress:
                self.on_progress(self.prog)


def choose_route(src: CopySite, dst: CopySite, route: str = "auto") -> str:
    """``auto``: direct where the source's configuration allows it, else through the driver."""
    if route not in ("auto", DIRECT, DRIVER):
        raise UsageError(f"unknown copy route {route!r}", hint="auto, direct or driver")
    if route == DIRECT and dst.name not in src.direct:
        raise UsageError(f"no direct route from {src.name} to {dst.name}",
                         hint=f"allow it in config.toml ([copy.{src.name}.direct] {dst.name} = \"ALIAS\"), "
                         "or copy through the driver")
    if route == "auto":
        return DIRECT if dst.name in src.direct else DRIVER
    return route


def copy_checkpoint(src: CopySite, dst: CopySite, *, route: str = "auto", manifest: cm.Manifest | None = None,
                    staging_dir: str | os.PathLike | None = None, bwlimit_kbps: int | None = None,
                    on_progress: Callable[[CopyProgress], None] | None = None,
                    progress_file: str | os.PathLike | None = None, poll_s: float | None = 5.0,
                    timeout_s: float = 24 * 3600.0) -> CopyResult:
    """Copy ``src``'s newest complete checkpoint (or ``manifest``'s) into ``dst``'s checkpoint folder,
    verified there before it is put in place. Raises a CopyError subclass in one line on failure;
    calling it again resumes."""
    route = choose_route(src, dst, route)
    prog = CopyProgress(src.name, dst.name, route)
    report = _Reporter(prog, on_progress, progress_file)
    report()
    t0 = time.monotonic()
    try:
        man = manifest or cm.manifest(src.runner, src.ckpt_dir)
        if man is None:
            raise NotFoundError(f"no complete checkpoint in {src.ckpt_dir} on {src.name} yet")
        report(generation=man.generation, step=man.step, checkpoint_bytes=man.total_bytes, bytes_total=man.total_bytes)
        if man.kind == cm.FOLDER and landed(dst, man):
            report(state="done", bytes_done=man.total_bytes)
            return CopyResult(src.name, dst.name, route, man, (), time.monotonic() - t0, None, already=True)
        partial, legs = send(src, dst, man, route=route, staging_dir=staging_dir, bwlimit_kbps=bwlimit_kbps,
                             report=report, poll_s=poll_s, timeout_s=timeout_s)
        report(state="verifying")
        land(dst, man, partial, source=src.name)
        if route == DRIVER and not src.here and not dst.here:
            shutil.rmtree(_staging(staging_dir, src, dst, man), ignore_errors=True)
        tput = cr.route_throughput(legs)
        report(state="done", throughput_Bps=tput, bytes_done=prog.bytes_total)
        return CopyResult(src.name, dst.name, route, man, tuple(legs), time.monotonic() - t0, tput)
    except Exception as e:
        report(state="failed", error=str(e))
        raise


def send(src: CopySite, dst: CopySite, man: cm.Manifest, *, route: str = "auto", staging_dir=None,
         bwlimit_kbps: int | None = None, report: _Reporter | None = None, poll_s: float | None = 5.0,
         timeout_s: float = 24 * 3600.0) -> tuple[str, list[cr.Leg]]:
    """The transfer alone: ``man``'s files into the destination's partial folder (returned, with the
    legs run). Nothing is in place until :func:`land` verified it."""
    route = choose_route(src, dst, route)
    report = report or _Reporter(CopyProgress(src.name, dst.name, route, checkpoint_bytes=man.total_bytes), None, None)
    partial = f"{dst.ckpt_dir}/{INCOMING}{man.name}"
    _mkdir(dst, partial)
    text = _text(man.content)
    if text is not None:  # a small single file: the bytes hashed on the source are the bytes sent
        dst.runner.write_file(f"{partial}/{man.name}", text, 0o600)
        return partial, []
    what = f"copy of {man.name} from {src.name} to {dst.name}"
    return partial, _send(src, dst, man, route, partial, what, staging_dir, bwlimit_kbps, report, poll_s, timeout_s)


def _text(content: bytes | None) -> str | None:
    try:
        return None if content is None else content.decode("utf-8")
    except UnicodeDecodeError:
        return None  # runners write text: other bytes go by rsync


def _staging(staging_dir, src: CopySite, dst: CopySite, man: cm.Manifest) -> Path:
    if staging_dir is None:
        from chainrun import paths

        staging_dir = paths.home() / "ckpt-staging"
    return Path(staging_dir) / f"{src.name}-{dst.name}" / man.name


def _send(src, dst, man, route, partial, what, staging_dir, bwlimit_kbps, report, poll_s, timeout_s) -> list[cr.Leg]:
    item = f"{src.ckpt_dir}/{man.name}" + ("/" if man.kind == cm.FOLDER else "")
    if route == DIRECT:
        r = src.direct[dst.name]
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", *r.ssh_options]
        argv = cr.rsync_argv(item, f"{r.dest}:{partial}/", rsync=src.rsync, ssh=ssh, remote_rsync=dst.rsync,
                             bwlimit_kbps=bwlimit_kbps)
        # rsync's own exit 255 (its ssh failed) must not read as the transport's: the runner would
        # take the inner ssh's "Permission denied (publickey)" for its own login failing
        argv = ["sh", "-c", cr.NOT_255, *argv]
        return [_leg(src.runner, argv, "direct", dst, partial, what, src.name, dst.name, report, 0, 1, poll_s, timeout_s)]
    here = LocalRunner()
    if src.here or dst.here:  # one leg: the driver's machine is one of the ends
        far = dst if src.here else src
        argv = cr.rsync_argv(src.path(item), dst.path(partial) + "/", rsync="rsync", ssh=far.ssh,
                             remote_rsync=far.rsync, bwlimit_kbps=bwlimit_kbps)
        return [_leg(here, argv, "push" if src.here else "pull", dst, partial, what, "this machine", far.name,
                     report, 0, 1, poll_s, timeout_s)]
    stage = _staging(staging_dir, src, dst, man)
    stage.mkdir(parents=True, exist_ok=True, mode=0o700)
    local = CopySite("driver", here, str(stage))
    pull = cr.rsync_argv(src.path(item), f"{stage}/", ssh=src.ssh, remote_rsync=src.rsync, bwlimit_kbps=bwlimit_kbps)
    push = cr.rsync_argv(f"{stage}/", dst.path(partial) + "/", ssh=dst.ssh, remote_rsync=dst.rsync,
                         bwlimit_kbps=bwlimit_kbps)
    return [_leg(here, pull, "pull", local, str(stage), what, "this machine", src.name, report, 0, 2, poll_s, timeout_s),
            _leg(here, push, "push", dst, partial, what, "this machine", dst.name, report, 1, 2, poll_s, timeout_s)]


def _leg(runner: Runner, argv, name, receiver: CopySite, into: str, what, runs_on, far, report, index, count,
         poll_s, timeout_s) -> cr.Leg:
    """One rsync run; a side thread measures what arrived in ``into`` every ``poll_s`` seconds."""
    total = report.prog.checkpoint_bytes
    base = total * index
    report(state="copying", leg=name, bytes_total=total * count, bytes_done=base)
    stop = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        while not stop.wait(poll_s):
            got = _bytes_in(receiver, into)
            if got is not None and not stop.is_set():
                dt = time.monotonic() - t0
                report(bytes_done=base + min(got, total), throughput_Bps=got / dt if dt > 0 else None)

    watcher = threading.Thread(target=watch, daemon=True) if poll_s else None
    if watcher:
        watcher.start()
    try:
        res: RunResult = runner.run(argv, timeout_s)
    finally:
        stop.set()
        if watcher:
            watcher.join(30)
    if not res.ok:
        raise cr.failure(res, what=f"{what} ({name})", runs_on=runs_on, far=far)
    moved = cr.parse_stats(res.stdout).get("Literal data", 0)
    report(bytes_done=base + total)
    return cr.Leg(name, moved, res.duration_s)


def _bytes_in(site: CopySite, folder: str) -> int | None:
    """Bytes under ``folder`` (rsync's temporary files included); None when it cannot be read now."""
    if site.here:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs
                   if os.path.exists(os.path.join(d, f)))
    try:
        res = site.runner.run(["du", "-sb", "--", folder], 60)
    except CopyError:
        return None
    except Exception:  # a progress poll never breaks the copy (a busy master, a lost session)
        return None
    head = res.stdout.split()[:1]
    return int(head[0]) if res.ok and head and head[0].isdigit() else None


def _mkdir(site: CopySite, folder: str) -> None:
    res = site.runner.run(["mkdir", "-p", "-m", "700", "--", folder], 60)
    if not res.ok:
        raise cr.failure(res, what=f"cannot create {folder} on {site.name}", runs_on=site.name, far=site.name)
