"""Both SSH runners against the real OpenSSH server: literal argv, env, stdin, timeouts, files,
connection reuse and reconnect, host-key refusal. ``paramiko`` is the built-in client
(runner/ssh.py), ``openssh`` the system ssh over a ControlMaster (runner/openssh.py), reading
a ~/.ssh/config Host block for the same server."""

from __future__ import annotations

import os
import shlex
import socket
import time
import uuid
from pathlib import Path

import pytest

from chainrun.clusters import Cluster
from chainrun.runner import openssh
from chainrun.runner.openssh import OpenSSHRunner
from chainrun.runner.ssh import HostKeyError, RemoteUnreachable, SSHRunner, command_line

from tests.ssh.conftest import REMOTE_USER, host_block

pytestmark = pytest.mark.ssh

NASTY = ["it's", 'a "quoted" word', "semi;colon", "$(touch {m})", "`touch {m}`", "new\nline", "$HOME", "*", "", "-n"]


def runner_for(server, known_hosts: Path, *, login_shell: bool = False, **kw) -> SSHRunner:
    spec = Cluster(name="lo", host="127.0.0.1", port=server.port, user=REMOTE_USER, key=server.key,
                   login_shell=login_shell)
    return SSHRunner(spec, known_hosts=known_hosts, **kw)


ALIAS = "crtest"


@pytest.fixture(params=["paramiko", "openssh"])
def make_runner(request, openssh_env):
    """``make(server, known_hosts, login_shell=False, **kw)``: a runner of this test's transport."""
    made = []

    def make(server, known_hosts: Path, *, login_shell: bool = False, extra: str = "", **kw):
        if request.param == "openssh":
            openssh_env(host_block(ALIAS, server, known_hosts) + extra)
            spec = Cluster(name="lo", host=ALIAS, login_shell=login_shell, transport="openssh")
            r = OpenSSHRunner(spec, **kw)
        else:
            r = runner_for(server, known_hosts, login_shell=login_shell, **kw)
        made.append(r)
        return r

    make.transport = request.param
    yield make
    for r in made:
        r.close()


def master_pid(alias: str = ALIAS) -> str | None:
    import subprocess

    p = subprocess.run(["ssh", "-F", os.environ["CHAINRUN_SSH_CONFIG"], "-o",
                        f"ControlPath={openssh.control_dir() / '%C'}", "-O", "check", alias],
                       capture_output=True, text=True, timeout=30)
    return p.stderr.split("pid=")[1].split(")")[0] if p.returncode == 0 else None


def test_command_line_quotes_every_word():
    line = command_line(["printf", "%s", "a b;$(x)"], {"SLURM_TIME_FORMAT": "%s"})
    assert shlex.split(line) == ["env", "SLURM_TIME_FORMAT=%s", "printf", "%s", "a b;$(x)"]
    outer = command_line(["echo", "it's"], None, login_shell=True)
    assert shlex.split(outer)[:2] == ["bash", "-lc"] and shlex.split(shlex.split(outer)[2]) == ["echo", "it's"]


@pytest.mark.parametrize("login_shell", [False, True])
def test_arguments_arrive_literally_and_run_nothing(ssh_server, login_shell, make_runner):
    marker = f"/tmp/chainrun-pwned-{uuid.uuid4().hex}"
    words = [w.format(m=marker) for w in NASTY]
    r = make_runner(ssh_server, ssh_server.known_hosts, login_shell=login_shell)
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


def test_stdin_exit_codes_timeout_and_one_connection(ssh_server, make_runner):
    r = make_runner(ssh_server, ssh_server.known_hosts)
    try:
        assert r.run(["cat"], 30, stdin="hello\nworld\n").stdout == "hello\nworld\n"
        fail = r.run(["sh", "-c", "echo oops >&2; exit 3"], 30)
        assert (fail.returncode, fail.stderr, fail.ok) == (3, "oops\n", False)
        assert r.run(["no-such-command-xyz"], 30).returncode == 127
        t0 = time.monotonic()
        slow = r.run(["sleep", "30"], 1)
        assert slow.timed_out and time.monotonic() - t0 < 5
        first = master_pid() if make_runner.transport == "openssh" else None
        for _ in range(20):
            assert r.run(["true"], 30).ok
        if make_runner.transport == "openssh":  # one master, made by the first call, carries every session
            assert first is not None and master_pid() == first
        else:
            assert r.connects == 1, "every call must reuse the one connection"
    finally:
        r.close()


def test_write_file_is_atomic_with_mode_and_parents(ssh_server, make_runner):
    r = make_runner(ssh_server, ssh_server.known_hosts)
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


def test_dropped_connection_reconnects_on_next_call(ssh_server, make_runner):
    r = make_runner(ssh_server, ssh_server.known_hosts)
    assert r.run(["true"], 30).ok
    if make_runner.transport == "openssh":
        before = master_pid()
        assert openssh.master_exit(ALIAS)  # the master gone: a key-only site gets a new one, unprompted
        assert r.run(["echo", "back"], 30).stdout == "back\n"
        assert master_pid() not in (None, before)
    else:
        r._clients[-1].get_transport().close()  # what a reset TCP connection looks like to paramiko
        assert r.run(["echo", "back"], 30).stdout == "back\n"
        assert r.connects == 2


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_unreachable_host_raises_remote_error_and_backs_off(tmp_path, transport, openssh_env):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if transport == "openssh":
        openssh_env(f"Host gone\n  HostName 127.0.0.1\n  Port {port}\n  User {REMOTE_USER}\n")
        r = OpenSSHRunner(Cluster(name="gone", host="gone", transport="openssh"), connect_timeout=3)
    else:
        spec = Cluster(name="gone", host="127.0.0.1", port=port, user=REMOTE_USER)
        r = SSHRunner(spec, known_hosts=tmp_path / "kh", connect_timeout=3)
    with pytest.raises(RemoteUnreachable, match="cannot connect to gone"):
        r.run(["true"], 5)
    t0 = time.monotonic()
    with pytest.raises(RemoteUnreachable, match="next try in"):  # inside the backoff window: no new attempt
        r.run(["true"], 5)
    assert time.monotonic() - t0 < 0.5


def test_unknown_host_key_is_refused_with_its_fingerprint(ssh_server, tmp_path, make_runner):
    r = make_runner(ssh_server, tmp_path / "empty_known_hosts")
    with pytest.raises(HostKeyError) as e:
        r.run(["true"], 10)
    assert "--accept-new-host-key" in str(e.value)
    if make_runner.transport == "paramiko":
        assert _fingerprint(ssh_server) in str(e.value) and "ssh-keyscan" in str(e.value)
    else:  # ssh's own accept-new records the key in the config's known_hosts file
        assert "is not known" in str(e.value) and not (tmp_path / "empty_known_hosts").exists()
        ok = make_runner(ssh_server, tmp_path / "empty_known_hosts", accept_new_host_key=True)
        assert ok.run(["true"], 30).ok
        assert (tmp_path / "empty_known_hosts").read_text().split()[1:3] == \
            (ssh_server.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]


def test_changed_host_key_is_refused(ssh_server, tmp_path, make_runner):
    other = tmp_path / "other.pub"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {tmp_path / 'other'} >/dev/null")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{ssh_server.port} " + " ".join(other.read_text().split()[:2]) + "\n")
    r = make_runner(ssh_server, kh, accept_new_host_key=True)  # accept-new never accepts a *changed* key
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


def test_openssh_proxy_jump_from_the_users_config(ssh_server, openssh_env):
    # the config's ProxyJump is ssh's own: chainrun only names the alias
    openssh_env(host_block("bastion", ssh_server) + host_block(ALIAS, ssh_server, ProxyJump="bastion"))
    r = OpenSSHRunner(Cluster(name="lo", host=ALIAS, transport="openssh"))
    assert r.run(["id", "-un"], 30).stdout == f"{REMOTE_USER}\n"
    assert r.user == REMOTE_USER  # from `ssh -G`, no connection
    import subprocess

    procs = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout.splitlines()
    jumps = [a for a in procs if os.environ["CHAINRUN_SSH_CONFIG"] in a and " -W " in a and "bastion" in a]
    assert len(jumps) == 1, "the master reaches the cluster through one `ssh -W` to the bastion"


def test_paramiko_reads_known_hosts_as_ssh_does(ssh_server, tmp_path):
    """Hashed names, marker lines (@cert-authority, @revoked) and a line it cannot parse: paramiko's own
    loader raised on the markers (an internal error); ssh skips what it does not use, and so do we."""
    import subprocess

    kh = tmp_path / "known_hosts"
    kh.write_text(ssh_server.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], capture_output=True, check=True)  # hash the names
    assert "127.0.0.1" not in kh.read_text()
    ca = (ssh_server.dir / "id_ed25519.pub").read_text().split()[:2]
    kh.write_text(f"@cert-authority *.example.org {' '.join(ca)}\n@revoked * {' '.join(ca)}\nnot a key line\n"
                  + kh.read_text())
    r = runner_for(ssh_server, kh)
    try:
        assert r.run(["true"], 30).ok
    finally:
        r.close()


def test_openssh_session_cut_by_its_master_is_lost_not_an_exit_code(ssh_server, openssh_env):
    """Both end with ssh's exit 255 and no message: a remote `exit 255` is a result, a session whose
    master went away is RemoteUnreachable (the command may have run: the caller must not re-send it)."""
    import threading

    openssh_env(host_block(ALIAS, ssh_server))
    r = OpenSSHRunner(Cluster(name="lo", host=ALIAS, transport="openssh"))
    own = r.run(["sh", "-c", "exit 255"], 30)
    assert own.returncode == 255 and not own.ok
    caught: list[BaseException] = []

    def long_call():
        try:
            r.run(["sleep", "60"], 90)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            caught.append(e)

    t = threading.Thread(target=long_call)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "sleep 60" not in _remote_procs():
        time.sleep(0.2)
    assert openssh.master_exit(ALIAS)
    t.join(60)
    assert not t.is_alive() and len(caught) == 1 and isinstance(caught[0], RemoteUnreachable), caught
    assert "lost during `sleep`" in str(caught[0])


def _remote_procs() -> str:
    import subprocess

    return subprocess.run(["ps", "-u", REMOTE_USER, "-o", "args="], capture_output=True, text=True).stdout


def test_openssh_recreates_a_missing_control_folder(ssh_server, openssh_env):
    """/tmp emptied by a reboot since `cluster add`: the first call makes the folder again (0700) and
    its master lives there, instead of ssh running without one."""
    import shutil
    import stat

    openssh_env(host_block(ALIAS, ssh_server))
    shutil.rmtree(openssh.control_dir())
    r = OpenSSHRunner(Cluster(name="lo", host=ALIAS, transport="openssh"))
    assert r.run(["true"], 30).ok
    assert stat.S_IMODE(openssh.control_dir().stat().st_mode) == 0o700 and master_pid() is not None
