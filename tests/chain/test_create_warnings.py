"""`#SBATCH` lines that set an option chainrun owns: warned about (naming the line and what chainrun
uses instead), never silently overridden; the same options after `--` stay refused."""

from __future__ import annotations

import json
import subprocess

import pytest

from chainrun.chain.create import script_overrides
from tests.conftest import run_cli

SCRIPT = """#!/bin/bash
# a comment line
#SBATCH --time=10:00
#SBATCH -t 5 -J mine   # two owned options on one line
#SBATCH --job-name=x --signal=USR1@60
#SBATCH --time-min=5 --gres=gpu:1 --comment='--time=5'
#SBATCH -t10
#SBATCH --parsable
#SBATCH --cpus-per-task=1
echo start
#SBATCH --time=3
"""


def _warn(**kw):
    args = dict(script="train.sh", chain_id="train-abcd", segment_s=7200, signal="USR2", signal_lead_s=300)
    return script_overrides(SCRIPT, **{**args, **kw})


def test_each_owned_option_is_named_with_its_line_and_what_chainrun_uses():
    w = _warn()
    assert w == [
        "train.sh line 3 `#SBATCH --time=10:00`: its --time is ignored, chainrun uses --time=0-02:00:00 per "
        "segment (set the segment length with --segment and the run with --total)",
        "train.sh line 4 `#SBATCH -t 5 -J mine   # two owned options on one line`: its --time is ignored, "
        "chainrun uses --time=0-02:00:00 per segment (set the segment length with --segment and the run with --total)",
        "train.sh line 4 `#SBATCH -t 5 -J mine   # two owned options on one line`: its --job-name is ignored, "
        "chainrun uses --job-name=cr.train-abcd.<segment> (name the chain with --name)",
        "train.sh line 5 `#SBATCH --job-name=x --signal=USR1@60`: its --job-name is ignored, chainrun uses "
        "--job-name=cr.train-abcd.<segment> (name the chain with --name)",
        "train.sh line 5 `#SBATCH --job-name=x --signal=USR1@60`: its --signal is ignored, chainrun uses "
        "--signal=B:USR2@300 (choose it with --signal SIG@SECONDS)",
        "train.sh line 7 `#SBATCH -t10`: its --time is ignored, chainrun uses --time=0-02:00:00 per segment "
        "(set the segment length with --segment and the run with --total)",
        "train.sh line 8 `#SBATCH --parsable`: its --parsable is ignored, chainrun uses --parsable itself "
        "(remove the line)",
    ]


def test_not_owned_options_and_lines_after_the_first_command_are_left_alone():
    text = "\n".join(_warn())
    assert "--time-min" not in text and "--gres" not in text and "--cpus-per-task" not in text
    assert "line 6" not in text  # --time-min, and --time=5 only inside a quoted --comment value
    assert "line 11" not in text  # sbatch stops reading directives at `echo start`


def test_a_script_without_owned_options_gives_no_warning():
    ok = "#!/bin/bash\n#SBATCH --cpus-per-task=1\n#SBATCH --partition=short\nsleep 1\n"
    assert script_overrides(ok, script="a.sh", chain_id="a-1", segment_s=60, signal="USR2", signal_lead_s=30) == []


@pytest.mark.slurm
def test_submit_prints_the_warning_on_stderr_and_in_json(slurm_cluster, chainrun_home, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --time=10:00\n#SBATCH --job-name=mine\nsleep 1\n")
    p = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@30", "--json", "--", "--hold",
                home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    try:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert lines == [f"chainrun: warning: {w}" for w in data["warnings"]]
        assert len(data["warnings"]) == 2
        assert "line 2 `#SBATCH --time=10:00`" in data["warnings"][0] and "--time=0-00:02:00" in data["warnings"][0]
        assert "line 3 `#SBATCH --job-name=mine`" in data["warnings"][1]
        assert f"cr.{data['chain']}.<segment>" in data["warnings"][1]
        # what the warning says is what Slurm got: chainrun's limit and name, not the script's
        q = subprocess.run(["squeue", "-h", "-j", data["first_job"], "-o", "%j %l"], capture_output=True,
                           text=True).stdout.split()
        assert q == [f"cr.{data['chain']}.0", "2:00"]
    finally:
        run_cli("cancel", data["chain"], home=chainrun_home)
    text = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@30", "--", "--hold",
                   home=chainrun_home, cwd=tmp_path)
    assert text.returncode == 0 and "chainrun: warning: train.sh line 2" in text.stderr
    assert "chainrun: warning" not in text.stdout
    chain = text.stdout.split()[1].rstrip(":")
    run_cli("cancel", chain, home=chainrun_home)


@pytest.mark.slurm
def test_the_same_option_after_dashdash_is_still_refused(slurm_cluster, chainrun_home, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nsleep 1\n")
    p = run_cli("submit", str(script), "--total", "2m", "--", "--time=5", home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 2 and "set by chainrun" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("segment_s,signal,hint", [
    (30, "USR2@30", "use a --signal time below 30s, e.g. USR2@7, or a longer --segment"),
    (None, "USR1", "use a --signal time below 120s, e.g. USR1@30)"),  # USR1 = USR1@300 > the partition's 2m
])
def test_a_signal_lead_longer_than_the_segment_suggests_one_that_fits(segment_s, signal, hint):
    """The hint was always `USR2@60`: for a 30 s segment a longer lead than the one refused."""
    from chainrun.chain.create import SubmitRequest, _segment_length
    from chainrun.errors import UsageError
    from chainrun.slurm.parsers import PartitionInfo

    req = SubmitRequest(script="/s.sh", script_text="", total_s=180, workdir="/w", segment_s=segment_s, signal=signal)
    part = PartitionInfo(name="short", max_time_s=120, default_time_s=None, is_default=True, state="UP", total_nodes=4)
    with pytest.raises(UsageError) as err:
        _segment_length(req, part, int(signal.partition("@")[2] or 300))
    assert hint in str(err.value)
