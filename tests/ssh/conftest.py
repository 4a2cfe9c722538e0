"""The real OpenSSH test server(s) and chainrun homes configured to reach them.

``ssh_server`` is the server of scripts/start-sshd.sh on 127.0.0.1:2222 (user ``chainrun``,
key only). ``flaky_server`` is a second, private instance on port 2223 that a test may stop
and start (the fault test), so stopping it never disturbs the other tests' connections.
Both need root (sshd, the test user); without it the tests skip, and in CI they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO, run_cli

REMOTE_USER = "chainrun"
REMOTE_HOME = Path("/home/chainrun")
TOY_DIR = REMOTE_HOME / "chainrun-test-toy"  # a copy of templates/ the remote jobs can read


@dataclass(frozen=True)
class Server:
    dir: Path
    port: int

    @property
    def key(self) -> str:
        return str(self.dir / "id_ed25519")

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def add_args(self, name: str) -> list[str]:
        return ["cluster", "add", name, "--host", "127.0.0.1", "--port", str(self.port), "--user", REMOTE_USER,
                "--key", self.key]

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        """The OpenSSH client, strict host keys: an independent witness of the remote side."""
        return subprocess.run(
            ["ssh", "-i", self.key, "-p", str(self.port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
             f"{REMOTE_USER}@127.0.0.1", command], capture_output=True, text=True, timeout=60)


def _need(why: str):
    if IN_CI:
        pytest.fail(why)
    pytest.skip(why)


def start(dir_: Path, port: int) -> Server:
    if os.geteuid() != 0:
        _need("the SSH tests start a private sshd and need root")
    p = subprocess.run(["bash", str(REPO / "scripts" / "start-sshd.sh"), str(dir_)],
                       env={**os.environ, "CHAINRUN_SSH_PORT": str(port)}, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        _need(f"sshd on port {port} did not start: {p.stderr.strip()[-500:]}")
    return Server(dir_, port)


def stop(server: Server) -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "stop-sshd.sh"), str(server.dir)], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def ssh_server() -> Server:
    server = start(Path("/tmp/chainrun-sshd"), 2222)
    # the toy payload for remote chains, readable by the test user's jobs
    TOY_DIR.mkdir(exist_ok=True)
    for f in ("toy_train.sh", "toy_trainer.py"):
        shutil.copy(REPO / "templates" / f, TOY_DIR / f)
    shutil.chown(TOY_DIR, REMOTE_USER, REMOTE_USER)
    for f in TOY_DIR.iterdir():
        shutil.chown(f, REMOTE_USER, REMOTE_USER)
    return server


@pytest.fixture(scope="session")
def flaky_server(ssh_server) -> Server:
    server = start(Path("/tmp/chainrun-sshd-flaky"), 2223)
    yield server
    stop(server)


def make_home(home: Path, servers: dict[str, Server], *, trust: bool = True) -> Path:
    """A chainrun home with one cluster per server; ``trust`` puts their host keys in its known_hosts."""
    if trust:
        home.mkdir(parents=True, exist_ok=True)
        text = "".join(s.known_hosts.read_text() for s in servers.values())
        (home / "known_hosts").write_text(text)
    for name, s in servers.items():
        # `cluster add` logs in to check; an untrusted host key is refused there, so save those unchecked
        p = run_cli(*s.add_args(name), *([] if trust else ["--no-check"]), home=home)
        assert p.returncode == 0, p.stderr
    return home


@pytest.fixture
def ssh_home(tmp_path, ssh_server) -> Path:
    return make_home(tmp_path / "home", {"lo": ssh_server})


# ---------------------------------------------------------------------------- the OpenSSH transport
MFA_PORT = 2224


CERT_PORT = 2225


def _start_kind(kind: str, dir_: Path, port: int, **env: str) -> Server:
    if os.geteuid() != 0:
        _need(f"the {kind} test server needs root")
    p = subprocess.run(["bash", str(REPO / "scripts" / "start-sshd.sh"), str(dir_)],
                       env={**os.environ, "CHAINRUN_SSH_PORT": str(port), "CHAINRUN_SSH_KIND": kind, **env},
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        _need(f"the {kind} sshd did not start: {p.stderr.strip()[-500:]}")
    return Server(dir_, port)


@pytest.fixture(scope="session")
def mfa_server(ssh_server) -> Server:
    """sshd-mfa on :2224: the key, then a one-time code asked by its own PAM stack (start-sshd.sh, kind mfa)."""
    return _start_kind("mfa", Path("/tmp/chainrun-sshd-mfa"), MFA_PORT)


@pytest.fixture(scope="session")
def cert_server(ssh_server) -> Server:
    """sshd on :2225 taking only a user certificate of its test CA; its host key is a certificate too."""
    return _start_kind("cert", Path("/tmp/chainrun-sshd-cert"), CERT_PORT)


ONE_SESSION_PORT = 2226
NO_SESSION_PORT = 2227


@pytest.fixture(scope="session")
def one_session_server(ssh_server) -> Server:
    """A key-only sshd on :2226 with ``MaxSessions 1``, how sites turn multiplexing off (stopped afterwards)."""
    server = _start_kind("plain", Path("/tmp/chainrun-sshd-one"), ONE_SESSION_PORT, CHAINRUN_SSH_MAX_SESSIONS="1")
    yield server
    stop(server)


@pytest.fixture(scope="session")
def no_session_server(ssh_server) -> Server:
    """A key-only sshd on :2227 with ``MaxSessions 0``: logins work, every session is refused."""
    server = _start_kind("plain", Path("/tmp/chainrun-sshd-none"), NO_SESSION_PORT, CHAINRUN_SSH_MAX_SESSIONS="0")
    yield server
    stop(server)


def host_block(alias: str, server: Server, known_hosts: Path | None = None, **extra: str) -> str:
    """A ``Host`` block of a user's ~/.ssh/config for one test server (what `--ssh ALIAS` reads)."""
    lines = [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {server.port}", f"  User {REMOTE_USER}",
             f"  IdentityFile {server.key}", "  IdentitiesOnly yes",
             f"  UserKnownHostsFile {known_hosts or server.known_hosts}", *(f"  {k} {v}" for k, v in extra.items())]
    return "\n".join(lines) + "\n"


@pytest.fixture
def openssh_env(monkeypatch):
    """This test's own ssh config file and control-socket folder (short: a socket path holds ~104 bytes).

    Returns ``write(text)``, which sets the config's content. Masters left open are closed afterwards.
    """
    import tempfile

    cm = Path(tempfile.mkdtemp(prefix="crcm", dir="/tmp"))
    cfg = cm.parent / f"{cm.name}.ssh_config"
    monkeypatch.setenv("CHAINRUN_SSH_CONTROL_DIR", str(cm))
    monkeypatch.setenv("CHAINRUN_SSH_CONFIG", str(cfg))

    def write(text: str) -> Path:
        cfg.write_text(text)
        return cfg

    yield write
    for sock in cm.iterdir():  # `ssh -O exit` for every master this test left open
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=30)
    shutil.rmtree(cm, ignore_errors=True)
    cfg.unlink(missing_ok=True)
