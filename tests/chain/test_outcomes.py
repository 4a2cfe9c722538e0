"""How a segment's ending is read: the wrapper's outcome/state file beside sacct's final state.

Each case is one row of the outcome table in docs/checkpoint-contract.md.
"""

import pytest

from chainrun.chain.outcomes import classify, payload_overlaps, payload_window, record_overlaps
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import ENDED, RUNNING, Segment
from tests.chain.test_policies import chain


def row(state, *, elapsed=100.0, limit=3600.0, code=0, sig=0, job="7"):
    return AcctRow(job_id=job, name="cr.c.0", user="u", partition="p", qos="", submit=0, eligible=0, start=0,
                   end=elapsed, elapsed_s=elapsed, time_limit_s=limit, nodes=1, cpus=1, gpus=0, state=state,
                   exit_code=code, exit_signal=sig, reason="", state_detail=state)


TRAINED = {"payload_start": "10", "payload_end": "90"}  # 80 s of training inside a 100 s job


@pytest.mark.parametrize(
    "state,info,outcome,credit",
    [
        # the wrapper's outcome file: training time is the payload's run time, never the allocation
        ("COMPLETED", {"outcome": "continue", "signaled": "1", **TRAINED}, "continue", 80),
        ("COMPLETED", {"outcome": "continue", "signaled": "0", **TRAINED}, "continue", 80),
        ("COMPLETED", {"outcome": "handoff", **TRAINED}, "handoff", 80),
        ("COMPLETED", {"outcome": "done", **TRAINED}, "done", 80),
        ("FAILED", {"outcome": "crash", "exit": "3", **TRAINED}, "crash", 80),
        ("FAILED", {"outcome": "checkpoint-crash", "exit": "1", **TRAINED}, "checkpoint-crash", 80),
        ("COMPLETED", {"outcome": "unstarted", "stopped_by": "USR2"}, "unstarted", 0),
        ("COMPLETED", {"outcome": "skipped"}, "skipped", 0),
        # scancel of a segment that waited for the hand-off: not a crash, not an external stop of the chain
        ("CANCELLED", {"outcome": "unstarted", "stopped_by": "TERM"}, "unstarted", 0),
        # no outcome file: the wrapper was killed; its state file says whether the payload ran
        ("TIMEOUT", {"phase": "training", "payload_start": "10"}, "continue", 90),
        ("FAILED", {"phase": "waiting"}, "unstarted", 0),  # killed (e.g. SIGKILL) while waiting: never trained
        ("TIMEOUT", {"phase": "waiting"}, "unstarted", 0),
        ("OUT_OF_MEMORY", {"phase": "training", "payload_start": "10"}, "crash", 90),
        # not requeued by Slurm (--no-requeue, JobRequeue=0): a new job; a retry is spent only if it trained
        ("NODE_FAIL", {}, "unstarted", 0),
        ("NODE_FAIL", {"phase": "waiting"}, "unstarted", 0),
        ("PREEMPTED", {}, "unstarted", 0),
        ("NODE_FAIL", {"phase": "training", "payload_start": "40"}, "crash", 60),
        ("PREEMPTED", {"phase": "training", "payload_start": "40"}, "crash", 60),
        ("PREEMPTED", {"outcome": "continue", "signaled": "1", **TRAINED}, "continue", 80),  # it saved on TERM
        # the wrapper could not see the run folder on its node (exit 86, nothing written)
        ("FAILED", {}, "crash", 0),
        ("COMPLETED", {}, "crash", 0),  # exit 0 with no outcome written: the control folder is broken
    ],
)
def test_classify(state, info, outcome, credit):
    r = classify(chain(), Segment(chain_id="c", idx=0, job_id="7", time_limit_s=3600), row(state), info)
    assert (r.outcome, r.credit_s) == (outcome, credit)


@pytest.mark.parametrize("state,info,words", [
    # moving between clusters (docs/remote-clusters.md): the wrapper's own reason, or what it waited for
    ("COMPLETED", {"outcome": "unstarted", "reason": "moved: the chain moved to another site at generation 4 "
                   "(control/moved.4): nothing more trains here", "moved": "4"}, "moved to another site"),
    ("COMPLETED", {"outcome": "unstarted", "stopped_by": "USR2", "handoff_mode": "gated"}, "got USR2 while waiting for the go-ahead"),
    ("TIMEOUT", {"phase": "waiting", "mode": "gated"}, "ended TIMEOUT while waiting for the go-ahead"),
    ("COMPLETED", {"outcome": "unstarted", "stopped_by": "USR2", "handoff_mode": "cut"}, "got USR2 while waiting for its predecessor's hand-off"),
])
def test_unstarted_says_what_it_waited_for(state, info, words):
    r = classify(chain(), Segment(chain_id="c", idx=3, job_id="7", time_limit_s=3600), row(state), info)
    assert (r.outcome, r.credit_s) == ("unstarted", 0) and words in r.reason and r.reason.endswith("never trained"), r
    assert r.message.startswith("segment 3 (job 7) ")


def test_cancelled_outside_chainrun_is_external():
    seg = Segment(chain_id="c", idx=0, job_id="7")
    r = classify(chain(), seg, row("CANCELLED"), {"outcome": "continue", "signaled": "1"})
    assert r.outcome == "cancelled" and r.external
    seg.extra["cancel_requested"] = True
    assert not classify(chain(), seg, row("CANCELLED"), {}).external


def test_payload_window_uses_the_job_end_when_the_wrapper_was_killed():
    assert payload_window({"payload_start": "5", "payload_end": "9"}, row("COMPLETED")) == (5.0, 9.0)
    assert payload_window({"payload_start": "5"}, row("TIMEOUT", elapsed=50)) == (5.0, 50.0)
    assert payload_window({"payload_start": "5"}, None) == (5.0, None)
    assert payload_window({"phase": "waiting"}, row("FAILED")) is None
    assert payload_window({"payload_start": "garbage"}, None) is None


def test_payload_overlaps_names_both_jobs():
    windows = {"1": (0.0, 100.0), "2": (100.0, 200.0), "3": (150.0, None)}
    assert payload_overlaps(windows, now=230.0) == [("2", "3", 50.0)]
    assert payload_overlaps({"1": (0.0, 10.0), "2": (10.0, 20.0)}, now=30.0) == []


def test_overlap_and_gap():
    a = Segment(chain_id="c", idx=0, phase=ENDED, start=0, end=100)
    b = Segment(chain_id="c", idx=1, phase=ENDED, start=90, end=200)
    c = Segment(chain_id="c", idx=2, phase=RUNNING, start=260)
    record_overlaps([a, b, c])
    assert b.overlap_s == 10 and b.extra["gap_s"] == -10
    assert c.overlap_s == 0 and c.extra["gap_s"] == 60


def test_a_segment_that_never_trained_is_not_a_boundary():
    a = Segment(chain_id="c", idx=0, phase=ENDED, start=0, end=100)
    w = Segment(chain_id="c", idx=1, phase=ENDED, start=20, end=60, outcome="unstarted")
    b = Segment(chain_id="c", idx=2, phase=RUNNING, start=95)
    record_overlaps([a, w, b])
    assert "gap_s" not in w.extra and b.extra["gap_s"] == -5 and b.overlap_s == 5


# ------------------------------------------------------------------ killed after the signal: say what is known
@pytest.mark.parametrize("state,code,said", [
    ("TIMEOUT", "143", "stopped at its time limit without reacting to the USR2 signal (killed by TERM, exit 143)"),
    ("COMPLETED", "137", "was killed by KILL (exit 137) without having exited on the USR2 signal"),
    ("TIMEOUT", "140", "was killed by the USR2 signal itself (exit 140)"),
])
def test_a_payload_killed_after_the_signal_is_not_said_to_have_checkpointed(state, code, said):
    ch = chain()
    info = {"outcome": "continue", "signaled": "1", "exit": code, **TRAINED}
    r = classify(ch, Segment(chain_id="c", idx=0, job_id="7", time_limit_s=3600), row(state), info,
                 checkpoint_time=lambda: 60.0)
    assert r.outcome == "continue" and r.credit_s == 80
    assert "checkpointed" not in r.message and said in r.message
    assert "the last checkpoint is from" in r.message and "30s before it stopped" in r.message


def test_no_checkpoint_found_is_said_and_a_clean_exit_still_checkpointed():
    seg = Segment(chain_id="c", idx=0, job_id="7", time_limit_s=3600)
    killed = {"outcome": "continue", "signaled": "1", "exit": "143", **TRAINED}
    assert "no checkpoint was found" in classify(chain(), seg, row("TIMEOUT"), killed, checkpoint_time=lambda: None).message
    asked = []
    clean = {"outcome": "continue", "signaled": "1", "exit": "0", **TRAINED}
    r = classify(chain(), seg, row("COMPLETED"), clean, checkpoint_time=lambda: asked.append(1))
    assert "checkpointed on the signal" in r.message and not asked  # no folder read for a clean exit


def test_newest_checkpoint_reads_the_folder_through_the_runner(tmp_path):
    import os

    from chainrun.chain.outcomes import newest_checkpoint
    from chainrun.runner.local import LocalRunner

    ch = chain()
    ch.checkpoint_dir = str(tmp_path)
    runner = LocalRunner()
    assert newest_checkpoint(runner, ch) is None  # empty folder
    (tmp_path / "ckpt-10").mkdir()
    (tmp_path / "ckpt-10" / "model.pt").write_text("x")
    os.utime(tmp_path / "ckpt-10" / "model.pt", (1_700_000_100, 1_700_000_100))
    os.utime(tmp_path / "ckpt-10", (1_700_000_000, 1_700_000_000))
    for name in ("steps.log", "ckpt.json.tmp", "CHAINRUN_DONE"):  # written later, but not checkpoints
        (tmp_path / name).write_text("x")
    assert newest_checkpoint(runner, ch) == 1_700_000_100
    ch.checkpoint_dir = str(tmp_path / "missing")
    assert newest_checkpoint(runner, ch) is None


def test_exit_86_without_an_outcome_is_a_blind_node():
    r86 = AcctRow(**{**row("FAILED", code=86).__dict__, "nodelist": "n[2-3]"})
    r = classify(chain(), Segment(chain_id="c", idx=0, job_id="7"), r86, {})
    assert r.outcome == "no-run-folder" and r.credit_s == 0 and "not visible on node n2" in r.reason
    assert classify(chain(), Segment(chain_id="c", idx=0, job_id="7"), r86,
                    {"phase": "training", "payload_start": "10"}).outcome == "crash"  # it trained: not the folder


def test_an_output_file_slurm_could_not_open_is_a_blind_node():
    """sacct's 0:53 (slurmd: "Could not open stdout file"): the script never ran, nothing was written."""
    r53 = AcctRow(**{**row("FAILED", elapsed=0, code=0, sig=53).__dict__, "nodelist": "n4"})
    seg = Segment(chain_id="c", idx=0, job_id="7")
    r = classify(chain(), seg, r53, {})
    assert r.outcome == "no-run-folder" and "not visible on node n4" in r.reason
    assert classify(chain(), seg, r53, {"phase": "waiting"}).outcome != "no-run-folder"  # it ran: something else


# ---------------------------------------------------------------- a successor stopped this owner (control/cancel.<G>)
CUT = {"job": "7", "gen": "3", "by": "9", "by_seg": "4", "timeout": "120", "requested": "1000", "deadline": "1120",
       "how": "scancel", "term_at": "1121", "at": "1182"}


@pytest.mark.parametrize("info", [
    {"phase": "training", "gen": "3", "payload_start": "10"},  # the hard scancel killed the wrapper before it wrote
    {"outcome": "continue", "signaled": "1", "exit": "143", "gen": "3", "cut": "1", **TRAINED},  # wrote on TERM, then cancelled
])
def test_an_owner_its_successor_cancelled_is_never_cancelled_outside_chainrun(info):
    asked = []
    r = classify(chain(), Segment(chain_id="c", idx=3, job_id="7"), row("CANCELLED"), info,
                 cancel_record=lambda gen: asked.append(gen) or CUT)
    assert asked == ["3"] and r.outcome == "continue" and not r.external, r
    for text in (r.reason, r.message):
        assert "segment 4 (job 9) sent it TERM, then cancelled it" in text and "within 2m of the request" in text, text
        assert "--save-timeout" in text and "outside chainrun" not in text


def test_an_owner_stopped_by_its_successors_term_says_who_and_why():
    """TERM through scancel --batch: the wrapper passes it on and ends normally (COMPLETED)."""
    cut = {**CUT, "how": "TERM", "deadline": "1060"}  # the owner's own end (+ grace) came before the timeout
    r = classify(chain(), Segment(chain_id="c", idx=3, job_id="7"), row("COMPLETED"),
                 {"outcome": "continue", "signaled": "1", "exit": "0", "gen": "3", "cut": "1", **TRAINED},
                 cancel_record=lambda g: cut)
    assert r.outcome == "continue" and r.credit_s == 80
    assert "segment 4 (job 9) sent it TERM: it had not handed off by its own end" in r.message, r.message


@pytest.mark.parametrize("record", [{}, {**CUT, "job": "8"}])  # no record, or one about another job
def test_a_cancel_no_chainrun_wrote_down_is_still_external(record):
    r = classify(chain(), Segment(chain_id="c", idx=3, job_id="7"), row("CANCELLED"),
                 {"phase": "training", "gen": "3", "payload_start": "10"}, cancel_record=lambda g: record)
    assert r.outcome == "cancelled" and r.external and "outside chainrun" in r.reason


@pytest.mark.parametrize("info", [{"outcome": "handoff"}, {"outcome": "continue", "signaled": "1", "cut": "0"}])
def test_the_cancel_record_is_read_only_for_a_job_cancelled_or_one_that_saw_it(info):
    asked = []
    r = classify(chain(), Segment(chain_id="c", idx=3, job_id="7"), row("COMPLETED"),
                 {**info, "gen": "3", **TRAINED}, cancel_record=lambda g: asked.append(g) or CUT)
    assert r.outcome == info["outcome"] and asked == [] and "sent it TERM" not in r.message
