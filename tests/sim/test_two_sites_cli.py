"""`chainrun sim --chains --trace A --trace B --json` end to end on two small sacct -P dumps: the JSON the
issue (#26) fixes, the same file twice, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.cli.sim_cmd import render_sites
from tests.conftest import run_cli

from .tracegen import frame, sacct_dump, steady

H = 3600.0
REPO = Path(__file__).resolve().parents[2]
ARGS = ["--nodes", "2", "--work", "72h", "--segment", "24h", "--chains-every", "4d", "--workers", "1"]
LEVELS = ("low", "medium", "heavy")


@pytest.fixture
def dumps(tmp_path):
    a, b = tmp_path / "a.sacct.txt", tmp_path / "b.txt"
    a.write_text(sacct_dump(frame(steady(40, every_s=2 * H, run_s=3 * H))))  # always a queue
    b.write_text(sacct_dump(frame(steady(40, every_s=4 * H, run_s=2 * H))))  # a quieter one
    return a, b


def _data(p) -> dict:
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert env["command"] == "sim" and env["schema"] == 2
    return env["data"]


def _check_rows(pols: dict, names: list[str], race: bool = False) -> None:
    assert list(pols) == [f"reactive:{names[0]}", *(f"predicted:{n}" for n in names), "predicted_multi",
                          *(["predicted_multi_race"] if race else []), "best_single_hindsight"]
    for row in pols.values():
        assert {"n", "stuck", "mean_overhead_h", "gpu_h_twice_share", "by_load"} <= set(row)
        assert row["n"] > 0 and all({"n", "mean_overhead_h"} <= set(row["by_load"][lv]) for lv in LEVELS)
        assert sum(row["by_load"][lv]["n"] for lv in LEVELS) == row["n"]  # every chain binned once
    assert pols["predicted_multi"]["moves"] >= 0 and "segments_by_site" in pols["predicted_multi"]


def test_two_traces_json(dumps, chainrun_home):
    a, b = dumps
    data = _data(run_cli("sim", "--chains", "--trace", str(a), "--trace", str(b), *ARGS, "--transfer", "15m",
                         "--pace", "b=0.8", "--site-margin", "1h", "--race", "--json", home=chainrun_home))
    c, m = data["chains"], data["meta"]
    _check_rows(c["policies"], ["a", "b"], race=True)
    assert c["policies"]["predicted_multi_race"]["moves"] >= 0
    assert c["transfer_min"] == 15 and c["site_margin"]["margin_s"] == 3600 and not c["site_margin"]["chosen"]
    assert [s["name"] for s in m["sites"]] == ["a", "b"] and [s["pace"] for s in m["sites"]] == [1.0, 0.8]
    assert [s["shift_weeks"] for s in m["sites"]] == [0, 0] and set(m["window"]) == {"from", "until"}
    assert m["injections"] == c["policies"]["reactive:a"]["n"] and m["warnings"] == []
    assert set(data["fidelity"]) == {"a", "b"}
    # the same chains in every row: the level is reactive's on the first trace
    by = {n: [r["by_load"][lv]["n"] for lv in LEVELS] for n, r in c["policies"].items()}
    assert len({tuple(v) for v in by.values()}) == 1
    assert "rolling" not in c  # a fixed margin: nothing to choose week by week


def test_the_same_file_twice_is_stem_hash_2_and_the_margin_is_chosen_on_the_older_half(dumps, chainrun_home, capsys,
                                                                                         tmp_path):
    a, _ = dumps
    data = _data(run_cli("sim", "--trace", str(a), "--trace", str(a), *ARGS, "--align", "0w", "--json",
                         home=chainrun_home))
    c, m = data["chains"], data["meta"]
    _check_rows(c["policies"], ["a", "a#2"])
    assert any("a#2 is a copy of a" in w for w in m["warnings"]) and any("equal pace" in w for w in m["warnings"])
    sm = c["site_margin"]
    assert sm["procedure"]["grid_s"] == [0, 1800, 3600, 10800, 21600, 43200] and "split" in sm
    assert sm["scored_chains"] == c["policies"]["reactive:a"]["n"]
    assert set(sm["choice"]) >= {"predicted_multi@0h", "predicted_multi@12h"} and "policies" in c["whole_window"]
    # the margin chosen week by week too: every point scored once, in the same rows
    ro = c["rolling"]
    _check_rows(ro["policies"], ["a", "a#2"])
    assert sum(w["n"] for w in ro["weeks"]) == m["injections"] == ro["policies"]["reactive:a"]["n"]
    assert all(w["margin_s"] in sm["procedure"]["grid_s"] for w in ro["weeks"]) and "targets" in ro
    # the text: `chainrun sim`'s tables and the bench's table both show the rolling rows and the weeks
    render_sites(data)
    text = capsys.readouterr().out
    assert "rolling (margin chosen each week" in text and "rolling weeks (start: margin, chains): " in text
    res = tmp_path / "res.json"
    res.write_text(json.dumps({"data": data}))
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_two_sites.py"), "--table", str(res)],
                       capture_output=True, text=True, cwd=REPO, check=False)
    assert p.returncode == 0, p.stderr
    section = p.stdout.split("rolling (margin chosen each week on the chains ended before it)\n")[1]
    assert section.splitlines()[1].split()[:2] == ["reactive:a", str(m["injections"])] and "  weeks (" in section


@pytest.mark.parametrize("args,fragment", [
    (["--pace", "c=0.5"], "no cluster 'c'"),
    (["--align", "soon"], "--align"),
    ([], "share no stretch"),  # a copy of a 40-day trace a month later leaves no window
    (["--rolling"], "not with --rolling"),
])
def test_bad_input_is_one_line(args, fragment, dumps, chainrun_home):
    a, b = dumps
    second = a if fragment == "share no stretch" else b
    p = run_cli("sim", "--trace", str(a), "--trace", str(second), *ARGS, *args, home=chainrun_home)
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert "Traceback" not in p.stderr and len(errors) == 1 and fragment in errors[0], p.stderr


@pytest.mark.parametrize("window,words", [
    (["--from", "2030-01-01"], "from 2030-01-01 on"),
    (["--from", "2023-11-01", "--until", "2023-11-20"], "between 2023-11-01 and 2023-11-20"),  # the warm-up
])
def test_a_window_outside_the_shared_one_says_so(window, words, dumps, chainrun_home):
    a, b = dumps
    p = run_cli("sim", "--trace", str(a), "--trace", str(b), *ARGS, *window, home=chainrun_home)
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert "Traceback" not in p.stderr and len(errors) == 1 and p.stdout == "", p.stderr
    # not "share no stretch": the traces do share one, the window misses it
    assert (f"no chain to score {words}: --from/--until fall outside the traces' shared window 2023-11-21 22:13 .. "
            "2023-12-18 06:13 (where chains start, every 96 h, after the shifts [0, 0] weeks)") in errors[0], errors[0]


def test_from_not_before_until_fails_before_the_traces_are_read(chainrun_home):
    p = run_cli("sim", "--trace", "/nonexistent/a.txt", "--trace", "/nonexistent/b.txt", *ARGS,
                "--from", "2030-01-01", "--until", "2020-01-01", home=chainrun_home)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().endswith("--from 2030-01-01 is not before --until 2020-01-01: the window holds no chain")
