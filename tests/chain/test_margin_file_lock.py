"""Two refreshes recording at once into one JSON file (chain/site_tuned.py: every cluster's cron refresh
writes the one site margin file; chain/tuned.py: a refresh and `model tune --pin` on one cluster) lose
nothing: each read-modify-write holds json_file.locked. Real processes, real files."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

N_PROCS, N_EACH = 6, 15


def _record_sites(home: str, k: int, go) -> None:
    os.environ["CHAINRUN_HOME"] = home
    from chainrun.chain import site_tuned

    go.wait()
    for j in range(N_EACH):
        site_tuned.record([f"a{k}", f"b{j}"], {"chosen": True, "margin_s": 600.0 * (j + 1), "reason": "test"})


def _record_partitions(home: str, k: int, go) -> None:
    os.environ["CHAINRUN_HOME"] = home
    from chainrun.chain import tuned

    go.wait()
    for j in range(N_EACH):
        tuned.record("local", f"p{k}-{j}", {"adopted": False, "reason": "test", "summary": "test"})


@pytest.mark.parametrize("writer, read_keys", [
    (_record_sites, lambda doc: set(doc["lists"])),
    (_record_partitions, lambda doc: set(doc["partitions"])),
])
def test_concurrent_records_all_survive(writer, read_keys, chainrun_home):
    ctx = mp.get_context("spawn")  # fresh interpreters, as two cron jobs are
    go = ctx.Event()
    procs = [ctx.Process(target=writer, args=(str(chainrun_home), k, go)) for k in range(N_PROCS)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    name = "site_margins.json" if writer is _record_sites else "local/tuning.json"
    doc = json.loads((chainrun_home / "models" / name).read_text())
    want = ({f"a{k},b{j}" for k in range(N_PROCS) for j in range(N_EACH)} if writer is _record_sites
            else {f"p{k}-{j}" for k in range(N_PROCS) for j in range(N_EACH)})
    assert read_keys(doc) == want  # every process's every entry: no write dropped another's
