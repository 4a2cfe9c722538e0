"""Cluster config and ~/.ssh/config resolution (files only, no server)."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from chainrun import clusters
from chainrun.errors import UsageError


def test_save_keeps_other_tables_and_is_private(chainrun_home):
    path = chainrun_home / "config.toml"
    chainrun_home.mkdir(mode=0o700)
    path.write_text('[notify]\ntargets = ["ops@example.org"]\n')
    cfg = clusters.load()
    cfg.clusters["hpc"] = clusters.Cluster(name="hpc", host="login.example.org", user="alice", port=2200,
                                           key="~/.ssh/id_ed25519", proxy_jump="bastion", login_shell=True,
                                           workdir="/scratch/alice dir")
    cfg.default = "hpc"
    clusters.save(cfg)
    clusters.save(clusters.load())  # a second rewrite changes nothing
    data = tomllib.loads(path.read_text())
    assert data["notify"] == {"targets": ["ops@example.org"]}
    assert data["default"] == "hpc" and data["clusters"]["hpc"]["workdir"] == "/scratch/alice dir"
    assert clusters.load().clusters["hpc"] == cfg.clusters["hpc"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_passwords_and_unknown_keys_are_refused(chainrun_home):
    chainrun_home.mkdir(mode=0o700)
    (chainrun_home / "config.toml").write_text('[clusters.x]\nhost = "h"\npassword = "hunter2"\n')
    with pytest.raises(UsageError, match="password"):
        clusters.load()
    with pytest.raises(UsageError, match="reserved"):
        clusters.check_name("local")
    with pytest.raises(UsageError):
        clusters.check_name("a b;c")


def test_ssh_config_fills_what_the_cluster_leaves_open(tmp_path, monkeypatch):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host hpc\n  HostName login01.internal\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/k\n"
                   "  ProxyJump bob@gate.example.org:2222\n")
    monkeypatch.setenv("CHAINRUN_SSH_CONFIG", str(cfg))
    t = clusters.resolve(clusters.Cluster(name="hpc", host="hpc"))
    assert (t.hostname, t.user, t.port, t.proxy_jump) == ("login01.internal", "alice", 2200, "bob@gate.example.org:2222")
    assert t.key_files[0].endswith("/.ssh/k")
    # looked up by the cluster's name when the host matches nothing; explicit options win
    t = clusters.resolve(clusters.Cluster(name="hpc", host="10.0.0.5", user="carol", port=22))
    assert (t.hostname, t.user, t.port, t.proxy_jump) == ("10.0.0.5", "carol", 22, "bob@gate.example.org:2222")
    jump = clusters.resolve_jump("bob@gate.example.org:2222")
    assert (jump.hostname, jump.user, jump.port) == ("gate.example.org", "bob", 2222)


def test_transport_is_stored_checked_and_selects_the_runner(chainrun_home, monkeypatch, tmp_path):
    chainrun_home.mkdir(mode=0o700)
    cfg = clusters.load()
    cfg.clusters["ls6"] = clusters.Cluster(name="ls6", host="ls6", transport=clusters.OPENSSH)
    clusters.save(cfg)
    spec = clusters.load().clusters["ls6"]
    assert spec.openssh and spec == cfg.clusters["ls6"]
    from chainrun.runner import for_cluster
    from chainrun.runner.openssh import OpenSSHRunner, control_dir, ensure_control_dir

    assert isinstance(for_cluster(spec, known_hosts=tmp_path / "kh"), OpenSSHRunner)
    (chainrun_home / "config.toml").write_text('[clusters.x]\nhost = "h"\ntransport = "telnet"\n')
    with pytest.raises(UsageError, match="transport must be one of openssh, paramiko"):
        clusters.load()
    # the socket folder: the override, made 0700; one that is not a folder is refused; pytest's own
    # tmp_path is already too long for a socket in it
    import shutil
    import tempfile

    with pytest.raises(UsageError, match="too long for a socket"):
        monkeypatch.setenv("CHAINRUN_SSH_CONTROL_DIR", str(tmp_path / "cm"))
        ensure_control_dir()
    short = Path(tempfile.mkdtemp(prefix="crt", dir="/tmp"))
    try:
        monkeypatch.setenv("CHAINRUN_SSH_CONTROL_DIR", str(short / "cm"))
        assert ensure_control_dir() == control_dir() == short / "cm"
        assert stat.S_IMODE((short / "cm").stat().st_mode) == 0o700
        (short / "file").write_text("")
        monkeypatch.setenv("CHAINRUN_SSH_CONTROL_DIR", str(short / "file"))
        with pytest.raises(UsageError, match="control folder"):
            ensure_control_dir()
    finally:
        shutil.rmtree(short)
