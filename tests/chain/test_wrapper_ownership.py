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

from chainrun.chain.contract import parse_outcome, render_wrapper

PAYLOAD = r"""#!/bin/bash
# a trainer: one step every 0.2 s; on the signal it saves and exits unless told to ignore it
log=$CHAINRUN_CHECKPOINT_DIR/steps.log
stop=0
[[ ${IGNORE_SIGNAL:-0} == 1 ]] && trap '' USR2 || trap 'stop=1' USR2
trap 'stop=1' TERM
while ((!stop)); do
  echo "step $SLURM_JOB_ID $(date +%s.%N)" >> "$log"
  sleep 0.2
done
[[ ${CRASH_ON_SAVE:-0} == 1 ]] && { echo "Traceback: cannot save" >&2; exit 1; }
echo "save $SLURM_JOB_ID $(date +%s.%N)" >> "$log"
"""

SQUEUE = """#!/bin/bash
# fake squeue: `squeue -h -j ID -o %T` prints RUNNING while $FAKE_SQUEUE/ID exists
id=""; while (($#)); do [[ $1 == -j ]] && id=$2; shift; done
[[ -e $FAKE_SQUEUE/$id ]] && echo RUNNING
exit 0
"""


class Chain:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.run_dir = tmp / "run"
        self.ckpt = tmp / "ckpt"
        self.bin = tmp / "bin"
        self.queue = tmp / "queue"
        for d in (self.run_dir, self.ckpt, self.bin, self.queue):
            d.mkdir(parents=True, exist_ok=True)
        (self.bin / "squeue").write_text(SQUEUE)
        (self.bin / "squeue").chmod(0o755)
        (self.bin / "scancel").write_text("#!/bin/bash\nrm -f \"$FAKE_SQUEUE/$1\"\n")
        (self.bin / "scancel").chmod(0o755)
        payload = tmp / "train.sh"
        payload.write_text(PAYLOAD)
        payload.chmod(0o755)
        self.wrapper = self.run_dir / "wrapper.sh"
        self.wrapper.write_text(render_wrapper(chain_id="c1", run_dir=str(self.run_dir), checkpoint_dir=str(self.ckpt),
                                               payload=str(payload), signal="USR2", script_text="#!/bin/bash\n"))
        self.jobs: dict[str, subprocess.Popen] = {}

    def start(self, seg: int, job: str, **env: str) -> subprocess.Popen:
        (self.queue / job).touch()
        full = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "FAKE_SQUEUE": str(self.queue),
                "SLURM_JOB_ID": job, **env}
        out = open(self.tmp / f"job-{job}.out", "w")
        p = subprocess.Popen(["bash", str(self.wrapper), str(seg)], env=full, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
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
        return [tuple(ln.split()[:2]) + (float(ln.split()[2]),) for ln in log.read_text().splitlines()] if log.exists() else []

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
    time.sleep(1)
    s1.send_signal(signal.SIGUSR2)  # its own early --signal, while job 100 (ignoring the request) trains on
    assert chain.finish("101") == 0
    assert chain.outcome(1)["outcome"] == "unstarted" and chain.outcome(1)["stopped_by"] == "USR2"
    chain.start(2, "102")
    chain.wait_for(lambda: chain.state(2).get("phase") == "waiting", what="job 102 to wait")
    assert chain.state(2)["owner_job"] == "100"  # the segment that last held the chain, not segment 1
    time.sleep(1.5)
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
    assert chain.outcome(0)["outcome"] == "handoff"
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
    time.sleep(4)
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
    pid = int(parse_outcome((chain.run_dir / "control/seg-0.start").read_text())["pid"])
    payload = int((chain.run_dir / "control/seg-0.pid").read_text())
    os.killpg(payload, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)  # no outcome, no release: as after a node failure
    chain.start(1, "401")
    time.sleep(2)
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
    time.sleep(2)
    assert not (chain.run_dir / "control/handoff.0").exists()  # no hand-off request: the owner is not cut
    assert not chain.training("701") and _last_step(chain, "700") > started  # the owner trains on
    time.sleep(max(0.0, end - 2 - time.time()))
    chain.jobs["700"].send_signal(signal.SIGUSR2)  # Slurm's --signal at the hand-over point
    chain.finish("700")
    chain.wait_for(lambda: chain.training("701"), what="job 701 to take over")
    assert chain.outcome(0)["outcome"] == "continue" and chain.outcome(0)["signaled"] == "1"
    assert _first_step(chain, "701") - _last_step(chain, "700") < 3  # it took over at once
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
    assert time.time() < end - 20  # it did not wait for the hand-over point
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
    time.sleep(1)
    assert not chain.training("901")
    if how == "stops-early":  # e.g. the trainer's own early exit on a signal
        chain.jobs["900"].send_signal(signal.SIGUSR2)
        chain.finish("900")
    elif how == "crashes":
        os.killpg(int((chain.run_dir / "control/seg-0.pid").read_text()), signal.SIGKILL)
        chain.finish("900")
        assert chain.outcome(0)["outcome"] == "crash"
    elif how == "node-dies":  # no outcome, no release: only Slurm's word counts
        pid = int(parse_outcome((chain.run_dir / "control/seg-0.start").read_text())["pid"])
        os.killpg(int((chain.run_dir / "control/seg-0.pid").read_text()), signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        time.sleep(3)
        assert not chain.training("901")  # squeue still lists job 900
        chain.finish("900")
    else:  # Slurm's signal is ignored; the time limit's TERM stops it (here: early)
        chain.jobs["900"].send_signal(signal.SIGUSR2)
        time.sleep(3)
        assert not chain.training("901") and chain.jobs["900"].poll() is None
        chain.jobs["900"].send_signal(signal.SIGTERM)
        chain.finish("900")
    ended = time.time()
    chain.wait_for(lambda: chain.training("901"), timeout=25, what="job 901 to take over")
    assert _first_step(chain, "901") - ended < (15 if how == "node-dies" else 3)
    assert time.time() < end - 60  # long before the hand-over point it waited for
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
