"""Cost of the queue-delay model: refresh on 1 M sacct rows, and one prediction.

    .venv/bin/python bench/predict_cost.py [--rows 1000000] [--trace /work/shared/traces/ls6-a100/ls6-a100-dev.log]

1. Build a ``sacct -X -P -n`` dump of ``--rows`` jobs by resampling the LS6 trace: the trace is
   tiled back to back in time (each tile a bootstrap sample of its jobs, times jittered by up
   to a minute, job ids made unique), so queue states stay realistic.
2. In a fresh process, run ``chainrun model refresh``'s core (service.refresh) with a runner
   that answers sacct with that dump: parse, merge into the cache, write it, train, save.
   Wall time and peak RSS (ru_maxrss of that process) are printed.
3. Load the saved model and time single predictions with a live-like snapshot and history.
Targets (issue #3, kept by #12): refresh <= 60 s and <= 2 GiB RSS on 2 cores; one prediction <= 50 ms.
Writes docs/results/predict_cost.json.

``--tune``: the refresh with self-tuning (chainrun/sim/selftune.py, issue #24) on ``--tune-days``
(60) of history: the last 60 days of the trace overlaid ``k`` times (each copy its own users and
job ids, times jittered by up to a minute) so that the dump has ``--rows`` rows, on a partition of
80 x k nodes (LS6's A100 partition times k) with LS6's priority weights (the runner answers
scontrol with them). Wall time, CPU seconds (the refresh and its replay workers) and peak RSS (the
largest of the process and its workers) of ``service.refresh(..., tuner=selftune.tuner(..., workers=2))``;
target (issue #24): < 5 min and < 2 GiB on 2 cores for 60 days of 1 M rows. Writes
docs/results/predict_cost_tune.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"


def make_dump(trace: str, rows: int, out: Path, seed: int = 7) -> None:
    import numpy as np
    import pandas as pd

    from chainrun.traces import read_trace

    df = read_trace(trace)
    rng = np.random.default_rng(seed)
    span = float(df["submit"].max() - df["submit"].min()) + 86400.0
    tiles, n = [], 0
    k = 0
    while n < rows:
        take = min(len(df), rows - n)
        t = df.iloc[rng.integers(0, len(df), take)].copy()
        shift = k * span + rng.uniform(0, 60, take)
        for c in ("submit", "eligible", "start", "end"):
            t[c] = t[c] + shift
        t["job_id"] = [str(10_000_000 + n + i) for i in range(take)]
        tiles.append(t)
        n += take
        k += 1
    _write_dump(pd.concat(tiles, ignore_index=True), out)  # ids 10_000_000 + position, as set above


class DumpRunner:
    """Answers the first sacct call with the dump, later windows with nothing."""

    name = "bench"

    def __init__(self, path: Path) -> None:
        self.path, self.sent = path, False

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        from chainrun.runner.base import RunResult

        if argv[0] != "sacct":  # scontrol show node: no cluster here, the model estimates capacity
            return RunResult(tuple(argv), 1, "", "not a cluster", 0.0)
        out = "" if self.sent else self.path.read_text()
        self.sent = True
        return RunResult(tuple(argv), 0, out, "", 0.0)


def make_tune_dump(trace: str, rows: int, days: float, out: Path, seed: int = 7) -> int:
    """The last ``days`` of the trace overlaid k times to ``rows`` rows; returns k."""
    import math

    import numpy as np
    import pandas as pd

    from chainrun.traces import read_trace

    df = read_trace(trace)
    df = df[df["submit"] >= df["submit"].max() - days * 86400.0].reset_index(drop=True)
    k = max(1, math.ceil(rows / len(df)))
    rng = np.random.default_rng(seed)
    copies = []
    for i in range(k):
        t = df.copy()
        jit = rng.uniform(0, 60, len(t)) if i else 0.0
        for c in ("submit", "eligible", "start", "end"):
            t[c] = t[c] + jit
        t["user"] = t["user"].astype(str) + (f"c{i}" if i else "")
        copies.append(t)
    d = pd.concat(copies, ignore_index=True).iloc[:rows]
    _write_dump(d, out)
    return k


def _write_dump(d, out: Path) -> None:
    import pandas as pd

    from chainrun.predict.ingest import SACCT_FORMAT

    d = d.reset_index(drop=True)
    d["job_id"] = [str(10_000_000 + i) for i in range(len(d))]

    def ep(s):
        return s.map(lambda v: "Unknown" if v != v else str(int(v)))

    cols = {
        "JobIDRaw": d["job_id"], "User": "u" + d["user"].astype(str), "Partition": "gpu-a100", "QOS": "normal",
        "Account": "acct", "Submit": ep(d["submit"]), "Eligible": ep(d["submit"]), "Start": ep(d["start"]),
        "End": ep(d["end"]), "TimelimitRaw": (d["timelimit_s"] // 60).astype(int).astype(str),
        "NNodes": d["nodes"].astype(str), "NCPUS": (d["nodes"] * 128).astype(str),
        "AllocTRES": "cpu=" + (d["nodes"] * 128).astype(str) + ",gres/gpu=" + d["gpus"].astype(str) + ",node=" + d["nodes"].astype(str),
        "ReqTRES": "cpu=" + (d["nodes"] * 128).astype(str) + ",gres/gpu=" + d["gpus"].astype(str),
        "State": d["state"], "ExitCode": d["exit_code"], "JobName": d["name"],
        "Elapsed": "00:00:00", "Reason": "None", "NodeList": "",
    }
    cols = {k: cols[k] for k in SACCT_FORMAT.split(",")}
    pd.DataFrame(cols).to_csv(out, sep="|", header=True, index=False)


class TuneRunner(DumpRunner):
    """The dump for sacct, a partition of ``nodes`` nodes and LS6's priority weights for scontrol."""

    def __init__(self, path: Path, nodes: int) -> None:
        super().__init__(path)
        self.nodes = nodes

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        from chainrun.runner.base import RunResult

        cmd = " ".join(argv[:3])
        if cmd == "scontrol show partition":
            out = (f"PartitionName=gpu-a100 Default=YES MaxTime=2-00:00:00 State=UP TotalNodes={self.nodes} "
                   f"Nodes=c[1-{self.nodes}]\n")
            return RunResult(tuple(argv), 0, out, "", 0.0)
        if cmd == "scontrol show config":
            c = json.loads((Path(TRACE).parent / "priority-config.json").read_text())
            out = "PriorityType = priority/multifactor\n" + "".join(
                f"{k} = {v if k != 'PriorityMaxAge' else f'{v}-0'}\n" for k, v in c.items())
            return RunResult(tuple(argv), 0, out.replace("Fairshare", "FairShare"), "", 0.0)
        if cmd == "scontrol show node":
            return RunResult(tuple(argv), 0, "".join(f"NodeName=c{i} State=IDLE\n" for i in range(self.nodes)), "", 0.0)
        return super().run(argv, timeout, env=env, stdin=stdin)


def tune_child(dump: str, nodes: int, workers: int = 2) -> None:
    from chainrun.predict import service

    t0, c0 = time.time(), time.process_time()

    def progress(part: str, done: int, total: int) -> None:  # on stderr, as it goes (a long run can be read early)
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        print(f"tuning {part}: batch {done}/{total}, wall {time.time() - t0:.0f}s, CPU {cpu:.0f}s", file=sys.stderr,
              flush=True)

    from chainrun.sim import selftune

    runner = TuneRunner(Path(dump), nodes)
    res = service.refresh(runner, cluster="bench", now=1e10, lookback_days=1e10 / 86400 - 1,
                          window_days=1e10 / 86400,
                          tuner=selftune.tuner(runner, cluster="bench", workers=workers, progress=progress))
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"wall_s": round(time.time() - t0, 1), "seconds": res["seconds"],
           "cpu_s": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1),
           "cpu_s_main": round(time.process_time() - c0, 1),
           "max_rss_mib": round(max(me.ru_maxrss, kids.ru_maxrss) / 1024, 0),
           "history_rows": res["history_rows"], "nodes": nodes, "workers": workers,
           "tuning": {p: {k: r.get(k) for k in ("summary", "window", "fidelity", "seconds", "chosen", "thinned")}
                      for p, r in res["tuning"].items()}}
    print(json.dumps(out))


def tune_bench(a) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "sacct.txt"
        k = make_tune_dump(a.trace, a.rows, a.tune_days, dump)
        rows = sum(1 for _ in dump.open()) - 1
        print(f"dump: {rows} rows over the last {a.tune_days:g} days, {k} overlaid copies, {80 * k} nodes", flush=True)
        p = subprocess.run([sys.executable, __file__, "--tune-child", str(dump), "--nodes", str(80 * k),
                            "--workers", str(a.workers)],
                           stdout=subprocess.PIPE, text=True, env={**os.environ, "CHAINRUN_HOME": tmp})
        if p.returncode:
            sys.exit(f"the refresh failed (exit {p.returncode})")
        r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(rows=rows, copies=k, days=a.tune_days, load_average=os.getloadavg(), cores=os.cpu_count())
    print(f"{'refresh + tuning wall time (s)':34s} {r['wall_s']:>12}  < 300 (1 M rows, 2 cores)")
    print(f"{'  of which tuning (s)':34s} {r['seconds'].get('tune'):>12}")
    print(f"{'CPU seconds (with replay workers)':34s} {r['cpu_s']:>12}")
    print(f"{'peak RSS (MiB, largest process)':34s} {r['max_rss_mib']:>12}  < 2048")
    for part, t in r["tuning"].items():
        print(f"{part}: {t['summary']}")
    out = Path(a.out or Path(__file__).resolve().parents[1] / "docs/results/predict_cost_tune.json")
    out.write_text(json.dumps(r, indent=1))


def refresh_child(dump: str) -> None:
    from chainrun.predict import service

    path = Path(dump)
    t0 = time.time()
    # one sacct window covering the whole dump (times < 1e10 s)
    res = service.refresh(DumpRunner(path), cluster="bench", now=1e10, lookback_days=1e10 / 86400 - 1,
                          window_days=1e10 / 86400)
    res["wall_s"] = round(time.time() - t0, 1)
    res["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0)
    print(json.dumps(res))


def predict_latency(trace: str, n: int = 50) -> dict:
    import numpy as np

    from chainrun.predict import WaitRequest, load_predictor
    from chainrun.predict.service import model_dir
    from chainrun.traces import read_trace

    pr = load_predictor(model_dir("bench"))
    df = read_trace(trace)
    df["user"] = "u" + df["user"].astype(str)
    now = float(np.quantile(df["submit"], 0.9))
    hist = df[df["end"] < now]
    snap = df[(df["submit"] < now) & ~(df["end"] < now)].copy()
    snap["state"] = np.where(snap["start"] < now, "RUNNING", "PENDING")
    req = WaitRequest(user=str(hist["user"].iloc[-1]), nodes=2, gpus=6, cpus=0, timelimit_s=86400, submit=now)
    pr.predict(req, snap, hist)  # first call pays lazy imports
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        pr.predict(req, snap, hist)
        ts.append(time.perf_counter() - t)
    return {"history_rows": int(len(hist)), "snapshot_rows": int(len(snap)),
            "median_ms": round(1000 * float(np.median(ts)), 1), "max_ms": round(1000 * max(ts), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--tune", action="store_true", help="the refresh with self-tuning on --tune-days of history")
    ap.add_argument("--tune-days", type=float, default=60.0)
    ap.add_argument("--out", help="--tune: the results file (default docs/results/predict_cost_tune.json)")
    ap.add_argument("--workers", type=int, default=2, help="--tune: the replay's worker processes (cron uses 1)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tune-child", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, default=80, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return refresh_child(a.child)
    if a.tune_child:
        return tune_child(a.tune_child, a.nodes, a.workers)
    if a.tune:
        return tune_bench(a)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CHAINRUN_HOME"] = tmp
        dump = Path(tmp) / "sacct.txt"
        t0 = time.time()
        make_dump(a.trace, a.rows, dump)
        print(f"dump: {a.rows} rows, {dump.stat().st_size / 2**20:.0f} MiB, built in {time.time() - t0:.0f}s", flush=True)
        p = subprocess.run([sys.executable, __file__, "--child", str(dump)], capture_output=True, text=True,
                           env={**os.environ, "CHAINRUN_HOME": tmp})
        if p.returncode:
            sys.exit(p.stderr)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        lat = predict_latency(a.trace)
    print(f"{'measure':34s} {'value':>12s}  target")
    print(f"{'refresh wall time (s)':34s} {r['wall_s']:>12}  <= 60")
    print(f"{'  of which sacct parse+cache (s)':34s} {r['seconds']['fetch']:>12}")
    print(f"{'refresh peak RSS (MiB)':34s} {r['max_rss_mib']:>12}  <= 2048")
    print(f"{'rows in history / trained on':34s} {str(r['history_rows']) + ' / ' + str(r['train_rows']):>12}")
    print(f"{'one prediction, median (ms)':34s} {lat['median_ms']:>12}  <= 50")
    print(f"{'one prediction, max of 50 (ms)':34s} {lat['max_ms']:>12}")
    print(f"(prediction with {lat['history_rows']} history rows and {lat['snapshot_rows']} queued/running jobs)")
    out = Path(__file__).resolve().parents[1] / "docs/results/predict_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"refresh": r, "prediction": lat, "rows": a.rows,
                               "load_average": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
