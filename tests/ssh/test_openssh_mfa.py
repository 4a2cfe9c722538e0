"""A site that asks for a one-time code after the key (sshd-mfa on :2224), through the real CLI.

Over the system ssh: `cluster login` answers the code once on a terminal (a pty here), then
chainrun's calls (submit, ticks) run over the master and never prompt; once the master is closed
a tick fails with one line naming `chainrun cluster login`, nothing is submitted twice, and after
logging in again the chain moves on. The built-in client (paramiko) against the same server
fails at once, without a prompt, and names --ssh.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chainrun.chain.request import job_name
from tests.conftest import REPO, run_cli
from tests.ssh.conftest import REMOTE_USER, TOY_DIR, host_block

pytestmark = pytest.mark.ssh

PROMPT = re.compile(rb"[Pp]assword: ?$|code: ?$")


def in_pty(args: list[str], home: Path, *, answer: str | None = None, timeout: float = 120) -> tuple[str, int, int]:
    """Run `chainrun ARGS` on a terminal; answer every prompt with ``answer`` (or with nothing, if None).

    Returns (everything the terminal showed, exit code, prompts seen)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI, its stdin/stdout/stderr the pty
        os.environ.update(CHAINRUN_HOME=str(home), COLUMNS="300")  # a message is one line: no wrapping
        os.execv(sys.executable, [sys.executable, "-m", "chainrun.cli.main", *args])
    shown, prompts, end = b"", 0, time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the CLI closed the terminal
                break
            if not data:
                break
            shown += data
            if PROMPT.search(shown):
                prompts += 1
                shown += b"<answered>\n"
                os.write(fd, ((answer or "") + "\n").encode())
        else:
            os.kill(pid, 9)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return shown.decode(errors="replace"), os.waitstatus_to_exitcode(status), prompts


def segment_jobs(chain: str) -> dict[int, list[str]]:
    """Slurm's own view (squeue here, as root): the job ids of each of the chain's segments. The
    cluster is the one the remote shell reaches (/etc/slurm/slurm.conf), not this process's SLURM_CONF."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = subprocess.run(["squeue", "-h", "-u", REMOTE_USER, "-o", "%i %j"], capture_output=True, text=True,
                         check=True, env=env).stdout
    jobs: dict[int, list[str]] = {}
    for line in out.splitlines():
        job, name = line.split(None, 1)
        for idx in range(20):
            if name.strip() == job_name(chain, idx):
                jobs.setdefault(idx, []).append(job)
    return jobs


@pytest.fixture
def mfa_home(tmp_path, mfa_server, openssh_env) -> Path:
    openssh_env(host_block("crmfa", mfa_server))
    home = tmp_path / "home"
    p = run_cli("cluster", "add", "mfa", "--ssh", "crmfa", "--json", home=home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["login_needed"] is True  # the host answered (key checked), the code is missing
    return home


@pytest.mark.slurm
def test_login_once_then_ticks_never_prompt_and_a_closed_master_fails_in_one_line(mfa_home, mfa_server,
                                                                                 slurm_cluster):
    home = mfa_home
    code = (mfa_server.dir / "mfa-code").read_text().strip()
    before = run_cli("cluster", "test", "mfa", home=home)
    assert before.returncode == 8 and "log in again: `chainrun cluster login mfa`" in before.stderr

    shown, rc, prompts = in_pty(["cluster", "login", "mfa"], home, answer=code)
    assert rc == 0 and prompts == 1, shown  # the code, asked once
    assert "logged in" in shown
    again, rc, prompts = in_pty(["cluster", "login", "mfa"], home)
    assert rc == 0 and prompts == 0 and "already logged in" in again, again

    # a chain over the master: the payload uploaded, sbatch and every tick without a prompt
    sub = run_cli("submit", str(REPO / "templates" / "toy_train.sh"), "--cluster", "mfa", "--total", "2m", "--signal", "USR2@50",
                  "--policy", "dependency", "--json", "--", f"--export=ALL,CHAINRUN_TOY={TOY_DIR / 'toy_train.sh'}",
                  home=home, cwd=home)
    assert sub.returncode == 0, sub.stderr
    chain = json.loads(sub.stdout)["data"]["chain"]
    try:
        shown, rc, prompts = in_pty(["watch", "--once", "--plain"], home)  # a terminal: a prompt would show
        assert rc == 0 and prompts == 0, shown
        assert "warning" not in shown, shown
        jobs = segment_jobs(chain)
        assert jobs and all(len(ids) == 1 for ids in jobs.values()), jobs

        closed = run_cli("cluster", "logout", "mfa", home=home)
        assert closed.returncode == 0 and "closed" in closed.stdout
        for _ in range(2):  # the first tick meets the site, the next one only the missing local socket
            shown, rc, prompts = in_pty(["watch", "--once", "--plain"], home)
            # the only cluster with chains could not be ticked: cron must see it (exit 8, docs/exit-codes.md)
            assert rc == 8 and prompts == 0, shown
            assert "error: the tick failed on the only cluster with chains (mfa: " in shown, shown
            # the tick's one warning for that cluster (the log handler keeps its copy for the log file)
            lines = [ln for ln in shown.splitlines() if " warning: mfa: " in ln]
            assert len(lines) == 1 and "log in again: `chainrun cluster login mfa`" in lines[0], shown
            assert "Traceback" not in shown
        assert segment_jobs(chain) == jobs, "nothing submitted (or lost) while the cluster was unreachable"

        shown, rc, prompts = in_pty(["cluster", "login", "mfa"], home, answer=code)
        assert rc == 0 and prompts == 1, shown
        shown, rc, prompts = in_pty(["watch", "--once", "--plain"], home)
        assert rc == 0 and prompts == 0 and "log in again" not in shown, shown
        after = segment_jobs(chain)
        assert all(len(ids) == 1 for ids in after.values()), after  # still one job per segment
        st = json.loads(run_cli("status", chain, "--json", home=home).stdout)["data"][0]
        assert st["status"] not in ("FAILED", "CANCELLED"), st
    finally:
        run_cli("cancel", chain, home=home)


def test_paramiko_against_the_mfa_site_fails_without_prompting_and_names_ssh(tmp_path, mfa_server):
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text(mfa_server.known_hosts.read_text())
    shown, rc, prompts = in_pty([*mfa_server.add_args("pm")], home)  # a terminal: paramiko could prompt on it
    assert rc == 8 and prompts == 0, shown
    assert "second factor" in shown and "--ssh" in shown and "cluster login" in shown
    assert "Traceback" not in shown and not (home / "config.toml").exists()


def test_cluster_add_ssh_refusals(tmp_path, openssh_env, monkeypatch, ssh_server):
    home = tmp_path / "home"
    openssh_env(host_block("crlo", ssh_server))
    both = run_cli("cluster", "add", "x", "--ssh", "crlo", "--host", "h", home=home)
    assert both.returncode == 2 and "not both" in both.stderr
    extra = run_cli("cluster", "add", "x", "--ssh", "crlo", "--user", "u", home=home)
    assert extra.returncode == 2 and "Host crlo" in extra.stderr
    bad = run_cli("cluster", "add", "x", "--ssh", "-oProxyCommand=touch", home=home)
    assert bad.returncode == 2 and "invalid ssh alias" in bad.stderr
    # a macOS-long folder: the socket would not fit, refused at `add`, not at the first tick
    monkeypatch.setenv("CHAINRUN_SSH_CONTROL_DIR", "/Users/someone-with-a-long-name/Library/Application Support/chainrun/ssh")
    long = run_cli("cluster", "add", "x", "--ssh", "crlo", home=home)
    assert long.returncode == 2 and "too long for a socket" in long.stderr and "CHAINRUN_SSH_CONTROL_DIR" in long.stderr
    assert not (home / "config.toml").exists()
    # a key-only cluster has nothing to log in to
    monkeypatch.delenv("CHAINRUN_SSH_CONTROL_DIR")
    assert run_cli(*ssh_server.add_args("keys"), "--no-check", home=home).returncode == 0
    p = run_cli("cluster", "login", "keys", home=home)
    assert p.returncode == 2 and "--ssh" in p.stderr


def test_cluster_add_ssh_on_a_key_only_site_works_without_login(tmp_path, openssh_env, ssh_server):
    home = tmp_path / "home"
    openssh_env(host_block("crlo", ssh_server))
    p = run_cli("cluster", "add", "lo", "--ssh", "crlo", "--json", home=home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["login_needed"] is False
    assert "ssh crlo" in run_cli("cluster", "list", home=home).stdout
    t = run_cli("cluster", "test", "lo", "--json", home=home)
    assert t.returncode == 0 and json.loads(t.stdout)["data"]["slurm_version"].startswith("slurm"), t.stderr


def test_cluster_add_ssh_with_a_key_the_site_refuses_saves_nothing(tmp_path, openssh_env, ssh_server):
    """A key-only site that refuses our key answers `Permission denied (publickey)`: no login would help
    (there is no prompt to answer), so `cluster add --ssh` fails in one line, exit 8, and saves nothing,
    as with --host; it once saved the cluster and called it an MFA site."""
    home = tmp_path / "home"
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    openssh_env(host_block("crother", ssh_server).replace(ssh_server.key, str(other)))
    p = run_cli("cluster", "add", "lo", "--ssh", "crother", home=home)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 8 and len(lines) == 1, p.stderr
    assert "did not accept our key" in lines[0] and "IdentityFile" in lines[0] and "nothing was saved" in lines[0]
    assert "MFA" not in p.stdout + p.stderr and not (home / "config.toml").exists()


def test_certificates_both_ways_over_openssh_only(tmp_path, cert_server, openssh_env):
    """A user certificate from a CA (no authorized_keys) and a host certificate checked through
    @cert-authority: the system ssh does both from the config; the built-in client cannot."""
    home = tmp_path / "home"
    openssh_env(host_block("crcert", cert_server, CertificateFile=f"{cert_server.key}-cert.pub"))
    assert cert_server.known_hosts.read_text().startswith("@cert-authority ")  # no plain host key to trust
    p = run_cli("cluster", "add", "cert", "--ssh", "crcert", "--json", home=home)
    assert p.returncode == 0 and json.loads(p.stdout)["data"]["login_needed"] is False, p.stderr
    t = run_cli("cluster", "test", "cert", "--json", home=home)
    assert t.returncode == 0 and json.loads(t.stdout)["data"]["slurm_version"].startswith("slurm"), t.stderr

    # the call that opens the master gets the site's login banner from ssh: it must not reach the command's stderr
    assert run_cli("cluster", "logout", "cert", home=home).returncode == 0
    from chainrun.clusters import Cluster
    from chainrun.runner.openssh import OpenSSHRunner

    r = OpenSSHRunner(Cluster(name="cert", host="crcert", transport="openssh"))
    res = r.run(["sh", "-c", "echo out; echo err >&2"], 60)
    assert (res.stdout, res.stderr) == ("out\n", "err\n")
    assert "banner" in (cert_server.dir / "sshd_config").read_text().lower()  # the server does print one

    # the same key without its certificate is refused: the server takes certificates only (the master
    # is per user@host:port, so the certificate's master is closed first)
    assert run_cli("cluster", "logout", "cert", home=home).returncode == 0
    bare = tmp_path / "bare"
    bare.write_bytes(Path(cert_server.key).read_bytes())
    bare.chmod(0o600)
    openssh_env(host_block("crbare", cert_server).replace(cert_server.key, str(bare)))
    assert run_cli("cluster", "add", "bare", "--ssh", "crbare", "--no-check", home=home).returncode == 0
    refused = run_cli("cluster", "test", "bare", home=home)
    assert refused.returncode == 8 and "(publickey)" in refused.stderr and "cluster login bare" in refused.stderr

    # paramiko: the host certificate's CA in known_hosts cannot be checked; the error says to use --ssh
    home2 = tmp_path / "home2"
    home2.mkdir()
    (home2 / "known_hosts").write_text(cert_server.known_hosts.read_text())
    pm = run_cli(*cert_server.add_args("pm"), home=home2)
    assert pm.returncode == 8 and "@cert-authority" in pm.stderr and "--ssh" in pm.stderr, pm.stderr


@pytest.mark.slurm
def test_a_cluster_waiting_for_a_login_is_notified_once_said_by_status_and_the_others_move(
        mfa_home, mfa_server, slurm_cluster, tmp_path, monkeypatch):
    """Ticks from a scheduler (`watch --once`, each a new process) while the MFA site's master is
    closed: each says one line, ONE mail goes out for all of them, `status` says the chain there is
    not ticked and why, and a chain on the local cluster keeps moving meanwhile."""
    from tests.ux.notifyhelpers import fake_sendmail, mails

    home = mfa_home
    log = fake_sendmail(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")  # the ticks' sendmail
    with open(home / "config.toml", "a") as f:
        f.write('\n[notify]\nmail = "me@example.org"\nmail_command = "sendmail"\n')
    code = (mfa_server.dir / "mfa-code").read_text().strip()
    assert in_pty(["cluster", "login", "mfa"], home, answer=code)[1] == 0
    toy = str(REPO / "templates" / "toy_train.sh")
    sub = run_cli("submit", toy, "--cluster", "mfa", "--total", "2m", "--signal", "USR2@50", "--policy", "dependency",
                  "--json", "--", f"--export=ALL,CHAINRUN_TOY={TOY_DIR / 'toy_train.sh'}", home=home, cwd=home)
    assert sub.returncode == 0, sub.stderr
    remote = json.loads(sub.stdout)["data"]["chain"]
    work = tmp_path / "work"
    work.mkdir()
    sub = run_cli("submit", toy, "--total", "2m", "--signal", "USR2@50", "--policy", "dependency", "--json",
                  home=home, cwd=work)
    assert sub.returncode == 0, sub.stderr
    local = json.loads(sub.stdout)["data"]["chain"]
    try:
        assert run_cli("cluster", "logout", "mfa", home=home).returncode == 0
        for _ in range(3):  # three scheduled ticks
            shown, rc, prompts = in_pty(["watch", "--once", "--plain"], home)
            assert rc == 0 and prompts == 0, shown
            lines = [ln for ln in shown.splitlines() if " warning: mfa: " in ln]
            assert len(lines) == 1 and "log in again: `chainrun cluster login mfa`" in lines[0], shown
        sent = mails(log)
        assert len(sent) == 1, sent  # one notification, not one per tick
        assert "mfa needs you to log in" in sent[0] and "chainrun cluster login mfa" in sent[0]
        st = {d["id"]: d for d in json.loads(run_cli("status", "--json", home=home).stdout)["data"]}
        assert st[local]["segments"] >= 2, st[local]  # dependency: the local chain's successor went out meanwhile
        assert st[remote]["untended"]["failing"] and st[local]["untended"]["failing"] == ""
        plain = run_cli("status", "--plain", home=home, env={"COLUMNS": "400"}).stdout
        said = [ln for ln in plain.splitlines() if "untended:" in ln]
        assert len(said) == 1 and "ticks of mfa fail since" in said[0] and "cluster login mfa" in said[0], plain
        assert "needs a tick" in said[0]

        assert in_pty(["cluster", "login", "mfa"], home, answer=code)[1] == 0
        shown, rc, _ = in_pty(["watch", "--once", "--plain"], home)
        assert rc == 0 and "log in again" not in shown, shown
        st = {d["id"]: d for d in json.loads(run_cli("status", "--json", home=home).stdout)["data"]}
        assert not st[remote]["untended"]["stale"] and st[remote]["untended"]["last_tick"], st[remote]["untended"]
        assert len(mails(log)) == 1
    finally:
        run_cli("cancel", remote, home=home)
        run_cli("cancel", local, home=home)
