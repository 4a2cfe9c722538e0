"""``chainrun submit``: validate a request, lay out the chain's folder, submit segment 0."""

from __future__ import annotations

import re
import secrets
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Callable
from pathlib import PurePosixPath

from chainrun.chain.contract import OWNED_OPTIONS, option_value, render_wrapper, sbatch_options, token_text
from chainrun.chain.policies import default_lead_s, get_policy
from chainrun.chain.maintenance import fit_maintenance, read_reservations
from chainrun.chain.request import merge_site_options
from chainrun.chain.segments import submit_segment, wrapper_path
from chainrun.clusters import run_mode, site_options
from chainrun.durations import format_duration, to_slurm_time
from chainrun.errors import RemoteError, SlurmError, UsageError
from chainrun.runner.base import Runner
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.slurm.parsers import PartitionInfo
from chainrun.state.records import FAILED, Chain, ChainSite, Segment
from chainrun.state.store import Store

SIGNALS = {"USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG", "ALRM"}
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]+")
DEFAULT_SIGNAL = "USR2@300"


@dataclass
class SubmitRequest:
    script: str  # absolute path on the cluster
    script_text: str
    total_s: int
    workdir: str
    segment_s: int | None = None
    policy: str | None = None  # None: `predicted` where the cluster has a queue-delay model, else `lead`
    lead_s: int | None = None  # None: the policy's default (policies.default_lead_s)
    signal: str = DEFAULT_SIGNAL
    name: str | None = None
    retries: int = 1
    checkpoint_dir: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    cluster: str = "local"
    upload_script: bool = False  # remote clusters: copy script_text into the chain's folder and run that copy
    adapt: bool = True  # exclude straggler nodes from later segments (docs/placement.md); --no-adapt turns it off
    shapes: str | None = None  # elastic segments (docs/elastic.md): node counts, e.g. "8,4,2", first = reference
    shape_efficiency: str | None = None  # e.g. "2=0.9,4=0.95": scaling efficiency per node count
    time_min_s: int | None = None  # --time-min: the shortest segment worth starting (Slurm may shorten one)
    filler_margin: float | None = None  # --filler: a filler's least gain in boundaries (None: no filler)
    save_timeout_s: int | None = None  # --save-timeout: a hand-off's save may take this long (wrapper)
    site_margin_s: int | None = None  # --site-margin: a chain spanning clusters moves only to gain more (site_plan)
    site_margin_source: str | None = None  # where that margin came from (chain/sites.py with_site_margin)
    race: bool = False  # --race: segment 0 (and successors planned while nothing runs) on every site (site_race.py)


@dataclass(frozen=True)
class SubmitResult:
    chain: Chain
    first: Segment
    partition_max_s: float | None
    warnings: tuple[str, ...] = ()  # e.g. #SBATCH lines chainrun overrides; the CLI prints them on stderr
    policy_note: str | None = None  # how the default policy was chosen, when it was (default_policy)
    sites: tuple[ChainSite, ...] = ()  # a chain spanning clusters: every site, the first where it starts
    unconfirmed: str | None = None  # segment 0's sbatch failed without a refusal: what happens now (the CLI warns)


def parse_signal(text: str) -> tuple[str, int]:
    """``USR2@300`` -> ("USR2", 300); ``SIGUSR1@60`` and ``B:USR2@300`` are accepted too."""
    t = text.strip().upper().removeprefix("B:")
    sig, sep, secs = t.partition("@")
    sig = sig.removeprefix("SIG")
    if sig not in SIGNALS:
        raise UsageError(f"unsupported signal {text!r}", hint=f"use one of {', '.join(sorted(SIGNALS))}, e.g. USR2@300")
    if not sep:
        return sig, 300
    if not secs.isdigit() or not 0 < int(secs) <= 65535:
        raise UsageError(f"invalid signal time in {text!r}", hint="seconds before the limit, 1-65535, e.g. USR2@300")
    return sig, int(secs)


def make_chain_id(name: str) -> str:
    """``<name>-<8 lowercase hex digits>``: 4 digits collided in a busy shared folder (issue 23)."""
    base = _NAME_OK.sub("-", name).strip("-")[:40] or "chain"
    return f"{base}-{secrets.token_hex(4)}"


def default_policy(cluster: str) -> tuple[str, str]:
    """The policy a chain gets without ``--policy``, and one line saying why: `predicted` where
    this cluster has a queue-delay model (``chainrun model refresh``), else `lead` and how to get one."""
    from chainrun.predict.service import has_model

    if has_model(cluster):
        return "predicted", f"policy predicted: the default where the cluster has a queue-delay model ({cluster})"
    opt = "" if cluster == "local" else f" --cluster {cluster}"
    return "lead", (f"policy lead: no queue-delay model for {cluster} yet; get one with "
                    f"`chainrun model refresh{opt} --install-cron` (later chains then default to predicted)")


def create_chain(store: Store, slurm: SlurmClient, runner: Runner, req: SubmitRequest, *,
                 other_sites: Callable[[Chain], list[ChainSite]] | None = None,
                 site_clients: Callable[[str], tuple[SlurmClient, Runner]] | None = None) -> SubmitResult:
    """``other_sites``: a chain spanning clusters (chain/sites.py). Called once this cluster's folders and
    wrapper are written and before anything is recorded: it prepares and checks every site (raising a
    one-line error that names the cluster) and returns them all; the chain is recorded with them. When it
    placed segment 0 on another site (``chain.extra["first_placement"]``), the chain starts there, through
    ``site_clients(name)``."""
    policy_note = None
    if req.policy is None:
        policy, policy_note = default_policy(req.cluster)
        req = replace(req, policy=policy)
    get_policy(req.policy)  # validates the name
    signal, signal_lead = parse_signal(req.signal)
    if req.retries < 0 or req.retries > 100:
        raise UsageError(f"--retries must be between 0 and 100 (got {req.retries})")
    _refuse_owned(req.sbatch_args)
    site = site_options(req.cluster)  # [sbatch] in config.toml: what this cluster always needs
    _refuse_owned(site)
    user_args = merge_site_options(site, list(req.sbatch_args))
    script_opts = sbatch_options(req.script_text)
    if option_value(script_opts, "--array", "-a") is not None:
        raise UsageError("job arrays cannot be chained", hint="remove the #SBATCH --array line")

    info = _partition(slurm, user_args, script_opts)
    shapes, efficiency = _elastic(req, user_args, script_opts, info.total_nodes)
    max_s = info.max_time_s
    segment = _segment_length(req, info, signal_lead)
    chain_id = make_chain_id(req.name or PurePosixPath(req.script).stem)
    warnings = script_overrides(req.script_text, script=PurePosixPath(req.script).name, chain_id=chain_id,
                                segment_s=min(segment, req.total_s), signal=signal, signal_lead_s=signal_lead)
    run_dir = f"{req.workdir.rstrip('/')}/chainrun-runs/{chain_id}"
    ckpt = req.checkpoint_dir or f"{run_dir}/checkpoint"
    script = f"{run_dir}/{_upload_name(req.script)}" if req.upload_script else req.script
    chain = Chain(
        id=chain_id, name=req.name or PurePosixPath(req.script).stem, cluster=req.cluster, script=script,
        workdir=req.workdir, run_dir=run_dir, checkpoint_dir=ckpt, total_s=req.total_s, segment_s=segment,
        policy=req.policy, lead_s=default_lead_s(req.policy, req.cluster, info.name) if req.lead_s is None else req.lead_s, signal=signal, signal_lead_s=signal_lead, retries=req.retries,
        sbatch_args=user_args + _default_output(user_args + script_opts, run_dir),
        partition=info.name, created=time.time(),
        extra={"partition_nodes": info.total_nodes, **({} if req.adapt else {"no_adapt": True}),
               **({"shapes": list(shapes), "shape_efficiency": {str(k): v for k, v in efficiency.items()}}
                  if shapes else {}),
               **({"time_min_s": int(req.time_min_s)} if req.time_min_s else {}),
               **({"filler_margin": float(req.filler_margin)} if req.filler_margin is not None else {}),
               **({"save_timeout_s": int(req.save_timeout_s)} if req.save_timeout_s else {}),
               **({"site_margin_s": int(req.site_margin_s)} if req.site_margin_s is not None else {}),
               **({"site_margin_source": req.site_margin_source} if req.site_margin_source else {})},
    )
    wrapper = render_wrapper(chain_id=chain_id, run_dir=run_dir, checkpoint_dir=ckpt, payload=script,
                             signal=signal, script_text=req.script_text, ref_nodes=shapes[0] if shapes else None,
                             signal_lead_s=signal_lead, save_timeout_s=int(req.save_timeout_s or 0),
                             cluster=req.cluster)
    warnings += make_folders(runner, run_dir, ckpt, run_mode())
    runner.write_file(f"{run_dir}/control/token", token_text(chain_id), 0o600)  # the wrapper checks it on the node
    if req.upload_script:
        runner.write_file(script, req.script_text, 0o700)
    runner.write_file(wrapper_path(chain), wrapper, 0o700)
    sites = other_sites(chain) if other_sites else []
    placed = chain.extra.get("first_placement") or {}
    if site_clients is not None and placed.get("site") not in (None, chain.cluster):
        from chainrun.chain import span

        span.move_to(chain, next(s for s in sites if s.cluster == placed["site"]))  # not a move: nothing ran
        slurm, runner = site_clients(chain.cluster)
    store.add_chain(chain, sites)
    if placed.get("reason"):
        store.add_event(chain.id, 0, "site", f"segment 0: {placed['reason']}")
    if chain.extra.get("race") is not None and site_clients is not None:  # --race: on every site, gated
        from chainrun.chain import site_race

        first = site_race.start(store, chain, sites, site_clients, time_min_s=req.time_min_s)
        return SubmitResult(chain, first, max_s, tuple(warnings), policy_note, tuple(sites),
                            unconfirmed=None if first.job_id else FIRST_UNCONFIRMED)  # no racer confirmed
    first = _submit_first(store, slurm, runner, chain, time_min_s=req.time_min_s,
                          site=chain.cluster if sites else None)
    return SubmitResult(chain, first, max_s, tuple(warnings), policy_note, tuple(sites),
                        unconfirmed=None if first.job_id else FIRST_UNCONFIRMED)


def _partition(slurm: SlurmClient, user_args: list[str], script_opts: list[str]) -> PartitionInfo:
    """The partition the chain runs in: the one asked for (the first of a list), else the cluster's default."""
    partition = (option_value(user_args, "--partition", "-p") or option_value(script_opts, "--partition", "-p") or "")
    parts = slurm.partitions()
    if partition:
        first = partition.split(",")[0]
        if first not in parts:
            raise UsageError(f"no partition {first!r} on this cluster", hint=f"partitions: {', '.join(parts) or 'none'}")
        info = parts[first]
    else:
        defaults = [p for p in parts.values() if p.is_default]
        if not defaults:
            raise UsageError("this cluster has no default partition", hint="pass one: chainrun submit ... -- --partition NAME")
        info = defaults[0]
    return info


def _segment_length(req: SubmitRequest, info: PartitionInfo, signal_lead: int) -> int:
    """A segment's limit: --segment, else the partition's; checked against the partition, the
    signal lead and --time-min."""
    max_s = info.max_time_s
    segment = req.segment_s or (int(max_s) if max_s else None)
    if segment is None:
        raise UsageError(f"partition {info.name!r} has no time limit", hint="say how long a segment is: --segment 24h")
    if max_s and segment > max_s:
        raise UsageError(
            f"--segment {format_duration(segment)} is longer than partition {info.name!r} allows ({format_duration(max_s)})"
        )
    # --total counts training: a single segment needs the total plus the signal lead
    segment = min(segment, req.total_s + signal_lead)
    if signal_lead >= segment:
        # the example must fit this segment (a fixed USR2@60 told a 30 s segment to take a longer lead)
        longer = ", or a longer --segment" if req.segment_s and (not max_s or req.segment_s < max_s) else ""
        raise UsageError(
            f"the signal comes {signal_lead}s before the limit, but a segment lasts only {segment}s",
            hint=f"use a --signal time below {segment}s, e.g. {parse_signal(req.signal)[0]}@{max(1, segment // 4)}"
                 f"{longer}",
        )

    if req.time_min_s is not None:
        if req.time_min_s > segment:
            raise UsageError(f"--time-min {format_duration(req.time_min_s)} is longer than a segment "
                             f"({format_duration(segment)})", hint="give a shorter --time-min, or a longer --segment")
        if req.time_min_s <= signal_lead:
            raise UsageError(f"--time-min {format_duration(req.time_min_s)}: the signal comes {signal_lead}s before "
                             "the end, so such a segment would not train", hint="give a longer --time-min")
    return segment


def _submit_first(store: Store, slurm: SlurmClient, runner: Runner, chain: Chain, *,
                  time_min_s: int | None, site: str | None = None) -> Segment:
    """Segment 0: its shape (--shapes), --time-min, a maintenance cut, then sbatch. A refusal fails
    the chain (recorded) and raises; any other sbatch failure leaves segment 0 SUBMITTING (the
    returned segment has no job id) for the watcher to settle."""
    first = Segment(chain_id=chain.id, idx=0, time_limit_s=chain.segment_s, cluster=site)
    shape_event = ""
    if chain.extra.get("shapes"):  # the reference shape, or a filler while it queues (docs/elastic.md);
        # the watcher chooses the rest
        from chainrun.chain.shape_plan import plan_first_shape
        from chainrun.chain.tick_context import TickContext

        shape_event = plan_first_shape(TickContext(store, slurm, runner), chain, first)
    if time_min_s:
        first.extra["time_min_s"] = min(int(time_min_s), chain.segment_s)
    fit_maintenance(chain, first, read_reservations(slurm), time.time())
    try:
        submit_segment(store, slurm, chain, first, note="first segment" + (
            f"; {first.extra['plan_note']}" if first.extra.get("plan_note") else ""))
    except SlurmRefused as e:  # Slurm answered no: nothing was created, the same request would fail again
        chain.status, chain.reason, chain.finished = FAILED, f"first segment refused: {e}", time.time()
        store.save(chain, [], [(0, "failed", chain.reason)])
        raise
    except (SlurmError, RemoteError) as e:
        # a timeout, an error we do not know, or a connection to a remote cluster lost while sbatch ran may
        # still have created the job (segments.py): failing the chain (or exiting non-zero, which invites a
        # second `submit`) would leave such a job running unwatched, with no successor. The chain stays
        # active with segment 0 SUBMITTING; the watcher adopts the job by name, or plans segment 0 again
        # once sacct says there is none (engine.py, ADOPT_AFTER_S)
        store.save(chain, events=[(0, "warning", f"{FIRST_UNCONFIRMED} ({e})")])
    if shape_event:
        store.add_event(chain.id, 0, "shape", shape_event)
    return first


# segment 0's sbatch failed without a refusal (_submit_first): an event, and the line `submit` prints
FIRST_UNCONFIRMED = ("sbatch did not answer for segment 0: the watcher will adopt the job if Slurm created it, "
                     "else submit it again")


NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")  # plus $TMPDIR: a folder only the node that writes it sees


def make_folders(runner: Runner, run_dir: str, ckpt: str, mode: int) -> list[str]:
    """Create the chain's run folder, refusing one that exists (chainrun never reuses one: another
    chain's control files would be taken for this one's), then its control, logs and checkpoint
    folders, all with ``mode`` (0700 unless config.toml says otherwise). Returns warnings for folders
    on a node-local filesystem."""
    parent = str(PurePosixPath(run_dir).parent)
    res = runner.run(["mkdir", "-p", parent], 30)
    if not res.ok:
        raise UsageError(f"cannot create {parent}: {res.first_error_line()}")
    octal = f"{mode:04o}"
    res = runner.run(["mkdir", "-m", octal, run_dir], 30)  # no -p: an existing folder is an error
    if not res.ok:
        if "exist" in (res.stderr or "").lower():
            raise UsageError(f"the run folder {run_dir} exists already; chainrun never reuses one",
                             hint="submit again (a new chain id is drawn), or move that folder away")
        raise UsageError(f"cannot create the run folder {run_dir}: {res.first_error_line()}")
    folders = [f"{run_dir}/control", f"{run_dir}/logs"]
    for path in folders + [ckpt]:
        # -p for a checkpoint folder of the user's own: it may exist (its mode is theirs) or need parents
        argv = ["mkdir", "-m", octal, path] if path in folders else ["mkdir", "-p", "-m", octal, path]
        res = runner.run(argv, 30)
        if not res.ok:
            raise UsageError(f"cannot create {path}: {res.first_error_line()}")
    return node_local_warnings(runner, {"run folder": run_dir, "checkpoint folder": ckpt})


def node_local_warnings(runner: Runner, folders: dict[str, str]) -> list[str]:
    """A warning for each folder under /tmp, /var/tmp, /dev/shm or the cluster's $TMPDIR: each compute
    node has its own, so a segment on another node would not find the chain there (it ends with
    'no-run-folder', or resumes from nothing). CHAINRUN_NODE_LOCAL_OK=1 silences it where /tmp is
    shared by every node (a one-host test cluster)."""
    import os

    if os.environ.get("CHAINRUN_NODE_LOCAL_OK") == "1":
        return []
    res = runner.run(["printenv", "TMPDIR"], 30)
    local = list(NODE_LOCAL) + ([res.stdout.strip().rstrip("/")] if res.ok and res.stdout.strip() else [])
    out = []
    for what, path in folders.items():
        hit = next((d for d in local if d and (path == d or path.startswith(d + "/"))), None)
        if hit:
            out.append(f"the {what} {path} is under {hit}, which each compute node usually has to itself: "
                       "a segment on another node will not see it. Use a shared filesystem (home, project, "
                       "scratch); `chainrun cluster test --probe` checks what a compute node sees")
    return out


def _elastic(req: SubmitRequest, user_args: list[str], script_opts: list[str],
             partition_nodes: int | None) -> tuple[tuple[int, ...], dict[int, float]]:
    """``--shapes`` and ``--shape-efficiency``, checked. A ``--nodes`` of the user (after ``--`` or in an
    ``#SBATCH`` line) must equal the reference shape (the first of ``--shapes``): each segment's
    node count replaces it, so any other value would silently do nothing."""
    from chainrun.chain.shapes import parse_efficiency, parse_shapes

    if not req.shapes:
        if req.shape_efficiency:
            raise UsageError("--shape-efficiency needs --shapes", hint="e.g. --shapes 4,2 --shape-efficiency 2=0.9")
        if req.filler_margin is not None:
            raise UsageError("--filler needs --shapes", hint="e.g. --shapes 4,2 --filler 6")
        return (), {}
    shapes = parse_shapes(req.shapes, max_nodes=partition_nodes or None)
    for opts, where in ((user_args, "after --"), (script_opts, "in an #SBATCH line")):
        pinned = option_value(opts, "--nodes", "-N")
        if pinned is not None and pinned.strip() != str(shapes[0]):
            raise UsageError(f"--shapes {req.shapes} starts with {shapes[0]} nodes (the reference shape) but "
                             f"--nodes={pinned} is given {where}",
                             hint=f"make them agree (--nodes={shapes[0]}) or drop --nodes: chainrun sets it per segment")
    return shapes, parse_efficiency(req.shape_efficiency, shapes)


def _upload_name(script: str) -> str:
    # the uploaded copy sits beside chainrun's own files in the chain folder: never on top of one
    name = PurePosixPath(script).name
    return f"payload-{name}" if name in ("wrapper.sh", "control", "logs", "checkpoint") else name


def _default_output(opts: list[str], run_dir: str) -> list[str]:
    """Segment logs go to the chain's folder (``%x`` is the segment's job name), unless the user chose."""
    if option_value(opts, "--output", "-o") is not None:
        return []
    return [f"--output={run_dir}/logs/%x-%j.out"]


def _owned_option(token: str) -> str | None:
    """The owned option a word of an sbatch command line sets (``--time=5``, ``-t5``, ``-J x``), else None."""
    opt = token.split("=", 1)[0]
    if opt.startswith("--"):
        return opt if opt in OWNED_OPTIONS else None
    for short in (o for o in OWNED_OPTIONS if not o.startswith("--")):
        if token == short or (token.startswith(short) and len(token) > len(short)):
            return short
    return None


_LONG_NAME = {"-t": "--time", "-J": "--job-name", "-a": "--array"}


def script_overrides(script_text: str, *, script: str, chain_id: str, segment_s: int, signal: str,
                     signal_lead_s: int) -> list[str]:
    """One warning per ``#SBATCH`` line that sets an option chainrun sets itself for every segment.

    ``sbatch`` lets the command line win over the script, so such a line would silently do nothing;
    ``-- --time=5`` is refused outright (``_refuse_owned``), a script line is reported instead.
    """
    instead = {
        "--time": (f"--time={to_slurm_time(segment_s)} per segment",
                   "set the segment length with --segment and the run with --total"),
        "--job-name": (f"--job-name=cr.{chain_id}.<segment>", "name the chain with --name"),
        "--signal": (f"--signal=B:{signal}@{signal_lead_s}", "choose it with --signal SIG@SECONDS"),
        "--parsable": ("--parsable itself", "remove the line"),
        "--wrap": (f"its own wrapper around {script}", "remove the line"),
    }
    out: list[str] = []
    for lineno, line in _directive_lines(script_text):
        try:
            words = shlex.split(line[len("#SBATCH"):], comments=True)
        except ValueError:
            continue  # sbatch_options() already refused an unreadable line
        seen: list[str] = []
        for w in words:
            opt = _owned_option(w)
            name = _LONG_NAME.get(opt, opt) if opt else None
            if name and name in instead and name not in seen:
                seen.append(name)
        for name in seen:
            uses, how = instead[name]
            out.append(f"{script} line {lineno} `{line}`: its {name} is ignored, chainrun uses {uses} ({how})")
    return out


def _directive_lines(script_text: str) -> list[tuple[int, str]]:
    """(line number, stripped text) of the ``#SBATCH`` lines sbatch reads: those before the first command."""
    out = []
    for lineno, line in enumerate(script_text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break
        out.append((lineno, stripped))
    return out


def _refuse_owned(args: list[str]) -> None:
    for a in args:
        opt = a.split("=", 1)[0]
        if opt in OWNED_OPTIONS or (opt.startswith("-t") and len(opt) > 2 and opt[2:].isdigit()):
            raise UsageError(
                f"{shlex.quote(a)} is set by chainrun for each segment",
                hint="use --segment/--total for time, --name for the name, --signal for the signal",
            )
