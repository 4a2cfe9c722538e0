"""What a user sees, on the real local Slurm: the three trainer templates as real chains, driven
by one real `chainrun watch` in its live view inside tmux (send-keys, capture-pane), with
notifications to a local webhook and a fake sendmail, and the timeline of a real chain.

One watcher drives all chains at once (like tests/chain/test_chain_slurm.py): each template
chain is two or more 2-minute segments (`--total 3m` of training, the signal 50 s before the
limit, up to a minute early); the torch
models are tiny and train on a CPU with a short sleep per step. The segment-0 checkpoint
must come from the real signal and segment 1 must resume from exactly that step. After the
chain, one more local run of each trainer resumes from the last checkpoint and says done.

Beside them, under the same watcher, one more chain per template has every save take 20 s
(SAVE_SECONDS: a big model); once a save is under way past a complete checkpoint, every process of
the job that saves is SIGKILLed (as when a node dies mid-save): the next segment must resume from
the previous, complete checkpoint, and the chain must finish.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.ux.notifyhelpers import fake_sendmail, mails, webhook_server

pytestmark = pytest.mark.slurm

PY = sys.executable
NODES = "--exclude=n1,n2"  # n1/n2 are pinned by other tests
TEMPLATES = {"pytorch": "reactive", "lightning": "dependency", "hf": "dependency"}  # reactive: a real gap
WATCH_TIMEOUT_S = 600
# where a save writes before the marker makes it complete (the job id ends the folder's name), and
# the file each template's save writes last
STAGED = {"pytorch": ".tmp-step-*/state.pt", "lightning": ".tmp-step-*/model.ckpt",
          "hf": ".tmp-hf*/checkpoint-*/trainer_state.json"}


@dataclass
class SaveKill:
    name: str
    chain: str = ""
    ckpt: Path = Path()
    killed_job: str = ""
    killed_at: float = 0.0
    complete_step: int = -1  # the newest complete checkpoint when the save was killed
    staged_step: int = -1  # the step of the save that was killed
    result: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


def _newest_marker_step(ckpt: Path) -> int | None:
    steps = []
    for m in ckpt.glob("latest*.json"):
        try:
            steps.append(json.loads(m.read_text())["step"])
        except (OSError, ValueError, KeyError):
            pass
    return max(steps, default=None)


def _kill_job_processes(job: str) -> int:
    """SIGKILL every process of a Slurm job on this host (found by SLURM_JOB_ID in its environment):
    the wrapper and the trainer die at once, as when a node fails; nothing is released or saved."""
    killed = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"SLURM_JOB_ID={job}\0".encode() in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):
            pass
    return killed


def _kill_mid_save(k: SaveKill) -> None:
    """Once a save is under way past a complete checkpoint, kill the job that writes it."""
    if k.killed_job:
        return
    complete = _newest_marker_step(k.ckpt)
    for f in k.ckpt.glob(STAGED[k.name]):
        staging = next(p for p in f.parents if p.name.startswith(".tmp-"))
        step = int(re.search(r"(?:step|checkpoint)-(\d+)", f.parent.name).group(1))  # step-000000040, checkpoint-40
        if complete is not None and step > complete and _kill_job_processes(staging.name.rsplit(".", 1)[1]):
            k.killed_job, k.killed_at = staging.name.rsplit(".", 1)[1], time.time()
            k.complete_step, k.staged_step = complete, step
            return


@dataclass
class Run:
    name: str
    policy: str
    chain: str = ""
    result: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


def _tmux(sock: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-u", "-L", sock, "-f", "/dev/null", *args], capture_output=True, text=True,
                          check=check, timeout=30, env={**os.environ, "LANG": "C.UTF-8"})


def _screen(sock: str) -> str:
    return _tmux(sock, "capture-pane", "-p", "-t", "ux", check=False).stdout


@pytest.fixture(scope="module")
def ux(slurm_cluster, tmp_path_factory):
    if not shutil.which("tmux"):
        pytest.fail("tmux is needed (scripts/test.sh installs it: apt-get install -y tmux)")
    pytest.importorskip("torch")
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    home = tmp_path_factory.mktemp("ux-home")
    bin_dir = tmp_path_factory.mktemp("ux-bin")
    mail_log = fake_sendmail(bin_dir)
    # defaults from config.toml (beside another engineer's [clusters] table, which must be left alone)
    runs = {name: Run(name, policy) for name, policy in TEMPLATES.items()}
    for r in runs.values():
        work = tmp_path_factory.mktemp(f"ux-{r.name}")
        p = run_cli("submit", str(REPO / "templates" / r.name / "train.sh"), "--name", f"ux-{r.name}",
                    "--total", "3m", "--signal", "USR2@50", "--policy", r.policy, "--json", "--", NODES,
                    "--mem=500M", f"--export=ALL,PYTHON={PY},STEP_SECONDS=0.05,SAVE_EVERY=200,HF_HUB_OFFLINE=1",
                    home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        r.chain = json.loads(p.stdout)["data"]["chain"]
    kills = {name: SaveKill(name) for name in TEMPLATES}
    for k in kills.values():  # 4-minute segments: the first save under way comes before Slurm's signal
        work = tmp_path_factory.mktemp(f"ux-kill-{k.name}")
        p = run_cli("submit", str(REPO / "templates" / k.name / "train.sh"), "--name", f"uxkill-{k.name}",
                    "--total", "10m", "--segment", "4m", "--signal", "USR2@50", "--policy", "dependency",
                    "--retries", "2", "--json", "--", "--partition=long", NODES, "--mem=500M",
                    f"--export=ALL,PYTHON={PY},STEP_SECONDS=0.05,SAVE_EVERY=20,SAVE_SECONDS=20,MAX_STEPS=60,"
                    "HF_HUB_OFFLINE=1", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        k.chain = json.loads(p.stdout)["data"]["chain"]
        k.ckpt = work / "chainrun-runs" / k.chain / "checkpoint"
    sock = f"chainrun-ux-{os.getpid()}"
    screens: list[str] = []
    with webhook_server() as (url, hooks):
        # the webhook has a name in config.toml: a URL on the command line would show in `ps`
        (home / "config.toml").write_text('[notify]\non = ["completed", "failed", "gap"]\ngap = "5s"\n\n'
                                          f'[notifiers]\nops-hook = "{url}"\n')
        try:
            _tmux(sock, "new-session", "-d", "-s", "ux", "-x", "160", "-y", "48", "bash --norc --noprofile")
            q = shlex.quote
            path = f"{bin_dir}:{os.environ['PATH']}"  # the fake sendmail first
            cmd = (f"env CHAINRUN_HOME={q(str(home))} PATH={q(path)} LANG=C.UTF-8 {q(PY)} -m chainrun.cli.main "
                   f"watch --interval 3 --until-done --notify ops-hook --notify ops@example.org; echo WATCH-EXIT=$?")
            _tmux(sock, "send-keys", "-t", "ux", cmd, "Enter")
            running_seen = None
            deadline = time.time() + WATCH_TIMEOUT_S
            while time.time() < deadline:
                time.sleep(2)
                for k in kills.values():
                    _kill_mid_save(k)
                s = _screen(sock)
                if running_seen is None and "running" in s and all(r.chain in s for r in runs.values()):
                    running_seen = s
                if re.search(r"^WATCH-EXIT=\d+", s, re.M):  # the typed command line shows "=$?"
                    break
            final = _screen(sock)
            screens += [running_seen or "", final]
            (home / "screens.txt").write_text(f"{running_seen}\n=====\n{final}")  # for a failing run
        finally:
            _tmux(sock, "kill-server", check=False)
            for r in [*runs.values(), *kills.values()]:  # nothing of ours left queued if the watcher did not finish
                run_cli("cancel", r.chain, home=home)
        received = list(hooks)
    for r in runs.values():
        st = run_cli("status", r.chain, "--json", home=home)
        assert st.returncode == 0, st.stderr
        r.result = json.loads(st.stdout)["data"][0]
        log = Path(r.result["checkpoint_dir"]) / "progress.log"
        r.log = log.read_text().splitlines() if log.exists() else []
    for k in kills.values():
        st = run_cli("status", k.chain, "--json", home=home)
        assert st.returncode == 0, st.stderr
        k.result = json.loads(st.stdout)["data"][0]
        log = k.ckpt / "progress.log"
        k.log = log.read_text().splitlines() if log.exists() else []
    # after the chain: one more run of each trainer resumes from the last checkpoint and finishes
    finishers = {}
    for r in runs.values():
        last = max([int(m.group(1)) for line in r.log if (m := re.search(r"saved step (\d+) on", line))], default=0)
        env = {**os.environ, "CHAINRUN_CHECKPOINT_DIR": r.result["checkpoint_dir"], "CHAINRUN_SEGMENT": "local",
               "MAX_STEPS": str(last + 5), "HF_HUB_OFFLINE": "1", "CHAINRUN_SIGNAL": "USR2"}
        env.pop("CHAINRUN_DONE_FILE", None)
        finishers[r.name] = subprocess.Popen([PY, str(REPO / "templates" / r.name / "train.py")], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finished = {name: (p.communicate(timeout=180)[0], p.returncode) for name, p in finishers.items()}
    return {"home": home, "runs": runs, "kills": kills, "screens": screens, "hooks": received, "mails": mails(mail_log),
            "finished": finished}


def _step(lines: list[str], pattern: str) -> int | None:
    for line in lines:
        if m := re.search(pattern, line):
            return int(m.group(1))
    return None


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_checkpoints_on_signal_and_resumes(ux, name):
    r = ux["runs"][name]
    assert r.result["status"] == "COMPLETED", (r.result["reason"], ux["screens"][-1])
    segs = r.result["segments_detail"]
    ran = [s for s in segs if s["start"] is not None]
    # --total counts training: two or three segments, depending on how early Slurm's signal came
    assert len(ran) >= 2 and all(s["outcome"] == "continue" for s in ran), segs
    seg0 = [ln for ln in r.log if " segment 0 " in ln]
    seg1 = [ln for ln in r.log if " segment 1 " in ln]
    saved = _step(seg0, r"saved step (\d+) on SIGUSR2")
    assert saved and saved > 0, f"segment 0 did not checkpoint on the signal: {r.log}"
    assert _step(seg1, r"resumed from step (\d+)") == saved, r.log
    assert _step(seg1, r"saved step (\d+) on SIG(?:USR2|TERM)") > saved, r.log


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_resumes_after_the_chain_and_says_done(ux, name):
    out, rc = ux["finished"][name]
    r = ux["runs"][name]
    assert rc == 0, out[-2000:]
    ckpt = Path(r.result["checkpoint_dir"])
    assert (ckpt / "CHAINRUN_DONE").exists(), out[-2000:]
    log = (ckpt / "progress.log").read_text()
    last = max(int(s) for s in re.findall(r"saved step (\d+) on", log))
    assert f"segment local resumed from step {last}" in log and f"finished at step {last + 5}" in log


def test_watch_in_tmux_shows_running_chains_with_progress(ux):
    running, final = ux["screens"]
    assert running, f"never saw the running chains on screen; last screen:\n{final}"
    for r in ux["runs"].values():
        assert r.chain in running
    assert re.search(r"[█░]{4,}\s+\d+%", running), running  # the progress bars
    assert "Ctrl-C to stop" in running and "chains" in running
    assert re.search(r"^WATCH-EXIT=0$", final, re.M), final
    assert final.count("completed") >= len(ux["runs"]), final
    assert "notified ops@example.org: completed" in final, final  # the live view's notifier hook


def test_live_watch_notifies_webhook_and_mail(ux):
    texts = [h["text"] for h in ux["hooks"]]
    for r in ux["runs"].values():
        done = [t for t in texts if f"chain {r.chain} completed" in t]
        assert len(done) == 1, texts
        assert sum(f"Subject: chainrun: {r.chain} completed" in m for m in ux["mails"]) == 1, ux["mails"]
    gap = ux["runs"]["pytorch"].result["segments_detail"][1]
    if (gap.get("gap_s") or 0) >= 5:  # reactive: the successor is submitted only after the end
        assert any(r"chain " + ux["runs"]["pytorch"].chain in t and ("not trained" in t or "interruption" in t)
                   for t in texts), texts


def test_report_of_a_real_chain_has_segments_and_gaps(ux, tmp_path):
    r = ux["runs"]["pytorch"]
    png, page = tmp_path / "timeline.png", tmp_path / "timeline.html"
    p = run_cli("report", r.chain, "--png", str(png), "--html", str(page), "--json", home=ux["home"])
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["data"]
    ran = [s for s in r.result["segments_detail"] if s["start"] is not None]
    assert d["segments_ran"] == len(ran) >= 2 and d["gaps"] >= 1 and d["interruption_s"] > 0
    meta = d["files"]["png"]
    assert meta["bars"] == len(ran) and meta["gaps"] >= 1 and meta["waits"] >= 1
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (meta["width"], meta["height"]) and 600 <= w <= 2000 and 150 <= h <= 1200
    html = page.read_text()
    assert html.count('class="segment ') == len(ran) and 'class="gap"' in html
    if os.environ.get("CHAINRUN_UX_KEEP_PNG"):  # keep the picture of this run to look at
        shutil.copyfile(png, os.environ["CHAINRUN_UX_KEEP_PNG"])


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_save_killed_mid_write_resumes_from_the_previous_checkpoint(ux, name):
    k = ux["kills"][name]
    assert k.killed_job, f"no save was seen under way past a complete checkpoint: {k.log}"
    assert k.staged_step > k.complete_step >= 0
    after = [ln for ln in k.log if float(ln.split()[0]) > k.killed_at]
    assert _step(after, r"resumed from step (\d+)") == k.complete_step, (k.complete_step, k.staged_step, k.log)
    assert k.result["status"] == "COMPLETED", (k.result["reason"], k.log)
    assert (k.ckpt / "CHAINRUN_DONE").exists() and any("finished at step 60" in ln for ln in k.log), k.log
