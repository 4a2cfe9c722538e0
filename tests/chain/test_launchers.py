"""What a launcher between srun and the trainer does with the signal (docs/checkpoint-contract.md).

torchrun (torch elastic) is the common one: it passes TERM on to every worker, but dies of USR2
and leaves its workers without it. So with `srun torchrun` a chain uses `--signal TERM@...`.
Runs where torch is installed (the test command installs it; the core-only variant skips this).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = """
import os, signal, sys, time
here, rank = sys.argv[1], os.environ["RANK"]
def got(sig, _):
    open(f"{here}/got-{rank}-{signal.Signals(sig).name}", "w").close(); sys.exit(0)
signal.signal(signal.SIGTERM, got)
signal.signal(signal.SIGUSR2, got)
open(f"{here}/up-{rank}", "w").close()
time.sleep(60)
"""


def _torchrun() -> str:
    exe = Path(sys.executable).with_name("torchrun")
    if not exe.exists() and not shutil.which("torchrun"):
        pytest.skip("torchrun is not installed (core-only test run)")
    return str(exe if exe.exists() else shutil.which("torchrun"))


@pytest.mark.parametrize("sig,reaches_workers", [(signal.SIGTERM, True), (signal.SIGUSR2, False)])
def test_torchrun_passes_term_not_usr2(tmp_path, sig, reaches_workers):
    (tmp_path / "w.py").write_text(WORKER)
    p = subprocess.Popen([_torchrun(), "--nproc_per_node=2", str(tmp_path / "w.py"), str(tmp_path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not all((tmp_path / f"up-{r}").exists() for r in (0, 1)) and time.time() < deadline:
            time.sleep(0.2)
        assert all((tmp_path / f"up-{r}").exists() for r in (0, 1)), "workers did not start"
        p.send_signal(sig)  # what srun does: the signal reaches the task (torchrun), not its children
        time.sleep(4)
        got = sorted(f.name for f in tmp_path.glob("got-*"))
        if reaches_workers:
            assert got == [f"got-0-{sig.name}", f"got-1-{sig.name}"]
        else:
            assert got == []
    finally:
        import os

        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)
