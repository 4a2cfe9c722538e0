"""scikit-learn is the `eval` extra: only `model eval`'s random-forest baseline uses it.

Each test runs a fresh interpreter in which ``import sklearn`` fails as if it were not installed
(a meta-path finder raising ModuleNotFoundError; LightGBM then runs without its scikit-learn
wrappers, as on an install without the extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NO_SKLEARN = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _run(code: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "CHAINRUN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", NO_SKLEARN + code], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_no_chainrun_module_imports_sklearn():
    """Importing every chainrun module (the ones behind --help, submit, watch, status, predict,
    model refresh and the rest) loads neither scikit-learn nor LightGBM, which would load it."""
    code = """
import pkgutil, importlib, chainrun
for m in pkgutil.walk_packages(chainrun.__path__, "chainrun."):
    if not m.name.startswith("chainrun.templates"):
        importlib.import_module(m.name)
print(",".join(m for m in ("sklearn", "lightgbm") if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code.replace("import pkgutil", "import sys, pkgutil")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "", f"imported at module level: {p.stdout.strip()}"


def test_model_refresh_and_predict_work_without_sklearn(tmp_path):
    """The everyday paths with scikit-learn missing: `--help` and `status`, and the model's core
    as `model refresh` (fit, save) and `predict` / the watcher (load, answer) run it, for both
    kinds chainrun can ship. (The Slurm side of refresh is tests/predict/test_slurm_e2e.py.)"""
    code = f"""
sys.path.insert(0, {str(ROOT / "tests" / "predict")!r})
try:
    import sklearn  # noqa: F401
    raise SystemExit("the blocker let scikit-learn in")
except ModuleNotFoundError:
    pass
from predict_helpers import synthetic_history
from chainrun.cli.main import main
from chainrun.predict import WaitRequest
from chainrun.predict.model import load_predictor
from chainrun.predict.training import fit_predictor
assert main(["--help"]) in (0, None)
assert main(["status"]) in (0, None)
df = synthetic_history(500, seed=2)
t = float(df["submit"].iloc[-1]) + 60
req = WaitRequest(user="u1", nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t)
for kind in ("quantile", "forest"):
    pr = fit_predictor(df, per_user="never", kind=kind)
    p = load_predictor(pr.save({str(tmp_path)!r} + "/" + kind)).predict(req, df.iloc[:0], df[df["end"] < t])
    assert p == pr.predict(req, df.iloc[:0], df[df["end"] < t]) and p.p50 > 0
    print(kind, "answered", round(p.p50))
"""
    p = _run(code, tmp_path / "home")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "quantile answered" in p.stdout and "forest answered" in p.stdout


def test_model_eval_without_sklearn_leaves_out_the_random_forest_only(ls6_slice, tmp_path):
    """`chainrun model eval` without the `eval` extra: one line says the random forest is left
    out, and every other row is there (text and JSON)."""
    args = ["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-05", "--test-until", "2023-01-12",
            "--refit-every", "7d"]
    code = f"""
from chainrun.cli.main import main
assert main({args!r}) in (0, None)
print("=== json")
assert main({args + ["--json"]!r}) in (0, None)
"""
    p = _run(code, tmp_path / "home")
    assert p.returncode == 0, p.stderr[-3000:]
    text, js = p.stdout.split("=== json\n")
    notes = [ln for ln in text.splitlines() if "random_forest" in ln]
    assert notes == ["random_forest left out: scikit-learn is not installed (pip install 'chainrun[eval]')"]
    rows = [ln.split()[0] for ln in text.splitlines() if ln.startswith(("lightgbm", "user_median", "global_median"))]
    assert rows == ["lightgbm", "lightgbm_uncalibrated", "lightgbm_forest", "global_median", "user_median"]
    res = json.loads(js)["data"]
    assert res["notes"] == notes and "random_forest" not in res["models"]
    assert set(res["models"]) == set(rows)
    assert res["test"]["n"] > 100 and all(m["n_test"] == res["test"]["n"] for m in res["models"].values())
