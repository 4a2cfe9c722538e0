"""Runner over the system ``ssh`` (OpenSSH), for sites with MFA, certificates, GSSAPI or odd jumps.

``chainrun cluster add NAME --ssh ALIAS`` stores only the alias: ``ssh ALIAS`` then applies the
user's ``~/.ssh/config`` as it is (ProxyJump, ProxyCommand, CertificateFile, GSSAPI, Match).
chainrun adds only what an unattended caller must have, on every call:

- ``BatchMode=yes``: never a prompt (no passphrase, no password, no one-time code);
- ``StrictHostKeyChecking=yes`` (``accept-new`` only from ``cluster add --accept-new-host-key``);
- a ControlMaster socket in a short private folder (:func:`control_dir`), ``ControlMaster=auto``
  and ``ControlPersist``: each command is a new session over one authenticated connection;
- ``LogLevel=ERROR``: a site's login banner must not land in a command's stderr.

On an MFA site the master is opened by a human once (:func:`login`, ``chainrun cluster login``);
when it is gone, a call fails with :class:`LoginRequired` (one line: log in again) and later
calls fail the same way from the local socket alone, without knocking on the site again.

Like the paramiko runner, a command that may have been sent is never re-sent: an ``ssh`` that
lost its connection raises :class:`RemoteUnreachable` and the engine's adoption logic takes over.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shlex
import stat
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from chainrun.errors import RemoteError, UsageError
from chainrun.runner.base import HostKeyError, RemoteUnreachable, RunResult, command_line

log = logging.getLogger(__name__)

# sun_path holds 104 bytes on macOS (108 on Linux); ssh binds "<ControlPath>.<16 random chars>" first
SOCKET_PATH_MAX = 104
_HASH_LEN = 40  # %C: a SHA1 of local host, remote host, port, user (and jump), in hex
_TEMP_SUFFIX = 17
DEFAULT_PERSIST = "10m"  # a master opened by a watcher's call outlives the gap between ticks

# what ssh itself prints when it could not log in: the remote command was never started
_NOT_SENT = re.compile(
    r"permission denied \(|host key verification failed|could not resolve hostname|ssh: connect to host|"
    r"connection refused|connection timed out|kex_exchange_identification|banner exchange|"
    r"connection closed by .* port \d+|no .* host key is known|remote host identification has changed|"
    r"proxyjump|proxycommand|stdio forwarding failed|bad configuration option|no such file or directory.*config|"
    r"too many authentication failures|certificate .*(?:expired|invalid)", re.IGNORECASE)
# the connection went away while the command may have run
_LOST = re.compile(
    r"closed by remote host|broken pipe|connection reset|timeout, server .* not responding|"
    r"mux_client|read from master failed|client_loop|packet_write_wait|session open refused|"
    r"administratively prohibited|channel \d+: open failed", re.IGNORECASE)
_AUTH = re.compile(r"permission denied \(([^)]*)\)", re.IGNORECASE)
# the master asked the server for a session and was refused (sshd's MaxSessions reached): ssh then
# tries a connection of its own, which an MFA site refuses in BatchMode; the command never started
_MUX_REFUSED = re.compile(r"mux_client\w*: session request failed: session open refused", re.IGNORECASE)
# ...and these lines of ssh's own are not the remote command's stderr
_MUX_NOISE = re.compile(r"^(mux_client\w*: |ControlSocket .* already exists, disabling multiplexing)")
_NEVER_STARTED = re.compile(r"permission denied \(|channel \d+: open failed", re.IGNORECASE)
SESSION_RETRY_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # a refused session waits for the one in use (short calls)


class LoginRequired(RemoteError):
    """The site needs a human (a one-time code, a fresh certificate or ticket) and no master is open."""

    exit_code = 8
    methods = ""  # what the server still offered (``Permission denied (...)``), e.g. "keyboard-interactive"


class SessionRefused(RemoteUnreachable):
    """The master is open but the server refused one more session over it (sshd ``MaxSessions``):
    the command never started, so it may be sent again."""


def control_dir() -> Path:
    """The short private folder for ControlMaster sockets: ``CHAINRUN_SSH_CONTROL_DIR``, else
    ``/tmp/chainrun-ssh-UID``. Never the chainrun home (a macOS home path is too long for a socket,
    NFS homes may not hold sockets), and never ``$XDG_RUNTIME_DIR``: a tick from cron has no such
    variable and must find the master that `cluster login` opened from a terminal."""
    override = os.environ.get("CHAINRUN_SSH_CONTROL_DIR")
    if override:
        return Path(override).expanduser()
    return Path("/tmp") / f"chainrun-ssh-{os.getuid()}"


def ensure_control_dir(path: Path | None = None) -> Path:
    """Create the folder 0700, refuse one that is not ours or too long for a socket in it."""
    path = path or control_dir()
    longest = len(str(path)) + 1 + _HASH_LEN + _TEMP_SUFFIX
    if longest >= SOCKET_PATH_MAX:
        raise UsageError(
            f"SSH control folder {path} is too long for a socket ({longest} of at most {SOCKET_PATH_MAX - 1} bytes)",
            hint="set CHAINRUN_SSH_CONTROL_DIR to a short private folder, e.g. /tmp/cr-ssh")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise UsageError(f"cannot create SSH control folder {path}: {e.strerror}",
                         hint="set CHAINRUN_SSH_CONTROL_DIR to a folder you own") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UsageError(f"SSH control folder {path} is not a folder of yours",
                         hint="remove it, or set CHAINRUN_SSH_CONTROL_DIR to a folder you own")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours: others must not reach the sockets (a socket is a logged-in session)
    return path


def check_alias(alias: str) -> str:
    if not alias or alias.startswith("-") or any(ch.isspace() for ch in alias):
        raise UsageError(f"invalid ssh alias {alias!r}", hint="a Host name from ~/.ssh/config, e.g. --ssh ls6")
    return alias


def _config_args() -> list[str]:
    # tests (and users with several configs) point chainrun at another file, as for the paramiko lookups
    cfg = os.environ.get("CHAINRUN_SSH_CONFIG")
    return ["-F", cfg] if cfg else []


def base_argv(alias: str, *, accept_new: bool = False, persist: str = DEFAULT_PERSIST, connect_timeout: int = 15,
              batch: bool = True, master: str = "auto") -> list[str]:
    """``ssh`` and the options chainrun adds to the user's config (command-line -o wins over the config)."""
    return [
        "ssh", *_config_args(),
        "-o", f"BatchMode={'yes' if batch else 'no'}",
        "-o", f"StrictHostKeyChecking={'accept-new' if accept_new else 'yes'}",
        "-o", f"ControlMaster={master}",
        "-o", f"ControlPath={control_dir() / '%C'}",
        "-o", f"ControlPersist={persist}",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
        # stderr is the remote command's (parsers read sbatch's): no login banner, no "Permanently added";
        # ssh's own failures are errors and still show
        *(["-o", "LogLevel=ERROR"] if batch else []),
        "-T", check_alias(alias),
    ]


def master_check(alias: str) -> bool:
    """Whether a master for ``alias`` listens on our socket (asks the local socket only)."""
    p = subprocess.run(["ssh", *_config_args(), "-o", f"ControlPath={control_dir() / '%C'}", "-O", "check", alias],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    return p.returncode == 0


def socket_path(alias: str) -> Path | None:
    """Where ssh puts the master's socket for ``alias`` (``ssh -G`` expands %C; no connection)."""
    p = subprocess.run(["ssh", *_config_args(), "-o", f"ControlPath={control_dir() / '%C'}", "-G", alias],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    for ln in p.stdout.splitlines():
        if ln.startswith("controlpath "):
            return Path(ln.split(None, 1)[1].strip())
    return None


def remove_stale_socket(alias: str) -> None:
    """A master that died leaves its socket behind; ``ControlMaster=yes`` would then run without one."""
    path = socket_path(alias)
    if path is not None and path.is_socket() and not master_check(alias):
        path.unlink(missing_ok=True)


def master_exit(alias: str) -> bool:
    """Close the master (``ssh -O exit``); True if one was running."""
    p = subprocess.run(["ssh", *_config_args(), "-o", f"ControlPath={control_dir() / '%C'}", "-O", "exit", alias],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    return p.returncode == 0


class OpenSSHRunner:
    def __init__(self, cluster, *, accept_new_host_key: bool = False, connect_timeout: int = 15,
                 max_backoff_s: float = 30.0) -> None:
        self.cluster = cluster
        self.name = cluster.name
        self.alias = check_alias(cluster.host)
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = connect_timeout
        self.max_backoff_s = max_backoff_s
        self.calls = 0  # ssh processes started (each a session over the master once it exists)
        self._user: str | None = None
        self._home: str | None = None
        self._needs_login = False
        self._dir_ready = False
        self._failures = 0
        self._retry_at = 0.0

    @property
    def user(self) -> str:
        """The remote user as ``ssh -G`` resolves it from the config (no connection)."""
        if self._user is None:
            p = subprocess.run(["ssh", *_config_args(), "-G", self.alias], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL, check=False)
            found = [ln.split(None, 1)[1] for ln in p.stdout.splitlines() if ln.startswith("user ")]
            self._user = found[0].strip() if found else ""
        return self._user

    # ------------------------------------------------------------------ commands
    def run(self, argv: Sequence[str], timeout: float = 60.0, *, env: Mapping[str, str] | None = None,
            stdin: str | None = None) -> RunResult:
        argv = tuple(str(a) for a in argv)
        line = command_line(argv, env, login_shell=bool(getattr(self.cluster, "login_shell", False)))
        res = self._ssh(line, argv, timeout, stdin)
        log.debug("openssh %s: %s -> rc=%s in %.2fs", self.name, argv, res.returncode, res.duration_s)
        return res

    def _ssh(self, line: str, argv: tuple[str, ...], timeout: float, stdin: str | None) -> RunResult:
        if not self._dir_ready:  # /tmp may have been emptied since `cluster add` (a reboot)
            ensure_control_dir()
            self._dir_ready = True
        self._gate()
        full = [*base_argv(self.alias, accept_new=self.accept_new_host_key, connect_timeout=self.connect_timeout), line]
        t0 = time.monotonic()
        for wait in (*SESSION_RETRY_S, None):
            self.calls += 1
            try:
                p = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=timeout,
                                   stdin=None if stdin is not None else subprocess.DEVNULL, check=False)
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                return RunResult(argv, -1, out, f"timed out after {timeout:.0f}s", time.monotonic() - t0, timed_out=True)
            except FileNotFoundError:
                raise RemoteError("the `ssh` command is not installed here",
                                  hint="install OpenSSH's client, or re-add the cluster with --host (built-in SSH)") from None
            refused = bool(_MUX_REFUSED.search(p.stderr))
            if not (refused and p.returncode == 255 and _NEVER_STARTED.search(p.stderr)):
                break
            # another process's session holds the site's one session: never started, so wait and send again
            if wait is None:
                raise SessionRefused(
                    f"{self.name} refused a session over the open SSH master, {len(SESSION_RETRY_S) + 1} times: "
                    f"the site allows few sessions per login (sshd MaxSessions); `{argv[0]}` was not sent",
                    hint="another chainrun command on this machine may hold it; try again")
            log.info("openssh %s: session refused over the master (another one in use); again in %.1fs", self.name, wait)
            time.sleep(wait)
        stderr = p.stderr
        if refused:  # ssh ran it over a connection of its own (a key-only site): its notes are not the command's
            stderr = "".join(ln for ln in p.stderr.splitlines(keepends=True) if not _MUX_NOISE.match(ln))
        res = RunResult(argv, p.returncode, p.stdout, stderr, time.monotonic() - t0)
        if p.returncode == 255:
            self._raise_if_ssh_failed(res)
        self._failures, self._retry_at = 0, 0.0
        return res

    def _gate(self) -> None:
        """Fail at once, without contacting the site, while a login is needed or a connect backs off."""
        if self._needs_login:
            if not master_check(self.alias):
                raise self._login_required("no SSH master is open")
            self._needs_login = False
        now = time.monotonic()
        if now < self._retry_at:
            raise RemoteUnreachable(f"{self.name} unreachable; next try in {self._retry_at - now:.0f}s")

    def _login_required(self, why: str) -> LoginRequired:
        return LoginRequired(f"{why} and the site needs a login: log in again: `chainrun cluster login {self.name}`")

    def _raise_if_ssh_failed(self, res: RunResult) -> None:
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
        text = "\n".join(lines)
        what = _ssh_line(lines)
        if "host key verification failed" in text.lower():
            changed = "has changed" in text.lower()
            raise HostKeyError(
                f"host key for {self.alias} " + ("has CHANGED; refusing to connect" if changed else "is not known"),
                hint=("if the cluster really re-keyed, remove the old entry with `ssh-keygen -R HOST`" if changed else
                      f"if you trust it, `ssh {self.alias}` once and check the fingerprint, or re-add with "
                      f"`chainrun cluster add {self.name} --ssh {self.alias} --accept-new-host-key`"))
        if m := _AUTH.search(text):
            self._needs_login = True
            e = LoginRequired(
                f"no SSH master is open and the site needs a login ({m.group(1)}): "
                f"log in again: `chainrun cluster login {self.name}`")
            e.methods = m.group(1).strip()
            raise e
        if _NOT_SENT.search(text):
            self._failures += 1
            self._retry_at = time.monotonic() + min(self.max_backoff_s, 2.0 ** (self._failures - 1))
            raise RemoteUnreachable(f"cannot connect to {self.name} (ssh {self.alias}): {what}")
        if _LOST.search(text) or not master_check(self.alias):
            # the command may have run: never re-send it here. A session cut by its master's end
            # exits 255 without a word, like a command's own `exit 255`: the master tells them apart
            raise RemoteUnreachable(f"connection to {self.name} lost during `{res.argv[0]}`: "
                                    + (what if lines else "the SSH master closed"))
        # exit 255 with nothing ssh-like on stderr and the master alive: the remote command's own code

    # ------------------------------------------------------------------ files
    def home(self) -> str:
        """The remote user's home folder (where a session starts)."""
        if self._home is None:
            res = self.run(["pwd"], 30)
            if not res.ok or not res.stdout.strip().startswith("/"):
                raise RemoteError(f"cannot read the home folder on {self.name}: {res.first_error_line()}")
            self._home = res.stdout.strip()
        return self._home

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        """Upload over the same master: ``cat`` into a temporary name beside it, chmod, rename over."""
        parent = posixpath.dirname(path) or "."
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{time.time_ns()}")
        q = shlex.quote
        script = (f"mkdir -p -- {q(parent)} && cat > {q(tmp)} && chmod {mode:o} -- {q(tmp)} && "
                  f"mv -f -- {q(tmp)} {q(path)} || {{ rc=$?; rm -f -- {q(tmp)}; exit $rc; }}")
        res = self.run(["sh", "-c", script], 120, stdin=content)
        if not res.ok:
            raise RemoteError(f"cannot write {path} on {self.name}: {res.first_error_line()}")

    def close(self) -> None:
        """Nothing to close: the master outlives this process on purpose (ControlPersist)."""


def _ssh_line(lines: list[str]) -> str:
    """The line of ssh's stderr that says what went wrong (the last one that is not a banner)."""
    for ln in reversed(lines):
        if not ln.startswith("@@@"):
            return ln.rstrip(".")
    return "ssh failed without a reason"


def login(cluster, *, persist: str = "yes", accept_new: bool = False) -> dict:
    """Open the master on this terminal (the user answers the site's prompts once), then check that
    commands run over it without prompting. Returns what happened; raises a RemoteError if not usable."""
    alias = check_alias(cluster.host)
    ensure_control_dir()
    if master_check(alias):
        already = True
    else:
        already = False
        remove_stale_socket(alias)
        argv = [*base_argv(alias, accept_new=accept_new, persist=persist, batch=False, master="yes"), "-N", "-f"]
        p = subprocess.run(argv, check=False)  # the terminal is the user's: prompts and answers go through it
        if p.returncode != 0:
            raise RemoteError(f"login to {cluster.name} (ssh {alias}) failed (ssh exit {p.returncode})",
                              hint=f"check `ssh {alias}` by hand; nothing was changed")
        if not master_check(alias):
            raise RemoteError(
                f"logged in to {cluster.name}, but no SSH master stayed open: multiplexing is disabled",
                hint="ControlMaster/ControlPersist must be allowed on this machine's ssh; "
                "on Windows' OpenSSH it is not (use WSL)")
    sessions = sessions_allowed(alias)
    if sessions == "none":
        master_exit(alias)  # a master nothing can run over is only a held login
        raise RemoteError(f"{cluster.name} disables SSH multiplexing: the server refuses every session over the "
                          "master (sshd MaxSessions 0)",
                          hint="chainrun cannot reuse one login there; run the watcher on a login node instead "
                          "(docs/remote-clusters.md, \"Running unattended\")")
    probe = OpenSSHRunner(cluster, connect_timeout=15)
    try:
        res = probe.run(["true"], 60)
    except LoginRequired:
        raise RemoteError(f"the SSH master for {cluster.name} is open, but a command over it still asked to log in",
                          hint="the site may forbid multiplexed sessions; run the watcher on a login node instead "
                          "(docs/remote-clusters.md)") from None
    if not res.ok:
        raise RemoteError(f"logged in to {cluster.name}, but `true` failed: {res.first_error_line()}",
                          hint="check that the account has a working shell")
    return {"cluster": cluster.name, "alias": alias, "already_open": already, "persist": persist,
            "control_dir": str(control_dir()), "sessions": sessions}


def sessions_allowed(alias: str, timeout: float = 60.0) -> str:
    """How many sessions the server allows over the open master: "many", "one" (sshd
    ``MaxSessions 1``, how sites turn multiplexing off: our ``-N`` master holds no session, so
    one command at a time still runs) or "none" (``MaxSessions 0``). One command, then a second
    while a first is held open; each asked once (no retries) and read from ssh's own words."""
    argv = base_argv(alias)

    def one_more() -> bool:  # True if the server refused the session over the master
        p = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, check=False)
        return bool(_MUX_REFUSED.search(p.stderr))

    if one_more():
        return "none"
    held = subprocess.Popen([*argv, "echo held; exec cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        import select

        ready, _, _ = select.select([held.stdout], [], [], timeout)
        if not ready or held.stdout.readline().strip() != "held":  # not held open: a second one tells nothing
            return "many"
        return "one" if one_more() else "many"
    finally:
        held.stdin.close()  # `cat` ends, and with it the session
        try:
            held.wait(timeout=30)
        except subprocess.TimeoutExpired:
            held.kill()
            held.wait()
