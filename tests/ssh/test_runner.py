"""The SSH runner against the real OpenSSH server: literal argv, env, stdin, timeouts, files,
connection reuse and reconnect, host-key refusal."""

from __future__ import annotations

import os
import shlex
import socket
import time
import uuid
from pathlib import Path

import pytest

from chainrun.clusters import Cluster
from chainrun.runner.ssh import HostKeyError, RemoteUnreachable, SSHRunner, command_line

from tests.ssh.conftest import REMOTE_USER

pytestmark = pytest.mark.ssh

NASTY = ["it's", 'a "quoted" word', "semi;colon", "$(touch {m})", "`touch {m}`", "new\nline", "$HOME", "*", "", "-n"]


def runner_for(server, known_hosts: Path, *, login_shell: bool = False, **kw) -> SSHRunner:
    spec = Cluster(name="lo", host="127.0.0.1", port=server.port, user=REMOTE_USER, key=server.key,
                   login_shell=login_shell)
    return SSHRunner(spec, known_hosts=known_hosts, **kw)


def test_command_line_quotes_every_word():
    line = command_line(["printf", "%s", "a b;$(x)"], {"SLURM_TIME_FORMAT": "%s"})
    assert shlex.split(line) == ["env", "SLURM_TIME_FORMAT=%s", "printf", "%s", "a b;$(x)"]
    outer = command_line(["echo", "it's"], None, login_shell=True)
    assert shlex.split(outer)[:2] == ["bash", "-lc"] and shlex.split(shlex.split(outer)[2]) == ["echo", "it's"]


@pytest.mark.parametrize("login_shell", [False, True])
def test_arguments_arrive_literally_and_run_nothing(ssh_server, login_shell, tmp_path):
    marker = f"/tmp/chainrun-pwned-{uuid.uuid4().hex}"
    words = [w.format(m=marker) for w in NASTY]
    r = runner_for(ssh_server, ssh_server.known_hosts, login_shell=login_shell)
    try:
        res = r.run(["printf", "%s\\0", *words], 30)
        env_res = r.run(["printenv", "CR_TEST"], 30, env={"CR_TEST": words[3] + " " + words[5]})
    finally:
        r.close()
    assert res.ok, res.stderr
    assert res.stdout.split("\0")[:-1] == words
    assert env_res.stdout == words[3] + " " + words[5] + "\n"  # env applied remotely, literally
    assert not os.path.exists(marker), "a command substitution ran on the remote side"


@pytest.mark.parametrize("login_shell", [False, True])
def test_env_none_removes_a_variable_the_remote_side_has(ssh_server, login_shell):
    """chainrun's Slurm reads unset the user's SQUEUE_*/SACCT_FORMAT (slurm/client.py): over SSH that is
    `env -u`, after the remote profile ran. HOME stands in for a variable the remote shell always sets."""
    r = runner_for(ssh_server, ssh_server.known_hosts, login_shell=login_shell)
    try:
        kept = r.run(["env"], 30, env={"CR_TEST": "x"})
        gone = r.run(["env"], 30, env={"HOME": None, "CR_TEST": "x"})
    finally:
        r.close()
    assert any(line.startswith("HOME=") for line in kept.stdout.splitlines())
    assert gone.ok and "CR_TEST=x" in gone.stdout.splitlines()
    assert not any(line.startswith("HOME=") for line in gone.stdout.splitlines())


def test_stdin_exit_codes_timeout_and_one_connection(ssh_server):
    r = runner_for(ssh_server, ssh_server.known_hosts)
    try:
        assert r.run(["cat"], 30, stdin="hello\nworld\n").stdout == "hello\nworld\n"
        fail = r.run(["sh", "-c", "echo oops >&2; exit 3"], 30)
        assert (fail.returncode, fail.stderr, fail.ok) == (3, "oops\n", False)
        assert r.run(["no-such-command-xyz"], 30).returncode == 127
        t0 = time.monotonic()
        slow = r.run(["sleep", "30"], 1)
        assert slow.timed_out and time.monotonic() - t0 < 5
        for _ in range(20):
            assert r.run(["true"], 30).ok
        assert r.connects == 1, "every call must reuse the one connection"
    finally:
        r.close()


def test_write_file_is_atomic_with_mode_and_parents(ssh_server):
    r = runner_for(ssh_server, ssh_server.known_hosts)
    folder = f"/home/{REMOTE_USER}/cr-test-{uuid.uuid4().hex[:8]}"
    try:
        r.write_file(f"{folder}/a b/c;d.sh", "#!/bin/sh\necho hi\n", 0o700)
        out = r.run(["stat", "-c", "%a %U", f"{folder}/a b/c;d.sh"], 30).stdout.split()
        assert out == ["700", REMOTE_USER]
        assert r.run(["sh", f"{folder}/a b/c;d.sh"], 30).stdout == "hi\n"
        r.write_file(f"{folder}/a b/c;d.sh", "replaced\n", 0o600)
        assert r.run(["cat", f"{folder}/a b/c;d.sh"], 30).stdout == "replaced\n"
        assert r.run(["ls", "-A", f"{folder}/a b"], 30).stdout == "c;d.sh\n", "no temporary file left behind"
        assert r.home() == f"/home/{REMOTE_USER}"
    finally:
        r.run(["rm", "-rf", folder], 30)
        r.close()


def test_dropped_connection_reconnects_on_next_call(ssh_server):
    r = runner_for(ssh_server, ssh_server.known_hosts)
    try:
        assert r.run(["true"], 30).ok
        r._clients[-1].get_transport().close()  # what a reset TCP connection looks like to paramiko
        assert r.run(["echo", "back"], 30).stdout == "back\n"
        assert r.connects == 2
    finally:
        r.close()


def test_unreachable_host_raises_remote_error_and_backs_off(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = Cluster(name="gone", host="127.0.0.1", port=port, user=REMOTE_USER)
    r = SSHRunner(spec, known_hosts=tmp_path / "kh", connect_timeout=3)
    with pytest.raises(RemoteUnreachable, match="cannot connect to gone"):
        r.run(["true"], 5)
    t0 = time.monotonic()
    with pytest.raises(RemoteUnreachable, match="next try in"):  # inside the backoff window: no new attempt
        r.run(["true"], 5)
    assert time.monotonic() - t0 < 0.5


def test_unknown_host_key_is_refused_with_its_fingerprint(ssh_server, tmp_path):
    r = runner_for(ssh_server, tmp_path / "empty_known_hosts")
    fp = _fingerprint(ssh_server)
    with pytest.raises(HostKeyError) as e:
        r.run(["true"], 10)
    assert fp in str(e.value) and "--accept-new-host-key" in str(e.value) and "ssh-keyscan" in str(e.value)


def test_changed_host_key_is_refused(ssh_server, tmp_path):
    other = tmp_path / "other.pub"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {tmp_path / 'other'} >/dev/null")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{ssh_server.port} " + " ".join(other.read_text().split()[:2]) + "\n")
    r = runner_for(ssh_server, kh, accept_new_host_key=True)  # accept-new never accepts a *changed* key
    with pytest.raises(HostKeyError, match="CHANGED"):
        r.run(["true"], 10)


def _fingerprint(server) -> str:
    import subprocess

    out = subprocess.run(["ssh-keygen", "-lf", str(server.dir / "ssh_host_ed25519_key.pub")], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


def test_proxy_jump_through_a_bastion(ssh_server, tmp_path, monkeypatch):
    # the test server is its own bastion: hop 1 logs in, hop 2 is a direct-tcpip tunnel through it
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host bastion\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User {REMOTE_USER}\n"
                   f"  IdentityFile {ssh_server.key}\n")
    monkeypatch.setenv("CHAINRUN_SSH_CONFIG", str(cfg))
    spec = Cluster(name="lo", host="127.0.0.1", port=ssh_server.port, user=REMOTE_USER, key=ssh_server.key,
                   proxy_jump="bastion")
    r = SSHRunner(spec, known_hosts=ssh_server.known_hosts)
    try:
        assert r.run(["id", "-un"], 30).stdout == f"{REMOTE_USER}\n"
        assert len(r._clients) == 2, "one client for the bastion, one for the cluster through it"
        assert not isinstance(r._clients[-1].get_transport().sock, socket.socket)  # a tunnel, not a TCP socket
    finally:
        r.close()
