#!/usr/bin/env python3
"""Cold start of `chainrun --help` (target <= 0.25 s) and which heavy modules it imports (target: none).

Run: .venv/bin/python bench/cli_startup.py [--runs 10]
"""

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("pandas", "numpy", "lightgbm", "sklearn", "paramiko", "matplotlib", "scipy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    cmds = {
        "chainrun --help": [sys.executable, "-m", "chainrun.cli.main", "--help"],
        "chainrun --version": [sys.executable, "-m", "chainrun.cli.main", "--version"],
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
    }
    print(f"{'command':28} {'median s':>9} {'min s':>7} {'max s':>7}  runs={args.runs}")
    for name, argv in cmds.items():
        subprocess.run(argv, capture_output=True)  # warm the page cache once
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        print(f"{name:28} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}")
    probe = "import sys; import chainrun.cli.main; print(','.join(m for m in %r if m in sys.modules))" % (HEAVY,)
    heavy = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    print(f"heavy modules imported on the --help path: {heavy or 'none'}")
    print("target: median <= 0.250 s, no heavy modules")


if __name__ == "__main__":
    main()
