"""`chainrun cluster ...` through the real CLI: config files, host-key trust, ~/.ssh/config,
and no secret in any output or file chainrun writes."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.ssh.conftest import REMOTE_USER, make_home

pytestmark = pytest.mark.ssh


def fingerprint(server) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(server.dir / "ssh_host_ed25519_key.pub")], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


def test_add_list_default_remove_and_private_files(tmp_path, ssh_server):
    home = tmp_path / "home"  # created by chainrun itself
    assert run_cli(*ssh_server.add_args("lo"), "--accept-new-host-key", home=home).returncode == 0
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for f in ("config.toml", "known_hosts"):
        assert stat.S_IMODE((home / f).stat().st_mode) == 0o600, f
    p = run_cli("cluster", "list", "--json", home=home)
    rows = json.loads(p.stdout)["data"]
    assert [r["name"] for r in rows] == ["local", "lo"] and rows[0]["default"]
    assert run_cli("cluster", "default", "lo", home=home).returncode == 0
    assert "* lo" in run_cli("cluster", "list", home=home).stdout
    assert stat.S_IMODE((home / "config.toml").stat().st_mode) == 0o600  # still, after a rewrite
    bad = run_cli("cluster", "add", "local", "--host", "x", home=home)
    assert bad.returncode == 2 and "reserved" in bad.stderr
    assert run_cli("cluster", "remove", "lo", home=home).returncode == 0
    gone = run_cli("cluster", "test", "lo", home=home)
    assert gone.returncode == 3 and "no cluster 'lo'" in gone.stderr


def test_cluster_test_reports_slurm_and_partitions(ssh_home):
    p = run_cli("cluster", "test", "lo", "--json", home=ssh_home)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["data"]
    assert d["slurm_version"].startswith("slurm")
    parts = {x["name"]: x for x in d["partitions"]}
    assert parts["short"]["default"] and parts["short"]["max_time_s"] == 120
    assert d["others_jobs_visible"] is True
    text = run_cli("cluster", "test", "lo", home=ssh_home).stdout
    assert "partition short (default): max 2m" in text


def test_unknown_host_key_refused_until_accepted(tmp_path, ssh_server):
    home = make_home(tmp_path / "home", {"lo": ssh_server}, trust=False)
    p = run_cli("cluster", "test", "lo", home=home)
    assert p.returncode == 8
    assert fingerprint(ssh_server) in p.stderr and "--accept-new-host-key" in p.stderr
    assert "Traceback" not in p.stderr
    p = run_cli(*ssh_server.add_args("lo"), "--accept-new-host-key", home=home)
    assert p.returncode == 0 and fingerprint(ssh_server) in p.stdout
    assert stat.S_IMODE((home / "known_hosts").stat().st_mode) == 0o600
    assert run_cli("cluster", "test", "lo", home=home).returncode == 0


def test_changed_host_key_refused_even_with_accept_new(tmp_path, ssh_server):
    home = make_home(tmp_path / "home", {"lo": ssh_server}, trust=False)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    (home / "known_hosts").write_text(f"[127.0.0.1]:{ssh_server.port} "
                                      + " ".join((tmp_path / "k.pub").read_text().split()[:2]) + "\n")
    for args in (["cluster", "test", "lo"], [*ssh_server.add_args("lo"), "--accept-new-host-key"]):
        p = run_cli(*args, home=home)
        assert p.returncode == 8 and "CHANGED" in p.stderr, p.stderr


def test_ssh_config_alias_is_honoured(tmp_path, ssh_server):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host testhpc\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User {REMOTE_USER}\n"
                   f"  IdentityFile {ssh_server.key}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text(ssh_server.known_hosts.read_text())
    env = {"CHAINRUN_SSH_CONFIG": str(cfg)}
    assert run_cli("cluster", "add", "testhpc", "--host", "testhpc", home=home, env=env).returncode == 0
    p = run_cli("cluster", "test", "testhpc", "--json", home=home, env=env)
    assert p.returncode == 0, p.stderr


def test_no_secret_in_logs_json_or_config(ssh_home, ssh_server):
    key_text = Path(ssh_server.key).read_text()
    secret_lines = [line for line in key_text.splitlines() if line and "-----" not in line]
    outputs = [run_cli("-vv", "cluster", "test", "lo", "--json", home=ssh_home),
               run_cli("-vv", "cluster", "list", "--json", home=ssh_home),
               run_cli("-vv", "status", "--json", "--cluster", "lo", home=ssh_home)]
    texts = [o.stdout + o.stderr for o in outputs] + [f.read_text(errors="replace") for f in ssh_home.rglob("*")
                                                    if f.is_file() and f.suffix != ".sqlite"]
    assert all(o.returncode == 0 for o in outputs), [o.stderr for o in outputs]
    for t in texts:
        assert "PRIVATE KEY" not in t
        assert not any(line in t for line in secret_lines)
    assert "password" not in (ssh_home / "config.toml").read_text().replace("passwords are never stored", "")
    for f in ("config.toml", "state.sqlite"):  # state too: it names hosts, paths and scripts
        assert stat.S_IMODE((ssh_home / f).stat().st_mode) == 0o600, f
    for d in [ssh_home, *[p for p in ssh_home.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.slurm
def test_model_refresh_and_predict_all_over_ssh(ssh_home, slurm_cluster):
    p = run_cli("model", "refresh", "--cluster", "lo", "--json", home=ssh_home, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["history_rows"] >= 20  # sacct history read through SSH
    p = run_cli("predict", "--cluster", "all", "--time", "10m", "--json", home=ssh_home)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    assert [r["cluster"] for r in data["ranked"]] == ["lo"]  # local has no model in this home
    assert data["unavailable"][0]["cluster"] == "local" and "no queue-delay model" in data["unavailable"][0]["error"]


@pytest.mark.slurm
def test_submit_uploads_into_the_chain_folder_and_cancel_reaches_the_cluster(ssh_home, slurm_cluster, tmp_path):
    from tests.conftest import REPO

    p = run_cli("submit", str(REPO / "templates" / "toy_train.sh"), "--cluster", "lo", "--total", "2m",
                "--policy", "lead", "--signal", "USR2@50", "--json", "--", "--hold", "--exclude=n1,n2", home=ssh_home, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["data"]
    run_dir = Path(d["run_dir"])
    assert d["cluster"] == "lo" and run_dir.parent == Path(f"/home/{REMOTE_USER}/chainrun-runs")
    script = run_dir / "toy_train.sh"
    assert script.read_text() == (REPO / "templates" / "toy_train.sh").read_text()
    assert stat.S_IMODE(script.stat().st_mode) == 0o700 and script.owner() == REMOTE_USER
    queued = subprocess.run(["squeue", "-h", "-j", d["first_job"], "-o", "%u %j"], capture_output=True, text=True)
    assert queued.stdout.split() == [REMOTE_USER, f"cr.{d['chain']}.0"]
    st = run_cli("status", "--cluster", "lo", "--json", home=ssh_home)
    assert [c["id"] for c in json.loads(st.stdout)["data"]] == [d["chain"]]
    assert json.loads(run_cli("status", "--cluster", "local", "--json", home=ssh_home).stdout)["data"] == []
    # removing the cluster under an active chain says the chain's jobs are left running, out of reach
    cfg = (ssh_home / "config.toml").read_text()
    rm = run_cli("cluster", "remove", "lo", "--json", home=ssh_home)
    (ssh_home / "config.toml").write_text(cfg)  # the cluster back (as `cluster add` would put it), so cancel reaches it
    assert rm.returncode == 0 and json.loads(rm.stdout)["data"]["active_chains"] == [d["chain"]], rm.stderr
    assert d["chain"] in rm.stderr and "keep running" in rm.stderr and len(rm.stderr.strip().splitlines()) == 1
    c = run_cli("cancel", d["chain"], "--json", home=ssh_home)  # no --cluster: the chain's own cluster
    assert c.returncode == 0, c.stderr
    assert json.loads(c.stdout)["data"]["cancelled_jobs"] == [d["first_job"]]
    left = subprocess.run(["squeue", "-h", "-j", d["first_job"], "-t", "PD,R"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
