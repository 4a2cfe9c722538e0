"""docs/reliability.md's network-filesystem block is rendered from docs/results/kill-soak-netfs.json: in sync."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_network_filesystem_block_matches_its_results_file():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "kill_soak.py"), "--check"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0, ("docs/reliability.md is out of date: run .venv/bin/python bench/kill_soak.py "
                               f"--render\n{p.stdout}{p.stderr}")
