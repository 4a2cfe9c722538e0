"""The wrapper and the contract helpers, without Slurm."""

import os
import subprocess

import pytest

from chainrun.chain.contract import option_value, parse_outcome, render_wrapper, sbatch_lines, sbatch_options
from chainrun.chain.create import parse_signal
from chainrun.errors import UsageError

SCRIPT = """#!/bin/bash
# a comment
#SBATCH --gres=gpu:2
#SBATCH -p gpu   # inline comment
#SBATCH --time=10:00

python train.py
#SBATCH --ignored=after-the-first-command
"""


def test_sbatch_lines_stop_at_first_command():
    assert sbatch_lines(SCRIPT) == ["#SBATCH --gres=gpu:2", "#SBATCH -p gpu   # inline comment", "#SBATCH --time=10:00"]
    opts = sbatch_options(SCRIPT)
    assert option_value(opts, "--partition", "-p") == "gpu"
    assert option_value(opts, "--gres") == "gpu:2"
    assert option_value(["-pdebug"], "--partition", "-p") == "debug"
    assert option_value(["--partition=a", "-p", "b"], "--partition", "-p") == "b"


def test_wrapper_quotes_everything_and_is_valid_bash(tmp_path):
    nasty = "/tmp/we ird;$(touch /tmp/pwned)'\"/run"
    text = render_wrapper(chain_id="c-1", run_dir=nasty, checkpoint_dir=nasty + "/ckpt",
                          payload="/x/it's here.sh", signal="USR2", script_text=SCRIPT)
    assert "@@" not in text
    assert "#SBATCH --gres=gpu:2" in text and "--ignored" not in text
    w = tmp_path / "w.sh"
    w.write_text(text)
    assert subprocess.run(["bash", "-n", str(w)]).returncode == 0
    # the values survive as literal strings
    probe = subprocess.run(["bash", "-c", f"source <(sed -n '/^CHAINRUN_CHAIN_ID=/,/^CHAINRUN_HANDOFF_TIMEOUT=/p' {w}); "
                            "printf '%s\\n' \"$CHAINRUN_RUN_DIR\" \"$CHAINRUN_PAYLOAD\""], capture_output=True, text=True)
    assert probe.stdout.splitlines() == [nasty, "/x/it's here.sh"]
    assert not os.path.exists("/tmp/pwned")


def test_parse_outcome():
    info = parse_outcome("outcome=handoff\nexit=0\nsignaled=1\njob=5\n")
    assert info["outcome"] == "handoff" and info["job"] == "5"
    assert "outcome" not in parse_outcome("outcome=rm -rf\n")


@pytest.mark.parametrize("text,expected", [("USR2@300", ("USR2", 300)), ("sigusr1@60", ("USR1", 60)),
                                           ("B:USR2@90", ("USR2", 90)), ("TERM", ("TERM", 300))])
def test_parse_signal(text, expected):
    assert parse_signal(text) == expected


@pytest.mark.parametrize("text", ["KILL@10", "USR2@", "USR2@-1", "USR2@abc", "", "USR2@99999"])
def test_parse_signal_rejects(text):
    with pytest.raises(UsageError):
        parse_signal(text)
