"""The progress contract's one parser: whole sane lines only, whatever a killed trainer leaves."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from chainrun.chain import progress
from chainrun.chain.progress import Point, parse_line, parse_lines, parse_read_output, read_argv, segment_progress


def test_line_fields():
    assert parse_line("1700000000.5 12") == Point(1700000000.5, 12)
    assert parse_line("1700000000 12 384 0.25 1000") == Point(1700000000, 12, 384, 0.25, 1000)
    assert parse_line("1700000000 12 - 0.25") == Point(1700000000, 12, None, 0.25, None)
    for bad in ("", "12", "abc 1", "1700000000 nan", "1700000000 inf", "1700000000 -3", "1700000000 1e300",
                "1700000000 1 2 3 4 5", "99 1", "1700000000 1 x"):
        assert parse_line(bad) is None, bad


def test_partial_last_line_and_tail_start_are_dropped():
    text = "1700000000 1\n1700000001 2\n1700000002 3"  # killed while writing "... 3x"
    assert [p.step for p in parse_lines(text)] == [1, 2]
    assert [p.step for p in parse_lines("00000 1\n1700000001 2\n", whole_first=False)] == [2]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_never_breaks_the_parser(text):
    for p in parse_lines(text) + parse_lines(text, whole_first=False):
        assert 0 <= p.step <= progress.MAX_STEP and progress.MIN_EPOCH <= p.t <= progress.MAX_EPOCH


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10, max_value=10**30),
                          st.one_of(st.none(), st.floats()), st.binary(max_size=12))),
       st.integers(min_value=0, max_value=40))
def test_garbage_huge_numbers_and_cuts_never_break_the_pace(rows, cut):
    lines = []
    for t, step, comp, junk in rows:
        lines.append(f"{t} {step} - {comp}\n")
        lines.append(junk.decode("latin-1") + "\n")
        lines.append(f"{1.7e9 + abs(step) % 1000} {abs(step) % 10**6}\n")
    text = "".join(lines)
    text = text[: max(0, len(text) - cut)]
    pts = parse_lines(text)
    prog = segment_progress({(0, "n1"): sorted(pts, key=lambda p: (p.t, p.step))} if pts else {}, read_at=0)
    for r in prog["ranks"]:
        assert r["steps_per_s"] is None or r["steps_per_s"] >= 0


def test_read_command_on_real_files(tmp_path, monkeypatch):
    base = str(tmp_path / "seg-0.progress")
    (tmp_path / "seg-0.progress.0.n1").write_text("".join(f"{1.7e9 + i} {i} {32 * i} 0.5 100\n" for i in range(10)))
    (tmp_path / "seg-0.progress.1.n2").write_text("garbage\n" + "".join(f"{1.7e9 + 2 * i} {i} - 1.0\n" for i in range(5))
                                                  + "17000")
    (tmp_path / "seg-1.progress.0.n3").write_text(f"{1.7e9} 1\n")  # another segment's
    out = subprocess.run(read_argv(base), capture_output=True, text=True).stdout
    ranks = parse_read_output(out, base)
    assert set(ranks) == {(0, "n1"), (1, "n2")}
    prog = segment_progress(ranks, read_at=0)
    assert prog["step"] == 9 and prog["steps"] == 9 and abs(prog["steps_per_s"] - 1) < 1e-9
    assert abs(prog["samples_per_s"] - 32) < 1e-9 and prog["total_steps"] == 100
    assert {r["node"]: r["step_s"] for r in prog["ranks"]} == {"n1": 0.5, "n2": 1.0}


def test_big_file_head_and_tail(tmp_path):
    base = str(tmp_path / "p")
    lines = "".join(f"{1.7e9 + i} {i} - 0.5\n" for i in range(20000))
    (tmp_path / "p.0.n1").write_text(lines + "1700")
    ranks = parse_read_output(subprocess.run(read_argv(base), capture_output=True, text=True).stdout, base)
    pts = ranks[(0, "n1")]
    assert pts[0].step == 0 and pts[-1].step == 19999


def test_helper_and_console_script(tmp_path, monkeypatch):
    base = tmp_path / "seg-3.progress"
    env = {"CHAINRUN_PROGRESS_FILE": str(base), "SLURM_PROCID": "2", "SLURMD_NODENAME": "n4", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", "from chainrun.chain.progress import progress_main; progress_main()",
                        "7", "-", "0.3", "50"], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    monkeypatch.setenv("CHAINRUN_PROGRESS_FILE", str(base))
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "n4")
    assert progress.report(8, 256)
    got = parse_lines((tmp_path / "seg-3.progress.2.n4").read_text())
    assert [(x.step, x.compute_s, x.total, x.samples) for x in got] == [(7, 0.3, 50, None), (8, None, None, 256)]
    bad = subprocess.run([sys.executable, "-c", "from chainrun.chain.progress import progress_main; progress_main()",
                          "1e400"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2


def test_invalid_bytes_and_nul_are_read_through_the_runner(tmp_path):
    """A crashing trainer may leave a NUL or invalid UTF-8: the read command passes printable ASCII only."""
    from chainrun.runner.local import LocalRunner

    base = str(tmp_path / "seg-0.progress")
    (tmp_path / "seg-0.progress.0.n2").write_bytes(b"\xff\x00 junk\n1700000000 1e400\n"
                                                   + b"".join(b"%d %d - 0.5\n" % (1.7e9 + i, i) for i in range(30))
                                                   + b"17000\xff")
    res = LocalRunner().run(read_argv(base), 30)
    assert res.ok, res.stderr
    prog = segment_progress(parse_read_output(res.stdout, base), read_at=0)
    assert prog["nodes"] == ["n2"] and prog["step"] == 29
