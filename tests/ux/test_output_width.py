"""Readable wherever users read it: `status`, `report`, `cluster list` and `watch --plain` at 80
and 200 columns, on a real terminal (a pty) and piped, for chains with long notes, many segments
and several clusters.

Every chain and job id must appear whole and no line may be wider than the width, whatever the
form: a table on a terminal (it degrades in a stated order), key=value lines off it. The chains
are written straight into a real SQLite store; the real CLI runs in a subprocess. No Slurm.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from rich.cells import cell_len

from chainrun.state.records import Chain, Segment
from chainrun.state.store import Store
from tests.conftest import REPO

T0 = 1_700_000_000.0
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")

LONG_NOTE = ("segment 7 (job 4815162349) crashed twice in a row: payload exit code 137 after the node ran out of "
             "memory while loading the dataloader workers; the checkpoint at step 120000 is intact, fix the "
             "memory request (--mem) and resubmit with chainrun submit --checkpoint-dir pointing at it")
CLUSTERS = {"gpu-cluster-west-datacenter-01": "login-node-01.gpu-cluster-west.example-university.edu",
            "hpc2": "hpc2.example.org"}
CHAINS = {  # id: (cluster, status, segments)
    "imagenet-resnet152-finetune-long-name-4f2a": ("local", "FAILED", 9),
    "bert-large-pretrain-9c1d": ("gpu-cluster-west-datacenter-01", "ACTIVE", 40),
    "tiny-0a0b": ("hpc2", "COMPLETED", 2),
}


def job_ids(chain_id: str) -> list[str]:
    base = {"imagenet": 4815162342, "bert": 91827364, "tiny": 7}.get(chain_id.split("-")[0], 5550000)
    return [str(base + i) for i in range(CHAINS.get(chain_id, ("", "", 3))[2])]


def _populate(home: Path, chains: dict = CHAINS) -> None:
    home.mkdir(parents=True, exist_ok=True)
    store = Store(home / "state.sqlite")
    try:
        for cid, (cluster, status, n) in chains.items():
            ch = Chain(id=cid, name=cid.rsplit("-", 1)[0], cluster=cluster, script="/x/train.sh", workdir="/x",
                       run_dir=f"/x/chainrun-runs/{cid}", checkpoint_dir=f"/scratch/someone/checkpoints/{cid}",
                       total_s=n * 3600, segment_s=3600, policy="predicted", lead_s=600, signal="USR2",
                       signal_lead_s=300, retries=1, sbatch_args=[], partition="gpu", created=T0)
            store.add_chain(ch)
            credited = 0
            for i, jid in enumerate(job_ids(cid)):
                last = i == n - 1
                start = T0 + i * 3700 + 60
                running = status == "ACTIVE" and last
                crash = status == "FAILED" and i >= n - 2
                seg = Segment(cid, i, phase="RUNNING" if running else "ENDED", job_id=jid,
                              slurm_state="RUNNING" if running else ("FAILED" if crash else "COMPLETED"),
                              outcome=None if running else ("crash" if crash else ("done" if last else "continue")),
                              reason=LONG_NOTE if crash else "", time_limit_s=3600, submit=start - 600,
                              eligible=start - 600, start=start, end=start + 3600, credit_s=0 if crash else 3540,
                              predicted_wait_s=400, predicted_model="lgbm-per-user", is_retry=crash and i == n - 1,
                              extra={"gap_s": 40.0} if i else {})
                credited += seg.credit_s
                store.save_segment(seg)
            ch.status, ch.credited_s = status, credited
            ch.reason = LONG_NOTE if status == "FAILED" else ("training finished" if status == "COMPLETED" else "")
            ch.finished = None if status == "ACTIVE" else T0 + n * 3700
            store.save_chain(ch)
    finally:
        store.close()


def _config(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    text = 'default = "hpc2"\n\n'
    for name, host in CLUSTERS.items():
        text += (f'[clusters.{name}]\nhost = "{host}"\nuser = "someone-with-a-long-login"\nport = 2222\n'
                 f'proxy_jump = "bastion.example-university.edu,jump2.example.org"\nlogin_shell = true\n\n')
    (home / "config.toml").write_text(text)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("width") / "home"
    _populate(h)
    _config(h)
    return h


def _env(home: Path, cols: int | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    # a known terminal type, whatever the CI runner's TERM (some set dumb)
    env.update({"CHAINRUN_HOME": str(home), "LANG": "C.UTF-8", "TERM": "xterm-256color", **extra})
    if cols is not None:
        env["COLUMNS"] = str(cols)
    return env


def piped(home: Path, cols: int | None, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chainrun.cli.main", *args], env=_env(home, cols, **extra),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=REPO)


def on_tty(home: Path, cols: int, *args: str, **extra: str) -> tuple[int, str]:
    """The real CLI on a pseudo-terminal of ``cols`` columns (COLUMNS says the same)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "chainrun.cli.main", *args], env=_env(home, cols, **extra),
                         stdin=slave, stdout=slave, stderr=slave, close_fds=True, cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def run(home: Path, mode: str, *args: str, **extra: str) -> tuple[str, int]:
    """(output without escapes, the width it must fit)."""
    kind, _, cols = mode.partition("-")
    width = int(cols) if cols != "default" else 80
    if kind == "tty":
        rc, out = on_tty(home, width, *args, **extra)
        assert rc == 0, out
        return ANSI.sub("", out), width
    p = piped(home, None if cols == "default" else width, *args, **extra)
    assert p.returncode == 0, p.stderr
    assert "\x1b[" not in p.stdout, "escape sequences in piped output"
    return p.stdout + p.stderr, width


def assert_fits(out: str, width: int) -> None:
    wide = [ln for ln in out.splitlines() if cell_len(ln) > width]
    assert not wide, f"{len(wide)} line(s) wider than {width}:\n" + "\n".join(wide) + "\n---\n" + out


def assert_whole(out: str, words: list[str]) -> None:
    for w in words:
        assert re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", out), f"{w!r} is not whole in:\n{out}"


MODES = ["tty-80", "tty-200", "pipe-80", "pipe-200", "pipe-default"]


@pytest.mark.parametrize("mode", MODES)
def test_status_overview(home, mode):
    out, width = run(home, mode, "status")
    assert_fits(out, width)
    assert_whole(out, list(CHAINS))
    if mode != "tty-80":  # a narrow terminal may drop the cluster column (last in the stated order)
        assert_whole(out, [c for c, _, _ in CHAINS.values()])
    assert "payload exit code 137" in " ".join(out.split())  # the failure note survives, below the table if need be
    if mode.startswith("pipe"):  # one record per chain, its id first: greppable
        for cid, (cluster, status, _) in CHAINS.items():
            assert re.search(rf"^{re.escape(cid)}  {status.lower()}  cluster={re.escape(cluster)}", out, re.M), out
    # no column shrank to nothing: the note is not wrapped a few characters a line
    assert len(out.splitlines()) < 40, out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chain", list(CHAINS))
def test_status_detail(home, mode, chain):
    out, width = run(home, mode, "status", chain)
    assert_fits(out, width)
    assert_whole(out, [chain, *job_ids(chain)])
    if mode.startswith("pipe"):
        for jid in job_ids(chain):  # one record per segment
            assert re.search(rf"^seg=\d+(\(retry\))?  job={jid}  state=", out, re.M), out


@pytest.mark.parametrize("mode", MODES)
def test_report_overview(home, mode):
    out, width = run(home, mode, "report")
    assert_fits(out, width)
    assert_whole(out, list(CHAINS))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chain", list(CHAINS))
def test_report_detail(home, mode, chain):
    out, width = run(home, mode, "report", chain)
    assert_fits(out, width)
    assert_whole(out, [chain, CHAINS[chain][0]])


@pytest.mark.parametrize("mode", MODES)
def test_cluster_list(home, mode):
    out, width = run(home, mode, "cluster", "list")
    assert_fits(out, width)
    assert_whole(out, ["local", *CLUSTERS, *CLUSTERS.values()])
    assert re.search(r"^\* hpc2 ", out, re.M), out


@pytest.mark.parametrize("mode", ["pipe-80", "pipe-200", "pipe-default"])
def test_watch_plain_once_warnings(tmp_path, mode):
    """Chains on clusters missing from the configuration: the tick warns about each, on stderr, once
    (the log handler's unwrapped `chainrun: WARNING:` copy of the same line went to the log file only)."""
    home = tmp_path / "home"
    _populate(home, {"bert-large-pretrain-9c1d": CHAINS["bert-large-pretrain-9c1d"],
                     "another-active-chain-with-a-long-name-77aa": ("hpc2-removed-from-config-long-name", "ACTIVE", 3)})
    cols = mode.partition("-")[2]
    width = int(cols) if cols != "default" else 80
    p = piped(home, None if cols == "default" else width, "watch", "--once", "--plain")
    # no cluster's tick worked: cron must see it; the first cluster's failure (not in the config) gives the code
    assert p.returncode == 3, p.stderr
    out = p.stdout + p.stderr
    [err] = [ln for ln in out.splitlines() if ln.startswith("chainrun: error: ")]  # one line, never wrapped
    assert err.startswith("chainrun: error: the tick failed on every cluster (gpu-cluster-west-datacenter-01: "), err
    # "chainrun: WARNING: ..." lines are the log handler's (logsetup.py), not the watch output
    assert_fits("\n".join(ln for ln in out.splitlines() if not ln.startswith("chainrun: ")), width)
    assert_whole(out, ["gpu-cluster-west-datacenter-01", "hpc2-removed-from-config-long-name"])
    assert "warning" in out
    assert "chainrun: WARNING" not in out, out
    warned = [ln.split(" warning: ", 1)[1].split(":")[0] for ln in out.splitlines() if " warning: " in ln]
    assert sorted(warned) == ["gpu-cluster-west-datacenter-01", "hpc2-removed-from-config-long-name"], out


@pytest.mark.parametrize("cols", [80, 200])
def test_watch_plain_events_wrap_but_keep_ids(chainrun_home, cols, monkeypatch, capsys):
    """The plain loop's event lines, with events as long as a crash reason, fit the width."""
    from chainrun.chain.engine import TickReport
    from chainrun.cli.chain_cmd import _plain_watch

    monkeypatch.setenv("COLUMNS", str(cols))
    _populate(chainrun_home, {k: CHAINS[k] for k in list(CHAINS)[:1]})
    store = Store(chainrun_home / "state.sqlite")
    cid = list(CHAINS)[0]

    class Engine:  # writes what a real tick would: events with long messages
        def __init__(self):
            self.store = store

        def tick(self):
            store.add_event(cid, 7, "crash", f"segment 7 (job {job_ids(cid)[7]}): {LONG_NOTE}")
            store.add_event(cid, 8, "retry", f"segment 8 submitted as job {job_ids(cid)[8]}")
            return TickReport(chains=1, warnings=[f"{cid}: sacct answered late for job {job_ids(cid)[7]}; " * 3])

    try:
        _plain_watch(store, Engine(), interval=1, once=True, until_done=False, json_out=False)
    finally:
        store.close()
    got = capsys.readouterr()
    out = got.out + got.err
    assert_fits(out, cols)
    assert_whole(out, [cid, job_ids(cid)[7], job_ids(cid)[8]])
    assert re.search(rf"^\d\d:\d\d:\d\d {re.escape(cid)} crash: ", got.out, re.M), got.out


def test_no_colour_with_no_color_and_nothing_on_a_dumb_terminal(home):
    rc, out = on_tty(home, 200, "status")
    assert rc == 0 and COLOUR.search(out), "a terminal gets colour"
    rc, out = on_tty(home, 200, "status", NO_COLOR="1")
    assert rc == 0 and not COLOUR.search(out), out
    rc, out = on_tty(home, 200, "status", TERM="dumb")
    assert rc == 0 and "\x1b[" not in out, out
    assert_whole(out, list(CHAINS))


def test_plain_flag_on_a_terminal_prints_lines(home):
    rc, out = on_tty(home, 120, "status", "--plain")
    assert rc == 0 and "\x1b[" not in out and "┃" not in out
    for cid in CHAINS:
        assert re.search(rf"^{re.escape(cid)}  ", out, re.M), out


# ---------------------------------------------------------------- in-process renderers
def _view(chain_id: str, home: Path):
    from chainrun.chain.summary import view_chain

    store = Store(home / "state.sqlite")
    try:
        return view_chain(store.chain(chain_id), store.segments(chain_id))
    finally:
        store.close()


def test_payload_overlap_is_loud_everywhere(chainrun_home):
    """Once the engine records payload_overlaps (and trained_s), every view says so in red."""
    from dataclasses import replace

    from rich.console import Console

    from chainrun.cli import tables

    _populate(chainrun_home)
    cid = "bert-large-pretrain-9c1d"
    v = replace(_view(cid, chainrun_home), trained_s=7200.0, allocated_s=9000.0,
                payload_overlaps=[{"jobs": ["91827364", "91827365"], "seconds": 42.0}])
    msg = "ERROR: two copies trained at once: jobs 91827364 and 91827365 for 42 s"
    for width in (80, 200):
        con = Console(file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor")
        con.print(tables.chain_list([v]))
        con.print(tables.chain_detail(v))
        raw = con.file.getvalue()
        text = ANSI.sub("", raw)
        assert text.count(msg) == 2 or (text.replace("\n", " ").count("two copies trained at once") == 2), text
        assert "\x1b[1;31m" in raw  # bold red
        assert "2h00m" in text  # trained_s, not the credited time
        assert_fits(text, width)
        lines = "\n".join(tables.chain_lines([v], width) + tables.detail_lines(v, width))
        assert lines.count("two copies trained at once") == 2 and "trained=2h00m/" in lines
        assert "allocated=2h30m" in lines
        assert_fits(lines, width)


# ---------------------------------------------------------------- the live view's loop
class FlakyEngine:
    """Ticks like an engine; the second tick raises, as a Slurm outage or a bug in one tick would."""

    def __init__(self, store):
        self.store = store
        self.ticks = 0

    def tick(self):
        from chainrun.chain.engine import TickReport

        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("squeue: slurm_load_jobs error: Unable to contact slurm controller")
        return TickReport(chains=len(self.store.chains(active_only=True)))


def test_live_view_survives_a_failing_tick_with_backoff(chainrun_home):
    from rich.console import Console

    from chainrun.cli.live import live_watch

    _populate(chainrun_home)
    store = Store(chainrun_home / "state.sqlite")
    engine = FlakyEngine(store)
    slept: list[float] = []
    con = Console(file=io.StringIO(), width=100, force_terminal=True)
    try:
        live_watch(engine, interval=10, until_done=False, console=con, sleep=slept.append, max_ticks=4)
    finally:
        store.close()
    out = ANSI.sub("", con.file.getvalue())
    assert engine.ticks == 4  # the failing tick did not end the live view
    assert slept == [10, 10, 10], slept  # after a failure: interval x backoff(1 failure) = interval, then reset
    assert "tick failed (RuntimeError: squeue: slurm_load_jobs error" in out.replace("\n", " ") or \
        "tick failed (RuntimeError" in out, out
    assert_whole(out, list(CHAINS))


def test_live_view_backs_off_while_ticks_keep_failing(chainrun_home):
    from rich.console import Console

    from chainrun.cli.live import live_watch

    _populate(chainrun_home, {"tiny-0a0b": CHAINS["tiny-0a0b"]})
    store = Store(chainrun_home / "state.sqlite")

    class Down(FlakyEngine):
        def tick(self):
            self.ticks += 1
            raise OSError("controller down")

    slept: list[float] = []
    con = Console(file=io.StringIO(), width=80, force_terminal=True)
    try:
        live_watch(Down(store), interval=10, until_done=True, console=con, sleep=slept.append, max_ticks=4)
    finally:
        store.close()
    assert slept == [10, 20, 40], slept  # capped exponential backoff, as in `watch --plain`
    assert "failed tick(s) in a row" in ANSI.sub("", con.file.getvalue()).replace("\n", " ")


def test_payload_overlap_recorded_by_the_engine_is_shown_by_every_command(chainrun_home):
    """The engine records an overlap on the segment (extra.payload_overlaps): status, status
    CHAIN and report CHAIN all say it, on a terminal and piped; report --json carries it."""
    import json

    _populate(chainrun_home, {"tiny-0a0b": CHAINS["tiny-0a0b"]})
    store = Store(chainrun_home / "state.sqlite")
    try:
        seg = store.segments("tiny-0a0b")[1]
        seg.extra["payload_overlaps"] = [{"jobs": ["7", "8"], "seconds": 12.4}]
        store.save_segment(seg)
    finally:
        store.close()
    msg = "ERROR: two copies trained at once: jobs 7 and 8 for 12 s"
    for args in (["status"], ["status", "tiny-0a0b"], ["report", "tiny-0a0b"]):
        out, width = run(chainrun_home, "pipe-80", *args)
        assert msg in out, (args, out)
        rc, raw = on_tty(chainrun_home, 80, *args)
        assert rc == 0 and msg in " ".join(ANSI.sub("", raw).split()), (args, raw)
        assert re.search(r"\x1b\[[0-9;]*31m", raw), "in red"
    p = piped(chainrun_home, 80, "report", "tiny-0a0b", "--json")
    assert json.loads(p.stdout)["data"]["payload_overlaps"] == [{"jobs": ["7", "8"], "seconds": 12.4}]
