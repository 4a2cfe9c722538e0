"""`chainrun sim` end to end on a small sacct -P dump: the JSON shape the external checks read."""

import json

import pytest

from tests.conftest import run_cli

from .tracegen import frame, sacct_dump, steady


@pytest.fixture
def dump(tmp_path):
    p = tmp_path / "sacct.txt"
    p.write_text(sacct_dump(frame(steady(16, every_s=2 * 3600, run_s=3 * 3600))))
    return p


def test_sim_json_on_a_sacct_dump(dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), "--nodes", "2", "--chains-every", "2d", "--json", home=chainrun_home)
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert set(env) == {"chainrun", "schema", "command", "data"} and env["command"] == "sim" and env["schema"] == 2
    out = env["data"]
    assert set(out["fidelity"]) >= {"spearman", "median_ratio", "within_2x"}
    for name in ("reactive", "dependency", "avg", "predicted", "predicted_handoff", "oracle"):
        row = out["policies"][name]
        assert row["transitions"] > 0
        for level in ("low", "medium", "heavy"):
            assert set(row["by_load"][level]) >= {"transitions", "mean_interruption_h", "mean_overlap_h",
                                                  "zero_interruption_share"}


def test_sim_table_prints_fidelity(dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), "--nodes", "2", "--chains-every", "3d", "--workers", "1",
                home=chainrun_home)
    assert p.returncode == 0, p.stderr
    assert "Fidelity" in p.stdout and "predicted_handoff" in p.stdout


@pytest.mark.parametrize("args,fragment", [
    (["--trace", "/nonexistent/trace.log"], "not found"),
    (["--chains-every", "4"], "has no unit"),
    (["--chains-every", "soon"], "invalid --chains-every"),
])
def test_bad_input_is_one_line(args, fragment, dump, chainrun_home):
    full = ["sim", "--trace", str(dump), *args] if args[0] != "--trace" else ["sim", *args]
    p = run_cli(*full, home=chainrun_home)
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert "Traceback" not in p.stderr and len(errors) == 1 and fragment in errors[0], p.stderr
