"""`chainrun cluster test --probe` on the real cluster: a compute node reads a token written on the
submit side and says what filesystem it sees; a node that does not find the token is reported."""

from __future__ import annotations

import json
import re

import pytest

from chainrun.probe import probe
from chainrun.runner.local import LocalRunner
from chainrun.slurm.client import SlurmClient
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm


def test_probe_proves_a_node_sees_the_folder(slurm_cluster, chainrun_home, tmp_path):
    tmp_path = tmp_path / "runs"
    tmp_path.mkdir()
    p = run_cli("cluster", "test", "local", "--probe", "--folder", str(tmp_path), "--json", home=chainrun_home,
                timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["data"]["probe"]
    assert got["sees_token"] is True and got["state"] == "COMPLETED" and re.fullmatch(r"n[1-4]", got["node"])
    assert got["node_mount"].split(" ")[0].startswith("/") and got["node_fstype"]  # what the node itself said
    assert f"compute node {got['node']} sees {tmp_path}" in got["verdict"]
    assert not list(tmp_path.iterdir())  # the probe's own folder is removed
    # no NAME: the default cluster, as submit's /tmp warning (`chainrun cluster test --probe`) tells a user to run it
    text = run_cli("cluster", "test", "--probe", "--folder", str(tmp_path), home=chainrun_home, timeout=300)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("local: connected") and "probe (job " in text.stdout and "the node's mount: " in text.stdout


class _TokenLost(LocalRunner):
    """The submit side writes the token where the compute node does not look (as when the folder the
    login node sees is not the one the node mounts): everything else is real."""

    def write_file(self, path, content, mode=0o644):
        if not path.endswith("/token"):
            super().write_file(path, content, mode)


def test_probe_reports_a_node_that_does_not_see_the_token(slurm_cluster, tmp_path):
    runner = _TokenLost()
    got = probe(runner, SlurmClient(runner), str(tmp_path), wait_s=240)
    assert got.sees_token is False and got.state == "FAILED", got
    assert got.verdict.startswith(f"compute node {got.node} does not see {tmp_path}") and "shared filesystem" in got.verdict
