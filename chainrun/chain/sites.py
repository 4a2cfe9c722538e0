"""A chain spanning clusters, at submit (issue 26, part 3): ``chainrun submit train.sh --cluster a,b``.

The order is the preference. Before anything is written, every site is reached without a prompt (a
driver must reach each one unattended: an OpenSSH site that needs a login with no open master, or an
untrusted host key, refuses the chain) and the GPUs each declares (``[clusters.NAME.gpu]``) are held
against ``--gpu-mem``/``--dtype``. Then each site gets its own run and checkpoint folders, its token,
its copy of the script and its wrapper (``CHAINRUN_CLUSTER`` says where it runs); ``sbatch --test-only``
and the optional preflight job run on every site (chain/preflight.py). Only when all passed is the chain
recorded with its sites (``chain_sites``), and segment 0 submitted where the rule places it: on the
first site unless another is expected to finish more than the margin sooner (each site's wait by its
queue-delay model where one was trained, else Slurm's own estimate from those ``--test-only`` runs:
chain/first_wait.py; the rule: chain/site_plan.py ``first_site``).

The watcher then places each next segment (chain/site_plan.py) and carries out moves (chain/mover.py).
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from chainrun import clusters
from chainrun.chain import copy_ready, preflight
from chainrun.chain.contract import render_wrapper, sbatch_options, token_text
from chainrun.chain.create import (SubmitRequest, SubmitResult, _default_output, _partition, _refuse_owned,
                                   _segment_length, _upload_name, create_chain, make_folders)
from chainrun.chain.request import merge_site_options
from chainrun.chain.segments import wrapper_path
from chainrun.errors import ChainrunError, RemoteError, SiteRefused, UsageError
from chainrun.runner.base import HostKeyError, Runner, innermost
from chainrun.site_config import SiteSettings, parse_dtype, parse_memory_mb
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import Chain, ChainSite
from chainrun.state.store import Store

MOVES = "by the rule"  # what a spanning chain's submit says about moves (chain/site_plan.py, chain/mover.py)
MOVES_NOTE = ("it starts on {first}; each next segment runs where the chain is expected to finish first, moving "
              "only to gain more than the margin ({margin}); `chainrun status` shows every decision")


def parse_sites(text: str) -> list[str]:
    """``a,b`` -> ["a", "b"] (order = preference); one name -> [name]."""
    names = [n.strip() for n in (text or "").split(",")]
    if any(not n for n in names):
        raise UsageError(f"--cluster {text!r}: an empty cluster name", hint="e.g. --cluster a,b")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--cluster {text!r} names {', '.join(dup)} twice",
                         hint="each cluster once, in order of preference")
    if "all" in names:
        raise UsageError("--cluster all is not a site", hint="name the clusters, e.g. --cluster a,b")
    return names


@dataclass(frozen=True)
class GpuNeed:
    memory_mb: int | None = None
    dtype: str | None = None

    @property
    def any(self) -> bool:
        return self.memory_mb is not None or self.dtype is not None


def parse_gpu_need(memory: str | None, dtype: str | None) -> GpuNeed:
    mem = None
    if memory is not None:
        mem = parse_memory_mb(memory)
        if mem is None or mem <= 0:
            raise UsageError(f"--gpu-mem {memory!r} is not a size", hint="e.g. --gpu-mem 40G")
    dt = None
    if dtype is not None:
        dt = parse_dtype(dtype)
        if dt is None:
            raise UsageError(f"--dtype {dtype!r} is not a dtype chainrun knows",
                             hint="e.g. bf16, fp16, fp32, tf32, fp8")
    return GpuNeed(mem, dt)


def gpu_fit(name: str, s: SiteSettings, need: GpuNeed) -> str:
    """A note on how this site's declared GPUs fit the chain's need; raises SiteRefused when they do not.
    What the site does not declare cannot be checked: the note says so."""
    notes = []
    if need.memory_mb is not None:
        if s.gpu_memory_mb is None:
            notes.append("GPU memory not declared ([clusters.%s.gpu] memory): not checked" % name)
        elif s.gpu_memory_mb < need.memory_mb:
            raise SiteRefused(f"cluster {name}: its GPUs have {_gb(s.gpu_memory_mb)} of memory, the chain needs "
                              f"{_gb(need.memory_mb)} (--gpu-mem)")
        else:
            notes.append(f"GPU memory {_gb(s.gpu_memory_mb)} >= {_gb(need.memory_mb)}")
    if need.dtype is not None:
        if s.gpu_dtypes is None:
            notes.append("GPU dtypes not declared ([clusters.%s.gpu] dtypes): not checked" % name)
        elif need.dtype not in s.gpu_dtypes:
            raise SiteRefused(f"cluster {name}: its GPUs do not support {need.dtype} (declared: "
                              f"{', '.join(s.gpu_dtypes) or 'none'}), the chain needs it (--dtype)")
        else:
            notes.append(f"GPUs support {need.dtype}")
    return "; ".join(notes)


def _gb(mb: int) -> str:
    return f"{mb / 1024:g}G"


@dataclass
class Site:
    """One site while the chain is being prepared (the stored form is records.ChainSite)."""

    name: str
    rank: int
    runner: Runner
    settings: SiteSettings
    workdir: str = ""
    script: str = ""  # the payload there
    script_text: str = ""
    upload: bool = False  # chainrun writes script_text to the site's run folder
    notes: dict = field(default_factory=dict)  # check -> what it found (the submit result shows them)

    @property
    def slurm(self) -> SlurmClient:
        return SlurmClient(self.runner)


def reach(name: str, runner: Runner) -> str:
    """Run ``true`` there with no prompt possible (BatchMode). A site that wants a human refuses the chain."""
    from chainrun.runner.openssh import LoginRequired, OpenSSHRunner, master_check

    why = "a chain spanning clusters needs a driver that reaches every cluster without a prompt"
    try:
        res = runner.run(["true"], 60)
    except LoginRequired:
        raise SiteRefused(f"cluster {name}: needs a login (MFA or a password) and no SSH master is open; {why}",
                          hint=f"open one with `chainrun cluster login {name}` (ControlPersist long enough), "
                               "or run the driver on a login node") from None
    except HostKeyError as e:
        raise SiteRefused(f"cluster {name}: its host key is not trusted ({e.message}); {why}", hint=e.hint) from None
    except RemoteError as e:
        raise SiteRefused(f"cluster {name}: unreachable ({e.message}); {why}", hint=e.hint) from None
    if not res.ok:
        raise SiteRefused(f"cluster {name}: `true` failed there: {res.first_error_line()}")
    inner = innermost(runner)
    if isinstance(inner, OpenSSHRunner) and master_check(inner.alias) and _login_without_master(inner.alias):
        return ("reached over the open SSH master; without it the site asks for a login: keep it open while the "
                f"chain runs (`chainrun cluster login {name}`)")
    return "reached without a prompt" if name != clusters.LOCAL else "this machine"


def _login_without_master(alias: str) -> bool:
    """Whether a connection of its own (no master) would need a human: one BatchMode attempt."""
    import subprocess

    from chainrun.runner.openssh import base_argv

    argv = ["ssh", "-o", "ControlPath=none", *base_argv(alias)[1:], "true"]  # ssh: the first -o given wins
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 255 and "permission denied (" in p.stderr.lower()


def open_sites(names: list[str], open_runner: Callable[[str], tuple[Runner, object]], *, local_workdir: str,
               need: GpuNeed) -> list[Site]:
    """Every site, its settings checked against the need, then reached; a checkpoint copy must be able to
    reach it (chain/copy_ready.py). Nothing is written yet."""
    cfg = clusters.load()
    specs = {n: (None if n == clusters.LOCAL else clusters.get(n, cfg)) for n in names}  # unknown names: one line
    settings = {n: clusters.site_settings(n, cfg) for n in names}
    fits = {n: gpu_fit(n, settings[n], need) for n in names}  # pure: before any connection
    copy_ready.check_driver_rsync(names)
    sites: list[Site] = []
    try:
        for rank, n in enumerate(names):
            runner, _ = open_runner(n)
            site = Site(n, rank, runner, settings[n])
            sites.append(site)
            copy_ready.check_transport(n, runner)  # before connecting: the transport alone decides
            site.notes["reach"] = reach(n, runner)
            site.notes["rsync"] = copy_ready.check_rsync(n, runner)
            if fits[n]:
                site.notes["gpu"] = fits[n]
            spec = specs[n]
            site.workdir = local_workdir if spec is None else (spec.workdir or runner.home())
    except BaseException:
        close_sites(sites)
        raise
    return sites


def close_sites(sites: list[Site]) -> None:
    for s in sites:
        s.runner.close()


def choose_scripts(sites: list[Site], *, script: str, script_text: str) -> None:
    """Each site's payload: its own ``[clusters.NAME.job] script`` (read there), else the submitted script
    (in place on this machine, an uploaded copy elsewhere). An environment file is sourced by a copy."""
    for s in sites:
        if s.settings.script:
            res = s.runner.run(["cat", "--", s.settings.script], 60)
            if not res.ok:
                raise SiteRefused(f"cluster {s.name}: cannot read its script {s.settings.script}: "
                                  f"{res.first_error_line()}")
            s.script, s.script_text, s.upload = s.settings.script, res.stdout, False
        else:
            s.script, s.script_text, s.upload = script, script_text, s.name != clusters.LOCAL
        if s.settings.env_file:
            check_env_file(s)
            s.script_text, s.upload = with_env_file(s.name, s.script_text, s.settings.env_file), True


def check_env_file(s: Site) -> None:
    """The environment file must be readable there, as the script's copy names it (quoted, as given):
    found only when a segment runs on that site, a missing one fails the chain hours later."""
    f = s.settings.env_file or ""
    res = s.runner.run(["test", "-r", f], 60)
    if res.ok:
        s.notes["env_file"] = f"{f} readable"
        return
    why = res.first_error_line() if res.returncode != 1 else "missing or not readable"
    if f.startswith("~"):  # sourced quoted, as given: the shell does not expand it
        why += "; ~ is not expanded: give the full path"
    raise SiteRefused(f"cluster {s.name}: cannot read its env_file {f} ({why})",
                      hint=f"create it there, or fix [clusters.{s.name}.job] env_file in config.toml")


_SHELL = re.compile(r"^#!\s*\S*/(?:env\s+)?(?:ba|z|k|da)?sh\b")


def with_env_file(name: str, text: str, env_file: str) -> str:
    """The script with ``. ENV_FILE`` after its header (shebang, comments, #SBATCH lines), so sbatch
    still reads those lines; only a shell script can source a file."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("#!") and not _SHELL.match(lines[0]):
        raise SiteRefused(f"cluster {name}: env_file needs a shell script, and the script starts with "
                          f"{lines[0].strip()}", hint="source the file in the script itself, or drop env_file")
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
        i += 1
    q = "'" + env_file.replace("'", "'\\''") + "'"
    src = (f". {q} || {{ echo \"chainrun: cannot source {env_file} on {name}\" >&2; exit 3; }}"
           "  # [clusters.%s.job] env_file\n" % name)
    return "".join(lines[:i]) + src + "".join(lines[i:])


def submit_spanning(store: Store, names: list[str], req: SubmitRequest, *,
                    open_runner: Callable[[str], tuple[Runner, object]], need: GpuNeed) -> SubmitResult:
    """Check and prepare every site, record the chain with them, start it on the first."""
    if len(names) < 2:
        raise UsageError("a chain spanning clusters needs two clusters or more", hint="e.g. --cluster a,b")
    if req.shapes:
        raise UsageError("--shapes with several clusters is not supported yet",
                         hint="give one cluster, or drop --shapes")
    if req.checkpoint_dir and not posixpath.isabs(req.checkpoint_dir):
        raise UsageError("--checkpoint-dir must be an absolute path with several clusters (used on each)")
    req = with_site_margin(req, names)
    sites = open_sites(names, open_runner, local_workdir=req.workdir, need=need)
    try:
        choose_scripts(sites, script=req.script, script_text=req.script_text)
        first = sites[0]
        req0 = replace(req, cluster=first.name, workdir=first.workdir, script=first.script,
                       script_text=first.script_text, upload_script=first.upload)
        warnings: list[str] = []
        by_name = {s.name: s for s in sites}
        res = create_chain(store, first.slurm, first.runner, req0,
                           other_sites=lambda chain: _prepare(chain, sites, req, warnings),
                           site_clients=lambda name: (by_name[name].slurm, by_name[name].runner))
    finally:
        close_sites(sites)
    return replace(res, warnings=res.warnings + tuple(warnings))


def with_site_margin(req: SubmitRequest, names: list[str]) -> SubmitRequest:
    """The request with its site margin and where it came from: ``--site-margin``, else the margin in
    force for this ordered list (chosen by `chainrun model sites`, else shipped: chain/site_tuned.py).
    Recorded in the chain, so a later choice does not change a running chain's margin behind its back."""
    if req.site_margin_s is not None:
        return replace(req, site_margin_source="--site-margin")
    from chainrun.chain import site_tuned

    f = site_tuned.in_force(names)
    if f.get("source") == "chosen":
        when = time.strftime("%Y-%m-%d", time.gmtime(f.get("chosen_at") or 0))
        src = f"chosen {when} on the clusters' past (chainrun model sites {site_tuned.key(names)})"
    elif f.get("source") == "rollback":
        when = time.strftime("%Y-%m-%d", time.gmtime(f.get("since") or 0))
        src = f"rolled back {when} (chainrun model sites {site_tuned.key(names)} --rollback)"
    else:
        src = f"shipped (choose one on the clusters' past: chainrun model sites {site_tuned.key(names)})"
    return replace(req, site_margin_s=int(round(f["margin_s"])), site_margin_source=src)


def _prepare(chain: Chain, sites: list[Site], req: SubmitRequest, warnings: list[str]) -> list[ChainSite]:
    """create_chain's hook: the first site's folders exist; lay out the others, then check them all.
    Any failure removes every run folder made here (nothing was recorded yet)."""
    views = {sites[0].name: chain}
    try:
        for s in sites[1:]:
            views[s.name] = _lay_out(s, chain, req, warnings, made=views, first=sites[0].name)
        starts = {}
        for s in sites:
            s.notes["test_only"], starts[s.name] = preflight.test_only(s.name, s.slurm, views[s.name])
        jobs = [preflight.plan(s.name, s.runner, s.settings.preflight, site_chain=views[s.name],
                               env_file=s.settings.env_file, time_s=s.settings.preflight_s)
                for s in sites if s.settings.preflight]
        for name, note in preflight.run_all(jobs).items():
            next(s for s in sites if s.name == name).notes["preflight"] = note
        # after the preflight jobs: the queues as segment 0 meets them
        choice = _place_first(chain, sites, views, starts, race=req.race)
        if req.race:  # segment 0 is submitted on every site where it could win (chain/site_race.py)
            from chainrun.chain.site_choice import race_sites

            raced, skipped = race_sites(choice, [s.name for s in sites])
            chain.extra["race"] = {"phase": "preparing", "idx": 0, "sites": raced, "racers": {},
                                   **({"skipped": skipped} if skipped else {})}
    except BaseException:
        for s in sites:
            if s.name in views:
                s.runner.run(["rm", "-rf", "--", views[s.name].run_dir], 120)
        raise
    chain.extra["sites"] = [s.name for s in sites]
    chain.extra["moves"] = MOVES
    return [ChainSite(chain_id=chain.id, cluster=s.name, rank=s.rank, workdir=views[s.name].workdir,
                      run_dir=views[s.name].run_dir, checkpoint_dir=views[s.name].checkpoint_dir,
                      script=views[s.name].script, sbatch_args=list(views[s.name].sbatch_args),
                      extra={"segment_s": views[s.name].segment_s, "partition": views[s.name].partition,
                             **({"env_file": s.settings.env_file} if s.settings.env_file else {}),
                             **({"preflight": s.settings.preflight} if s.settings.preflight else {}),
                             "checks": dict(s.notes)})
            for s in sites]


def _place_first(chain: Chain, sites: list[Site], views: dict[str, Chain], starts: dict[str, float | None], *,
                 race: bool = False):
    """Where segment 0 starts: by the rule every next segment follows (site_plan.first_site), on each
    site's wait as the watcher would estimate it (its queue-delay model, else the start ``sbatch
    --test-only`` just gave: chain/first_wait.py). ``create_chain`` starts the chain there; the reason,
    where each wait came from and each site with none are kept (the site event, ``status`` and
    ``status --json`` say them). With ``race`` nothing is placed (the first racer to start is kept):
    the choice is returned for site_choice.race_sites."""
    import time

    from chainrun.chain import first_wait
    from chainrun.chain.site_plan import TEST_ONLY, first_site, median_s, wait_sources
    from chainrun.durations import format_duration

    now = time.time()
    waits = first_wait.first_waits([(s.name, s.slurm, views[s.name]) for s in sites], starts, now)
    for s in sites:
        w = waits.get(s.name)
        if w is not None and w.model != TEST_ONLY:
            s.notes["wait"] = f"queue-delay model {w.model}: segment 0 would wait ~{format_duration(median_s(w))}"
    choice = first_site(chain, [s.name for s in sites], waits)
    if choice is None or race:
        return choice
    placed = wait_sources(waits)
    chain.extra["site_choice"] = {**choice.as_dict(), "at": now, "for": 0, "waits": placed}
    said = first_wait.note(waits)  # empty when no site had a wait (the reason names each)
    chain.extra["first_placement"] = {"site": choice.site, "waits": placed,
                                      "reason": f"{choice.reason}; waits: {said}" if said else choice.reason}
    return choice


def _lay_out(s: Site, chain: Chain, req: SubmitRequest, warnings: list[str], *, made: dict, first: str) -> Chain:
    """This site's view of the chain: its options, partition, segment length, folders, script and wrapper."""
    try:
        own = clusters.site_options(s.name)
        _refuse_owned(own)
        user_args = merge_site_options(own, list(req.sbatch_args))
        script_opts = sbatch_options(s.script_text)
        info = _partition(s.slurm, user_args, script_opts)
        segment = _segment_length(req, info, chain.signal_lead_s)
    except SiteRefused:
        raise
    except ChainrunError as e:
        raise SiteRefused(f"cluster {s.name}: {e.message}", hint=e.hint) from None
    run_dir = f"{s.workdir.rstrip('/')}/chainrun-runs/{chain.id}"
    ckpt = req.checkpoint_dir or f"{run_dir}/checkpoint"
    if s.runner.run(["test", "-e", run_dir], 30).ok:  # made a moment ago on another site: one filesystem
        raise SiteRefused(f"cluster {s.name}: its run folder {run_dir} exists already: it shares a filesystem "
                          f"with cluster {first}", hint=f"give cluster {s.name} its own workdir ([clusters.{s.name}] "
                          "workdir), or submit to one of them")
    try:
        warnings += [f"cluster {s.name}: {w}" for w in make_folders(s.runner, run_dir, ckpt, clusters.run_mode())]
    except UsageError as e:
        if "exists already" not in e.message:  # it did not exist a moment ago: a part made is ours
            s.runner.run(["rm", "-rf", "--", run_dir], 120)
        raise SiteRefused(f"cluster {s.name}: {e.message}", hint=e.hint) from None
    made[s.name] = view = replace(
        chain, cluster=s.name, workdir=s.workdir, run_dir=run_dir, checkpoint_dir=ckpt,
        script=f"{run_dir}/{_upload_name(s.script)}" if s.upload else s.script,
        sbatch_args=user_args + _default_output(user_args + script_opts, run_dir), partition=info.name,
        segment_s=segment, extra=dict(chain.extra))
    s.runner.write_file(f"{run_dir}/control/token", token_text(chain.id), 0o600)
    if s.upload:
        s.runner.write_file(view.script, s.script_text, 0o700)
    s.runner.write_file(wrapper_path(view), render_wrapper(
        chain_id=chain.id, run_dir=run_dir, checkpoint_dir=ckpt, payload=view.script, signal=chain.signal,
        script_text=s.script_text, signal_lead_s=chain.signal_lead_s,
        save_timeout_s=int(chain.extra.get("save_timeout_s") or 0), cluster=s.name), 0o700)
    return view
