"""The checks a chain spanning clusters runs on each site at submit, through that site's Runner:

- ``sbatch --test-only`` of the very request segment 0 would make there (the site's wrapper, options,
  time limit): the site accepts the script and its options, no job is created;
- the optional preflight command (``[clusters.NAME.job] preflight``) as a tiny job there: one node, one
  task, the site's account/partition/gres, its environment file sourced, in the chain's workdir. It
  shows that the data and the environment are present where the chain may run; its exit code and the
  last line of its output are read back.

Each failure is one line that names the cluster (:class:`SiteRefused`). Preflight jobs of all sites run
at the same time (``sbatch --wait`` in one thread per site): the submit waits for the slowest one.
"""

from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from chainrun.chain.request import _drop, segment_args
from chainrun.chain.segments import wrapper_path
from chainrun.durations import format_duration, to_slurm_time
from chainrun.errors import ChainrunError, SiteRefused, SlurmError
from chainrun.runner.base import Runner
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import Chain, Segment

# how long a preflight job may queue before chainrun gives up on it (and cancels it): on top of its limit
PREFLIGHT_QUEUE_S = 600
# a tiny job: options of the chain's request that would make it big, or that chainrun sets itself
_NOT_FOR_PREFLIGHT = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--output", "-o", "--error", "-e",
                      "--array", "-a", "--time", "-t", "--time-min", "--job-name", "-J", "--open-mode",
                      "--dependency", "-d", "--signal", "--chdir", "-D", "--nodelist", "-w")


def test_only(name: str, slurm: SlurmClient, site_chain: Chain) -> tuple[str, float | None]:
    """``sbatch --test-only`` of segment 0 as it would be submitted on this site: a note, and the start
    Slurm expects (None when it gave none), which places segment 0 (site_plan.first_site)."""
    seg = Segment(chain_id=site_chain.id, idx=0, time_limit_s=site_chain.segment_s)
    try:
        start = slurm.test_only(wrapper_path(site_chain), segment_args(site_chain, seg), script_args=["0"])
    except SlurmError as e:
        raise SiteRefused(f"cluster {name}: sbatch --test-only refused the chain's job: "
                          f"{_one_line(e.message)}") from None
    if start is None:
        return "accepted by sbatch --test-only", None
    return f"accepted by sbatch --test-only (would start in {format_duration(max(0.0, start - time.time()))})", start


@dataclass(frozen=True)
class Preflight:
    """One site's preflight job, ready to submit."""

    cluster: str
    runner: Runner
    command: str
    script_path: str  # where its batch script is written (the site's run folder)
    log_path: str
    job_name: str
    time_s: int
    sbatch_args: tuple[str, ...]
    script_text: str


def plan(cluster: str, runner: Runner, command: str, *, site_chain: Chain, env_file: str | None,
         time_s: int) -> Preflight:
    """The tiny job for ``command`` on this site: the site's request without its size, in the chain's
    workdir, with the chain's variables and the site's environment file."""
    run_dir = site_chain.run_dir
    q = shlex.quote
    lines = ["#!/bin/bash", "# chainrun preflight: is everything this chain needs present on this cluster?",
             f"export CHAINRUN_CLUSTER={q(cluster)} CHAINRUN_CHAIN_ID={q(site_chain.id)}",
             f"export CHAINRUN_RUN_DIR={q(run_dir)} CHAINRUN_CHECKPOINT_DIR={q(site_chain.checkpoint_dir)}"]
    if env_file:
        lines.append(f". {q(env_file)} || {{ echo \"chainrun preflight: cannot source {env_file}\" >&2; exit 3; }}")
    lines += [f"cd {q(site_chain.workdir)} || exit 3", command, ""]
    name = f"cr-preflight.{site_chain.id}"  # never cr.<chain>.<idx>: the watcher must not take it for a segment
    log = f"{run_dir}/logs/preflight-%j.out"
    args = _drop([a for a in site_chain.sbatch_args if a not in ("--exclusive",)], _NOT_FOR_PREFLIGHT)
    args += ["--nodes=1", "--ntasks=1", f"--time={to_slurm_time(time_s)}", f"--job-name={name}",
             f"--output={log}", f"--chdir={site_chain.workdir}"]
    return Preflight(cluster, runner, command, f"{run_dir}/preflight.sh", log, name, time_s, tuple(args),
                     "\n".join(lines))


def run_all(jobs: list[Preflight]) -> dict[str, str]:
    """Run every site's preflight at once; {cluster: note} when all passed, else the first failure
    (in the order given) is raised. Every job is waited for, so none is left behind unread."""
    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [(j, pool.submit(_run_one, j)) for j in jobs]
        outcomes = []
        for j, f in futures:
            try:
                outcomes.append((j, f.result(), None))
            except ChainrunError as e:
                outcomes.append((j, None, e))
    for j, _, err in outcomes:
        if err is not None:
            raise err if isinstance(err, SiteRefused) else SiteRefused(f"cluster {j.cluster}: preflight: "
                                                                       f"{_one_line(str(err))}")
    return {j.cluster: note for j, note, _ in outcomes}


def _run_one(job: Preflight) -> str:
    job.runner.write_file(job.script_path, job.script_text, 0o700)
    wait_s = job.time_s + PREFLIGHT_QUEUE_S
    res = job.runner.run(["sbatch", "--parsable", "--wait", *job.sbatch_args, job.script_path], wait_s + 60)
    job_id = _job_id(res.stdout)
    where = f"cluster {job.cluster}: preflight `{_short(job.command)}`"
    if res.timed_out:
        job.runner.run(["scancel", f"--name={job.job_name}"], 60)  # sbatch --wait was killed, the job may live on
        raise SiteRefused(f"{where} did not end within {format_duration(wait_s)} (job {job_id or '?'} cancelled): "
                          "is the queue full there?")
    if job_id is None:  # sbatch refused the job itself
        raise SiteRefused(f"{where}: sbatch refused the preflight job: {res.first_error_line()}")
    if res.returncode == 0:
        return f"preflight passed (job {job_id})"
    last = _last_line(job.runner, job.log_path.replace("%j", job_id))
    raise SiteRefused(f"{where} failed (job {job_id}, exit {res.returncode})" + (f": {last}" if last else ""))


def _job_id(stdout: str) -> str | None:
    for line in (stdout or "").splitlines():
        head = line.strip().split(";")[0]
        if head.isdigit():
            return head
    return None


def _last_line(runner: Runner, path: str) -> str:
    """The last non-empty line of the preflight's output (what a failing check said), if readable."""
    for _ in range(10):  # the log may reach a shared filesystem a moment after the job ended
        res = runner.run(["tail", "-n", "20", "--", path], 30)
        lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()] if res.ok else []
        if lines:
            return _one_line(lines[-1])
        time.sleep(1)
    return ""


def _short(command: str) -> str:
    c = " ".join(command.split())
    return c if len(c) <= 60 else c[:57] + "..."


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
