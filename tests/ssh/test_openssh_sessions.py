"""Sites that limit SSH multiplexing, against real sshds (start-sshd.sh, CHAINRUN_SSH_MAX_SESSIONS).

``MaxSessions 1`` is how a site turns multiplexing off: `cluster login` says so in one line and
works on (its master holds no session of its own), and a command refused while another holds
the one session waits and is sent again, never twice. ``MaxSessions 0`` refuses every session:
`cluster login` says the site disables multiplexing, in one line, and leaves no master open.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from chainrun.clusters import Cluster
from chainrun.runner import openssh
from chainrun.runner.openssh import OpenSSHRunner
from tests.conftest import run_cli
from tests.ssh.conftest import REMOTE_HOME, host_block

pytestmark = pytest.mark.ssh


def private_key_copy(server, tmp_path: Path) -> Path:
    """A copy of the test key this test may take away after the login (as a site's certificate or
    one-time code is gone after it): a connection of its own is then refused, the master goes on."""
    key = tmp_path / "key"
    shutil.copy(server.key, key)
    key.chmod(0o600)
    return key


def test_one_session_site_login_says_so_and_a_refused_command_waits_its_turn(tmp_path, one_session_server,
                                                                             openssh_env):
    key = private_key_copy(one_session_server, tmp_path)
    openssh_env(host_block("crone", one_session_server).replace(one_session_server.key, str(key)))
    home = tmp_path / "home"
    assert run_cli("cluster", "add", "one", "--ssh", "crone", home=home).returncode == 0
    assert run_cli("cluster", "logout", "one", home=home).returncode == 0  # `add` opened a master: log in anew
    p = run_cli("cluster", "login", "one", home=home)
    assert p.returncode == 0, p.stderr
    said = [ln for ln in p.stdout.splitlines() if "one SSH session at a time" in ln]
    assert len(said) == 1 and "MaxSessions 1" in said[0], p.stdout
    assert json.loads(run_cli("cluster", "login", "one", "--json", home=home).stdout)["data"]["sessions"] == "one"

    key.unlink()  # from here on only the master can run anything
    runner = OpenSSHRunner(Cluster(name="one", host="crone", transport="openssh"))
    marker = REMOTE_HOME / f"held-{time.time_ns()}"
    held = {}
    t = threading.Thread(target=lambda: held.update(res=runner.run(["sh", "-c", f"touch {marker}; sleep 3"], 60)))
    t.start()
    try:
        end = time.monotonic() + 60
        while not marker.exists():  # the first command holds the one session
            assert time.monotonic() < end and t.is_alive(), held
            time.sleep(0.05)
        other = OpenSSHRunner(Cluster(name="one", host="crone", transport="openssh"))
        res = other.run(["sh", "-c", f"echo ran >> {marker}; echo out; echo err >&2"], 60)
    finally:
        t.join(60)
    assert held["res"].ok
    assert res.ok and (res.stdout, res.stderr) == ("out\n", "err\n")  # ssh's own notes are not the command's
    assert other.calls > 1  # refused at least once while the other session ran...
    assert marker.read_text() == "ran\n"  # ...and run exactly once
    marker.unlink()
    t = run_cli("cluster", "test", "one", "--json", home=home)  # the CLI over the master, one session at a time
    assert t.returncode == 0 and json.loads(t.stdout)["data"]["slurm_version"].startswith("slurm"), t.stderr


def test_a_site_refusing_every_session_is_refused_at_login_in_one_line(tmp_path, no_session_server, openssh_env):
    openssh_env(host_block("crnone", no_session_server))
    home = tmp_path / "home"
    assert run_cli("cluster", "add", "none", "--ssh", "crnone", "--no-check", home=home).returncode == 0
    p = run_cli("cluster", "login", "none", home=home)
    assert p.returncode == 8, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "disables SSH multiplexing" in lines[0] and "MaxSessions 0" in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not openssh.master_check("crnone")  # no useless master left holding a login
