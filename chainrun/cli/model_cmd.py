"""Queue-delay model commands: ``model refresh|status|eval`` and ``predict``.

Heavy imports (pandas, lightgbm) happen inside the commands, so ``chainrun --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from chainrun.cli.model_sites import SITES_HELP, sites_cmd
from chainrun.cli.model_status import status_rows

ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster name: which history and model to use.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

model_app = typer.Typer(help="The queue-delay model: learn waits from sacct, show it, measure it.",
                        no_args_is_help=True)


model_app.command("sites", help=SITES_HELP)(sites_cmd)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
    app.command("predict", help="Predict how long a job submitted now would wait (p10/p50/p90).")(predict)


def _user_on(cluster: str) -> str | None:
    """Who we are on ``cluster``: a remote cluster's login user (from the config, no connection), else None
    (this machine's user). Per-user models are keyed by the cluster's user names."""
    from chainrun import clusters
    from chainrun.errors import NotFoundError

    if cluster in (clusters.LOCAL, "default"):
        return None
    try:
        runner = _runner(cluster)
    except NotFoundError:  # a model kept for a cluster no longer configured: model_status says so, or shows it
        return None
    try:
        return getattr(runner, "user", None) or None
    finally:
        runner.close()


def _runner(cluster: str = "local"):
    # local, or the cluster's SSH runner (connects on first use); the model commands need only run()
    from chainrun.context import open_runner

    return open_runner(cluster)[0]


def _fmt(seconds: float) -> str:
    s = float(seconds)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


@model_app.command("refresh", help="Read new sacct history, retrain the model and save it.")
def refresh(
    cluster: ClusterOpt = "local",
    install_cron: Annotated[bool, typer.Option("--install-cron", help="Also put a refresh entry (every 6 h) in your crontab (your scrontab where cron is barred; the same code as `watch --install-schedule`); safe to repeat.")] = False,
    print_cron: Annotated[bool, typer.Option("--print-cron", help="Only print the crontab line, change nothing.")] = False,
    lookback: Annotated[Optional[str], typer.Option("--lookback", help="History to read on the first refresh, e.g. 60d.")] = None,
    no_tune: Annotated[bool, typer.Option("--no-tune", help="Only the model: do not choose `predicted`'s values for this cluster (docs/self-tuning.md), nor re-choose the site margins of the cluster lists holding it (docs/multi-cluster.md).")] = False,
    json_out: JsonOpt = False,
) -> None:
    from chainrun.cli.render import envelope
    from chainrun.durations import parse_duration
    from chainrun.predict import service

    if print_cron:
        typer.echo(service.cron_line(cluster))
        return
    lookback_days = parse_duration(lookback, what="--lookback") / 86400.0 if lookback else None
    # an unreadable tuning file stops no refresh: set aside before tuning; with --no-tune left alone, but said
    aside = _set_aside(cluster, quiet=json_out) if not no_tune else None
    unreadable = _unreadable_tuning(cluster, quiet=json_out) if no_tune else None
    workers, bar = _tune_setup(json_out)
    runner = _runner(cluster)
    try:
        with bar as progress:
            tuner = None
            if not no_tune:  # predicted's values from the same history (chainrun/sim/selftune.py)
                from chainrun.sim import selftune

                tuner = selftune.tuner(runner, cluster=cluster, workers=workers, progress=progress)
            res = service.refresh(runner, cluster=cluster, lookback_days=lookback_days, tuner=tuner)
    finally:
        runner.close()
    if not no_tune:  # the model is saved: re-choose the site margins of the lists holding this cluster (never raises)
        from chainrun.sim import site_selftune

        res["site_margins"] = site_selftune.refresh_margins(cluster, workers=workers)
    if install_cron:  # the refresh runs here (it reaches a remote cluster by itself): our crontab (chainrun/schedule.py)
        line, changed = service.install_cron(_runner(), cluster)
        res["cron"] = {"line": line, "changed": changed}
    if aside:
        res["tuning_set_aside"] = aside
    if unreadable:
        res["tuning_unreadable"] = unreadable
    if json_out:
        typer.echo(envelope("model refresh", res))
        return
    who = "all users" if res["all_users"] else "your jobs only"
    typer.echo(f"{res['cluster']}: {res['new_rows']} sacct rows read ({who}), {res['history_rows']} in history, "
               f"trained on {res['train_rows']} jobs in {res['seconds']['total']:.1f}s; "
               f"per-user models: {', '.join(res['user_models']) or 'none'}")
    typer.echo(f"saved to {res['model_dir']}")
    _echo_tuning(res.get("tuning"), cluster)
    _echo_site_margins(res.get("site_margins"))
    if install_cron:
        typer.echo(("installed cron line: " if res["cron"]["changed"] else "cron line already there: ") + res["cron"]["line"])
    else:
        typer.echo("to refresh automatically: chainrun model refresh --install-cron")


def _set_aside(cluster: str, quiet: bool) -> dict | None:
    """An unreadable tuning file set aside before a tuning step (chainrun/chain/tuned.py), said in
    one warning line on stderr (unless ``quiet``: `model refresh --json` carries it in its data)."""
    from chainrun.chain import tuned

    aside = tuned.set_aside(cluster)
    if aside and not quiet:
        typer.echo(f"warning: {tuned.set_aside_text(aside)}", err=True)
    return aside


def _unreadable_tuning(cluster: str, quiet: bool) -> dict | None:
    """With ``--no-tune`` the tuning file is not touched; an unreadable one is still said (one warning
    line on stderr, unless ``quiet``), since `predicted` runs on the shipped values meanwhile."""
    from chainrun.chain import tuned

    p = tuned.path(cluster)
    _, why = tuned.read(p)
    if why is None:
        return None
    if not quiet:
        typer.echo(f"warning: unreadable tuning file {p} ({why}): predicted runs on the shipped values; "
                   f"{tuned.FIX}", err=True)
    return {"file": str(p), "why": why, "hint": tuned.FIX}


def _tune_setup(json_out: bool):
    """(workers, progress context) for the tuning step: on a terminal two workers and a progress bar
    (on stderr); elsewhere (cron, whose line runs it under ``nice -n 10``) single-threaded, quietly."""
    import contextlib
    import sys

    if sys.stderr.isatty() and not json_out:
        return 2, _Bar()
    return 1, contextlib.nullcontext(None)


class _Bar:
    """A rich progress bar per partition; the context value is the core's progress callback."""

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from chainrun.cli.render import console

        self.p = Progress(TextColumn("tuning {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=console(stderr=True), transient=True)
        self.p.__enter__()
        self.tasks: dict = {}

        def step(partition: str, done: int, total: int) -> None:
            if partition not in self.tasks:
                self.tasks[partition] = self.p.add_task(partition, total=total)
            self.p.update(self.tasks[partition], completed=done, total=total)

        return step

    def __exit__(self, *exc):
        return self.p.__exit__(*exc)


def _echo_tuning(tuning: dict | None, cluster: str) -> None:
    if tuning is None:
        typer.echo("predicted's values: not tuned (--no-tune)")
        return
    from chainrun.sim.tuning_text import priority_text

    for part, r in tuning.items():
        typer.echo(f"predicted on {part}: {r['summary']}")
        if r.get("facts"):  # the replay behind it: its priority model, and what stood in for what Slurm did not tell
            typer.echo(f"  replay: {priority_text(r['facts'])}")
    if tuning:
        typer.echo(f"see: chainrun model status --cluster {cluster}; pin or roll back: chainrun model tune "
                   f"--cluster {cluster} --partition P --pin | --unpin | --rollback")


def _echo_site_margins(sm: dict | None) -> None:
    """One line per cluster list re-chosen (nothing when no stored list holds this cluster)."""
    if not sm:
        return
    if sm.get("unreadable"):
        typer.echo(f"site margins: not re-chosen: unreadable site margin file {sm['file']} ({sm['unreadable']['why']}); "
                   f"submit uses the shipped margin; {sm['unreadable']['hint']}")
    for k, r in sm["lists"].items():
        typer.echo(f"site margin for {k}: {r['summary']}")


@model_app.command("tune", help="Choose `predicted`'s values for this cluster now (from the cached history), or pin / unpin / roll back the values in force.")
def tune_cmd(
    cluster: ClusterOpt = "local",
    partition: Annotated[Optional[str], typer.Option("--partition", "-p", help="The partition (default: the cluster's default one and those of your chains).")] = None,
    pin: Annotated[bool, typer.Option("--pin", help="Keep the values in force: refreshes still choose and record, but change nothing.")] = False,
    unpin: Annotated[bool, typer.Option("--unpin", help="Let refreshes put their choices in force again.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Put the values in force before the current ones back (shipped if none), pinned.")] = False,
    json_out: JsonOpt = False,
) -> None:
    from chainrun.chain import tuned
    from chainrun.cli.render import envelope
    from chainrun.errors import UsageError
    from chainrun.sim import selftune

    if pin + unpin + rollback > 1:
        raise UsageError("give one of --pin, --unpin, --rollback")
    if pin or unpin or rollback:
        if not partition:
            raise UsageError("--pin, --unpin and --rollback need --partition")
        e = tuned.rollback(cluster, partition) if rollback else tuned.pin(cluster, partition, on=pin)
        if json_out:
            typer.echo(envelope("model tune", {"partition": partition, "in_force": e["in_force"], "pinned": e["pinned"],
                                               "tuning_set_aside": e.get("set_aside")}))
            return
        if e.get("set_aside"):
            typer.echo(f"warning: {tuned.set_aside_text(e['set_aside'])}", err=True)
        what = "rolled back to" if rollback else ("pinned" if pin else "unpinned")
        typer.echo(f"{cluster}/{partition}: {what} {selftune.values_text(e['in_force'])}"
                   + (" (pinned)" if e["pinned"] and not pin else ""))
        return
    if partition:  # before an unreadable file is set aside (tune_now checks again, for library callers)
        selftune.check_partitions(cluster, [partition])
    _set_aside(cluster, quiet=False)  # its data is {partition: outcome}: the line goes to stderr with --json too
    workers, bar = _tune_setup(json_out)
    runner = _runner(cluster)
    try:
        with bar as progress:
            res = selftune.tune_now(runner, cluster=cluster, partitions=[partition] if partition else None,
                                    workers=workers, progress=progress)
    finally:
        runner.close()
    if json_out:
        typer.echo(envelope("model tune", res))
        return
    _echo_tuning(res, cluster)


@model_app.command("status", help="Show the saved model: when trained, on what, which model answers for you.")
def status(cluster: ClusterOpt = "local", json_out: JsonOpt = False,
           plain: Annotated[bool, typer.Option("--plain", help="Plain `key: value` lines instead of a table; the "
                                               "default when the output is not a terminal.")] = False) -> None:
    from chainrun.cli.render import console, envelope
    from chainrun.errors import NotFoundError
    from chainrun.chain.live_score import model_status

    st = model_status(cluster, _user_on(cluster))
    if json_out:
        typer.echo(envelope("model status", st))
        return
    if st["model"] is None:  # an error line on stderr, exit 3 (docs/exit-codes.md), as for any missing thing
        raise NotFoundError(f"no queue-delay model for cluster {cluster} yet",
                            hint=f"run: chainrun model refresh --cluster {cluster}")
    rows = status_rows(st)
    out = console()
    if plain or not out.is_terminal:  # pipes, cron mail, CI logs: plain lines, as every command prints there
        from chainrun.cli.tables import print_lines, wrap_text

        print_lines(out, [ln for k, v in rows for ln in wrap_text(v, out.width, first=f"{k}: ")])
        return
    from rich.table import Table

    t = Table(title=f"queue-delay model for {cluster}", show_header=False)
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


@model_app.command("eval", help="Replay the model's refresh through the end of a trace and score what it would have answered, against baselines.")
def eval_cmd(
    trace: Annotated[Optional[str], typer.Option("--trace", help="sacct text or a sacct -P dump (.xz/.gz too), or a built-in trace: ls6-a100-dev (default: the cached history).")] = None,
    train_until: Annotated[Optional[str], typer.Option("--train-until", help="Train on jobs submitted before this date (default: 80 % of the span).")] = None,
    test_until: Annotated[Optional[str], typer.Option("--test-until", help="Test on jobs submitted from --train-until to this date (default: the end).")] = None,
    refit_every: Annotated[str, typer.Option("--refit-every", help="Refit the models this often through the test window (the cron refresh: 6h).")] = "1d",
    no_forest: Annotated[bool, typer.Option("--no-forest", help="Leave out the quantile random forest (the slowest model).")] = False,
    cluster: ClusterOpt = "local",
    json_out: JsonOpt = False,
) -> None:
    from chainrun.cli.render import envelope
    from chainrun.durations import parse_duration
    from chainrun.predict import service

    every = parse_duration(refit_every, what="--refit-every")
    res = service.eval_trace(trace, cluster=cluster, train_until=train_until, test_until=test_until,
                             refit_every_s=every, random_forest=not no_forest)
    if json_out:
        typer.echo(envelope("model eval", res))
        return
    te = res["test"]
    typer.echo(f"test {te['from']} .. {te['to']}: {te['n']} jobs, refit every {te['refit_every_h']:g} h "
               f"(train {res['train']['n']} jobs from {res['train']['from']}; "
               f"{te['excluded_dependency_like']} dependency-like left out)")
    w = max(len(n) for n in res["models"])
    typer.echo(f"{'model':{w}}  {'cov q50/90/98':>15}  {'width':>5}  {'pinball':>7}  {'q98':>5}  {'1h/6h':>9}  {'2x':>4}")
    for name, m in res["models"].items():
        c, d = m["calibration"], m["deadline"]
        typer.echo(f"{name:{w}}  {c['q50']:.2f}/{c['q90']:.2f}/{c['q98']:.3f}  {m['sharpness_log10_q50_q98']:5.2f}  "
                   f"{m['mean_pinball']:7.3f}  {m['pinball']['p98']:5.3f}  "
                   f"{d['1h']['accuracy']:.2f}/{d['6h']['accuracy']:.2f}  {m['within_2x']:4.2f}")
    typer.echo("coverage: share of waits below each quantile; width: mean log10(q98/q50); pinball: mean over "
                    "the quantiles, and q98's (log10 s); 1h/6h: accuracy of 'starts within H' when P >= 0.5")
    b = res["deadline_baselines"]
    typer.echo("deadline baselines (accuracy 1h / 6h): majority class "
               f"{b['1h']['majority_class_accuracy']:.3f} / {b['6h']['majority_class_accuracy']:.3f}, "
               f"user median {b['1h']['user_median_accuracy']:.3f} / {b['6h']['user_median_accuracy']:.3f}")
    for note in res["notes"]:
        typer.echo(note)


def predict(
    nodes: Annotated[int, typer.Option("--nodes", "-N", help="Nodes the job asks for.")] = 1,
    gpus: Annotated[int, typer.Option("--gpus", "-G", help="GPUs in total.")] = 0,
    time_: Annotated[str, typer.Option("--time", "-t", help="Time limit, e.g. 24h, 90m, 1-00:00:00.")] = "1h",
    partition: Annotated[str, typer.Option("--partition", "-p", help="Partition (default: the cluster's default).")] = "",
    qos: Annotated[str, typer.Option("--qos", help="QOS, if you use one.")] = "",
    cpus: Annotated[int, typer.Option("--cpus", help="CPUs in total (0: not given).")] = 0,
    cluster: ClusterOpt = "local",
    json_out: JsonOpt = False,
) -> None:
    from chainrun.cli.render import envelope
    from chainrun.durations import parse_duration
    from chainrun.predict import service

    limit = parse_duration(time_, what="--time")
    if cluster == "all":
        return _predict_all(nodes=nodes, gpus=gpus, cpus=cpus, timelimit_s=limit, partition=partition, qos=qos,
                            json_out=json_out)
    runner = _runner(cluster)
    try:
        a = service.predict_now(runner, cluster=cluster, nodes=nodes, gpus=gpus, cpus=cpus, timelimit_s=limit,
                                partition=partition, qos=qos, user=getattr(runner, "user", None))
        note = service.time_limit_note(runner, timelimit_s=limit, partition=partition)
    finally:
        runner.close()
    if a.slurm is not None and a.slurm.refused:
        note = "; ".join(filter(None, [note, f"Slurm would not run this job as asked (sbatch --test-only: "
                                              f"{a.slurm.refused}): the wait below is the model's alone"]))
    p = a.prediction
    within = {h: p.prob_within(s) for h, s in (("10m", 600), ("1h", 3600), ("6h", 21600), ("24h", 86400))}
    if json_out:
        typer.echo(envelope("predict", {"p10_s": p.p10, "p50_s": p.p50, "p90_s": p.p90, "model": p.model,
                                        "quantiles_s": p.as_dict()["quantiles_s"], "p_start_within": within,
                                        "support": a.as_dict(), "warnings": [note] if note else []}))
        return
    if note:
        typer.echo(f"warning: {note}", err=True)
    soon = f"starts within 10m: {within['10m'] * 100:.0f} %, 1h: {within['1h'] * 100:.0f} %" if p.p50 < 3600 else \
        f"starts within 1h: {within['1h'] * 100:.0f} %, 24h: {within['24h'] * 100:.0f} %"
    typer.echo(f"expected wait {_fmt(p.p50)} (80 % between {_fmt(p.p10)} and {_fmt(p.p90)}, "
               f"98 % within {_fmt(p.quantile(0.98))}); {soon}; model: {p.model}")
    for line in _support_lines(a):
        typer.echo(line)


def _support_lines(a) -> list[str]:
    """What the answer rests on, when the model alone is not enough (chainrun/predict/doubt.py)."""
    s = a.slurm
    lines = []
    if a.reasons:
        lines.append("the model alone is not sure: " + "; ".join(a.reasons))
    if s is not None and (a.reasons or s.ahead_jobs):
        said = f"Slurm's estimate ({s.source}): start in {_fmt(s.wait_s)}" if s.wait_s is not None else \
            "Slurm gave no start estimate"
        lines.append(f"{said}; {s.ahead_jobs} job(s) pending ahead in the partition ({s.ahead_nodes} nodes)")
    if a.leaned:
        lines.append(f"so the answer leans on Slurm's estimate (the model alone said {_fmt(a.model_only.p50)}, "
                     f"98 % within {_fmt(a.model_only.quantile(0.98))})")
    elif a.reasons and s is not None and s.wait_s is not None:  # Slurm answered, no later than the model
        lines.append("Slurm's estimate is no later than the model's: " + (
            f"the answer is the model's, only widened by the short history (the model alone said "
            f"{_fmt(a.model_only.p50)}, 98 % within {_fmt(a.model_only.quantile(0.98))})" if a.support.short
            else "the model's answer stands"))
    elif a.reasons:
        lines.append("so the answer is only widened by the short history (no Slurm estimate to lean on)"
                     if a.support.short else "no Slurm estimate to lean on: the model's answer stands")
    return lines


def _predict_all(*, json_out: bool, **job) -> None:
    """``predict --cluster all``: every configured cluster, ranked by predicted median wait."""
    from chainrun import clusters
    from chainrun.cli.render import envelope
    from chainrun.errors import ChainrunError
    from chainrun.predict import service

    ranked, failed = [], []
    for name in ["local", *sorted(clusters.load().clusters)]:
        try:
            runner = _runner(name)
            try:
                a = service.predict_now(runner, cluster=name, user=getattr(runner, "user", None), **job)
            finally:
                runner.close()
        except ChainrunError as e:  # no model yet, or unreachable: say so, rank the others
            failed.append({"cluster": name, "error": str(e)})
            continue
        p = a.prediction
        # a cluster whose model is not sure is ranked on its widened (or leaned-on) answer: say so there too
        ranked.append({"cluster": name, "p10_s": p.p10, "p50_s": p.p50, "p90_s": p.p90, "model": p.model,
                       "not_sure": list(a.reasons), "leaned_on_slurm": a.leaned})
    ranked.sort(key=lambda r: r["p50_s"])
    if json_out:
        typer.echo(envelope("predict", {"ranked": ranked, "unavailable": failed}))
        return
    for i, r in enumerate(ranked, 1):
        doubt = "" if not r["not_sure"] else "; the model alone is not sure: " + "; ".join(r["not_sure"]) + (
            ", so it leans on Slurm's estimate" if r["leaned_on_slurm"] else ", so it is widened")
        typer.echo(f"{i}. {r['cluster']}: expected wait {_fmt(r['p50_s'])} "
                   f"(80 % between {_fmt(r['p10_s'])} and {_fmt(r['p90_s'])}){doubt}")
    for f in failed:
        typer.echo(f"-  {f['cluster']}: {f['error']}", err=True)
