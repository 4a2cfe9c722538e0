"""Shared fixtures: the real local Slurm cluster and an isolated chainrun home.

Tests marked ``slurm`` need scripts/start-cluster.sh to have run. Locally they skip
when it has not; in CI (CI=true) a missing cluster fails them, so a green run always
means they ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# the test cluster is one host: its /tmp (where tests put run folders) is what every node sees.
# tests/chain/test_submit_folders.py checks the warning chainrun gives elsewhere.
os.environ.setdefault("CHAINRUN_NODE_LOCAL_OK", "1")


def _slurm_up() -> str | None:
    if not shutil.which("scontrol"):
        return "scontrol is not installed"
    try:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "scontrol ping timed out"
    return None if "is UP" in p.stdout else f"slurmctld is not answering: {p.stdout.strip() or p.stderr.strip()}"


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    why = _slurm_up()
    if why:
        msg = f"real Slurm test cluster needed ({why}); start it with scripts/start-cluster.sh"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def chainrun_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    return home


def run_cli(*args: str, home: Path, cwd: Path | None = None, timeout: float = 120, env: dict | None = None):
    """Run the real `chainrun` command in a subprocess."""
    full_env = {**os.environ, "CHAINRUN_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "chainrun.cli.main", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a test that needs a real service and skipped is a failure: green must mean it ran."""
    outcome = yield
    report = outcome.get_result()
    needs_service = item.get_closest_marker("slurm") or item.get_closest_marker("ssh")
    if IN_CI and needs_service and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {report.longrepr}"


def pytest_collection_modifyitems(config, items):
    """Long or load-sensitive runs (``@pytest.mark.slow``) are deselected unless asked for.

    Deselected, not skipped (in CI a skipped Slurm test fails the run): run them with
    ``pytest -m slow`` or ``CHAINRUN_SLOW=1``.
    """
    if "slow" in (config.getoption("-m") or "") or os.environ.get("CHAINRUN_SLOW") == "1":
        return
    keep, drop = [], []
    for it in items:
        (drop if it.get_closest_marker("slow") else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
