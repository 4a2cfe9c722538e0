"""The wrapper's ownership protocol, run for real in bash without Slurm (fast).

Several copies of the generated wrapper run side by side as "jobs" of one chain; a tiny
``squeue`` on PATH answers from a folder (a job is running while its file exists). The
payload logs every step with its job id and time, so each test checks from the trainer's
own record that no two jobs ever trained at once. The same scenarios on real Slurm are in
tests/chain/test_handoff_slurm.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chainrun.chain.contract import parse_outcome, render_wrapper, token_text

PAYLOAD = r"""#!/bin/bash
# a trainer: one step every 0.2 s; on the signal it saves and exits unless told to ignore it
log=$CHAINRUN_CHECKPOINT_DIR/steps.log
stop=0
[[ ${IGNORE_SIGNAL:-0} == 1 ]] && trap '' USR2 || trap 'stop=1' USR2
trap 'stop=1' TERM
while ((!stop)); do
  echo "step $SLURM_JOB_ID $(date +%s.%N) ${CHAINRUN_GENERATION:-?} ${SLURM_RESTART_COUNT:-0}" >> "$log"
  sleep 0.2
done
[[ ${CRASH_ON_SAVE:-0} == 1 ]] && { echo "Traceback: cannot save" >&2; exit 1; }
# an asynchronous checkpoint writer that leaves the process group and outlives the trainer (with
# WRITER_ESCAPES=1 it also drops its environment: only the job's cgroup still tells it is the payload's)
# (a simple command, so no subshell of the payload's group stays behind waiting for it)
if [[ -n ${WRITER_SECONDS:-} ]]; then
  ${WRITER_ESCAPES:+env -i PATH=/usr/bin:/bin} setsid bash -c 'for ((i = 0; i < $1; i++)); do date +%s.%N >> "$2"; sleep 1; done' \
    _ "$WRITER_SECONDS" "$CHAINRUN_CHECKPOINT_DIR/writer.log" < /dev/null > /dev/null 2>&1 &
fi
echo "save $SLURM_JOB_ID $(date +%s.%N)" >> "$log"
"""

SQUEUE = """#!/bin/bash
# fake squeue: `squeue -h -t all -j ID -O JobID:|,State:|,RestartCnt:|` prints ID|RUNNING|<n>| while
# $FAKE_SQUEUE/ID exists (holding the restart count n, empty = 0); then, as for a purged job, an error
id=""; fmt=""; while (($#)); do [[ $1 == -j ]] && id=$2; [[ $1 == -O ]] && fmt=$2; shift; done
[[ -z $fmt ]] && exit 0  # the end-time query: no answer
echo "$id $(cat "$FAKE_SQUEUE/$id" 2>/dev/null || echo gone)" >> "$FAKE_SQUEUE/asked"  # what a waiter was told
if [[ -e $FAKE_SQUEUE/$id ]]; then
  echo "$id|RUNNING|$(cat "$FAKE_SQUEUE/$id" 2>/dev/null || true)|"
  exit 0
fi
echo "slurm_load_jobs error: Invalid job id specified" >&2
exit 1
"""


SCANCEL = """#!/bin/bash
# fake scancel: `scancel --batch --signal=SIG ID` signals the job's wrapper; `scancel ID` ends the job
id=${@: -1}; sig=""
for a in "$@"; do [[ $a == --signal=* ]] && sig=${a#--signal=}; done
if [[ -n $sig ]]; then kill -s "$sig" "$(cat "$FAKE_SQUEUE/$id.pid")"; else rm -f "$FAKE_SQUEUE/$id"; fi
"""


class Chain:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.run_dir = tmp / "run"
        self.ckpt = tmp / "ckpt"
        self.bin = tmp / "bin"
        self.queue = tmp / "queue"
        for d in (self.run_dir / "control", self.ckpt, self.bin, self.queue):
            d.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "control" / "token").write_text(token_text("c1"))  # as `submit` writes it
        (self.bin / "squeue").write_text(SQUEUE)
        (self.bin / "squeue").chmod(0o755)
        (self.bin / "scancel").write_text(SCANCEL)
        (self.bin / "scancel").chmod(0o755)
        payload = tmp / "train.sh"
        payload.write_text(PAYLOAD)
        payload.chmod(0o755)
        self.wrapper = self.run_dir / "wrapper.sh"
        self.wrapper.write_text(render_wrapper(chain_id="c1", run_dir=str(self.run_dir), checkpoint_dir=str(self.ckpt),
                                               payload=str(payload), signal="USR2", script_text="#!/bin/bash\n"))
        self.jobs: dict[str, subprocess.Popen] = {}

    def start(self, seg: int, job: str, cgroup: Path | None = None, args: tuple[str, ...] = (),
              **env: str) -> subprocess.Popen:
        """Run the wrapper as job ``job`` (``args``: the words after the segment index, e.g. ``gated race``);
        with ``cgroup``, inside that cgroup (as proctrack/cgroup puts a job)."""
        (self.queue / job).touch()
        full = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "FAKE_SQUEUE": str(self.queue),
                "SLURM_JOB_ID": job, **env}
        out = open(self.tmp / f"job-{job}.out", "w")
        enter = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
        p = subprocess.Popen(["bash", str(self.wrapper), str(seg), *args], env=full, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, preexec_fn=enter)
        (self.queue / f"{job}.pid").write_text(str(p.pid))
        self.jobs[job] = p
        return p

    def finish(self, job: str, timeout: float = 30) -> int:
        rc = self.jobs[job].wait(timeout)
        (self.queue / job).unlink(missing_ok=True)  # Slurm: the job has ended
        return rc

    def outcome(self, seg: int) -> dict:
        return parse_outcome((self.run_dir / "control" / f"seg-{seg}.outcome").read_text())

    def state(self, seg: int) -> dict:
        p = self.run_dir / "control" / f"seg-{seg}.state"
        return parse_outcome(p.read_text()) if p.exists() else {}

    def wait_for(self, cond, timeout: float = 20, what: str = "") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; logs:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(self.tmp.glob("job-*.out")))

    def steps(self) -> list[tuple[str, str, float]]:
        log = self.ckpt / "steps.log"
        text = log.read_text() if log.exists() else ""
        out = []
        # only whole lines (one may be being written), and only those with their time: a run killed while
        # `$(date ...)` ran wrote its line without it ("step JOB GEN RESTART", "save JOB")
        for ln in text.splitlines()[: text.count("\n")]:
            f = ln.split()
            if len(f) == {"step": 5, "save": 3}.get(f[0] if f else "", -1):
                out.append((f[0], f[1], float(f[2])))
        return out

    def training_windows(self) -> dict[str, tuple[float, float]]:
        w: dict[str, tuple[float, float]] = {}
        for _, job, t in self.steps():
            a, b = w.get(job, (t, t))
            w[job] = (min(a, t), max(b, t))
        return w

    def assert_never_two_at_once(self) -> None:
        items = sorted(self.training_windows().items(), key=lambda kv: kv[1][0])
        for (ja, (_, ea)), (jb, (sb, _)) in zip(items, items[1:]):
            assert sb >= ea, f"jobs {ja} and {jb} trained at the same time ({ea - sb:.2f}s)\n{self.logs()}"

    def asked(self, job: str, answer: str = "") -> int:
        """How often a waiting wrapper asked squeue about ``job`` (the fake's log), and was told it runs
        (``answer`` "": any answer, "gone": ended). Each ask is a decision point of the waiter: a negative
        check made after one ("it still does not train") tests the protocol, not the machine's speed."""
        log = self.queue / "asked"
        lines = log.read_text().splitlines() if log.exists() else []
        return sum(1 for ln in lines if ln.split()[0] == job and (not answer or (ln.split()[1:] == ["gone"]) == (answer == "gone")))

    def wait_asked(self, job: str, times: int = 1, after: int = 0) -> None:
        """Until a waiter has asked squeue about ``job`` ``times`` more times than ``after`` (and been
        told it still runs)."""
        self.wait_for(lambda: self.asked(job, "running") >= after + times, timeout=60,
                      what=f"a waiter to ask squeue about job {job} {times} time(s)")

    def training(self, job: str) -> bool:
        return any(j == job for _, j, _ in self.steps())

    def kill_all(self) -> None:
        for p in self.jobs.values():
            if p.poll() is None:
                p.kill()
        subprocess.run(["pkill", "-f", str(self.tmp / "train.sh")], check=False)


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path)
    yield c
    c.kill_all()


def test_signal_ignoring_predecessor_is_never_joined(chain):
    """The reported bug: a successor that gets its own early signal while waiting must end cleanly
    (not be counted as a crash), and the next one must wait for the segment that really trains."""
    chain.start(0, "100", IGNORE_SIGNAL="1")
    chain.wait_for(lambda: chain.training("100"), what="job 100 to train")
    s1 = chain.start(1, "101")
    chain.wait_for(lambda: chain.state(1).get("phase") == "waiting", what="job 101 to wait")
    s1.send_signal(signal.SIGUSR2)  # its own early --signal, while job 100 (ignoring the request) trains on
    assert chain.finish("101") == 0
    assert chain.outcome(1)["outcome"] == "unstarted" and chain.outcome(1)["stopped_by"] == "USR2"
    chain.start(2, "102")
    chain.wait_for(lambda: chain.state(2).get("phase") == "waiting", what="job 102 to wait")
    assert chain.state(2)["owner_job"] == "100"  # the segment that last held the chain, not segment 1
    chain.wait_asked("100", after=chain.asked("100", "running"))  # job 102 has checked on the owner: told it runs
    assert not chain.training("102")
    chain.jobs["100"].send_signal(signal.SIGTERM)  # the limit: TERM stops even a signal-ignoring trainer
    chain.finish("100")
    chain.wait_for(lambda: chain.training("102"), what="job 102 to take over")
    assert chain.outcome(0)["outcome"] in ("handoff", "continue")  # asked to hand off; stopped at its limit
    chain.jobs["102"].send_signal(signal.SIGUSR2)
    chain.finish("102")
    chain.assert_never_two_at_once()


def test_handoff_request_reaches_the_owner_and_one_successor_claims(chain):
    chain.start(0, "200")
    chain.wait_for(lambda: chain.training("200"), what="job 200 to train")
    chain.start(1, "201")
    chain.start(2, "202")  # a second successor (e.g. a stray copy): exactly one may take over
    chain.wait_for(lambda: chain.jobs["200"].poll() is not None, what="job 200 to hand off")
    chain.finish("200")
    assert chain.outcome(0)["outcome"] == "handoff" and chain.outcome(0)["cut"] == "0"
    chain.wait_for(lambda: chain.training("201") and chain.training("202"), what="both successors to train")
    # one claimed generation 1; the other waited for it, asked it to hand off and claimed generation 2
    owners = sorted(p.name for p in (chain.run_dir / "control").glob("owner.*"))
    assert owners == ["owner.0", "owner.1", "owner.2"]
    last = next(j for j in ("201", "202") if chain.jobs[j].poll() is None)
    chain.jobs[last].send_signal(signal.SIGUSR2)
    for job in ("201", "202"):
        chain.finish(job)
    chain.assert_never_two_at_once()


def test_silent_heartbeat_is_not_proof_that_the_owner_stopped(chain):
    chain.start(0, "300", IGNORE_SIGNAL="1")
    chain.wait_for(lambda: chain.training("300") and (chain.run_dir / "control/seg-0.monitor").exists(),
                   what="job 300 to train")
    monitor = int((chain.run_dir / "control/seg-0.monitor").read_text())
    os.kill(monitor, signal.SIGSTOP)  # the heartbeat stops; the payload trains on
    chain.start(1, "301")
    chain.wait_asked("300")  # it made its decision: the owner still runs, whatever the heartbeat says
    assert not chain.training("301")
    chain.jobs["300"].send_signal(signal.SIGTERM)
    chain.finish("300")  # must not hang on the stopped monitor
    chain.wait_for(lambda: chain.training("301"), what="job 301 to take over")
    chain.jobs["301"].send_signal(signal.SIGUSR2)
    chain.finish("301")
    chain.assert_never_two_at_once()


def test_owner_killed_without_release_is_taken_over_once_slurm_says_it_ended(chain):
    chain.start(0, "400")
    chain.wait_for(lambda: chain.training("400"), what="job 400 to train")
    _node_dies(chain)  # no outcome, no release
    chain.start(1, "401")
    chain.wait_asked("400")
    assert not chain.training("401")  # squeue still lists job 400
    (chain.queue / "400").unlink()  # now Slurm reports it ended
    chain.wait_for(lambda: chain.training("401"), timeout=20, what="job 401 to take over")
    chain.jobs["401"].send_signal(signal.SIGUSR2)
    chain.finish("401")
    chain.assert_never_two_at_once()


def test_checkpoint_crash_after_the_signal_is_its_own_outcome(chain):
    chain.start(0, "500", CRASH_ON_SAVE="1")
    chain.wait_for(lambda: chain.training("500"), what="job 500 to train")
    chain.jobs["500"].send_signal(signal.SIGUSR2)
    assert chain.finish("500") == 1
    out = chain.outcome(0)
    assert out["outcome"] == "checkpoint-crash" and out["signaled"] == "1"
    assert "Traceback" in (chain.run_dir / "control/seg-0.tail").read_text()
    assert (chain.run_dir / "control/released.0").exists()  # the next segment may take over


def test_done_chain_hands_nothing_to_a_successor(chain):
    (chain.ckpt / "CHAINRUN_DONE").write_text("done\n")
    chain.start(0, "600")
    assert chain.finish("600") == 0
    assert chain.outcome(0)["outcome"] == "skipped"
    assert not chain.steps()


# ---------------------------------------------------------------- adaptive hand-off (the watcher's rule)
def _rule(chain: Chain, seg: int, for_job: str, windows: list[tuple[int, int]], lead: int) -> None:
    """What the watcher writes before submitting segment ``seg`` (chainrun/chain/handoff_plan.py)."""
    from chainrun.chain.handoff_plan import rule_text

    (chain.run_dir / "control").mkdir(exist_ok=True)
    (chain.run_dir / "control" / f"handoff-rule.{seg}").write_text(rule_text(for_job, lead, windows, {}))


def _took_over_by_release(chain: Chain, job: str) -> bool:
    """The job took the chain on its predecessor's release (at once), not on a later check of Slurm nor
    after the fencing wait of a generation taken without a release."""
    log = (chain.tmp / f"job-{job}.out").read_text()
    return "Slurm reports" not in log and "taken without a release" not in log


def _first_step(chain: Chain, job: str) -> float:
    return min(t for _, j, t in chain.steps() if j == job)


def _last_step(chain: Chain, job: str) -> float:
    return max(t for _, j, t in chain.steps() if j == job)


def test_successor_within_the_rule_waits_and_the_owner_is_not_cut(chain):
    end = int(time.time()) + 9  # the owner's real end; with a 2 s signal lead it hands over 7 s from now
    _rule(chain, 1, "700", [(0, 30)], lead=2)
    chain.start(0, "700", SLURM_JOB_END_TIME=str(end))
    chain.wait_for(lambda: chain.training("700"), what="job 700 to train")
    chain.start(1, "701")
    chain.wait_for(lambda: chain.state(1).get("phase") == "waiting", what="job 701 to wait")
    st = chain.state(1)
    assert st["mode"] == "wait" and int(st["handover_at"]) == end - 2, st
    started = time.time()
    chain.wait_asked("700")  # job 701 checked on its owner while waiting by the rule
    chain.wait_for(lambda: _last_step(chain, "700") > started, what="the owner to train on")
    assert not (chain.run_dir / "control/handoff.0").exists()  # no hand-off request: the owner is not cut
    assert not chain.training("701")
    time.sleep(max(0.0, end - 2 - time.time()))
    chain.jobs["700"].send_signal(signal.SIGUSR2)  # Slurm's --signal at the hand-over point
    chain.finish("700")
    chain.wait_for(lambda: chain.training("701"), what="job 701 to take over")
    assert chain.outcome(0)["outcome"] == "continue" and chain.outcome(0)["signaled"] == "1"
    assert _first_step(chain, "701") > _last_step(chain, "700")
    assert _took_over_by_release(chain, "701")  # at once: on the release, not on a later check of Slurm
    chain.jobs["701"].send_signal(signal.SIGUSR2)
    chain.finish("701")
    out = chain.outcome(1)
    assert out["outcome"] == "continue" and out["handoff_mode"] == "wait" and int(out["handoff_wait"]) >= 4, out
    chain.assert_never_two_at_once()


@pytest.mark.parametrize("case", ["beyond", "other-owner", "turned-off"])
def test_successor_outside_the_rule_cuts_as_before(chain, case):
    end = int(time.time()) + 60
    # beyond: the hand-over point is ~58 s away, the rule waits at most 3 s; other-owner: a rule made
    # for another predecessor job does not apply; turned-off: CHAINRUN_ADAPTIVE_HANDOFF=0 in the job
    _rule(chain, 1, "999" if case == "other-owner" else "800", [(0, 3)] if case == "beyond" else [(0, 600)], lead=2)
    chain.start(0, "800", SLURM_JOB_END_TIME=str(end))
    chain.wait_for(lambda: chain.training("800"), what="job 800 to train")
    chain.start(1, "801", **({"CHAINRUN_ADAPTIVE_HANDOFF": "0"} if case == "turned-off" else {}))
    chain.wait_for(lambda: chain.jobs["800"].poll() is not None, what="job 800 to hand off")
    chain.finish("800")
    chain.wait_for(lambda: chain.training("801"), what="job 801 to take over")
    assert chain.outcome(0)["outcome"] == "handoff"
    assert "mode" not in chain.state(1) or chain.state(1)["mode"] != "wait"
    chain.jobs["801"].send_signal(signal.SIGUSR2)
    chain.finish("801")
    assert chain.outcome(1)["handoff_mode"] == "cut"
    # it did not wait for the hand-over point: it asked for the hand-off, and took over on the release
    assert parse_outcome((_ctl(chain) / "handoff.0").read_text())["by"] == "801"
    assert _took_over_by_release(chain, "801") and _first_step(chain, "801") < end - 2
    chain.assert_never_two_at_once()


@pytest.mark.parametrize("how", ["stops-early", "crashes", "node-dies", "ignores-signal"])
def test_waiting_successor_takes_over_when_the_owner_ends_before_its_handover(chain, how):
    """Waiting is not claiming: the successor still takes over the moment the owner releases the
    chain or Slurm says its job ended, long before the hand-over point it was waiting for."""
    end = int(time.time()) + 120
    _rule(chain, 1, "900", [(0, 600)], lead=2)
    chain.start(0, "900", SLURM_JOB_END_TIME=str(end), IGNORE_SIGNAL="1" if how == "ignores-signal" else "0")
    chain.wait_for(lambda: chain.training("900") and (chain.run_dir / "control/seg-0.pid").exists(),
                   what="job 900 to train")
    chain.start(1, "901")
    chain.wait_for(lambda: chain.state(1).get("mode") == "wait", what="job 901 to wait by the rule")
    chain.wait_asked("900")
    assert not chain.training("901")
    if how == "stops-early":  # e.g. the trainer's own early exit on a signal
        chain.jobs["900"].send_signal(signal.SIGUSR2)
        chain.finish("900")
    elif how == "crashes":
        os.killpg(int((chain.run_dir / "control/seg-0.pid").read_text()), signal.SIGKILL)
        chain.finish("900")
        assert chain.outcome(0)["outcome"] == "crash"
    elif how == "node-dies":  # no outcome, no release: only Slurm's word counts
        _node_dies(chain)
        chain.wait_asked("900", after=chain.asked("900", "running"))
        assert not chain.training("901")  # squeue still lists job 900
        chain.finish("900")
    else:  # Slurm's signal is ignored; the time limit's TERM stops it (here: early)
        signalled = time.time()
        chain.jobs["900"].send_signal(signal.SIGUSR2)
        chain.wait_for(lambda: _last_step(chain, "900") > signalled + 0.5, what="job 900 to train on after the signal")
        chain.wait_asked("900", after=chain.asked("900", "running"))
        assert not chain.training("901") and chain.jobs["900"].poll() is None
        chain.jobs["900"].send_signal(signal.SIGTERM)
        chain.finish("900")
    chain.wait_for(lambda: chain.training("901"), timeout=60, what="job 901 to take over")
    # at once: on the release, or (no release) on Slurm's word at its next check; never at the hand-over point
    log = (chain.tmp / "job-901.out").read_text()
    if how == "node-dies":
        assert "Slurm reports that job 900's run ended" in log and chain.asked("900", "gone") >= 1, log
    else:
        assert _took_over_by_release(chain, "901")
    assert _first_step(chain, "901") < end - 2  # before the hand-over point it waited for
    chain.jobs["901"].send_signal(signal.SIGUSR2)
    chain.finish("901")
    chain.assert_never_two_at_once()


def test_successor_waiting_by_the_rule_that_gets_its_own_signal_never_trains(chain):
    end = int(time.time()) + 120
    _rule(chain, 1, "950", [(0, 600)], lead=2)
    chain.start(0, "950", SLURM_JOB_END_TIME=str(end))
    chain.wait_for(lambda: chain.training("950"), what="job 950 to train")
    chain.start(1, "951")
    chain.wait_for(lambda: chain.state(1).get("mode") == "wait", what="job 951 to wait by the rule")
    chain.jobs["951"].send_signal(signal.SIGUSR2)  # its own early signal, or scancel, while it waits
    assert chain.finish("951") == 0
    out = chain.outcome(1)
    assert out["outcome"] == "unstarted" and out["handoff_mode"] == "wait", out
    assert chain.jobs["950"].poll() is None and not (chain.run_dir / "control/handoff.0").exists()
    chain.jobs["950"].send_signal(signal.SIGUSR2)
    chain.finish("950")
    assert chain.outcome(0)["outcome"] == "continue" and not chain.training("951")


def test_owner_running_past_its_recorded_end_is_asked_to_hand_off(chain):
    """Its limit was extended (or its end misread): once it outlives the end it recorded by the
    grace, the waiting successor asks for the hand-off as it would have without the rule; the
    15-minute cancel counts from that request, never from a hand-over point the owner never had."""
    end = int(time.time()) + 4
    _rule(chain, 1, "1000", [(0, 600)], lead=2)
    chain.start(0, "1000", SLURM_JOB_END_TIME=str(end))  # Slurm never signals it here
    chain.wait_for(lambda: chain.training("1000"), what="job 1000 to train")
    chain.start(1, "1001", CHAINRUN_HANDOFF_GRACE="1")
    chain.wait_for(lambda: chain.state(1).get("mode") == "wait", what="job 1001 to wait by the rule")
    chain.wait_for(lambda: chain.jobs["1000"].poll() is not None, timeout=30, what="job 1000 to hand off")
    asked = (chain.run_dir / "control/seg-0.outcome").stat().st_mtime
    chain.finish("1000")
    chain.wait_for(lambda: chain.training("1001"), what="job 1001 to take over")
    assert asked >= end + 1 and chain.outcome(0)["outcome"] == "handoff"
    chain.jobs["1001"].send_signal(signal.SIGUSR2)
    chain.finish("1001")
    assert chain.outcome(1)["handoff_mode"] == "cut"
    chain.assert_never_two_at_once()


# ---------------------------------------------------------------- issue 23: the field (folders, requeue, Slurm, release)
def _ctl(chain: Chain) -> Path:
    return chain.run_dir / "control"


def _train_alone(chain: Chain, job: str, cgroup: Path | None = None, **env: str) -> None:
    chain.start(0, job, cgroup, **env)
    chain.wait_for(lambda: chain.training(job) and (_ctl(chain) / "seg-0.pid").exists(), what=f"job {job} to train")


def _stop(chain: Chain, job: str) -> None:
    chain.jobs[job].send_signal(signal.SIGUSR2)
    chain.finish(job)


def _node_dies(chain: Chain, seg: int = 0) -> None:
    """A node failure as Slurm acts on it: every process of the job is killed at once, with no outcome and no
    release: the payload's group, the wrapper and its monitor (an orphaned monitor that lived on would fence
    the rerun and write over the killed run's record, which no real node failure does)."""
    ctl = _ctl(chain)
    chain.wait_for(lambda: (ctl / f"seg-{seg}.monitor").exists(), what="the monitor to start")
    wrapper = int(parse_outcome((ctl / f"seg-{seg}.start").read_text())["pid"])
    os.killpg(int((ctl / f"seg-{seg}.pid").read_text()), signal.SIGKILL)
    for pid in (wrapper, int((ctl / f"seg-{seg}.monitor").read_text())):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("case", ["missing", "other-chain", "no-folder"])
def test_run_folder_without_its_token_trains_nothing_and_exits_86(chain, case):
    token = _ctl(chain) / "token"
    if case == "missing":
        token.unlink()
    elif case == "other-chain":
        token.write_text("chain=c2\n")
    else:  # the run folder is not mounted on this node at all
        subprocess.run(["rm", "-rf", str(chain.run_dir / "control")], check=True)
    p = chain.start(0, "1100")
    assert chain.finish("1100", timeout=10) == 86
    err = (chain.tmp / "job-1100.out").read_text()
    assert str(chain.run_dir) in err and "training nothing" in err and os.uname().nodename in err, err
    assert not chain.steps() and p.returncode == 86
    assert not (chain.run_dir / "control").exists() or not list(_ctl(chain).glob("owner.*"))  # nothing claimed
    if case == "missing":
        out = chain.outcome(0)
        assert out["outcome"] == "no-run-folder" and out["host"] == os.uname().nodename, out
    else:  # another chain's folder is not written to, a missing folder not created
        assert not (_ctl(chain) / "seg-0.outcome").exists()


def test_payload_gets_its_generation_and_control_files_are_private(chain):
    _train_alone(chain, "1150")
    _stop(chain, "1150")
    assert {ln.split()[3] for ln in (chain.ckpt / "steps.log").read_text().splitlines() if ln.startswith("step")} == {"0"}
    for f in _ctl(chain).iterdir():
        if f.name != "token":  # the test wrote the token itself
            assert f.stat().st_mode & 0o077 == 0, (f.name, oct(f.stat().st_mode))
    assert not list(_ctl(chain).glob("*.heartbeat"))  # gone: nothing read it


def test_rerun_of_the_owner_claims_the_next_generation_at_once(chain):
    """Requeued after a node failure: no release, same job id. Its own earlier run is over: never
    wait for it (formerly 15 min, then it cancelled itself)."""
    _train_alone(chain, "1200")
    _node_dies(chain)  # no release written
    chain.jobs["1200"].wait(10)
    (chain.queue / "1200").write_text("1")  # squeue: job 1200 runs again, restart count 1
    t = time.time()
    chain.start(0, "1200", SLURM_RESTART_COUNT="1")
    chain.wait_for(lambda: any(j == "1200" and time.time() > t and s > t for _, j, s in chain.steps()),
                   timeout=15, what="the rerun to train")
    assert (_ctl(chain) / "owner.1").read_text().count("restart=1") == 1
    assert not (_ctl(chain) / "handoff.0").exists()
    _stop(chain, "1200")
    # each run keeps its own record (the watcher sums a requeued job's runs): the killed first run's
    # training start, the rerun's outcome
    run0, run1 = (parse_outcome((_ctl(chain) / f"seg-0.run-{r}").read_text()) for r in (0, 1))
    assert run0["phase"] == "training" and run0["restart"] == "0" and float(run0["payload_start"]) < t, run0
    assert run1["outcome"] == "continue" and run1["restart"] == "1" and float(run1["payload_start"]) >= int(t), run1
    chain.assert_never_two_at_once()


def test_rerun_of_a_predecessor_never_takes_the_chain_from_its_successor(chain):
    _train_alone(chain, "1300")
    chain.start(1, "1301")
    chain.wait_for(lambda: chain.training("1301"), what="job 1301 to take over")
    chain.finish("1300")
    (chain.queue / "1300").write_text("1")
    rerun = chain.start(0, "1300", SLURM_RESTART_COUNT="1")  # the predecessor, requeued after its successor claimed
    assert rerun.wait(15) == 0
    out = parse_outcome((_ctl(chain) / "seg-0.rerun-1").read_text())
    assert out["outcome"] == "unstarted" and "superseded" in out["reason"] and out["restart"] == "1", out
    assert chain.outcome(0)["outcome"] == "handoff"  # what the first run did stays the job's outcome
    run0, run1 = (parse_outcome((_ctl(chain) / f"seg-0.run-{r}").read_text()) for r in (0, 1))
    assert run0["outcome"] == "handoff" and "payload_end" in run0 and run1["outcome"] == "unstarted", (run0, run1)
    assert not (_ctl(chain) / "handoff.1").exists() and chain.jobs["1301"].poll() is None
    _stop(chain, "1301")
    chain.assert_never_two_at_once()


def test_owner_file_left_empty_by_a_dead_claimer_is_resolved_after_a_minute(chain):
    (_ctl(chain) / "owner.0").touch()
    old = time.time() - 61
    os.utime(_ctl(chain) / "owner.0", (old, old))
    _train_alone(chain, "1400")
    assert (_ctl(chain) / "owner.1").exists()
    _stop(chain, "1400")


def test_failed_claims_never_spin(chain):
    """The token is there but the control folder refuses new files (read-only, full, a stale NFS
    listing): each failed claim sleeps, so the wrapper's CPU time stays a sliver of its wall time,
    and after 30 failures it ends no-run-folder (exit 86) instead of idling the allocation."""
    import resource

    ctl = _ctl(chain)
    subprocess.run(["rm", "-rf", str(ctl)], check=True)
    ctl.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(ctl)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs to mount a tmpfs (root) to make a folder that refuses files")
    try:
        (ctl / "token").write_text(token_text("c1"))
        subprocess.run(["mount", "-o", "remount,ro", str(ctl)], check=True)
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        chain.start(0, "1450")
        rc = chain.finish("1450", timeout=120)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.time() - t
    finally:
        subprocess.run(["umount", str(ctl)], check=False)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert rc == 86 and wall >= 30 and not chain.steps(), (rc, wall, chain.logs())
    assert cpu < 0.05 * wall, (cpu, wall)
    assert "cannot create" in chain.logs()


def test_slurm_answers_read_by_field_and_cannot_tell_is_settled_by_sacct(chain):
    """A squeue that prints a warning on stderr and nothing on stdout, with SQUEUE_STATES=PD in the
    job's environment: "cannot tell", settled by sacct. Once sacct says the owner ended, take over."""
    _train_alone(chain, "1500", IGNORE_SIGNAL="1")
    (chain.bin / "squeue").write_text("#!/bin/bash\necho 'squeue: warning: configuration mismatch' >&2\n"
                                     "[[ -n ${SQUEUE_STATES:-} ]] && echo \"filtered by SQUEUE_STATES\" >&2\nexit 0\n")
    (chain.bin / "sacct").write_text("#!/bin/bash\necho sacct >> $FAKE_SQUEUE/sacct-asked\n"
                                     "[[ -e $FAKE_SQUEUE/1500 ]] && echo RUNNING || echo 'CANCELLED by 0'\n")
    (chain.bin / "sacct").chmod(0o755)
    chain.start(1, "1501", SQUEUE_STATES="PD", SQUEUE_FORMAT="%i")
    chain.wait_for(lambda: chain.state(1).get("phase") == "waiting", what="job 1501 to wait")
    asked = chain.queue / "sacct-asked"  # it could not tell from squeue and asked the accounting, twice
    chain.wait_for(lambda: asked.exists() and len(asked.read_text().split()) >= 2, timeout=60, what="sacct to be asked")
    assert not chain.training("1501")  # sacct: still running
    _node_dies(chain)
    chain.finish("1500")
    chain.wait_for(lambda: chain.training("1501"), timeout=30, what="job 1501 to take over")
    _stop(chain, "1501")
    chain.assert_never_two_at_once()


def test_slurm_that_cannot_tell_for_the_limit_ends_the_segment_unstarted(chain):
    _train_alone(chain, "1600")
    (chain.bin / "squeue").write_text("#!/bin/bash\necho 'squeue: error: Socket timed out' >&2\nexit 1\n")
    (chain.bin / "sacct").write_text("#!/bin/bash\nexit 1\n")
    (chain.bin / "sacct").chmod(0o755)
    chain.start(1, "1601", CHAINRUN_SLURM_UNKNOWN_LIMIT="5", CHAINRUN_HANDOFF_TIMEOUT="600")
    chain.jobs["1600"].send_signal(signal.SIGSTOP)  # the owner neither hands off nor releases
    try:
        assert chain.finish("1601", timeout=60) == 0
    finally:
        chain.jobs["1600"].send_signal(signal.SIGCONT)
    out = chain.outcome(1)
    assert out["outcome"] == "unstarted" and "cannot tell whether job 1600 ended" in out["reason"], out
    assert "Socket timed out" in out["reason"] and not chain.training("1601")
    _stop(chain, "1600")


def test_failed_scancel_is_retried_and_the_cut_never_outlasts_the_owners_end(chain):
    """The hand-off wait ends at the owner's own end (+ grace), not after a fixed 15 min. The owner is
    then sent TERM (as its limit would), through scancel --batch; a scancel that fails is logged and
    tried again."""
    end = int(time.time()) + 6
    _train_alone(chain, "1700", IGNORE_SIGNAL="1", SLURM_JOB_END_TIME=str(end))
    (chain.bin / "scancel").write_text(f"""#!/bin/bash
if [[ ! -e {chain.tmp}/scancel-failed ]]; then touch {chain.tmp}/scancel-failed; echo "scancel: error: Socket timed out" >&2; exit 1; fi
{SCANCEL.split(chr(10), 1)[1]}""")
    chain.start(1, "1701", CHAINRUN_HANDOFF_GRACE="2")
    chain.wait_for(lambda: chain.training("1701"), timeout=60, what="job 1701 to take over")
    log = (chain.tmp / "job-1701.out").read_text()
    assert "scancel 1700 failed (scancel: error: Socket timed out): trying again" in log, log
    cut = parse_outcome((_ctl(chain) / "cancel.0").read_text())  # who stopped the owner and why: for the watcher
    assert (cut["how"], cut["job"], cut["gen"], cut["by"], cut["by_seg"]) == ("TERM", "1700", "0", "1701", "1"), cut
    assert int(cut["deadline"]) == end + 2 and int(cut["timeout"]) > 0 and cut["requested"].isdigit(), cut
    chain.finish("1700")
    assert chain.outcome(0)["outcome"] in ("handoff", "continue")  # it ended normally, with its checkpoint
    assert chain.outcome(0)["cut"] == "1"  # it saw the record naming it: the watcher reads who cut it, and why
    _stop(chain, "1701")
    chain.assert_never_two_at_once()


def test_release_waits_for_a_writer_that_left_the_process_group(chain):
    _train_alone(chain, "1800", WRITER_SECONDS="4")
    _stop(chain, "1800")
    released = (_ctl(chain) / "released.0").stat().st_mtime
    writes = [float(x) for x in (chain.ckpt / "writer.log").read_text().split()]
    assert len(writes) == 4 and released >= writes[-1], (released, writes)
    assert chain.outcome(0)["writer_killed"] == "0"


@pytest.fixture
def job_cgroup():
    """A real cgroup (v1 freezer, or v2) laid out as Slurm's proctrack/cgroup lays out a job's:
    <root>/chainrun-test-<pid>/job_<id>/step_batch. The test cluster's slurmd uses proctrack/linuxproc,
    so the wrapper's cgroup path is proven here, on the kernel's cgroups without Slurm."""
    made = []

    def make(job: str) -> Path:
        for root in (Path("/sys/fs/cgroup/freezer"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
            top = root / f"chainrun-test-{os.getpid()}"
            step = top / f"job_{job}" / "step_batch"
            try:
                step.mkdir(parents=True)
            except OSError:
                continue
            if (step / "cgroup.procs").exists():
                made.append(top)
                return step
            subprocess.run(["rmdir", str(step), str(step.parent), str(top)], capture_output=True)
        pytest.skip("cannot create a cgroup here (needs root and a writable cgroup hierarchy)")

    yield make
    for top in made:  # leftovers killed, then the folders removed deepest first
        for procs in top.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                subprocess.run(["kill", "-KILL", pid], capture_output=True)
        deadline = time.time() + 10
        while any(p.read_text().strip() for p in top.rglob("cgroup.procs")) and time.time() < deadline:
            time.sleep(0.1)
        for d in sorted((p.parent for p in top.rglob("cgroup.procs")), key=lambda d: -len(d.parts)):
            d.rmdir()


@pytest.mark.parametrize("in_cgroup", [True, False])
def test_release_waits_for_a_writer_only_the_jobs_cgroup_knows(chain, job_cgroup, in_cgroup):
    """A writer that left the process group and dropped its environment (no SLURM_JOB_ID, no
    CHAINRUN_*): only the job's cgroup still holds it. Inside one, the release waits for it; without
    one (the control case) nothing can find it, so the release comes first: the cgroup path did it."""
    cg = job_cgroup("1850") if in_cgroup else None
    seconds = 4 if in_cgroup else 60  # the control's writer outlives the release by far; it is killed then
    _train_alone(chain, "1850", cg, WRITER_SECONDS=str(seconds), WRITER_ESCAPES="1")
    _stop(chain, "1850")
    released = (_ctl(chain) / "released.0").stat().st_mtime
    log = chain.ckpt / "writer.log"
    if in_cgroup:
        chain.wait_for(lambda: log.exists() and len(log.read_text().split()) == seconds, what="the writer's writes")
        writes = [float(x) for x in log.read_text().split()]
        assert released >= writes[-1], (released, writes)
        assert chain.outcome(0)["writer_killed"] == "0"
    else:
        writer = subprocess.run(["pgrep", "-f", str(log)], capture_output=True, text=True).stdout.split()
        assert writer, "the writer should still run after the release"  # nothing found it: released without it
        subprocess.run(["kill", *writer], check=False)


def test_writer_still_running_after_the_grace_is_killed_before_release(chain):
    _train_alone(chain, "1900", WRITER_SECONDS="600", CHAINRUN_RELEASE_GRACE="3")
    _stop(chain, "1900")
    writes = [float(x) for x in (chain.ckpt / "writer.log").read_text().split()]
    released = (_ctl(chain) / "released.0").stat().st_mtime
    gone = subprocess.run(["pgrep", "-f", str(chain.ckpt / "writer.log")], capture_output=True, text=True).stdout
    assert not gone.split(), gone  # it is gone, not merely quiet
    assert released >= writes[-1] and int(chain.outcome(0)["writer_killed"]) >= 1, chain.outcome(0)  # bash, sleep


def test_owner_is_fenced_as_soon_as_a_later_generation_exists(chain):
    """A node Slurm gave up on: another job claimed generation 1. The owner's monitor stops its
    payload within one monitor period, and the fenced segment writes no outcome."""
    _train_alone(chain, "2000", IGNORE_SIGNAL="1")
    (_ctl(chain) / "owner.1").write_text("job=2001\nseg=1\n")
    claimed = time.time()
    chain.wait_for(lambda: chain.jobs["2000"].poll() is not None, timeout=15, what="the fenced owner to end")
    assert _last_step(chain, "2000") < claimed + 2 + 1  # one monitor period (2 s) + one step
    assert parse_outcome((_ctl(chain) / "seg-0.fenced").read_text())["by_job"] == "2001"
    assert not (_ctl(chain) / "seg-0.outcome").exists()
    assert "fenced" in (chain.tmp / "job-2000.out").read_text()


@pytest.mark.parametrize("lead,save_timeout,want", [(240, 0, 300), (240, 1200, 1200), (30, 60, 90)])
def test_handoff_bound_is_the_longer_of_the_signal_lead_plus_a_margin_and_the_save_timeout(tmp_path, lead, save_timeout,
                                                                                         want):
    w = tmp_path / "w.sh"
    w.write_text(render_wrapper(chain_id="c1", run_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ck"), payload="x",
                                signal="USR2", script_text="", signal_lead_s=lead, save_timeout_s=save_timeout))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRUN_")}
    p = subprocess.run(["bash", "-c", f"source <(sed -n '/^CHAINRUN_CHAIN_ID=/,/^CHAINRUN_HANDOFF_TIMEOUT=/p' {w}); "
                        "echo $CHAINRUN_HANDOFF_TIMEOUT"], capture_output=True, text=True, env=env)
    assert p.stdout.strip() == str(want), p.stderr


def _proc_state(pid: int) -> str:
    """The process's state letter (R, S, T stopped, Z zombie...), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


IGNORES_USR2_DIES_OF_TERM = """#!/bin/bash
trap '' USR2
while :; do echo "step $SLURM_JOB_ID $(date +%s.%N) ${CHAINRUN_GENERATION:-?} 0" >> "$CHAINRUN_CHECKPOINT_DIR/steps.log"; sleep 0.2; done
"""


@pytest.mark.parametrize("stopped", [False, True])
def test_a_payload_killed_by_term_at_the_limit_beside_its_wrapper_is_stopped_not_crashed(chain, stopped):
    """Slurm's TERM at the limit reaches every process of the job at once: the payload (no TERM handler)
    dies of it while the wrapper runs its own TERM trap. Its status is 143, "stopped at its limit", never
    a checkpoint crash (a first fix read bash's status a second time and got none: exit=-1, seen on the
    real cluster). ``stopped``: the wrapper is held while both signals land, so the trap cuts its wait."""
    (chain.tmp / "train.sh").write_text(IGNORES_USR2_DIES_OF_TERM)
    _train_alone(chain, "530")
    wrapper, payload = chain.jobs["530"].pid, int((_ctl(chain) / "seg-0.pid").read_text())
    if stopped:
        os.kill(wrapper, signal.SIGSTOP)
        chain.wait_for(lambda: _proc_state(wrapper) == "T", what="the wrapper to stop")
    try:
        os.killpg(payload, signal.SIGTERM)
        os.kill(wrapper, signal.SIGTERM)
    finally:
        os.kill(wrapper, signal.SIGCONT)
    assert chain.finish("530") == 0, chain.logs()
    out = chain.outcome(0)
    assert out["outcome"] == "continue" and out["exit"] == "143" and out["signaled"] == "1", out


def test_a_payload_that_crashed_while_the_wrapper_ran_its_signal_trap_is_a_checkpoint_crash(chain):
    """The cause of a CI flake (finish returned 0 under load): the signal cut the wrapper's `wait` short,
    and the payload crashed on it and was reaped while the trap still ran. The wrapper took the trap's
    status (128 + USR2) for the payload's, counted it "stopped by the signal" and wrote `continue`.
    Made certain here: the wrapper is stopped while its payload crashes on the signal and the wrapper's
    own signal is pending, then continued."""
    _train_alone(chain, "520", CRASH_ON_SAVE="1")
    wrapper, payload = chain.jobs["520"].pid, int((_ctl(chain) / "seg-0.pid").read_text())
    os.kill(wrapper, signal.SIGSTOP)
    try:
        chain.wait_for(lambda: _proc_state(wrapper) == "T", what="the wrapper to stop")  # it cannot reap from now on
        os.killpg(payload, signal.SIGUSR2)  # as the wrapper would forward it: the payload crashes saving
        chain.wait_for(lambda: _proc_state(payload) == "Z", what="the payload to exit (a zombie until its wrapper reaps it)")
        os.kill(wrapper, signal.SIGUSR2)  # the wrapper's own signal, pending beside SIGCHLD
    finally:
        os.kill(wrapper, signal.SIGCONT)
    assert chain.finish("520") == 1, chain.logs()
    out = chain.outcome(0)
    assert out["outcome"] == "checkpoint-crash" and out["signaled"] == "1" and out["exit"] == "1", out
