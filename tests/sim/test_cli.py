"""`chainrun sim` end to end on a small sacct -P dump: one replay, the whole-chain one, which runs the
shipped policy classes; the per-transition replay (its own copies of the rules) was retired."""

import json

import pytest

from tests.conftest import run_cli

from .tracegen import frame, sacct_dump, steady

H = 3600.0
ARGS = ["--nodes", "2", "--work", "72h", "--segment", "24h", "--chains-every", "6d", "--workers", "1"]


@pytest.fixture
def dump(tmp_path):
    p = tmp_path / "sacct.txt"
    p.write_text(sacct_dump(frame(steady(40, every_s=2 * H, run_s=3 * H))))  # 2 nodes, always a queue
    return p


def _data(p) -> dict:
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert set(env) == {"chainrun", "schema", "command", "data"} and env["command"] == "sim" and env["schema"] == 2
    data = env["data"]
    data["meta"].pop("seconds", None)  # wall clock
    data["meta"].pop("cost", None)  # wall clock per worker
    return data


def test_sim_is_the_whole_chain_replay_with_or_without_chains(dump, chainrun_home):
    plain = _data(run_cli("sim", "--trace", str(dump), *ARGS, "--json", home=chainrun_home))
    assert plain == _data(run_cli("sim", "--trace", str(dump), "--chains", *ARGS, "--json", home=chainrun_home))
    assert set(plain["fidelity"]) >= {"spearman", "median_ratio", "within_2x"}
    for name in ("reactive", "dependency", "avg", "predicted", "oracle"):
        row = plain["chains"]["policies"][name]
        assert row["n"] > 0 and row["mean_overhead_h"] is not None
        # Mirage's per-transition metric, now from the shipped classes: every boundary of every chain
        assert {"mean_interruption_h", "zero_interruption_share"} <= set(row["transitions"])


def test_sim_table_prints_fidelity(dump, chainrun_home):
    p = run_cli("sim", "--trace", str(dump), *ARGS, home=chainrun_home)
    assert p.returncode == 0, p.stderr
    assert "Fidelity" in p.stdout and "predicted" in p.stdout and "per transition" in p.stdout


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


def test_a_stray_row_from_1970_is_named_not_an_internal_error(dump, chainrun_home):
    """Slurm's unset time (epoch 0, printed in US Central) in one row: fair share's decay overflowed."""
    text = dump.read_text() + "99999|u0|1969-12-31T18:00:00|1969-12-31T18:00:00|1969-12-31T19:00:00|360|1|COMPLETED\n"
    dump.write_text(text)
    p = run_cli("sim", "--trace", str(dump), *ARGS, "--json", home=chainrun_home)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "job 99999 has submit 1969-12-31" in p.stderr, p.stderr


def test_rows_set_aside_are_warnings_in_the_result(dump, chainrun_home):
    dump.write_text(dump.read_text() + "123|u1|2023-01-01T00:00:00\n")  # a cut last line
    data = _data(run_cli("sim", "--trace", str(dump), *ARGS, "--json", home=chainrun_home))
    assert data["meta"]["warnings"] == ["1 row(s) without the 8 fields the header names: skipped"]
