"""Fixtures for the queue-delay model tests: small frames, a trace slice, the real cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from .predict_helpers import LS6, synthetic_history  # noqa: E402


@pytest.fixture
def history() -> pd.DataFrame:
    return synthetic_history()


@pytest.fixture
def ls6_slice(tmp_path) -> Path:
    """Jobs of the real LS6 trace submitted 2022-12-01 .. 2023-01-20, in its own format."""
    if not LS6.exists():
        pytest.skip("LS6 trace not present")
    lines = LS6.read_text().splitlines()
    keep = lines[:2] + [ln for ln in lines[2:] if "\t2022-12" in ln or "\t2023-01-0" in ln or "\t2023-01-1" in ln]
    p = tmp_path / "ls6-slice.log"
    p.write_text("\n".join(keep) + "\n")
    return p


def _slurm_ok() -> bool:
    if not shutil.which("sacct") or not shutil.which("squeue"):
        return False
    try:
        r = subprocess.run(["sacct", "-X", "-n", "-S", "now-1hours"], capture_output=True, timeout=20)
        q = subprocess.run(["squeue", "-h"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and q.returncode == 0


@pytest.fixture
def slurm():
    """The real local test cluster; in CI its absence is a failure, elsewhere a skip."""
    if not _slurm_ok():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but the Slurm test cluster (sacct/squeue) is not answering")
        pytest.skip("no Slurm test cluster here (scripts/start-cluster.sh)")
    return True
