"""`chainrun sim`: a --from/--until window that scores no chain, and options that do not apply, fail in one
line (exit 2) before any replay, instead of a run with 0 chains or an option silently ignored."""

from dataclasses import replace

import pytest

from chainrun.errors import UsageError
from chainrun.sim.chain_replay import ChainsConfig, chain_points, check_window, with_work
from chainrun.sim.workload import build_workload
from tests.conftest import run_cli

from .tracegen import T0, frame, sacct_dump, steady

H = 3600.0
ARGS = ["--nodes", "2", "--work", "72h", "--segment", "24h", "--chains-every", "6d", "--workers", "1"]
# steady(40) from T0 (2023-11-14 22:13 UTC): chains start 7 days in, every 6 d, until 6.5 d before the last job
SPAN = "the trace covers 2023-11-14 .. 2023-12-24, its chains start 2023-11-21 22:13 .. 2023-12-18 08:13 every 144 h"


@pytest.fixture
def dump(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text(sacct_dump(frame(steady(40, every_s=2 * H, run_s=3 * H))))
    return p


def _one_line(p, fragment: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[:300], p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert "Traceback" not in p.stderr and len(errors) == 1 and fragment in errors[0], p.stderr
    assert p.stdout == ""  # no table, no JSON with 0 chains
    return errors[0]


@pytest.mark.parametrize("window,words", [
    (["--from", "2030-01-01"], "from 2030-01-01 on"),
    (["--until", "2023-11-20"], "before 2023-11-20"),  # inside the warm-up
    (["--from", "2023-11-25", "--until", "2023-11-26"], "between 2023-11-25 and 2023-11-26"),  # between two points
])
@pytest.mark.parametrize("mode", [[], ["--chains"], ["--chains", "--rolling"], ["--shapes", "2,1"]])
def test_a_window_with_no_chain_names_itself_and_the_trace(window, words, mode, dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), *ARGS, *mode, *window, "--json", home=chainrun_home)
    assert _one_line(p, f"no chain to score {words}: {SPAN}")


def test_from_now_is_after_the_trace(dump, chainrun_home):
    line = _one_line(run_cli("sim", "--trace", str(dump), *ARGS, "--from", "now", home=chainrun_home),
                     "no chain to score from ")
    assert SPAN in line


@pytest.mark.parametrize("until", ["2023-11-01", "2023-12-01"])
def test_from_not_before_until_fails_up_front(until, dump, chainrun_home):
    # a trace that does not exist: the window is refused before it is read
    for trace in (str(dump), "/nonexistent/trace.txt"):
        p = run_cli("sim", "--trace", trace, *ARGS, "--from", "2023-12-01", "--until", until, home=chainrun_home)
        _one_line(p, f"--from 2023-12-01 is not before --until {until}")


def test_a_trace_too_short_for_any_chain(tmp_path, chainrun_home):
    short = tmp_path / "short.txt"
    short.write_text(sacct_dump(frame(steady(8, every_s=2 * H, run_s=3 * H))))
    _one_line(run_cli("sim", "--trace", str(short), *ARGS, home=chainrun_home),
              "no chain to score: the trace covers 2023-11-14 .. 2023-11-22, too short for a chain of 72 h after a "
              "7-day warm-up")


def test_tune_score_from_sets_its_own_windows(dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), *ARGS, "--tune-score-from", "2023-12-05", "--from", "2023-12-05",
                home=chainrun_home)
    _one_line(p, "--tune-score-from splits the trace itself: not with --from or --until")


@pytest.mark.parametrize("extra,names", [
    (["--pace", "a=0.5"], "--pace"),
    (["--transfer", "15m"], "--transfer"),  # the default value, given: still refused
    (["--align", "end"], "--align"),
    (["--site-margin", "1h"], "--site-margin"),
    (["--race", "--transfer", "1h"], "--transfer, --race"),
])
@pytest.mark.parametrize("chains", [[], ["--chains"]])
def test_several_trace_options_with_one_trace(extra, names, chains, dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), *ARGS, *chains, *extra, home=chainrun_home)
    _one_line(p, f"{names}: only with two or more --trace (one given)")


def test_check_window_agrees_with_the_injection_points():
    """The check reads the trace's times itself: it passes exactly when chain_points has a point."""
    tr = frame(steady(40, every_s=2 * H, run_s=3 * H))
    w = build_workload(tr)
    base = with_work(ChainsConfig(nodes=2, chains_every_s=6 * 86400.0), work_s=72 * H, segment_s=24 * H)
    pts = chain_points(w.jobs[-1][0], w.open_at + base.warmup_s, base, (1,))
    assert len(pts) == 5 and pts[0][0] == T0 + 7 * 86400
    for t0, _ in pts:  # a window around each point alone passes; one just after it does not
        check_window(tr, replace(base, inject_from=t0, inject_until=t0 + 1))
        with pytest.raises(UsageError, match="no chain to score between"):
            check_window(tr, replace(base, inject_from=t0 + 1, inject_until=t0 + 3600))


def test_tune_score_from_needs_chains_before_the_split(dump, chainrun_home):
    # was a traceback (min() of an empty sequence) after the whole replay
    p = run_cli("sim", "--trace", str(dump), *ARGS, "--tune-score-from", "2020-01-01", home=chainrun_home)
    line = _one_line(p, "no chain to choose on before --tune-score-from 2020-01-01 (it must start by 2019-12-25 12:00)")
    assert SPAN in line and "a later --tune-score-from" in line


def test_shapes_tune_score_from_needs_chains_after_the_split(dump, chainrun_home):
    # was 0 chains scored, exit 0
    p = run_cli("sim", "--trace", str(dump), *ARGS, "--shapes", "2,1", "--tune-score-from", "2030-01-01",
                home=chainrun_home)
    line = _one_line(p, "no chain to score from --tune-score-from 2030-01-01 on")
    assert SPAN in line and "an earlier --tune-score-from" in line
