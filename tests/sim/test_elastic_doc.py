"""docs/elastic.md's replay table is rendered from docs/results/sim-chains-ls6-elastic.json: in sync."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_elastic_doc_table_matches_the_results_file():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_elastic.py"), "--check"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0, "docs/elastic.md is out of date: run .venv/bin/python bench/sim_elastic.py --render"


def test_elastic_bound_table_matches_its_results_file():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_elastic_bound.py"), "--check"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, "docs/elastic.md is out of date: run .venv/bin/python bench/sim_elastic_bound.py --render"
