"""The result tables in docs/evaluation.md are rendered from docs/results/*.json: in sync."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_evaluation_tables_match_the_results_files():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_render.py"), "--check"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0, "docs/evaluation.md is out of date: run .venv/bin/python bench/sim_render.py"
