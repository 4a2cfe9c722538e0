"""The folders `chainrun submit` lays out: never an existing one, private by default (or the mode of
config.toml), and a warning when one sits on a node-local filesystem. Chain ids and job names."""

from __future__ import annotations

import json
import re
import stat
import subprocess

import pytest

from chainrun.chain.create import make_chain_id, make_folders, node_local_warnings
from chainrun.clusters import run_mode
from chainrun.errors import UsageError
from chainrun.runner.local import LocalRunner
from tests.conftest import REPO, run_cli

TOY = str(REPO / "templates" / "toy_train.sh")


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_chain_ids_keep_their_form_with_8_hex_digits():
    ids = {make_chain_id("my train.py") for _ in range(50)}
    assert all(re.fullmatch(r"my-train-py-[0-9a-f]{8}", i) for i in ids) and len(ids) == 50


def test_folders_are_private_and_an_existing_run_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_NODE_LOCAL_OK", "1")
    run = tmp_path / "chainrun-runs" / "c-0123abcd"
    make_folders(LocalRunner(), str(run), str(run / "checkpoint"), 0o700)
    for p in (run, run / "control", run / "logs", run / "checkpoint"):
        assert _mode(p) == 0o700, p
    with pytest.raises(UsageError, match="exists already; chainrun never reuses one"):
        make_folders(LocalRunner(), str(run), str(run / "checkpoint"), 0o700)


def test_a_team_mode_and_a_checkpoint_folder_of_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_NODE_LOCAL_OK", "1")
    mine = tmp_path / "ckpts"
    mine.mkdir(mode=0o755)
    run = tmp_path / "runs" / "c-0123abcd"
    make_folders(LocalRunner(), str(run), str(mine), 0o750)
    assert _mode(run / "control") == 0o750 and _mode(mine) == 0o755  # an existing folder keeps its mode
    make_folders(LocalRunner(), str(tmp_path / "runs" / "c-2"), str(tmp_path / "new" / "ck"), 0o750)
    assert _mode(tmp_path / "new" / "ck") == 0o750


@pytest.mark.parametrize("text,mode", [(None, 0o700), ('"0750"', 0o750), ('"770"', 0o770)])
def test_run_mode_from_config(chainrun_home, text, mode):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    if text:
        (chainrun_home / "config.toml").write_text(f"[run]\nmode = {text}\n")
    assert run_mode() == mode


@pytest.mark.parametrize("text,words", [('"0600"', "read, write and enter"), ('"0777"', "every user"),
                                        ("750", "octal permissions in quotes"), ('"rwx"', "octal")])
def test_a_bad_run_mode_is_one_clear_error(chainrun_home, text, words):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    (chainrun_home / "config.toml").write_text(f"[run]\nmode = {text}\n")
    with pytest.raises(UsageError, match=words):
        run_mode()


def test_node_local_folders_are_warned_about(monkeypatch):
    monkeypatch.delenv("CHAINRUN_NODE_LOCAL_OK", raising=False)
    monkeypatch.setenv("TMPDIR", "/local/job")
    got = node_local_warnings(LocalRunner(), {"run folder": "/tmp/x/run", "checkpoint folder": "/local/job/ck",
                                              "other": "/scratch/me/run", "shm": "/dev/shm/a"})
    assert len(got) == 3
    assert got[0].startswith("the run folder /tmp/x/run is under /tmp, which each compute node usually has")
    assert "under /local/job" in got[1] and "cluster test --probe" in got[1] and "/dev/shm" in got[2]
    assert node_local_warnings(LocalRunner(), {"run folder": "/tmpfoo/run"}) == []
    monkeypatch.setenv("CHAINRUN_NODE_LOCAL_OK", "1")  # one host: every "node" sees /tmp (docs/cli.md says how)
    assert node_local_warnings(LocalRunner(), {"run folder": "/tmp/x/run"}) == []
    assert "`CHAINRUN_NODE_LOCAL_OK=1`" in (REPO / "docs" / "cli.md").read_text()


@pytest.mark.slurm
def test_submit_folders_on_the_real_cluster(slurm_cluster, chainrun_home, tmp_path):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    (chainrun_home / "config.toml").write_text('[run]\nmode = "0750"\n')
    p = run_cli("submit", TOY, "--total", "5m", "--signal", "USR2@30", "--json", home=chainrun_home, cwd=tmp_path,
                env={"CHAINRUN_NODE_LOCAL_OK": "0"})
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    try:
        assert re.fullmatch(r"toy_train-[0-9a-f]{8}", data["chain"])
        q = subprocess.run(["squeue", "-h", "-j", data["first_job"], "-o", "%j"], capture_output=True, text=True)
        assert q.stdout.strip() == f"cr.{data['chain']}.0"
        run = tmp_path / "chainrun-runs" / data["chain"]
        assert {p.name: _mode(p) for p in (run, run / "control", run / "checkpoint")} == \
               {data["chain"]: 0o750, "control": 0o750, "checkpoint": 0o750}
        warned = [line for line in p.stderr.splitlines() if "which each compute node usually has to itself" in line]
        assert len(warned) == 2 and warned[0].startswith(f"chainrun: warning: the run folder {run} is under /tmp")
    finally:
        run_cli("cancel", data["chain"], home=chainrun_home)
