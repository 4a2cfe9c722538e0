"""End-to-end chains on the real Slurm cluster *through* real OpenSSH servers on 127.0.0.1.

Like tests/chain/test_chain_slurm.py: every scenario is submitted at once and one real
`chainrun watch --until-done` process drives them all; then each test checks one result.
Four clusters share that watcher: ``lo`` (sshd :2222), ``flaky`` (a second sshd, :2223),
``ossh`` (the :2222 server again, through the system ssh and a ControlMaster: `cluster add --ssh`)
and ``local``. In the middle of the run the flaky server is stopped, its sessions are
killed, and it is started again 30 s later: the fault test checks that its chain carried
on, that no segment was submitted twice and that the user saw warnings, not a traceback.
Plain scenarios run on n4 only, ``lead`` holds n3 exclusively and ``handoff`` may use either
(n1/n2 belong to other tests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.chain.test_chain_slurm import assert_continuous_and_exclusive
from tests.conftest import REPO, run_cli
from tests.ssh.conftest import REMOTE_HOME, REMOTE_USER, TOY_DIR, host_block, make_home, start, stop

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]

SIGNAL = "USR2@50"
N4 = "--exclude=n1,n2,n3"
TOY = f"CHAINRUN_TOY={TOY_DIR / 'toy_train.sh'}"  # an uploaded toy_train.sh finds its trainer through this
MARK_NAME = f"cr-pwned-{uuid.uuid4().hex}"  # file names cannot hold '/': those markers land in a cwd
MARK = f"/tmp/{MARK_NAME}"
NASTY = f"we'ird \"name\"; $(touch {MARK}-1) `touch {MARK}-2`\nline two"
LITERAL_SCRIPT = ("#!/bin/bash\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=50M\n"
                  'echo "ran as $0" > "$CHAINRUN_CHECKPOINT_DIR/ran"\ntouch "$CHAINRUN_DONE_FILE"\n')


@dataclass
class Scenario:
    cluster: str
    args: list[str]
    script: str = ""  # default: the toy, uploaded
    chain: str = ""
    result: dict = field(default_factory=dict)


SCENARIOS = {
    # the flaky cluster's chain: its server goes away while segment 0 runs
    "reactive": Scenario("flaky", ["--total", "3m", "--policy", "reactive", "--", N4, f"--export=ALL,{TOY}"]),
    # an existing remote script, used in place (it finds toy_trainer.py beside itself)
    "dependency": Scenario("lo", ["--remote-script", "--total", "3m", "--policy", "dependency", "--", N4],
                           script=str(TOY_DIR / "toy_train.sh")),
    "lead": Scenario("lo", ["--total", "3m", "--policy", "lead", "--lead", "40s", "--", "--nodelist=n3",
                            "--exclusive", f"--export=ALL,{TOY}"]),
    # 3-minute segments (partition long) and a lead longer than that: the successor is queued as soon as
    # segment 0 starts and has minutes to find a free CPU on the shared nodes, then must hand off (the
    # adaptive hand-off may wait with such short segments: turned off in the job's environment)
    "handoff": Scenario("lo", ["--total", "4m", "--segment", "3m", "--policy", "lead", "--lead", "150s", "--",
                               "--partition=long", "--exclude=n1,n2",
                               f"--export=ALL,{TOY},CHAINRUN_ADAPTIVE_HANDOFF=0"]),
    # the queue-delay model of cluster lo, trained from its sacct over SSH, decides when to submit
    "predicted": Scenario("lo", ["--total", "3m", "--policy", "predicted", "--lead", "40s", "--", N4,
                                 f"--export=ALL,{TOY}"]),
    # every try crashes 20 s in (no checkpoint to resume from): long enough that the watcher sees the retry
    # run and pre-queues its successor, which the failure must cancel (at 2 s, under CI load, one tick
    # could see both tries end and there was no successor to cancel)
    "crash": Scenario("lo", ["--total", "10m", "--policy", "dependency", "--retries", "1", "--", N4,
                             f"--export=ALL,TOY_CRASH_AT_STEP=40,TOY_SAVE_EVERY=1000,{TOY}"]),
    # quotes, spaces, ; $(...) `...` and a newline in the chain name and both script paths
    # (policies pinned: "lo" has a model in this home, so the default there would be predicted)
    "literal-upload": Scenario("lo", ["--name", NASTY, "--total", "2m", "--policy", "lead", "--", N4]),
    "literal-remote": Scenario("lo", ["--remote-script", "--name", NASTY, "--total", "2m", "--policy", "lead", "--", N4]),
    # the same server through the system ssh (the OpenSSH transport): upload, sbatch, ticks over one master
    "openssh": Scenario("ossh", ["--total", "3m", "--policy", "lead", "--lead", "40s", "--", N4,
                                 f"--export=ALL,{TOY}"]),
    "literal-openssh": Scenario("ossh", ["--name", NASTY, "--total", "2m", "--policy", "lead", "--", N4]),
    "local": Scenario("local", ["--total", "2m", "--policy", "lead", "--", N4, "--export=ALL,TOY_TOTAL_STEPS=10"],
                      script=str(REPO / "templates" / "toy_train.sh")),
}


def sessions_of(port: int) -> set[int]:
    """PIDs of the sshd processes serving connections to our test server on ``port``."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    return {p for p in pids if Path(f"/proc/{p}/comm").exists() and Path(f"/proc/{p}/comm").read_text().strip() == "sshd"}


def chain_status(home: Path, chain: str) -> dict:
    p = run_cli("status", chain, "--json", home=home)
    return json.loads(p.stdout)["data"][0] if p.returncode == 0 else {}


@pytest.fixture(scope="module")
def run(slurm_cluster, ssh_server, flaky_server, tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("ssh-chains") / "home", {"lo": ssh_server, "flaky": flaky_server})
    env = pytest.MonkeyPatch()  # the ossh cluster's ~/.ssh/config and control folder, for every process below
    cm = Path(tempfile.mkdtemp(prefix="crcm", dir="/tmp"))
    (cm / "config").write_text(host_block("crlo", ssh_server))
    env.setenv("CHAINRUN_SSH_CONFIG", str(cm / "config"))
    env.setenv("CHAINRUN_SSH_CONTROL_DIR", str(cm))
    p = run_cli("cluster", "add", "ossh", "--ssh", "crlo", home=home)
    assert p.returncode == 0, p.stderr
    p = run_cli("model", "refresh", "--cluster", "lo", "--json", home=home, timeout=300)
    assert p.returncode == 0, p.stderr
    local_dir = tmp_path_factory.mktemp("literal") / f"sp ace's;$(touch {MARK_NAME}-3)\nx"
    local_dir.mkdir()
    (local_dir / f"pay load;$(touch {MARK_NAME}-4).sh").write_text(LITERAL_SCRIPT)
    SCENARIOS["literal-upload"].script = SCENARIOS["literal-openssh"].script = str(next(local_dir.iterdir()))
    remote_dir = REMOTE_HOME / f"cr-literal-{uuid.uuid4().hex[:6]} it's;$(touch {MARK_NAME}-5)\n`touch {MARK_NAME}-6`"
    remote_dir.mkdir()
    remote_script = remote_dir / f"run me;$(touch {MARK_NAME}-7).sh"
    remote_script.write_text(LITERAL_SCRIPT)
    for p in (remote_dir, remote_script):
        os.chown(p, *_ids(REMOTE_USER))
    SCENARIOS["literal-remote"].script = str(remote_script)
    work = tmp_path_factory.mktemp("work")
    for sc in SCENARIOS.values():
        p = run_cli("submit", sc.script or str(REPO / "templates" / "toy_train.sh"), "--cluster", sc.cluster,
                    "--signal", SIGNAL, "--json", *sc.args, home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        sc.chain = json.loads(p.stdout)["data"]["chain"]
    # one tick by hand: one squeue (and at most one sacct) per cluster, over one connection each
    once = run_cli("watch", "--once", "--json", home=home)
    assert once.returncode == 0, once.stderr
    first_tick = json.loads(once.stdout)["data"]
    watch = subprocess.Popen(
        [sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", "3", "--until-done"],
        env={**os.environ, "CHAINRUN_HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )
    outage = _outage(home, SCENARIOS["reactive"].chain, flaky_server)
    try:
        out, err = watch.communicate(timeout=720)
    except subprocess.TimeoutExpired:
        watch.kill()
        out, err = watch.communicate()
        pytest.fail(f"watch did not finish: {err[-2000:]}")
    assert watch.returncode == 0, err[-2000:]
    from chainrun.state.store import Store

    store = Store(home / "state.sqlite")
    for sc in SCENARIOS.values():
        sc.result = chain_status(home, sc.chain)
        sc.result["script"] = store.chain(sc.chain).script  # where the payload really was on the cluster
    store.close()
    yield {"work": work, "home": home, "log": out, "stderr": err, "outage": outage, "first_tick": first_tick,
           "remote_script": remote_script, "local_script": SCENARIOS["literal-upload"].script,
           "control_dir": cm}
    shutil.rmtree(remote_dir, ignore_errors=True)
    for sock in cm.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=30)
    shutil.rmtree(cm, ignore_errors=True)
    env.undo()


def _outage(home: Path, chain: str, server) -> dict:
    """Once the flaky chain's segment 0 runs: stop its sshd, drop its sessions, wait 30 s, restart."""
    deadline = time.time() + 300
    while time.time() < deadline:
        st = chain_status(home, chain)
        # cut a live connection, not just refuse new ones: wait for the watcher's session too
        if st and any(s["start"] for s in st.get("segments_detail", [])) and sessions_of(server.port):
            break
        time.sleep(2)
    else:
        pytest.fail("the flaky cluster's chain never started")
    stop(server)  # the listener only: established sessions outlive it
    killed = sessions_of(server.port)
    for pid in killed:
        os.kill(pid, signal.SIGTERM)
    down_at = time.time()
    time.sleep(30)
    start(server.dir, server.port)
    return {"down_at": down_at, "up_at": time.time(), "killed_sessions": len(killed)}


def other_jobs(node: str, t0: float, t1: float, chain: str) -> list[str]:
    """Jobs of other chains that ran on ``node`` between t0 and t1 (the test cluster is shared)."""
    out = subprocess.run(["sacct", "-a", "-X", "-n", "-P", "-N", node, "--format", "JobName,Start,End",
                          "--starttime", "now-1hours"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout
    found = []
    for line in out.splitlines():
        name, start, end = (line.split("|") + ["", "", ""])[:3]
        if not start.isdigit() or name.startswith(f"cr.{chain}."):
            continue
        if int(start) < t1 and (not end.isdigit() or int(end) > t0):
            found.append(name)
    return found


def _ids(user: str) -> tuple[int, int]:
    import pwd

    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def segs(name: str) -> list[dict]:
    return SCENARIOS[name].result["segments_detail"]


def test_one_squeue_per_cluster_per_tick(run):
    calls = run["first_tick"]["slurm_calls"]
    for cluster in ("lo:", "flaky:", "ossh:", ""):
        assert calls.get(f"{cluster}squeue") == 1, calls
        assert calls.get(f"{cluster}sacct", 0) <= 1, calls


def test_reactive_chain_survives_ssh_outage(run):
    sc = SCENARIOS["reactive"]
    assert run["outage"]["killed_sessions"] >= 1, "the watcher's connection was not cut"
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    assert len(segs("reactive")) >= 2 and all(s["outcome"] == "continue" for s in segs("reactive"))
    for a, b in zip(segs("reactive"), segs("reactive")[1:]):
        assert b["submit"] >= a["end"] - 1
    # nothing submitted twice: Slurm knows exactly one job per segment
    names = ",".join(f"cr.{sc.chain}.{i}" for i in range(len(segs("reactive")) + 2))
    acct = subprocess.run(["sacct", "-a", "-X", "-n", "-P", "--format", "JobName", "--name", names,
                           "--starttime", "now-1hours"], capture_output=True, text=True).stdout.split()
    assert sorted(acct) == sorted(set(acct)) and len(acct) == len(segs("reactive")), acct
    assert_continuous_and_exclusive(sc)
    err = run["stderr"]
    assert "warning: flaky:" in err and "Traceback" not in err, err[-3000:]


def test_dependency_with_remote_script_in_place(run):
    sc = SCENARIOS["dependency"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    assert sc.result["script"] == str(TOY_DIR / "toy_train.sh")
    for a, b in zip(segs("dependency"), segs("dependency")[1:]):
        if b["outcome"] != "cancelled":
            assert b["submit"] < a["end"], "dependency policy should pre-queue the successor"
    assert_continuous_and_exclusive(sc)


def test_lead_successor_starts_when_predecessor_ends(run):
    sc = SCENARIOS["lead"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    ran = [s for s in segs("lead") if s["start"] is not None]
    assert len(ran) >= 2
    for a, b in zip(ran, ran[1:]):
        assert b["submit"] < a["end"]
        gap = b["start"] - a["end"]
        # queued behind its predecessor on n3, it starts right after it, unless another job took n3 meanwhile
        assert gap >= 0 and (gap <= 20 or other_jobs("n3", a["end"], b["start"], sc.chain)), f"gap {gap}s"
    assert_continuous_and_exclusive(sc)


def test_handoff_over_ssh(run):
    sc = SCENARIOS["handoff"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    assert "handoff" in [s["outcome"] for s in segs("handoff")]
    assert all(s["overlap_s"] < 60 for s in segs("handoff")[1:] if s["overlap_s"] > 0)
    assert_continuous_and_exclusive(sc)
    assert "handed off" in run["log"]


def test_predicted_policy_over_ssh_records_predictions(run):
    sc = SCENARIOS["predicted"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    later = segs("predicted")[1:]
    assert later and all(s["predicted_wait_s"] is not None and s["predicted_model"] for s in later), later
    assert_continuous_and_exclusive(sc)


def test_crash_fails_after_retries_and_cancels_successor(run):
    sc = SCENARIOS["crash"]
    assert sc.result["status"] == "FAILED" and "no retries left" in sc.result["reason"]
    assert [s["outcome"] for s in segs("crash")].count("crash") == 2
    assert segs("crash")[-1]["outcome"] == "cancelled", [s["outcome"] for s in segs("crash")]  # the pre-queued successor


def test_nasty_names_and_paths_pass_literally(run):
    for name in ("literal-upload", "literal-remote", "literal-openssh"):
        sc = SCENARIOS[name]
        assert sc.result["status"] == "COMPLETED", (name, sc.result["reason"])
        assert sc.result["name"] == NASTY
        ran = Path(sc.result["checkpoint_dir"], "ran").read_text()
        assert ran == f"ran as {sc.result['script']}\n"  # the payload ran from its literal path
    for name in ("literal-upload", "literal-openssh"):  # SFTP, and `cat >` over the system ssh
        uploaded = Path(SCENARIOS[name].result["script"])
        assert uploaded.name == Path(run["local_script"]).name and uploaded.read_text() == LITERAL_SCRIPT
    assert SCENARIOS["literal-remote"].result["script"] == str(run["remote_script"])
    # wherever an injected command would have run: the remote home (sshd and the jobs), our cwd, /tmp
    leaked = [p for d in (Path("/tmp"), REMOTE_HOME, run["work"], Path.cwd()) for p in d.glob(f"{MARK_NAME}*")]
    assert not leaked, f"a command hidden in a name ran: {leaked}"


def test_local_chain_in_the_same_loop(run):
    sc = SCENARIOS["local"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    assert sc.result["cluster"] == "local" and not sc.result["run_dir"].startswith(str(REMOTE_HOME))


def test_chain_over_the_openssh_transport(run):
    sc = SCENARIOS["openssh"]
    assert sc.result["status"] == "COMPLETED", sc.result["reason"]
    ran = [s for s in segs("openssh") if s["start"] is not None]
    assert len(ran) >= 2 and not any(s["outcome"] == "crash" for s in ran), ran  # several segments, none crashed
    assert_continuous_and_exclusive(sc)
    # every call went over one master in the test's short private folder
    socks = [p for p in run["control_dir"].iterdir() if p.is_socket()]
    assert len(socks) == 1 and oct(run["control_dir"].stat().st_mode & 0o777) == "0o700"
