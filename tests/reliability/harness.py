"""Fault harness for real chains on a real Slurm: kill the watcher, break sbatch, stop the controller.

Shared by tests/reliability/test_faults_slurm.py (bounded for CI) and bench/kill_soak.py (the
long version). Everything goes through the real ``chainrun`` command in subprocesses, the way
users run it; the audit afterwards reads the state store, Slurm's accounting and the toy
trainer's steps.log, and never trusts chainrun's own account alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "templates" / "toy_train.sh"
# 1-minute segments, signal 20 s before the limit. Slurm sends it up to 60 s early, so a
# segment trains 0-40 s, and --total counts that training: a 2-minute chain is ~5-8 segments
SEG = ["--segment", "1m", "--signal", "USR2@20"]
PRIVATE_DIR = "/tmp/chainrun-slurm-r"
PRIVATE_ENV = {
    "CHAINRUN_SLURM_PORT_BASE": "7817", "CHAINRUN_SLURM_DB_PORT": "3308", "CHAINRUN_SLURM_CLUSTER": "relcheck",
    "CHAINRUN_SLURM_ETC_LINK": "0", "CHAINRUN_SLURM_NODES": "2",
}


def cli(*args: str, home: Path, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    full = {**os.environ, "CHAINRUN_HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "chainrun.cli.main", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def submit(home: Path, work: Path, name: str, *args: str, env: dict | None = None) -> str:
    work.mkdir(parents=True, exist_ok=True)
    p = cli("submit", str(TOY), "--name", name, "--json", *args, home=home, cwd=work, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"submit {name} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)["data"]["chain"]


def watch_argv(interval: float = 2) -> list[str]:
    return [sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", str(interval), "--until-done"]


def active_chains(home: Path) -> int:
    db = home / "state.sqlite"
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT count(*) FROM chains WHERE status = 'ACTIVE'").fetchone()[0]
    finally:
        con.close()


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def kill_after_sbatch_shim(bindir: Path, state: Path) -> None:
    """An ``sbatch`` that, when ``state/kill-next`` exists, SIGKILLs its caller right after the
    real sbatch succeeded: the watcher dies between "Slurm has the job" and "we recorded it"."""
    real = shutil.which("sbatch")
    bindir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    _write_exe(bindir / "sbatch", f"""#!/bin/bash
out=$({real} "$@"); rc=$?
printf '%s\\n' "$out"
if [ $rc -eq 0 ] && rm "{state}/kill-next" 2>/dev/null; then
  echo "$(date +%s) $PPID $out" >> "{state}/shim-kills"
  kill -9 $PPID
fi
exit $rc
""")


def flaky_sbatch_shim(bindir: Path, state: Path, k: int = 2) -> None:
    """An ``sbatch`` whose first ``k`` calls fail: odd ones with an error chainrun does not
    recognise and no job; even ones with a timeout *after* the job was created (a lost reply)."""
    real = shutil.which("sbatch")
    bindir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    _write_exe(bindir / "sbatch", f"""#!/bin/bash
n=$(( $(cat "{state}/calls" 2>/dev/null || echo 0) + 1 )); echo $n > "{state}/calls"
if [ $n -le {k} ]; then
  if [ $((n % 2)) -eq 0 ]; then
    out=$({real} "$@") && echo "$out" >> "{state}/landed"
    echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
  else
    echo "sbatch: error: Batch job submission failed: Unexpected message received" >&2
  fi
  exit 1
fi
exec {real} "$@"
""")


@dataclass
class KillStats:
    kills: int = 0  # watcher processes killed with SIGKILL
    shim_kills: int = 0  # ... of which right after a successful sbatch, before it was recorded
    restarts: int = 0  # watcher processes started
    odd_exits: list = field(default_factory=list)  # exit codes other than 0 / killed
    final_rc: int | None = None
    seconds: float = 0.0


def kill_loop(home: Path, *, kills: int, rng: random.Random, log: Path, env: dict | None = None,
              shim_state: Path | None = None, sbatch_share: float = 0.3, min_shim_kills: int = 0,
              min_s: float = 1.0, max_s: float = 15.0, interval: float = 2, timeout: float = 1200) -> KillStats:
    """Run `chainrun watch` and SIGKILL it ``kills`` times, restarting it each time; then let a last
    watcher drive the chains to the end.

    Most rounds kill after a random 1-``max_s`` s. A share of rounds (and every round until
    ``min_shim_kills`` happened) arm the sbatch shim instead and give the watcher up to 60 s to
    reach its next sbatch, so the worst moment is hit for sure, not only by luck."""
    st = KillStats()
    t0 = time.time()
    full = {**os.environ, "CHAINRUN_HOME": str(home), **(env or {})}
    with log.open("a") as out:
        while st.kills < kills and time.time() - t0 < timeout and active_chains(home):
            armed = shim_state is not None and (st.shim_kills < min_shim_kills or rng.random() < sbatch_share)
            if armed:
                (shim_state / "kill-next").touch()
            p = subprocess.Popen(watch_argv(interval), env=full, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            st.restarts += 1
            try:
                rc = p.wait(60 if armed else rng.uniform(min_s, max_s))
            except subprocess.TimeoutExpired:
                if shim_state is not None:
                    (shim_state / "kill-next").unlink(missing_ok=True)  # a timer kill: disarm the shim
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                st.kills += 1
                out.write(f"--- harness: SIGKILL watcher {p.pid} ({st.kills}/{kills})\n")
                out.flush()
                continue
            if rc == -signal.SIGKILL:
                st.kills += 1
                st.shim_kills += 1
                out.write(f"--- harness: watcher {p.pid} killed right after sbatch ({st.kills}/{kills})\n")
                out.flush()
            elif rc == 0:
                break
            else:
                st.odd_exits.append(rc)
        if shim_state is not None:
            (shim_state / "kill-next").unlink(missing_ok=True)
        out.write("--- harness: last watcher, runs to the end\n")
        out.flush()
        left = max(60.0, timeout - (time.time() - t0))
        try:
            st.final_rc = subprocess.run(watch_argv(interval), env=full, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, timeout=left).returncode
        except subprocess.TimeoutExpired:
            st.final_rc = None
    st.seconds = time.time() - t0
    return st


def release_requeued(job: str, timeout: float = 150) -> None:
    """End Slurm's requeue delay (BeginTime ~2 min ahead) for a requeued job: that wait is Slurm's, not
    what the tests test. `scontrol update StartTime=now` is accepted (exit 0) while the job is still
    COMPLETING, and the requeue then sets the BeginTime anyway: so it is sent again until squeue shows
    the job pending for another reason, or running. Not at once, either: sent the moment the job shows
    BeginTime, the rerun was launched while the node still cleaned up the first run and failed at once
    (exit 1, batch step CANCELLED); 5 s later it starts cleanly."""
    deadline = time.time() + timeout
    held_since = None
    while True:
        p = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T|%r"], capture_output=True, text=True,
                           timeout=60)
        state, _, reason = p.stdout.strip().partition("|")
        if state == "PENDING" and reason == "BeginTime":
            held_since = held_since or time.time()
            if time.time() - held_since >= 5:
                subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True,
                               timeout=60)
        elif state != "PENDING" and state not in ("COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", ""):
            return  # running again (or ended)
        elif state == "PENDING" and reason not in ("BeginTime", "None"):
            return  # waiting for something of the test's own (a node, a hold)
        if time.time() > deadline:
            raise AssertionError(f"job {job} still held by its requeue delay after {timeout:.0f}s: {p.stdout.strip()!r}")
        time.sleep(1)


def sacct_jobs(since: float, env: dict | None = None) -> list[dict]:
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 120))
    p = subprocess.run(["sacct", "-X", "-P", "-a", "-S", start, "-o", "JobIDRaw,JobName,State,Submit,Start,End"],
                       capture_output=True, text=True, env={**os.environ, **(env or {}), "SLURM_TIME_FORMAT": "%s"},
                       timeout=60)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    if not lines:
        return []
    head = lines[0].split("|")
    return [dict(zip(head, ln.split("|"))) for ln in lines[1:]]


def audit(home: Path, since: float, env: dict | None = None) -> dict:
    """Per chain: its status, how many Slurm jobs each segment index got, gaps in training."""
    from tests.chain.test_chain_slurm import assert_continuous_and_exclusive

    st = cli("status", "--json", home=home, env=env)
    chains = json.loads(st.stdout)["data"]
    jobs = sacct_jobs(since, env)
    out = {"chains": {}, "duplicates": 0, "losses": 0, "unfinished": 0, "training_faults": 0}
    for summary in chains:
        cid = summary["chain"] if "chain" in summary else summary["id"]
        detail = json.loads(cli("status", cid, "--json", home=home, env=env).stdout)["data"][0]
        segs = detail["segments_detail"]
        mine = [j for j in jobs if j["JobName"].startswith(f"cr.{cid}.")]
        per_name = Counter(j["JobName"] for j in mine)
        dups = {n: c for n, c in per_name.items() if c > 1}
        recorded = {str(s.get("job_id")) for s in segs if s.get("job_id")}
        unrecorded = [j["JobIDRaw"] for j in mine if j["JobIDRaw"] not in recorded]
        lost = [s["idx"] for s in segs if s.get("outcome") == "crash" and "no record" in (s.get("reason") or "")]
        try:
            assert_continuous_and_exclusive(SimpleNamespace(result={"checkpoint_dir": detail["checkpoint_dir"]}))
            training = "ok"
        except (AssertionError, FileNotFoundError) as e:
            training = str(e).splitlines()[0]
        out["chains"][cid] = {"status": detail["status"], "reason": detail["reason"], "segments": len(segs),
                              "jobs": len(mine), "duplicates": dups, "unrecorded_jobs": unrecorded,
                              "lost_segments": lost, "training": training}
        out["duplicates"] += sum(c - 1 for c in dups.values()) + len(unrecorded)
        out["losses"] += len(lost)
        out["unfinished"] += detail["status"] != "COMPLETED"
        out["training_faults"] += training != "ok"
    return out


def run_side_by_side(groups: list[dict], tmp_path_factory, only_env: str) -> dict:
    """Run scenario functions (name -> fn(base folder) -> result dict) in threads, group after group;
    a scenario that raises gets {"error": traceback}. ``only_env`` names an environment variable that
    picks scenarios by name while developing (e.g. CHAINRUN_HANDOFF_SCENARIOS=heartbeat,replan)."""
    import threading
    import traceback

    results: dict = {}

    def run(name, fn, folder):
        try:
            results[name] = fn(folder)
        except Exception:
            results[name] = {"error": traceback.format_exc()}

    only = os.environ.get(only_env)
    for group in groups:
        items = [item for item in group.items() if not only or item[0] in only.split(",")]
        # the folders are made here, one thread: pytest's tmp_path_factory is not thread-safe (threads that
        # make the first folder of a session at once each create a base folder, and all but the last then
        # fail with "... is not a normalized and relative path", as seen in CI)
        folders = {name: tmp_path_factory.mktemp(name) for name, _ in items}
        threads = [threading.Thread(target=run, args=(name, fn, folders[name])) for name, fn in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def train_model(home: Path) -> None:
    """Give the cluster some history and train the queue-delay model in this home."""
    from tests.chain.test_chain_slurm import train_model as train

    train(home)


def model_decisions(home: Path, chain: str) -> dict:
    """Of a chain's segments submitted early (while their predecessor still ran: the policy's decision),
    how many carried the model's estimate rather than the lead fallback."""
    detail = json.loads(cli("status", chain, "--json", home=home).stdout)["data"][0]
    segs = [s for s in detail["segments_detail"] if s["job_id"]]
    early = [b for a, b in zip(segs, segs[1:]) if b["submit"] and a["end"] and b["submit"] < a["end"]]
    return {"later_segments": len(early), "with_model": sum(1 for s in early if s["predicted_model"]),
            "models": sorted({s["predicted_model"] for s in early})}


def events(home: Path, kind: str) -> list[str]:
    con = sqlite3.connect(f"file:{home / 'state.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return [r[0] for r in con.execute("SELECT message FROM events WHERE kind = ?", (kind,))]
    finally:
        con.close()


def start_private_cluster() -> dict:
    """The second, private cluster of the controller test; returns the env its clients need."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "start-cluster.sh"), PRIVATE_DIR],
                       env={**os.environ, **PRIVATE_ENV}, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"private cluster did not start: {p.stderr[-2000:]}")
    return {"SLURM_CONF": f"{PRIVATE_DIR}/etc/slurm.conf"}


def stop_private_cluster() -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "stop-cluster.sh"), PRIVATE_DIR], capture_output=True,
                   text=True, timeout=600)


def ctld_pid() -> int | None:
    try:
        pid = int(Path(f"{PRIVATE_DIR}/slurm/slurmctld.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if comm.startswith("slurmctld") else None


def stop_ctld() -> None:
    """Stop the private cluster's slurmctld (by its PID file) and wait until it is gone."""
    pid = ctld_pid()
    if pid is None:
        raise RuntimeError("private slurmctld is not running")
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):  # it may end between the last look and the kill
        os.kill(pid, signal.SIGKILL)
