"""The PyTorch template on CPU keeps the optimisation across shapes (docs/templates.md, elastic segments).

A chain whose segment 0 runs at the reference shape (2 processes, gloo) and whose segment 1 resumes on
half of it (1 process, 2 accumulation steps) must end with the same weights as one uninterrupted run:
same global batch, same samples per step, same learning rate per sample.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")
TRAIN = REPO / "templates" / "pytorch" / "train.py"
STEPS = 12


def _env(ckpt: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CHAINRUN_"))}
    env.update({"CHAINRUN_CHECKPOINT_DIR": str(ckpt), "CHAINRUN_SIGNAL": "USR2", "MAX_STEPS": str(STEPS),
                "SAVE_EVERY": "1000", "CHAINRUN_PROGRESS_FILE": str(ckpt / "prog"), "OMP_NUM_THREADS": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(ckpt: Path) -> dict:
    """The model of the newest complete checkpoint: the one the newest marker names (no generation here)."""
    import json

    marker = json.loads((ckpt / "latest.json").read_text())
    return torch.load(ckpt / marker["folder"] / "state.pt", map_location="cpu")["model"]


def test_a_segment_on_half_the_nodes_continues_the_same_optimisation(tmp_path):
    # one uninterrupted run at one shape (beside the chain's segment 0: torch takes seconds to import)
    a = tmp_path / "a"
    a.mkdir()
    whole = subprocess.Popen([sys.executable, str(TRAIN)], env=_env(a, CHAINRUN_NODES=1, CHAINRUN_REF_NODES=1),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # segment 0: the reference shape, 2 nodes with one process each; the signal reaches rank 0 only
    b = tmp_path / "b"
    b.mkdir()
    port = _free_port()
    ranks = [subprocess.Popen([sys.executable, str(TRAIN)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(b, CHAINRUN_NODES=2, CHAINRUN_REF_NODES=2, SLURM_NTASKS=2,
                                                  SLURM_PROCID=r, MASTER_PORT=port, STEP_SECONDS=0.1))
             for r in (0, 1)]
    prog = b / "prog.0.local"
    deadline = time.time() + 90
    while time.time() < deadline and (not prog.exists() or len(prog.read_text().splitlines()) < 3):
        assert all(r.poll() is None for r in ranks), [r.communicate()[0] for r in ranks]
        time.sleep(0.1)
    ranks[0].send_signal(signal.SIGUSR2)
    outs = [r.communicate(timeout=60)[0] for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0], outs
    saved = int(re.search(r"saved step (\d+) on SIGUSR2", (b / "progress.log").read_text()).group(1))
    assert 3 <= saved < STEPS

    out = whole.communicate(timeout=120)[0]
    assert whole.returncode == 0, out

    # segment 1: half the reference shape, one process accumulating two micro-batches per step
    p = subprocess.run([sys.executable, str(TRAIN)], env=_env(b, CHAINRUN_NODES=1, CHAINRUN_REF_NODES=2),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    log = (b / "progress.log").read_text()
    assert "2 process(es) (2 node(s), 2 at the reference shape): per-device batch 32 x 1 accumulation steps " \
           "-> global batch 64" in log
    assert f"resumed from step {saved}" in log
    assert "1 process(es) (2 node(s), 2 at the reference shape): per-device batch 32 x 2 accumulation steps " \
           "-> global batch 64" in log
    assert f"finished at step {STEPS}" in log

    # the same model as the uninterrupted run
    wa, wb = _weights(a), _weights(b)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), (k, (wa[k] - wb[k]).abs().max())
    # and the progress lines count samples at the global batch in every segment
    steps = [line.split() for line in prog.read_text().splitlines()]
    assert all(int(s[2]) == int(s[1]) * 64 for s in steps)
