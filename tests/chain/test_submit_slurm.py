"""`chainrun submit` against the real cluster: defaults read from Slurm, refusals before anything is queued."""

import json
import subprocess

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm
TOY = str(REPO / "templates" / "toy_train.sh")


def test_segment_defaults_to_partition_maxtime_and_cancel(slurm_cluster, chainrun_home, tmp_path):
    p = run_cli("submit", TOY, "--total", "5m", "--signal", "USR2@30", "--json", home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    assert data["segment_s"] == 120  # the test partition's MaxTime
    job = data["first_job"]
    q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%j %l"], capture_output=True, text=True).stdout.split()
    assert q == [f"cr.{data['chain']}.0", "2:00"]
    wrapper = (tmp_path / "chainrun-runs" / data["chain"] / "wrapper.sh").read_text()
    assert "#SBATCH --cpus-per-task=1" in wrapper  # the user's #SBATCH lines are carried over
    c = run_cli("cancel", data["chain"], home=chainrun_home)
    assert c.returncode == 0 and job in c.stdout
    st = json.loads(run_cli("status", data["chain"], "--json", home=chainrun_home).stdout)["data"][0]
    assert st["status"] == "CANCELLED"
    assert run_cli("cancel", data["chain"], home=chainrun_home).returncode == 2  # already cancelled


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--segment", "5m"], "longer than partition"),
        (["--", "--partition=nope"], "no partition 'nope'"),
        (["--", "--time=10"], "set by chainrun"),
        (["--signal", "USR2@200"], "lasts only"),
    ],
)
def test_refusals_queue_nothing(slurm_cluster, chainrun_home, tmp_path, extra, fragment):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    p = run_cli("submit", TOY, "--total", "10m", *extra, home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert fragment in p.stderr and "Traceback" not in p.stderr
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert set(after.split()) <= set(before.split())


def test_sbatch_refusal_keeps_the_chain_as_failed(slurm_cluster, chainrun_home, tmp_path):
    p = run_cli("submit", TOY, "--total", "5m", "--signal", "USR2@30", "--", "--gres=gpu:99",
                home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 4 and "sbatch failed" in p.stderr and "Traceback" not in p.stderr
    st = json.loads(run_cli("status", "--json", home=chainrun_home).stdout)["data"]
    assert st[0]["status"] == "FAILED" and "first segment refused" in st[0]["reason"]


def test_users_own_output_is_kept(slurm_cluster, chainrun_home, tmp_path):
    script = tmp_path / "mine.sh"
    script.write_text("#!/bin/bash\n#SBATCH --output=my-%j.log\nsleep 1\n")
    p = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@30", "--json", home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    out = subprocess.run(["scontrol", "show", "job", data["first_job"]], capture_output=True, text=True).stdout
    assert f"StdOut={tmp_path}/my-{data['first_job']}.log" in out
    run_cli("cancel", data["chain"], home=chainrun_home)


def test_default_output_is_per_segment_in_the_run_folder(slurm_cluster, chainrun_home, tmp_path):
    p = run_cli("submit", TOY, "--total", "2m", "--signal", "USR2@30", "--json", home=chainrun_home, cwd=tmp_path)
    data = json.loads(p.stdout)["data"]
    out = subprocess.run(["scontrol", "show", "job", data["first_job"]], capture_output=True, text=True).stdout
    assert f"StdOut={data['run_dir']}/logs/cr.{data['chain']}.0-{data['first_job']}.out" in out
    run_cli("cancel", data["chain"], home=chainrun_home)
