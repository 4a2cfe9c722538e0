"""A chain spanning clusters, the parts that need no cluster: `--cluster a,b`, `--gpu-mem`/`--dtype`
against declared GPUs, the site tables of config.toml (one-line errors naming the file and the key,
kept by `cluster add`/`remove`), the environment file and the preflight job's request.
The real checks on two real clusters are in tests/ssh/test_sites_slurm.py."""

from __future__ import annotations

import pytest

from chainrun import clusters
from chainrun.chain import preflight
from chainrun.chain.sites import GpuNeed, gpu_fit, parse_gpu_need, parse_sites, with_env_file
from chainrun.errors import SiteRefused, UsageError
from chainrun.runner.local import LocalRunner
from chainrun.site_config import settings_from
from chainrun.state.records import Chain
from tests.conftest import run_cli


def test_cluster_list_keeps_the_order_of_preference():
    assert parse_sites("b,a") == ["b", "a"]
    assert parse_sites("local") == ["local"]
    assert parse_sites(" a , b ") == ["a", "b"]
    for bad, word in (("a,,b", "empty"), ("a,b,a", "twice"), ("a,all", "all")):
        with pytest.raises(UsageError, match=word):
            parse_sites(bad)


def test_declared_gpus_against_the_chains_need():
    big = settings_from({"gpu": {"memory": "80G", "dtypes": ["bf16", "fp16"]}})
    small = settings_from({"gpu": {"memory": 40, "dtypes": ["fp16", "fp32"]}})
    need = parse_gpu_need("48G", "bfloat16")
    assert need == GpuNeed(48 * 1024, "bf16")
    assert gpu_fit("a", big, need) == "GPU memory 80G >= 48G; GPUs support bf16"
    with pytest.raises(SiteRefused, match=r"^cluster b: its GPUs have 40G of memory, the chain needs 48G"):
        gpu_fit("b", small, need)
    with pytest.raises(SiteRefused, match=r"^cluster b: its GPUs do not support bf16 \(declared: fp16, fp32\)"):
        gpu_fit("b", small, GpuNeed(None, "bf16"))
    # nothing declared: nothing to hold it against, and the note says so (never a silent pass)
    assert "not declared" in gpu_fit("c", settings_from({}), need)
    assert gpu_fit("c", settings_from({}), GpuNeed()) == ""
    with pytest.raises(UsageError, match="--gpu-mem"):
        parse_gpu_need("lots", None)
    with pytest.raises(UsageError, match="--dtype"):
        parse_gpu_need(None, "bf17")


def _home(tmp_path, monkeypatch, text: str):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(text)
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    return home / "config.toml"


SITE_CONFIG = """\
default = "a"
[notify]
mail = "me@example.org"

[clusters.a]
host = "login.a.example.org"
workdir = "/scratch/me"

[clusters.a.sbatch]
account = "proj42"
partition = "gpu"
gres = "gpu:a100:4"
args = ["--qos=normal"]

[clusters.a.gpu]
memory = "80G"
dtypes = ["bf16", "fp16"]

[clusters.a.job]
env_file = "/scratch/me/env.sh"
preflight = "test -d /scratch/me/data"
preflight_time = "3m"
pace = 0.6
restart = "2m30s"

[clusters.local.sbatch]
args = ["--exclude=n1"]
"""


def test_site_tables_are_read_and_kept_when_the_file_is_rewritten(tmp_path, monkeypatch):
    path = _home(tmp_path, monkeypatch, SITE_CONFIG)
    a = clusters.site_settings("a")
    assert a.sbatch_options() == ["--account=proj42", "--partition=gpu", "--gres=gpu:a100:4", "--qos=normal"]
    assert (a.gpu_memory_mb, a.gpu_dtypes, a.preflight_s) == (80 * 1024, ("bf16", "fp16"), 180)
    assert (a.pace, a.restart_s) == (0.6, 150)  # declared for the site rule (chain/site_pace.py)
    assert (clusters.site_settings("local").pace, clusters.site_settings("local").restart_s) == (None, None)
    assert clusters.site_options("a") == a.sbatch_options()
    assert clusters.site_options("local") == ["--exclude=n1"]  # local is configurable too
    assert clusters.site_options("other") == []
    # `cluster add` of another cluster rewrites the file: every site table stays, [notify] too
    p = run_cli("cluster", "add", "z", "--host", "z.example.org", "--no-check", home=path.parent)
    assert p.returncode == 0, p.stderr
    cfg = clusters.load()
    assert set(cfg.clusters) == {"a", "z"} and cfg.sites["a"]["gpu"] == {"memory": "80G", "dtypes": ["bf16", "fp16"]}
    assert clusters.site_settings("a") == a and clusters.site_options("local") == ["--exclude=n1"]
    assert 'mail = "me@example.org"' in path.read_text()
    # removing a cluster removes its site tables (a table left behind would be a cluster with no host)
    p = run_cli("cluster", "remove", "a", home=path.parent)
    assert p.returncode == 0, p.stderr
    assert "clusters.a." not in path.read_text()
    assert clusters.load().sites == {"local": {"sbatch": {"args": ["--exclude=n1"]}}}


@pytest.mark.parametrize("table, key_line, words", [
    ("[clusters.a.gpu]", 'memory = "lots"', "[clusters.a.gpu] memory 'lots' is not a size"),
    ("[clusters.a.gpu]", 'dtypes = ["bf16", "bf17"]', "[clusters.a.gpu] dtypes: unknown 'bf17'"),
    ("[clusters.a.sbatch]", 'acount = "x"', "[clusters.a.sbatch] has an unknown key 'acount'"),
    ("[clusters.a.sbatch]", 'args = "--qos=x"', "[clusters.a.sbatch] args must be a list of strings"),
    ("[clusters.a.sbatch]", 'args = ["--time=5"]', "[clusters.a.sbatch] args: --time=5 is chainrun's to set"),
    ("[clusters.a.job]", 'script = "train.sh"', "[clusters.a.job] script must be an absolute path"),
    ("[clusters.a.job]", 'preflight_time = "soon"', "[clusters.a.job] preflight_time 'soon' is not a duration"),
    ("[clusters.local]", 'host = "x"', "[clusters.local] takes only site tables"),
    ("[clusters.a.job]", "pace = 0", "[clusters.a.job] pace must be a number from 0.01 to 100, e.g. 0.6"),
    ("[clusters.a.job]", 'pace = "fast"', "[clusters.a.job] pace must be a number"),
    ("[clusters.a.job]", "pace = true", "[clusters.a.job] pace must be a number"),
    ("[clusters.a.job]", "pace = nan", "[clusters.a.job] pace must be a number"),
    ("[clusters.a.job]", 'restart = "soon"', "[clusters.a.job] restart 'soon' is not a duration"),
    ("[clusters.a.job]", 'restart = "2d"', "[clusters.a.job] restart '2d' is not a duration of a day or less"),
    ("[clusters.a.job]", "restart = 180", "[clusters.a.job] restart must be a non-empty string"),
])
def test_a_bad_site_table_is_one_line_naming_the_file_and_the_key(tmp_path, monkeypatch, table, key_line, words):
    path = _home(tmp_path, monkeypatch, f'[clusters.a]\nhost = "h"\n\n{table}\n{key_line}\n')
    (tmp_path / "x.sh").write_text("#!/bin/bash\ntrue\n")
    p = run_cli("submit", "x.sh", "--total", "1h", "--cluster", "a,local", home=path.parent, cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_the_environment_file_is_sourced_after_the_sbatch_header():
    text = "#!/bin/bash\n# train\n#SBATCH --gres=gpu:1\n\npython train.py\n"
    out = with_env_file("a", text, "/w/env it's.sh")
    lines = out.splitlines()
    assert lines[:4] == ["#!/bin/bash", "# train", "#SBATCH --gres=gpu:1", ""]  # sbatch still reads the header
    assert lines[4].startswith(". '/w/env it'\\''s.sh' || ") and lines[5] == "python train.py"
    with pytest.raises(SiteRefused, match="^cluster a: env_file needs a shell script"):
        with_env_file("a", "#!/usr/bin/env python3\nprint(1)\n", "/w/env.sh")


def test_the_preflight_job_is_tiny_and_never_taken_for_a_segment():
    ch = Chain(id="t-1a2b3c4d", name="t", cluster="a", script="/w/t.sh", workdir="/w", run_dir="/w/r",
               checkpoint_dir="/w/r/checkpoint", total_s=3600, segment_s=1200, policy="lead", lead_s=60,
               signal="USR2", signal_lead_s=300, retries=1, partition="gpu",
               sbatch_args=["--account=p", "--nodes=8", "--exclusive", "--gres=gpu:4", "-w", "n1", "--output=/o"])
    job = preflight.plan("a", LocalRunner(), "test -d data", site_chain=ch, env_file="/w/env.sh", time_s=120)
    assert list(job.sbatch_args) == ["--account=p", "--gres=gpu:4", "--nodes=1", "--ntasks=1", "--time=0-00:02:00",
                                     "--job-name=cr-preflight.t-1a2b3c4d", "--output=/w/r/logs/preflight-%j.out",
                                     "--chdir=/w"]
    from chainrun.chain.segments import parse_job_name

    assert parse_job_name("cr-preflight.t-1a2b3c4d") is None
    assert ". /w/env.sh ||" in job.script_text and job.script_text.rstrip().endswith("test -d data")
    assert "export CHAINRUN_CLUSTER=a" in job.script_text
