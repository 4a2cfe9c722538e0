"""Runner for a cluster's login node over SSH (paramiko), implementing the Runner protocol.

One connection per runner, opened on first use and reused for every command and SFTP
transfer (a watcher tick is then a few channel round trips, not a handshake each).
Host keys are always verified against the user's and chainrun's known_hosts; an unknown
key is refused with its fingerprint, a changed one is refused outright.

Commands are argv lists joined with ``shlex.join`` so every argument reaches the remote
program literally; ``env`` becomes an ``env K=V`` prefix (sshd refuses most SetEnv);
with ``login_shell`` the joined line runs as ``bash -lc LINE`` for sites whose Slurm
comes from ``module load`` in a profile.

A dropped connection is reconnected on the next call, but never by re-running a
command that was already sent (an ``sbatch`` could run twice): that call raises
:class:`RemoteUnreachable` and the engine's SUBMITTING/adoption logic takes over.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import posixpath
import select
import socket
import time
from pathlib import Path
from typing import Mapping, Sequence

import paramiko

from chainrun.clusters import Cluster, Target, resolve, resolve_jump
from chainrun.errors import RemoteError
from chainrun.runner.base import HostKeyError, RemoteUnreachable, RunResult, command_line

__all__ = ["HostKeyError", "RemoteUnreachable", "SSHRunner", "command_line", "fingerprint"]

log = logging.getLogger(__name__)
# paramiko's transport thread logs failures with tracebacks; without a handler Python would print them on
# stderr. The CLI also sends them to the log file (chainrun.cli.logsetup); the user sees one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_NET_ERRORS = (paramiko.SSHException, OSError, EOFError, socket.timeout)
# paramiko's words when it had no key file and no agent key to offer (auth never started)
_NO_KEY = "No authentication methods available"


class _SecondFactor(paramiko.AuthenticationException):
    """The server took the key and then asked for keyboard-interactive (a one-time code)."""


class _NoPromptClient(paramiko.SSHClient):
    """An SSHClient that never prompts: after a key's partial success paramiko would ask for the
    second factor on this process's stdin (``auth_interactive_dumb``); a tick must fail instead."""

    def _auth(self, username, *args, **kwargs):  # paramiko's private hook, called once per connect
        def refuse(*_a, **_k):
            raise _SecondFactor("the server asks for a second factor")

        self._transport.auth_interactive_dumb = refuse
        return super()._auth(username, *args, **kwargs)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint (what ``ssh-keygen -lf`` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_host_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _Refuse(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that says which key it refused and how to trust it."""

    def __init__(self, cluster_name: str, accept_new: bool, cert_authority: bool = False) -> None:
        self.cluster_name, self.accept_new = cluster_name, accept_new
        self.cert_authority = cert_authority  # a known_hosts trusts a CA: paramiko cannot check host certificates
        self.accepted: tuple[str, paramiko.PKey] | None = None

    def missing_host_key(self, client, hostname, key) -> None:
        if self.accept_new:  # only from `cluster add --accept-new-host-key`: the user asked for it
            self.accepted = (hostname, key)
            return
        if self.cert_authority:
            raise HostKeyError(
                f"unknown host key for {hostname}: {key.get_name()} {fingerprint(key)}; your known_hosts trusts "
                "a @cert-authority, which the built-in SSH client cannot check",
                hint=f"use the system ssh: `chainrun cluster add {self.cluster_name} --ssh ALIAS` (a Host in ~/.ssh/config)")
        raise HostKeyError(
            f"unknown host key for {hostname}: {key.get_name()} {fingerprint(key)}",
            hint=f"if that fingerprint is right, trust it with `chainrun cluster add {self.cluster_name} ... "
            f"--accept-new-host-key`, or add `ssh-keyscan` output for {hostname} to ~/.ssh/known_hosts",
        )


class SSHRunner:
    def __init__(
        self, cluster: Cluster, *, known_hosts: Path, connect_timeout: float = 15.0, keepalive_s: int = 15,
        accept_new_host_key: bool = False, max_backoff_s: float = 30.0,
    ) -> None:
        self.cluster = cluster
        self.name = cluster.name
        self.target: Target = resolve(cluster)
        self.user = self.target.user
        self.known_hosts = known_hosts
        self.connect_timeout, self.keepalive_s = connect_timeout, keepalive_s
        self.accept_new_host_key = accept_new_host_key
        self.max_backoff_s = max_backoff_s
        self.new_host_keys: list[tuple[str, paramiko.PKey]] = []  # accepted this session, for `cluster add`
        self.connects = 0
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the cluster last
        self._sftp: paramiko.SFTPClient | None = None
        self._failures = 0
        self._retry_at = 0.0

    # ------------------------------------------------------------------ connection
    def _connected(self) -> paramiko.Transport:
        if self._clients:
            t = self._clients[-1].get_transport()
            if t is not None and t.is_active():
                return t
            log.warning("%s: SSH connection lost; reconnecting", self.name)
            self._drop()
        now = time.monotonic()
        if now < self._retry_at:
            raise RemoteUnreachable(f"{self.name} unreachable; next try in {self._retry_at - now:.0f}s")
        try:
            self._connect()
        except HostKeyError:
            self._drop()
            raise
        except (RemoteError, *_NET_ERRORS) as e:
            self._drop()
            self._failures += 1
            delay = min(self.max_backoff_s, 2.0 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            if isinstance(e, RemoteError):
                raise
            log.debug("%s: connect failed", self.name, exc_info=True)
            raise RemoteUnreachable(f"cannot connect to {self.name} ({self._where()}): {_describe(e)}",
                                    hint=_connect_hint(e)) from None
        self._failures, self._retry_at = 0, 0.0
        return self._clients[-1].get_transport()

    def _where(self) -> str:
        t = self.target
        return f"{t.user}@{t.hostname}:{t.port}" + (f" via {t.proxy_jump}" if t.proxy_jump else "")

    def _connect(self) -> None:
        hops = [resolve_jump(h.strip()) for h in self.target.proxy_jump.split(",")] if self.target.proxy_jump else []
        chain = [*hops, self.target]
        sock = None
        for i, hop in enumerate(chain):
            keys = self._key_files(hop, explicit=i + 1 == len(chain) and bool(self.cluster.key))
            client = self._client_for()
            try:
                client.connect(
                    hop.hostname, port=hop.port, username=hop.user, key_filename=keys or None,
                    allow_agent=True, look_for_keys=not keys, sock=sock, timeout=self.connect_timeout,
                    banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                    channel_timeout=self.connect_timeout, passphrase=None,
                )
            except paramiko.BadHostKeyException as e:
                client.close()
                raise HostKeyError(
                    f"host key for {e.hostname} has CHANGED: expected {fingerprint(e.expected_key)}, "
                    f"got {e.key.get_name()} {fingerprint(e.key)}; refusing to connect",
                    hint="if the cluster really re-keyed, remove the old entry with "
                    f"`ssh-keygen -R {known_host_name(hop.hostname, hop.port)}` (and from "
                    f"{self.known_hosts}), then add the new one",
                ) from None
            except _SecondFactor:
                client.close()
                raise RemoteError(
                    f"{hop.user}@{hop.hostname}:{hop.port} took the key, then asked for a second factor "
                    "(keyboard-interactive: a one-time code or password), which the built-in SSH client never answers",
                    hint=f"use the system ssh: `chainrun cluster add {self.name} --ssh ALIAS` (a Host in ~/.ssh/config), "
                    f"then log in once with `chainrun cluster login {self.name}`",
                ) from None
            except paramiko.AuthenticationException as e:
                client.close()
                tried = ", ".join(keys) if keys else "your SSH agent's and ~/.ssh's keys"
                only_password = isinstance(e, paramiko.BadAuthenticationType) and "publickey" not in e.allowed_types
                raise RemoteError(
                    f"{hop.user}@{hop.hostname}:{hop.port} "
                    + ("accepts only passwords, which chainrun never uses" if only_password
                       else f"did not accept our key (tried {tried})"),
                    hint="check --user and --key, or load the key into your SSH agent with ssh-add; "
                    "passwords are not supported",
                ) from None
            except paramiko.SSHException as e:
                client.close()
                if str(e) != _NO_KEY:
                    raise
                # paramiko found no key file and no agent: the server was never offered anything
                bastion = i + 1 < len(chain)
                raise RemoteError(
                    f"no key to offer to {hop.user}@{hop.hostname}:{hop.port}"
                    + (" (a --proxy-jump hop)" if bastion else "") + ": no SSH agent and no key in ~/.ssh",
                    hint=(f"--key is the cluster's: give Host {hop.hostname} an IdentityFile in ~/.ssh/config, "
                          "or load its key into your SSH agent with ssh-add") if bastion else
                    "pass --key, load the key into your SSH agent with ssh-add, or name an IdentityFile in ~/.ssh/config",
                ) from None
            except BaseException:
                client.close()
                raise
            self._clients.append(client)
            self._remember_new_key(client)
            t = client.get_transport()
            t.set_keepalive(self.keepalive_s)
            if isinstance(t.sock, socket.socket):
                # small request/answer packets: without this, Nagle + delayed ACK add ~40 ms to every command
                t.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if i + 1 < len(chain):  # tunnel to the next hop through this one
                nxt = chain[i + 1]
                sock = t.open_channel("direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                                      timeout=self.connect_timeout)
        self.connects += 1
        log.info("%s: connected to %s", self.name, self._where())

    def _key_files(self, hop: Target, *, explicit: bool) -> list[str]:
        """The key files to offer: a missing ``--key`` is an error; a missing IdentityFile is skipped, as ssh does."""
        keys = []
        for k in hop.key_files:
            if os.path.isfile(k):
                keys.append(k)
            elif explicit:
                raise RemoteError(f"key file {k} of cluster {self.name} does not exist",
                                  hint="pass an existing private key with --key, or leave --key out to use "
                                  "your SSH agent and ~/.ssh keys")
        return keys

    def _client_for(self) -> paramiko.SSHClient:
        client = _NoPromptClient()
        # ~/.ssh/known_hosts, and chainrun's own file (read only; written by `cluster add --accept-new-host-key`)
        cert_authority = False
        for f in (Path.home() / ".ssh" / "known_hosts", self.known_hosts):
            cert_authority |= _load_known_hosts(client.get_host_keys(), f)
        policy = _Refuse(self.name, self.accept_new_host_key, cert_authority=cert_authority)
        client.set_missing_host_key_policy(policy)
        client._chainrun_policy = policy  # type: ignore[attr-defined]
        return client

    def _remember_new_key(self, client: paramiko.SSHClient) -> None:
        policy = client._chainrun_policy  # type: ignore[attr-defined]
        if policy.accepted:
            self.new_host_keys.append(policy.accepted)

    def _drop(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:  # closing a dead channel may raise anything; it is gone either way
                pass
            self._sftp = None
        for c in reversed(self._clients):
            try:
                c.close()
            except Exception:
                pass
        self._clients = []

    def close(self) -> None:
        self._drop()

    # ------------------------------------------------------------------ commands
    def run(
        self, argv: Sequence[str], timeout: float = 60.0, *, env: Mapping[str, str | None] | None = None,
        stdin: str | None = None,
    ) -> RunResult:
        argv = tuple(str(a) for a in argv)
        cmd = command_line(argv, env, login_shell=self.cluster.login_shell)
        chan = self._open_session()
        t0 = time.monotonic()
        try:
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            res = self._collect(chan, argv, timeout, t0)
        except _NET_ERRORS as e:
            self._drop()
            # the command may have run: never re-send it here
            raise RemoteUnreachable(f"connection to {self.name} lost during `{argv[0]}`: {_describe(e)}") from None
        finally:
            chan.close()
        log.debug("ssh %s: %s -> rc=%s in %.2fs", self.name, argv, res.returncode, res.duration_s)
        return res

    def _open_session(self) -> paramiko.Channel:
        # opening a channel sends nothing to run yet, so one retry on a fresh connection is safe
        for attempt in (1, 2):
            t = self._connected()
            try:
                return t.open_session(timeout=self.connect_timeout)
            except _NET_ERRORS as e:
                self._drop()
                if attempt == 2:
                    raise RemoteUnreachable(f"cannot open a session on {self.name}: {_describe(e)}") from None
        raise AssertionError("unreachable")

    def _collect(self, chan: paramiko.Channel, argv: tuple[str, ...], timeout: float, t0: float) -> RunResult:
        out, err = bytearray(), bytearray()
        deadline = t0 + timeout
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return RunResult(argv, -1, out.decode(errors="replace"), f"timed out after {timeout:.0f}s",
                                 time.monotonic() - t0, timed_out=True)
            select.select([chan], [], [], min(left, 1.0))  # the channel's pipe wakes us on data or exit
            if not self._clients or not chan.get_transport().is_active():
                raise EOFError("transport closed")
        while chan.recv_ready():  # whatever arrived between the last read and the close
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        rc = chan.recv_exit_status()
        return RunResult(argv, rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0)

    # ------------------------------------------------------------------ files
    def _sftp_client(self) -> paramiko.SFTPClient:
        t = self._connected()
        if self._sftp is None:
            self._sftp = paramiko.SFTPClient.from_transport(t)
        return self._sftp

    def home(self) -> str:
        """The remote user's home folder (where a session starts)."""
        try:
            return self._sftp_client().normalize(".")
        except _NET_ERRORS as e:
            self._drop()
            raise RemoteUnreachable(f"SFTP on {self.name} failed: {_describe(e)}") from None

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        """Upload atomically: a temporary name in the same folder, chmod, then rename over."""
        try:
            sftp = self._sftp_client()
            parent = posixpath.dirname(path)
            self._makedirs(sftp, parent)
            tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{time.time_ns()}")
            with sftp.open(tmp, "wb") as f:
                f.write(content.encode())
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as e:
            t = self._clients[-1].get_transport() if self._clients else None
            if isinstance(e, OSError) and t is not None and t.is_active():  # e.g. permission denied
                raise RemoteError(f"cannot write {path} on {self.name}: {_describe(e)}") from None
            self._drop()
            raise RemoteUnreachable(f"SFTP on {self.name} failed writing {path}: {_describe(e)}") from None

    def _makedirs(self, sftp: paramiko.SFTPClient, folder: str) -> None:
        missing = []
        while folder and folder not in ("/", "."):
            try:
                sftp.stat(folder)
                break
            except FileNotFoundError:
                missing.append(folder)
                folder = posixpath.dirname(folder)
        for d in reversed(missing):
            try:
                sftp.mkdir(d, 0o755)  # slurmd runs the job as the same user; 755 like a normal mkdir
            except OSError:
                sftp.stat(d)  # made meanwhile by someone else is fine; anything else raises


def _load_known_hosts(keys: paramiko.HostKeys, path: Path) -> bool:
    """Add a known_hosts file's plain entries; True if it has ``@cert-authority`` lines.

    paramiko's own loader raises on marker lines (``@cert-authority``, ``@revoked``) and on any line
    it cannot parse; ssh skips what it does not use, and so does this.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("cannot read %s: %s", path, e)
        return False
    markers = False
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("@"):
            markers |= line.startswith("@cert-authority")
            continue
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError, TypeError) as e:
            log.debug("%s:%d: skipped (%s)", path, lineno, e)
            continue
        if entry is not None and entry.key is not None:
            for host in entry.hostnames:
                keys.add(host, entry.key.get_name(), entry.key)
    return markers


def _describe(e: BaseException) -> str:
    """What went wrong, in words a user reads: never a Python class name."""
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        inner = [x for x in e.errors.values() if isinstance(x, OSError)]
        if inner and all(isinstance(x, ConnectionRefusedError) for x in inner):
            ports = sorted({addr[1] for addr in e.errors if len(addr) > 1})
            return f"connection refused: nothing listens for SSH on port {', '.join(map(str, ports))}"
        return "; ".join(sorted({_describe(x) for x in inner})) or "no address could be reached"
    if isinstance(e, socket.gaierror):
        return f"unknown host name ({e.strerror or e})"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "no answer in time (timed out)"
    if isinstance(e, paramiko.PasswordRequiredException):
        return "the key file is protected by a passphrase"
    if isinstance(e, EOFError):
        return "the server closed the connection"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    text = " ".join(str(e).split())
    if "protocol banner" in text:  # paramiko: the port answered, but not with SSH's greeting
        return "no SSH greeting from the server"
    return text or "the connection failed without a reason"


def _connect_hint(e: BaseException) -> str | None:
    """How to fix a failed connection, where the failure says enough."""
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(e, ConnectionRefusedError):
        return "check --host, and --port: the login node's SSH port"
    if isinstance(e, socket.gaierror):
        return "check --host, or HostName in ~/.ssh/config"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "check the host and port, your network or VPN, or reach it through a bastion with --proxy-jump"
    if isinstance(e, paramiko.PasswordRequiredException):
        return "load the key into your SSH agent with ssh-add; chainrun never asks for or stores a passphrase"
    if isinstance(e, (EOFError, paramiko.SSHException)):
        return "is that port an SSH server? check --host and --port"
    return None
