"""`chainrun cluster add` logs in before it saves: against the real sshd on 127.0.0.1, a wrong port, a
wrong user, a missing key file or an untrusted host key each exit non-zero with one clear line (no Python
class name, no traceback) and save nothing; `--no-check` saves without connecting."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tests.conftest import run_cli
from tests.ssh.conftest import REMOTE_USER

pytestmark = pytest.mark.ssh

# names that must never reach a user: Python exception classes
CLASS_NAME = re.compile(r"\b\w+(Error|Exception)\b|\bgaierror\b|Traceback")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again at once: nothing listens there


def _trusted_home(tmp_path, server):
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text(server.known_hosts.read_text())
    return home


def _args(server, name="hpc", **over):
    opts = {"--host": "127.0.0.1", "--port": str(server.port), "--user": REMOTE_USER, "--key": server.key, **over}
    args = ["cluster", "add", name]
    for k, v in opts.items():
        if v is not None:
            args += [k, v]
    return args


def _refused(p, home, *fragments):
    assert p.returncode != 0, p.stdout
    assert not CLASS_NAME.search(p.stdout + p.stderr), p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("chainrun: error: "), p.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "nothing was saved" in lines[0]
    assert not (home / "config.toml").exists(), "a failed check must save nothing"
    return lines[0]


def test_good_settings_are_checked_and_saved(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    p = run_cli(*_args(ssh_server), "--json", home=home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["cluster"]["port"] == ssh_server.port
    assert "[clusters.hpc]" in (home / "config.toml").read_text()


def test_wrong_port(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    port = _free_port()
    p = run_cli(*_args(ssh_server, **{"--port": str(port)}), home=home)
    line = _refused(p, home, f"nothing listens for SSH on port {port}", "--port")
    assert p.returncode == 8, line


def test_wrong_user(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    p = run_cli(*_args(ssh_server, **{"--user": "no-such-user"}), home=home)
    line = _refused(p, home, "no-such-user@127.0.0.1", "did not accept our key", "--user")
    assert p.returncode == 8, line


def test_missing_key_file(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    missing = str(tmp_path / "no-such-key")
    p = run_cli(*_args(ssh_server, **{"--key": missing}), home=home)
    line = _refused(p, home, f"key file {missing}", "does not exist", "--key")
    assert p.returncode == 8, line


def test_untrusted_host_key(tmp_path, ssh_server):
    home = tmp_path / "home"  # no known_hosts: the server's key is unknown
    p = run_cli(*_args(ssh_server), home=home)
    line = _refused(p, home, "unknown host key", "SHA256:", "--accept-new-host-key")
    assert p.returncode == 8, line
    assert not (home / "known_hosts").exists()  # nothing trusted either
    ok = run_cli(*_args(ssh_server), "--accept-new-host-key", home=home)
    assert ok.returncode == 0 and "trusted host key" in ok.stdout, ok.stderr


def test_unknown_host_name(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    p = run_cli(*_args(ssh_server, **{"--host": "no-such-host.invalid"}), home=home)
    _refused(p, home, "unknown host name", "--host")


def test_a_port_that_is_not_ssh(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    with socket.socket() as srv:  # accepts, then closes without an SSH banner
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        import threading

        def serve():
            try:
                conn, _ = srv.accept()
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                conn.close()
            except OSError:
                pass

        threading.Thread(target=serve, daemon=True).start()
        p = run_cli(*_args(ssh_server, **{"--port": str(port)}), home=home)
    _refused(p, home, "no SSH greeting", "--port")


def test_no_check_saves_without_connecting(tmp_path, ssh_server):
    home = tmp_path / "home"
    port = _free_port()
    p = run_cli(*_args(ssh_server, **{"--port": str(port), "--key": str(tmp_path / "later")}), "--no-check", home=home)
    assert p.returncode == 0, p.stderr
    assert "not checked" in p.stdout and "chainrun cluster test hpc" in p.stdout
    assert f"port = {port}" in (home / "config.toml").read_text()
    t = run_cli("cluster", "test", "hpc", home=home)  # the check comes later, with the same words
    assert t.returncode == 8 and not CLASS_NAME.search(t.stderr), t.stderr
    both = run_cli(*_args(ssh_server, name="x"), "--no-check", "--accept-new-host-key", home=home)
    assert both.returncode == 2 and "needs a connection" in both.stderr


def test_a_failed_check_keeps_the_existing_config(tmp_path, ssh_server):
    home = _trusted_home(tmp_path, ssh_server)
    assert run_cli(*_args(ssh_server), home=home).returncode == 0
    before = (home / "config.toml").read_text()
    p = run_cli(*_args(ssh_server, **{"--user": "no-such-user"}), home=home)  # replacing hpc with a bad one
    assert p.returncode == 8 and "nothing was saved" in p.stderr
    assert (home / "config.toml").read_text() == before


@pytest.mark.parametrize("exc,words", [
    (socket.timeout("timed out"), "no answer in time"),
    (TimeoutError(), "no answer in time"),
    (EOFError(), "the server closed the connection"),
    (ConnectionResetError(104, "Connection reset by peer"), "Connection reset by peer"),
    (FileNotFoundError(2, "No such file or directory", "/x/key"), "No such file or directory: /x/key"),
    (socket.gaierror(-2, "Name or service not known"), "unknown host name"),
    (RuntimeError(), "the connection failed without a reason"),
])
def test_connection_failures_are_described_without_class_names(exc, words):
    import paramiko

    from chainrun.runner.ssh import _describe

    assert words in _describe(exc)
    assert not CLASS_NAME.search(_describe(exc))
    refused = paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.1", 2299): ConnectionRefusedError(111, "x")})
    assert _describe(refused) == "connection refused: nothing listens for SSH on port 2299"
    assert "passphrase" in _describe(paramiko.PasswordRequiredException("private key file is encrypted"))


def test_no_key_to_offer_says_so_for_the_cluster_and_for_a_bastion(tmp_path, ssh_server):
    """No --key, no SSH agent, no key in ~/.ssh: paramiko has nothing to offer. That is a missing key,
    not "is that port an SSH server?", and for a bastion hop the line names the hop (--key is the cluster's)."""
    home = _trusted_home(tmp_path, ssh_server)
    empty = tmp_path / "empty-home"  # a HOME without ~/.ssh: no default keys, no ssh config
    empty.mkdir()
    bare = {"HOME": str(empty), "SSH_AUTH_SOCK": ""}
    p = run_cli(*_args(ssh_server, **{"--key": None}), home=home, env=bare)
    line = _refused(p, home, f"{REMOTE_USER}@127.0.0.1:{ssh_server.port}", "no key to offer", "--key", "ssh-add")
    assert p.returncode == 8 and "SSH server?" not in line, line
    jump = f"{REMOTE_USER}@127.0.0.1:{ssh_server.port}"
    p = run_cli(*_args(ssh_server, **{"--proxy-jump": jump}), home=home, env=bare)
    line = _refused(p, home, f"no key to offer to {jump}", "IdentityFile", "~/.ssh/config")
    assert p.returncode == 8 and "SSH server?" not in line, line


def test_a_relative_key_path_is_stored_absolute(tmp_path, ssh_server):
    """`--key id_hpc` checked from one folder must work from any other (cron, another terminal)."""
    home = _trusted_home(tmp_path, ssh_server)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_hpc").write_bytes(open(ssh_server.key, "rb").read())
    (keys / "id_hpc").chmod(0o600)
    p = run_cli(*_args(ssh_server, **{"--key": "id_hpc"}), home=home, cwd=keys)
    assert p.returncode == 0, p.stderr
    assert f'key = "{keys / "id_hpc"}"' in (home / "config.toml").read_text()
    t = run_cli("cluster", "test", "hpc", home=home, cwd=tmp_path)
    assert t.returncode == 0, t.stderr
