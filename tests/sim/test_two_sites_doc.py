"""docs/multi-cluster.md's results blocks are rendered from docs/results/sim-two-sites-*.json: in sync."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_multi_cluster_results_match_their_files():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_two_sites.py"), "--render", "--check"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, "docs/multi-cluster.md is out of date: run .venv/bin/python bench/sim_two_sites.py --render"
