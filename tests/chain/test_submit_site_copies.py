"""`submit --cluster a,b` refuses, before anything is written, a site where the chain could not run or
its checkpoint could never follow it: an env_file not readable there, a site reached with the built-in
SSH client (rsync needs this machine or the OpenSSH transport: ckpt_site.transport_refusal, the predicate
the copy itself uses), rsync missing where a copy runs it. Real files and SQLite under a tmp
CHAINRUN_HOME; the CLI in a subprocess where no second site needs reaching. On two real clusters:
tests/ssh/test_sites_slurm.py."""

from __future__ import annotations

import pytest

from chainrun.chain import copy_ready
from chainrun.chain.ckpt_site import site_for, transport_refusal
from chainrun.chain.create import SubmitRequest
from chainrun.chain.sites import GpuNeed, Site, check_env_file, submit_spanning
from chainrun.errors import SiteRefused, UsageError
from chainrun.runner.local import LocalRunner
from chainrun.site_config import settings_from
from chainrun.state.store import Store
from tests.conftest import run_cli

B = '[clusters.b]\nhost = "127.0.0.1"\n'
Q = '[clusters.q]\nhost = "127.0.0.1"\nport = 2228\n'  # the built-in client (paramiko): `cluster add q --host`


def _home(chainrun_home, text: str):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    (chainrun_home / "config.toml").write_text(text)
    return chainrun_home


def _script(tmp_path):
    s = tmp_path / "train.sh"
    s.write_text("#!/bin/bash\ntrue\n")
    return s


def _one_line(p, *words: str) -> str:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _nothing_made(home, work) -> None:
    p = run_cli("status", "--json", home=home)
    assert p.returncode == 0 and '"data": []' in p.stdout, p.stdout
    assert not (work / "chainrun-runs").exists() and not (work / "b" / "chainrun-runs").exists()


def test_a_site_on_the_built_in_ssh_client_is_refused_at_submit_naming_the_fix(chainrun_home, tmp_path):
    home = _home(chainrun_home, Q)
    _script(tmp_path)
    # no server on that port is needed: the transport alone decides, before any connection
    p = run_cli("submit", "train.sh", "--total", "1h", "--cluster", "local,q", home=home, cwd=tmp_path)
    _one_line(p, "cluster q: checkpoint copies to or from q need the OpenSSH transport",
              "chainrun cluster add q --ssh ALIAS")
    _nothing_made(home, tmp_path)
    # the same predicate as the copy itself: they cannot disagree
    from chainrun.context import open_runner

    runner, _ = open_runner("q")
    assert transport_refusal("q", runner) is not None and transport_refusal("local", LocalRunner()) is None
    with pytest.raises(UsageError, match="need the OpenSSH transport"):
        site_for("q", runner, "/ckpt")


def _b(tmp_path) -> str:
    return B + f'workdir = "{tmp_path}/b"\n'


def _submit(home, tmp_path, names):
    """submit_spanning with every site on this machine (b stands in: its runner is a LocalRunner, its
    workdir a folder of its own)."""
    s = _script(tmp_path)
    req = SubmitRequest(script=str(s), script_text=s.read_text(), total_s=3600, workdir=str(tmp_path))
    from chainrun import paths

    store = Store(paths.state_db())
    try:
        return submit_spanning(store, names, req, open_runner=lambda n: (LocalRunner(), None), need=GpuNeed())
    finally:
        store.close()


def test_an_env_file_not_readable_on_a_site_is_one_line_naming_the_cluster_and_the_file(chainrun_home, tmp_path):
    home = _home(chainrun_home, _b(tmp_path) + '\n[clusters.b.job]\nenv_file = "/nonexistent/env.sh"\n')
    with pytest.raises(SiteRefused) as e:
        _submit(home, tmp_path, ["local", "b"])
    assert e.value.message == "cluster b: cannot read its env_file /nonexistent/env.sh (missing or not readable)"
    assert "[clusters.b.job] env_file" in (e.value.hint or "")
    _nothing_made(home, tmp_path)
    # a readable one passes, and the submit result says so
    env = tmp_path / "env.sh"
    env.write_text("export X=1\n")
    site = Site("b", 1, LocalRunner(), settings_from({"job": {"env_file": str(env)}}))
    check_env_file(site)
    assert site.notes["env_file"] == f"{env} readable"
    site = Site("b", 1, LocalRunner(), settings_from({"job": {"env_file": "~/env.sh"}}))
    with pytest.raises(SiteRefused, match="~ is not expanded: give the full path"):
        check_env_file(site)  # sourced quoted, as given: a ~ would never be found


def test_rsync_missing_where_a_copy_runs_it_is_refused(chainrun_home, tmp_path):
    home = _home(chainrun_home, _b(tmp_path) + '\n[copy.b]\nrsync = "/nonexistent/rsync"\n')
    assert copy_ready.check_rsync("local", LocalRunner()).startswith("rsync: /")
    with pytest.raises(SiteRefused) as e:
        _submit(home, tmp_path, ["local", "b"])
    assert e.value.message.startswith("cluster b: `/nonexistent/rsync` not found there")
    assert "[copy.b] rsync" in (e.value.hint or "")
    _nothing_made(home, tmp_path)


def test_this_machine_needs_rsync_only_when_it_relays_a_copy(chainrun_home, monkeypatch):
    _home(chainrun_home, B + Q + '\n[copy.b.direct]\nq = "qa"\n[copy.q.direct]\nb = "ba"\n')
    assert not copy_ready.driver_relays(["b", "q"]) and copy_ready.driver_relays(["local", "b"])
    monkeypatch.setattr(copy_ready.shutil, "which", lambda _n: None)  # this machine without rsync
    copy_ready.check_driver_rsync(["b", "q"])  # direct both ways: nothing runs here
    with pytest.raises(SiteRefused, match=r"^this machine: `rsync` not found"):
        copy_ready.check_driver_rsync(["local", "b"])
