"""Chain commands: submit, status, watch, cancel."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from chainrun.cli.render import clock, console, envelope, role_line
from chainrun.durations import DURATION_HELP, format_duration, parse_duration
from chainrun.errors import ChainrunError, UsageError

ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster name (default: the configured default, else local).")]
# status, watch and cancel read --cluster otherwise: a filter, or a check (the chain runs on its own cluster)
OnlyClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="Only that cluster's chains (default: every cluster's).")]
CheckClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="Refuse unless the chain runs on this cluster (it is cancelled on its own cluster either way).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of a table.")]
PlainOpt = Annotated[bool, typer.Option("--plain", help="Plain lines (one record per line, key=value) instead of a "
                                         "table; the default when the output is not a terminal.")]


def register(app: typer.Typer) -> None:
    app.command(
        "submit",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
        help="Start a chain: split SCRIPT into checkpointed segments and submit the first. "
        "Arguments after -- are passed to sbatch untouched.",
    )(submit)
    app.command("status", help="Show chains, or one chain's segments.")(status)
    app.command("watch", help="Move chains forward: reconcile with Slurm, submit next segments, handle endings.")(watch)
    app.command("cancel", help="Cancel a chain's queued and running segments.")(cancel)
    app.command("unexclude", help="Pardon nodes chainrun excluded as stragglers: later segments may run there again.")(
        unexclude)


def submit(
    ctx: typer.Context,
    script: Annotated[Path, typer.Argument(help="The batch script to run in every segment (#SBATCH lines honoured).")],
    total: Annotated[str, typer.Option("--total", help=f"Total run time of the chain: {DURATION_HELP}.")],
    segment: Annotated[Optional[str], typer.Option("--segment", help="Length of one segment (default: the partition's MaxTime).")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="When to submit the next segment: reactive, dependency, lead, predicted (default: predicted where the cluster has a queue-delay model, see `chainrun model refresh`; else lead).")] = None,
    lead: Annotated[Optional[str], typer.Option("--lead", help="Submit the next segment this long before the current one stops (lead; default 1h); the least lead the model may choose (predicted; default 1h, its own constant).")] = None,
    signal: Annotated[str, typer.Option("--signal", help="Signal sent before the limit, and how many seconds before: SIG@SECONDS.")] = "USR2@300",
    name: Annotated[Optional[str], typer.Option("--name", help="A name for the chain (default: the script's name).")] = None,
    retries: Annotated[int, typer.Option("--retries", help="How many consecutive crashed segments to retry before the chain fails.")] = 1,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", help="Where the payload keeps checkpoints (default: inside the chain's run folder).")] = None,
    cluster: ClusterOpt = None,
    remote_script: Annotated[bool, typer.Option("--remote-script", help="SCRIPT is a path on the (remote) cluster: use it in place instead of uploading a copy.")] = False,
    json_out: JsonOpt = False,
    no_adapt: Annotated[bool, typer.Option("--no-adapt", help="Never change later segments' requests (e.g. exclude a node measured slow, or another of --shapes); slow nodes are still reported.")] = False,
    shapes: Annotated[Optional[str], typer.Option("--shapes", metavar="N,N,...", help="Elastic segments: node counts each segment may ask for, e.g. 8,4,2; the first is the reference shape --total is counted in (docs/elastic.md).")] = None,
    shape_efficiency: Annotated[Optional[str], typer.Option("--shape-efficiency", metavar="N=E,...", help="Scaling efficiency per node count against linear, e.g. 2=0.9,4=0.95 (default 1.0) until the chain has measured its pace.")] = None,
    time_min: Annotated[Optional[str], typer.Option("--time-min", help=f"The shortest segment worth starting: Slurm may start a segment sooner with a limit down to this (sbatch --time-min); {DURATION_HELP}.")] = None,
    save_timeout: Annotated[Optional[str], typer.Option("--save-timeout", help=f"How long a checkpoint may take when the next segment asks for the hand-off, before it cancels this one (default: the signal lead + 1 min; never past the segment's end); {DURATION_HELP}.")] = None,
    gpu_mem: Annotated[Optional[str], typer.Option("--gpu-mem", metavar="SIZE", help="GPU memory the chain needs, e.g. 40G: checked at submit against each cluster's declared [clusters.NAME.gpu] memory.")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="A number format the GPUs must support, e.g. bf16: checked at submit against each cluster's declared [clusters.NAME.gpu] dtypes.")] = None,
    site_margin: Annotated[Optional[str], typer.Option("--site-margin", help=f"With several clusters: move the chain to another cluster only when it is expected to finish more than this much sooner there (default 1h); {DURATION_HELP}.")] = None,
    race: Annotated[bool, typer.Option("--race", help="With several clusters: submit segment 0 on every cluster where it could win and keep the one that starts first, cancelling the others; so too a next segment planned while nothing of the chain runs (one asked for while a segment runs is placed by the rule; docs/multi-cluster.md).")] = False,
    filler: Annotated[Optional[float], typer.Option("--filler", metavar="BOUNDARIES", help="With --shapes: while the reference shape only queues, run a segment on fewer nodes when it gains at least this many segment boundaries of work, e.g. 6 (default: no filler, the replay's pick; docs/elastic.md).")] = None,
) -> None:
    from chainrun.chain.create import SubmitRequest, create_chain
    from chainrun.context import cluster_name, open_context

    from chainrun.chain.sites import parse_gpu_need, parse_sites

    names = parse_sites(cluster_name(cluster))
    need = parse_gpu_need(gpu_mem, dtype)
    if len(names) > 1:  # a chain spanning clusters (order = preference): chain/sites.py
        return _submit_spanning(ctx, script, names, need, total=total, segment=segment, policy=policy, lead=lead,
                                signal=signal, name=name, retries=retries, checkpoint_dir=checkpoint_dir,
                                remote_script=remote_script, json_out=json_out, adapt=not no_adapt,
                                elastic=_elastic_options(shapes, shape_efficiency, time_min, filler, save_timeout),
                                site_margin=site_margin, race=race)
    if race:
        raise UsageError("--race needs several clusters", hint="e.g. --cluster a,b --race")
    if site_margin is not None:
        raise UsageError("--site-margin is for a chain spanning clusters", hint="e.g. --cluster a,b --site-margin 30m")
    name_of_cluster = names[0]
    if need.any:  # the declared GPUs of this one cluster (config only, no connection)
        from chainrun import clusters
        from chainrun.chain.sites import gpu_fit

        gpu_fit(name_of_cluster, clusters.site_settings(name_of_cluster), need)
    if name_of_cluster != "local":
        return _submit_remote(ctx, script, total, segment, policy, lead, signal, name, retries, checkpoint_dir,
                              name_of_cluster, remote_script, json_out, adapt=not no_adapt,
                              elastic=_elastic_options(shapes, shape_efficiency, time_min, filler, save_timeout))
    if remote_script:
        raise UsageError("--remote-script is for remote clusters", hint="on the local cluster SCRIPT is used in place anyway")
    total_s = parse_duration(total, what="--total")
    segment_s = parse_duration(segment, what="--segment") if segment else None
    lead_s = parse_duration(lead, what="--lead") if lead else None  # None: the policy's default
    script_path = script.expanduser().resolve()
    text = _read_script(script)
    extra = list(ctx.args)
    req = SubmitRequest(
        script=str(script_path), script_text=text, total_s=total_s, workdir=os.getcwd(), segment_s=segment_s,
        policy=policy, lead_s=lead_s, signal=signal, name=name, retries=retries,
        checkpoint_dir=str(checkpoint_dir.expanduser().resolve()) if checkpoint_dir else None,
        sbatch_args=extra, cluster="local", adapt=not no_adapt, **_elastic_options(shapes, shape_efficiency, time_min, filler, save_timeout),
    )
    c = open_context("local")
    try:
        res = create_chain(c.store, c.slurm, c.runner, req)
    finally:
        c.close()
    _print_submitted(res, json_out)


def _submit_remote(ctx, script, total, segment, policy, lead, signal, name, retries, checkpoint_dir, cluster,
                   remote_script, json_out, adapt: bool = True, elastic: dict | None = None) -> None:
    """Same request on a cluster over SSH: the folder is the cluster's workdir, the script is uploaded."""
    import posixpath

    from chainrun.chain.create import SubmitRequest, create_chain
    from chainrun.context import open_context

    total_s = parse_duration(total, what="--total")
    segment_s = parse_duration(segment, what="--segment") if segment else None
    lead_s = parse_duration(lead, what="--lead") if lead else None  # None: the policy's default
    c = open_context(cluster)
    try:
        workdir = c.remote_workdir()
        if remote_script:
            path = str(script)  # a remote path, taken literally (typer handed us a Path: no resolving)
            if not posixpath.isabs(path):
                path = posixpath.join(workdir, path)
            got = c.runner.run(["cat", "--", path], 60)
            if not got.ok:
                raise UsageError(f"cannot read {path} on {cluster}: {got.first_error_line()}")
            text = got.stdout
        else:
            path, text = str(script), _read_script(script)
        ckpt = None
        if checkpoint_dir:
            ckpt = str(checkpoint_dir)
            ckpt = ckpt if posixpath.isabs(ckpt) else posixpath.join(workdir, ckpt)
        req = SubmitRequest(
            script=path, script_text=text, total_s=total_s, workdir=workdir, segment_s=segment_s, policy=policy,
            lead_s=lead_s, signal=signal, name=name, retries=retries, checkpoint_dir=ckpt,
            sbatch_args=list(ctx.args), cluster=cluster, upload_script=not remote_script, adapt=adapt,
            **(elastic or {}),
        )
        res = create_chain(c.store, c.slurm, c.runner, req)
    finally:
        c.close()
    _print_submitted(res, json_out)


def _submit_spanning(ctx, script: Path, names: list[str], need, *, total, segment, policy, lead, signal, name,
                     retries, checkpoint_dir, remote_script: bool, json_out: bool, adapt: bool, elastic: dict,
                     site_margin: str | None = None, race: bool = False) -> None:
    """``--cluster a,b``: every site checked and prepared, the chain starts on the first (chain/sites.py)."""
    from chainrun import paths
    from chainrun.chain.create import SubmitRequest
    from chainrun.chain.sites import submit_spanning
    from chainrun.context import open_runner
    from chainrun.state.store import Store

    if remote_script:
        raise UsageError("--remote-script takes one cluster", hint="give each cluster its own script in "
                         "[clusters.NAME.job] script, or submit a local script (uploaded to each cluster)")
    script_path = script.expanduser().resolve()
    req = SubmitRequest(
        script=str(script_path), script_text=_read_script(script), total_s=parse_duration(total, what="--total"),
        workdir=os.getcwd(), segment_s=parse_duration(segment, what="--segment") if segment else None,
        policy=policy, lead_s=parse_duration(lead, what="--lead") if lead else None, signal=signal, name=name,
        retries=retries, checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
        sbatch_args=list(ctx.args), adapt=adapt,
        site_margin_s=parse_duration(site_margin, what="--site-margin", minimum=0) if site_margin is not None else None,
        race=race, **elastic)
    store = Store(paths.state_db())
    try:
        res = submit_spanning(store, names, req, open_runner=open_runner, need=need)
    finally:
        store.close()
    _print_submitted(res, json_out)


def _elastic_options(shapes: str | None, efficiency: str | None, time_min: str | None,
                     filler: float | None = None, save_timeout: str | None = None) -> dict:
    """--shapes, --shape-efficiency, --time-min as SubmitRequest fields. Their syntax is checked here,
    before any Slurm call; create_chain checks them against the partition and the script."""
    from chainrun.chain.shapes import parse_efficiency, parse_filler, parse_shapes

    if shapes is not None:
        parse_efficiency(efficiency, parse_shapes(shapes))
    elif efficiency:
        raise UsageError("--shape-efficiency needs --shapes", hint="e.g. --shapes 4,2 --shape-efficiency 2=0.9")
    if filler is not None and shapes is None:
        raise UsageError("--filler needs --shapes", hint="e.g. --shapes 4,2 --filler 6")
    return {"shapes": shapes, "shape_efficiency": efficiency,
            "time_min_s": parse_duration(time_min, what="--time-min") if time_min else None,
            "filler_margin": parse_filler(filler),
            "save_timeout_s": parse_duration(save_timeout, what="--save-timeout") if save_timeout else None}


def _read_script(script: Path) -> str:
    try:
        return script.expanduser().resolve().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"script not found: {script}") from None
    except IsADirectoryError:
        raise UsageError(f"{script} is a folder, not a script") from None
    except UnicodeDecodeError:
        raise UsageError(f"{script} is not a text file") from None
    except OSError as e:
        raise UsageError(f"cannot read {script}: {e.strerror}") from None


def _print_submitted(res, json_out: bool) -> None:
    ch = res.chain
    # segment 0's sbatch failed without a refusal (chain/create.py): still exit 0, since the chain exists and the
    # watcher settles segment 0 (adopts the job or submits it again); a non-zero exit would invite a second
    # `submit`, a second chain, and two jobs for one training run. The warning goes on stderr; --json has
    # first_job null and "unconfirmed"
    unconfirmed = getattr(res, "unconfirmed", None)
    for w in [*res.warnings, *([unconfirmed] if unconfirmed else [])]:  # e.g. #SBATCH lines chainrun overrides
        typer.echo(f"chainrun: warning: {w}", err=True)  # on stderr, with or without --json
    if json_out:
        typer.echo(envelope("submit", {"chain": ch.id, "first_job": res.first.job_id, "unconfirmed": unconfirmed,
                                       "segment_s": ch.segment_s,
                                       "total_s": ch.total_s, "policy": ch.policy, "run_dir": ch.run_dir,
                                       "checkpoint_dir": ch.checkpoint_dir, "cluster": ch.cluster,
                                       "shapes": ch.extra.get("shapes") or [],
                                       "time_min_s": ch.extra.get("time_min_s"),
                                       "policy_note": res.policy_note, "warnings": list(res.warnings),
                                       **_sites_json(res)}))
        return
    from chainrun.chain.pace import segment_overhead, total_tolerance
    from chainrun.chain.sizing import planned_segments

    # as the watcher will plan them: each segment trains its limit less the signal lead
    n = planned_segments(ch.total_s, segment_s=ch.segment_s, overhead_s=segment_overhead(ch, []),
                         tolerance_s=total_tolerance(ch))
    typer.echo(f"chain {ch.id}: {format_duration(ch.total_s)} in ~{n} segment(s) of {format_duration(ch.segment_s)} "
               f"on partition {ch.partition}, policy {ch.policy}")
    if ch.extra.get("shapes"):
        sh = ch.extra["shapes"]
        typer.echo(f"elastic: each next segment asks for {', '.join(map(str, sh))} nodes, whichever finishes first; "
                   f"--total counted at {sh[0]} nodes")
    if res.policy_note:  # no --policy given: which default, and (for lead) how to get the model
        typer.echo(res.policy_note)
    sites = getattr(res, "sites", ())  # a chain spanning clusters (chain/sites.py)
    race = ch.extra.get("race")
    if race:  # --race: segment 0 pends on every site (chain/site_race.py)
        jobs = [f"job {r['job_id']} on {n}" if r.get("job_id") else f"not confirmed on {n} (sbatch did not answer: "
                "the watcher adopts the job if Slurm created it, else gives that racer up)"
                for n, r in (race.get("racers") or {}).items() if r.get("job_id") or r.get("phase") == "SUBMITTING"]
        typer.echo(f"segment 0 raced: {', '.join(jobs)}; gated, each trains only once the watcher keeps it: the "
                   "first to start is kept, the others are cancelled")
    elif unconfirmed:  # said on stderr above; stdout must not claim a job
        typer.echo("segment 0 not confirmed: `chainrun watch` adopts its job or submits it again")
    else:
        typer.echo(f"segment 0 submitted as job {res.first.job_id}" + (f" on {ch.cluster}" if sites else ""))
    typer.echo(f"checkpoints: {ch.checkpoint_dir}")
    if sites:  # each site and what its checks found
        from chainrun.chain.sites import MOVES_NOTE

        for site in sites:
            checks = site.extra.get("checks") or {}
            typer.echo(f"site {site.rank + 1} {site.cluster}: {site.run_dir}; "
                       + "; ".join(checks[k] for k in ("reach", "gpu", "test_only", "wait", "preflight") if checks.get(k)))
        from chainrun.chain.site_plan import margin_s

        typer.echo(MOVES_NOTE.format(first="whichever cluster starts segment 0 first" if race else ch.cluster,
                                     margin=format_duration(margin_s(ch))))
        if ch.extra.get("site_margin_source"):
            typer.echo(f"site margin {format_duration(margin_s(ch))}: {ch.extra['site_margin_source']}")
    typer.echo("keep `chainrun watch` running (or `chainrun watch --once` from cron) to move the chain forward")


def _sites_json(res) -> dict:
    if not getattr(res, "sites", ()):
        return {}
    from chainrun.chain.site_plan import margin_s
    from chainrun.chain.sites import MOVES

    return {"sites": [{"cluster": s.cluster, "rank": s.rank, "workdir": s.workdir, "run_dir": s.run_dir,
                       "checkpoint_dir": s.checkpoint_dir, "script": s.script, "sbatch_args": s.sbatch_args,
                       "segment_s": s.extra.get("segment_s"), "checks": s.extra.get("checks") or {}}
                      for s in res.sites], "moves": MOVES, "site_margin_s": margin_s(res.chain),
            "site_margin_source": res.chain.extra.get("site_margin_source"),
            **({"race": {n: r.get("job_id") for n, r in (res.chain.extra["race"].get("racers") or {}).items()}}
               if res.chain.extra.get("race") else {})}


def status(
    chain: Annotated[Optional[str], typer.Argument(help="A chain id (or a unique prefix, or its name).")] = None,
    all_chains: Annotated[bool, typer.Option("--all", "-a", help="Include finished chains.")] = True,
    cluster: OnlyClusterOpt = None,
    plain: PlainOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from chainrun import clusters
    from chainrun.chain import untended
    from chainrun.chain.summary import site_decisions, view_chain
    from chainrun.context import open_context

    clusters.load()  # a config.toml chainrun cannot read is an error here too, not a silent "no chains"
    c = open_context(cluster or "local")  # reads the store only: no connection is opened
    try:
        chains = [c.store.chain(chain)] if chain else c.store.chains(active_only=not all_chains)
        if cluster:  # only that cluster's chains (without --cluster: every cluster's)
            chains = [ch for ch in chains if ch.cluster == c.cluster]
        tended = untended.read_all(c.store)  # says what happens to a chain nothing ticks
        views = [view_chain(ch, c.store.segments(ch.id), ticks=tended, decisions=site_decisions(c.store, ch))
                 for ch in chains]
        from chainrun.schedule import tick_status

        ticks = tick_status(c.store)  # where scheduled ticks come from, last/next, late (schedule.py)
    finally:
        c.close()
    if json_out:
        typer.echo(envelope("status", [v.to_dict(with_segments=bool(chain)) for v in views]))
        return
    from chainrun.cli import tables

    out = console()
    if not views:
        typer.echo("no chains yet: start one with `chainrun submit SCRIPT --total 72h`")
    elif plain or not out.is_terminal:  # pipes, cron mail, CI logs: stable lines
        tables.print_lines(out, tables.detail_lines(views[0], out.width) if chain else
                           tables.chain_lines(views, out.width))
    else:
        out.print(tables.chain_detail(views[0]) if chain else tables.chain_list(views))
    if ticks is not None:
        tables.print_lines(out, tables.tick_lines(ticks, out.width))


def watch(
    once: Annotated[bool, typer.Option("--once", help="One tick, then exit (for cron).")] = False,
    interval: Annotated[float, typer.Option("--interval", min=1.0, help="Seconds between ticks.")] = 60.0,
    plain: Annotated[bool, typer.Option("--plain", help="Log lines instead of the live view.")] = False,
    until_done: Annotated[bool, typer.Option("--until-done", help="Exit when no chain is active any more.")] = False,
    cluster: OnlyClusterOpt = None,
    json_out: JsonOpt = False,
    notify: Annotated[Optional[list[str]], typer.Option(
        "--notify", metavar="NAME|ADDRESS", help="Notify this notifier (a name from [notifiers] in config.toml, "
        "where its webhook URL stays out of `ps`) or mail address on completion, failure and long interruptions "
        "(repeatable; defaults: [notify] in config.toml).")] = None,
    install_schedule: Annotated[bool, typer.Option("--install-schedule", help="Install one periodic `watch --once "
        "--plain` tick (scrontab where the site enables it, else cron) and exit; safe to repeat.")] = False,
    uninstall_schedule: Annotated[bool, typer.Option("--uninstall-schedule", help="Remove chainrun's tick entry "
        "(your other scrontab/crontab lines stay) and exit.")] = False,
    every: Annotated[Optional[str], typer.Option("--every", help="With --install-schedule: the tick period, "
        "whole minutes dividing an hour or hours dividing a day (default 5m).")] = None,
    via: Annotated[Optional[str], typer.Option("--via", metavar="scrontab|cron", help="With --install-schedule: "
        "force scrontab or cron (default: scrontab where enabled).")] = None,
) -> None:
    if install_schedule or uninstall_schedule or every or via:  # chainrun/schedule.py; renders in cli/schedule_cmd.py
        from chainrun.cli.schedule_cmd import schedule_options

        used = [o for o, on in (("--once", once), ("--until-done", until_done), ("--cluster", cluster),
                                ("--notify", notify)) if on]
        return schedule_options(install=install_schedule, uninstall=uninstall_schedule, every=every, via=via,
                                json_out=json_out, other_options=used)
    from chainrun import paths
    from chainrun import schedule
    from chainrun.chain.multi import MultiEngine
    from chainrun.chain.watcher import fenced_open
    from chainrun.context import open_context
    from chainrun.state.lease import ActingLease, LeaseHeld
    from chainrun.state.store import Store

    # without --cluster every cluster's chains move, one Engine (one squeue/sacct) per cluster per tick
    c = open_context(cluster) if cluster else None  # checks the name; the connection opens on first use
    store = c.store if c else Store(paths.state_db())
    schedule.tick_started(store)  # inside a job: its SLURM_* never reach sbatch; a scheduled tick is recorded
    lease = ActingLease(store)  # one watcher of this home acts; the others are read-only views
    _exit_on_sigterm()  # so `finally` releases the lease (else another host waits for its expiry)
    engine = MultiEngine(store, only=cluster, predictor_for=_predictor_for, open_context=fenced_open(open_context, lease))
    try:
        if not plain and not json_out and not once and _live_terminal():
            from chainrun.cli.live import live_watch

            live_watch(engine, interval=interval, until_done=until_done, notify=notify, lease=lease)
            return
        _plain_watch(store, engine, interval=interval, once=once, until_done=until_done, json_out=json_out,
                     notify=notify, lease=lease)
    except LeaseHeld as e:  # only with --once: cron overlapping a running watcher, here or on another host
        if json_out:
            typer.echo(envelope("watch", {"skipped": True, "holder": e.holder.label, "until": e.holder.expires}))
        else:
            typer.echo(f"skipped: held by {e.holder.label} until {clock(e.holder.expires)}")
    finally:
        engine.close()
        if c:
            c.runner.close()
        store.close()


def _exit_on_sigterm() -> None:
    import signal

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _live_terminal() -> bool:
    """The live view redraws in place: only on a real terminal that can move its cursor."""
    return sys.stdout.isatty() and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


def _plain_watch(store, engine, *, interval: float, once: bool, until_done: bool, json_out: bool,
                 notify: list[str] | None = None, lease=None) -> None:
    from chainrun.chain.watcher import run_watch
    from chainrun.cli.tables import wrap_text
    from chainrun.notify import watch_notifier

    # made when this watch starts to act, before its first tick (it writes its high-water mark): a view never notifies
    notifier = watch_notifier(store, notify) if lease is None else None
    width = console().width  # COLUMNS, else the terminal's, else 80 (cron, pipes)

    def say(line: str, err: bool = False) -> None:  # one event per record, long messages on indented lines
        for part in wrap_text(line, width):
            typer.echo(part, err=err)

    recent = store.events(limit=1)
    last_event = recent[-1][0] if recent else 0
    acting, holder = lease is None, None

    def log_role(role) -> None:
        nonlocal acting, holder, notifier
        acting, holder = role.acting, role.holder
        if acting and notifier is None:
            notifier = watch_notifier(store, notify)  # reads events after each tick; never raises
        if not json_out:  # JSON: each tick's envelope says it
            say(f"{clock(time.time())} {role_line(role)}")

    def log_tick(report) -> None:
        nonlocal last_event
        sent = notifier.after_tick() if acting else []  # the acting watch notifies, never a view as well
        if json_out:
            typer.echo(envelope("watch", {"chains": report.chains, "submitted": report.submitted,
                                          "ended": report.ended, "slurm_calls": report.slurm_calls,
                                          "warnings": report.warnings, "failed": report.failed, "acting": acting,
                                          "acting_holder": None if acting or holder is None else holder.label}))
            return
        for eid, ev in store.events(after_id=last_event):
            last_event = eid
            say(f"{clock(ev.ts)} {ev.chain_id} {ev.kind}: {ev.message}")
        for w in report.warnings:
            say(f"{clock(time.time())} warning: {w}", err=True)
        for msg, target, ok in sent:
            say(f"{clock(time.time())} {msg.chain_id} notified {target}: {msg.kind}" + ("" if ok else " (failed)"))

    try:
        report = run_watch(engine, interval=interval, once=once, on_tick=log_tick, stop_when_idle=until_done,
                           lease=lease, on_role=log_role)
        # cron sees only the exit code: a tick that worked on no cluster must not look like success (its
        # warnings are printed above). Some clusters working is a success with warnings
        if once and report.failed:
            from chainrun.chain.multi import tick_failed

            # MultiEngine's cause is one TickFailed naming every cluster; a bare Engine's, its Slurm error
            raise report.cause if isinstance(report.cause, ChainrunError) else tick_failed([])
    finally:  # sends still going out get a last chance; what is left is logged (notify.py)
        for msg, target, ok in (notifier.close() if notifier is not None else []):
            if not json_out:
                say(f"{clock(time.time())} {msg.chain_id} notified {target}: {msg.kind}" + ("" if ok else " (failed)"))


def cancel(
    chain: Annotated[str, typer.Argument(help="The chain to cancel.")],
    cluster: CheckClusterOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from chainrun import paths
    from chainrun.chain.cancel import cancel_chain
    from chainrun.context import open_context
    from chainrun.state.store import Store

    store = Store(paths.state_db())
    try:
        ch = store.chain(chain)
        if cluster and ch.cluster != cluster:
            raise UsageError(f"chain {ch.id} runs on cluster {ch.cluster}, not {cluster}")
        if ch.is_final:
            raise UsageError(f"chain {ch.id} is already {ch.status.lower()}")
        c = open_context(ch.cluster, store=store)  # the chain's own cluster, whatever the default
        try:
            ids = cancel_chain(store, c.slurm, ch)
        finally:
            c.runner.close()
        _cancel_racers(store, ch)
    finally:
        store.close()
    if json_out:
        typer.echo(envelope("cancel", {"chain": ch.id, "cancelled_jobs": ids}))
    else:
        typer.echo(f"chain {ch.id} cancelled" + (f" (jobs {', '.join(ids)})" if ids else ""))


def _cancel_racers(store, ch) -> None:
    """--race: segment 0's racers on every site are cancelled too (chain/race_driver.py)."""
    from chainrun.chain import race_driver, site_race

    if not site_race.open_racers(ch):
        return
    from chainrun.context import open_context

    opened = []

    def open_site(name: str):
        opened.append(open_context(name, store=store))
        return opened[-1]

    try:
        race_driver.cancel_racers(store, ch, open_site)
    finally:
        for o in opened:
            o.runner.close()


def unexclude(
    chain: Annotated[str, typer.Argument(help="The chain.")],
    nodes: Annotated[list[str], typer.Argument(help="Nodes to allow again (as `chainrun status CHAIN` lists them).")],
    json_out: JsonOpt = False,
) -> None:
    import time

    from chainrun import paths
    from chainrun.chain import placement
    from chainrun.state.store import Store

    store = Store(paths.state_db())
    try:
        ch = store.chain(chain)
        excluded = (ch.extra.get("adapt") or {}).get("exclude") or []
        unknown = [n for n in nodes if n not in excluded]
        if unknown:
            raise UsageError(f"chainrun did not exclude {', '.join(unknown)} from chain {ch.id}",
                             hint=f"excluded now: {', '.join(excluded) or 'none'}; "
                                  "nodes you excluded yourself (-- --exclude) stay in your options")
        now = time.time()
        for n in nodes:
            placement.unexclude(ch, n, now)
        store.save(ch, [], [(None, "adapt", f"node {n} pardoned by the user: later segments may run there again; "
                                            f"the evidence against it so far is forgotten") for n in nodes])
    finally:
        store.close()
    if json_out:
        typer.echo(envelope("unexclude", {"chain": ch.id, "pardoned": nodes,
                                          "excluded": (ch.extra.get("adapt") or {}).get("exclude") or []}))
    else:
        typer.echo(f"chain {ch.id}: {', '.join(nodes)} no longer excluded from later segments")


def _predictor_for(c):
    """The queue-delay model for the `predicted` policy, if one has been trained (see `chainrun model`)."""
    try:
        from chainrun.chain.prediction import make_predictor
    except ImportError:
        return None
    return make_predictor(c)
