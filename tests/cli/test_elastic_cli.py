"""Bad --shapes / --shape-efficiency / --time-min: one clear line, exit 2, before any Slurm call."""

import pytest

from tests.conftest import REPO, run_cli

TOY = str(REPO / "templates" / "toy_train.sh")


@pytest.mark.parametrize("extra, fragment", [
    (["--shapes", "0"], "--shapes '0': a shape needs at least 1 node, not 0"),
    (["--shapes", "4,two"], "'two' is not a node count"),
    (["--shapes", "4,-2"], "'-2' is not a node count"),
    (["--shapes", "4,2.5"], "'2.5' is not a node count"),
    (["--shapes", "4,,2"], "give node counts separated by commas"),
    (["--shapes", "4,4"], "4 is listed twice"),
    (["--shapes", "4,2", "--shape-efficiency", "2=fast"], "'2=fast' is not NODES=EFFICIENCY"),
    (["--shapes", "4,2", "--shape-efficiency", "3=0.9"], "3 nodes is not one of --shapes 4,2"),
    (["--shape-efficiency", "2=0.9"], "--shape-efficiency needs --shapes"),
    (["--time-min", "soon"], "invalid --time-min"),
    (["--filler", "6"], "--filler needs --shapes"),
    (["--shapes", "4,2", "--filler", "0"], "--filler 0: give a positive number of segment boundaries"),
    (["--shapes", "4,2", "--filler", "-1"], "--filler -1: give a positive number"),
])
def test_bad_elastic_options_are_one_line_errors(extra, fragment, chainrun_home, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")  # proves no Slurm call is needed
    p = run_cli("submit", TOY, "--total", "10m", *extra, home=chainrun_home)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert len(errors) == 1 and fragment in errors[0], p.stderr
