"""Install on a login node, as docs/remote-clusters.md says: an offline wheelhouse into a clean
tool environment (no project venv, no PYTHONPATH, no index), then `chainrun --version` and
`chainrun cluster test local` against the real test cluster.

The wheelhouse is made as a user would on a machine with internet: the project's wheel
(`pip wheel`), then its dependencies (`pip download` of that wheel: numpy, pandas, scipy,
lightgbm, paramiko...; no torch, ~80 MB, fetched once into pip's cache). The install runs with
`--no-index --find-links` only and pip's configuration switched off, so nothing but the
wheelhouse can serve it, and `--no-compile` (byte-compiling pandas and scipy would triple its
time; Python compiles what it imports on first use). About 45-90 s on the 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import chainrun
from tests.conftest import IN_CI, REPO

pytestmark = pytest.mark.slurm


def _need(why: str):
    if IN_CI:
        pytest.fail(why)
    pytest.skip(why)


def run(argv: list, *, env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p


def clean_env(**extra: str) -> dict:
    """A login node's environment: none of this checkout's Python settings, no pip configuration."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV", "CHAINRUN_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """The project's wheel and every dependency's, as `pip wheel` + `pip download` make them."""
    tmp = tmp_path_factory.mktemp("wheelhouse")
    src = tmp / "src"  # a copy: building in the checkout would leave build/ and *.egg-info in it
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    shutil.copytree(REPO / "chainrun", src / "chainrun", ignore=shutil.ignore_patterns("__pycache__"))
    wh = tmp / "wheels"
    p = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wh, src])
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = wh.glob("chainrun-*.whl")
    p = run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", wh, wheel])
    if p.returncode != 0:
        _need(f"pip download of chainrun's dependencies failed (no package index?): {p.stderr.strip()[-500:]}")
    assert not list(wh.glob("torch-*")), "the core install must not pull torch"
    return wh


def test_offline_wheelhouse_into_a_clean_tool_environment_runs_against_the_cluster(wheelhouse, tmp_path,
                                                                                   slurm_cluster):
    base = Path(getattr(sys, "_base_executable", sys.executable))  # a Python >= 3.11, not this venv
    tool = tmp_path / "tool"
    p = run([base, "-m", "venv", tool], env=clean_env())
    assert p.returncode == 0, p.stderr
    p = run([tool / "bin" / "pip", "install", "-q", "--no-compile", "--no-index", "--find-links", wheelhouse,
             "chainrun"], env=clean_env())
    assert p.returncode == 0, p.stderr[-2000:]

    work = tmp_path / "work"  # not the checkout: `import chainrun` must find the installed copy
    work.mkdir()
    env = clean_env(CHAINRUN_HOME=str(tmp_path / "home"), SLURM_CONF=os.environ.get("SLURM_CONF", ""))
    where = run([tool / "bin" / "python", "-c", "import chainrun, pathlib; print(pathlib.Path(chainrun.__file__))"],
                env=env, cwd=work)
    assert where.stdout.strip().startswith(str(tool)), where.stdout + where.stderr
    for helper in ("chainrun", "chainrun-done", "chainrun-progress"):
        assert (tool / "bin" / helper).exists(), helper
    wrapper = run([tool / "bin" / "python", "-c", "import importlib.resources as r; "
                   "print((r.files('chainrun') / 'templates' / 'wrapper.sh').is_file())"], env=env, cwd=work)
    assert wrapper.stdout.strip() == "True", wrapper.stderr  # the hand-off wrapper ships in the wheel

    v = run([tool / "bin" / "chainrun", "--version"], env=env, cwd=work)
    assert v.returncode == 0 and chainrun.__version__ in v.stdout, v.stdout + v.stderr
    t = run([tool / "bin" / "chainrun", "cluster", "test", "local", "--json"], env=env, cwd=work, timeout=120)
    assert t.returncode == 0, t.stderr
    data = json.loads(t.stdout)["data"]
    assert data["slurm_version"].startswith("slurm") and data["partitions"], data
