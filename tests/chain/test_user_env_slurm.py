"""A user's shell sets SQUEUE_*/SACCT_FORMAT for their own use, and the site's squeue prints a warning
on stderr: the watcher's reads are not changed by either (real cluster, `chainrun watch`)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from chainrun.state.store import Store
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm

USER_ENV = {"SQUEUE_STATES": "PD", "SQUEUE_USERS": "nobody", "SQUEUE_PARTITION": "long", "SQUEUE_SORT": "-i",
            "SQUEUE_FORMAT": "%i", "SQUEUE_FORMAT2": "JobID", "SACCT_FORMAT": "JobID", "SLURM_TIME_FORMAT": "relative"}


def test_the_watcher_reads_slurm_whatever_the_users_environment(slurm_cluster, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "squeue"
    shim.write_text(f"#!/bin/sh\necho 'squeue: warning: this site wraps squeue' >&2\nexec {shutil.which('squeue')} \"$@\"\n")
    shim.chmod(0o755)
    env = {**USER_ENV, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    home = tmp_path / "home"
    chain = h.submit(home, tmp_path / "w", "userenv", "--total", "40s", "--signal", "USR2@30", "--policy", "reactive")
    watcher = subprocess.run(h.watch_argv(3), env={**os.environ, **env, "CHAINRUN_HOME": str(home)},
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    try:
        assert watcher.returncode == 0, watcher.stdout + watcher.stderr
        store = Store(home / "state.sqlite")
        c, segs = store.chain(chain), store.segments(chain)
        assert c.status == "COMPLETED", c.reason
        messages = [e.message for _, e in store.events(chain)]
        # squeue showed the running segment (SQUEUE_STATES=PD / SQUEUE_USERS=nobody would hide it)
        assert f"segment 0 (job {segs[0].job_id}) started" in messages
        assert segs[0].start and segs[0].end and segs[0].end > segs[0].start  # epoch seconds, not "relative"
        assert not any("Slurm query failed" in line for line in watcher.stdout.splitlines())
    finally:
        h.cli("cancel", chain, home=home)
