"""The chains the self-tuning replay injects are shaped like the user's (chainrun/sim/user_chains.py):
a chain's node count is what Slurm gave its jobs (the history's NNodes) before what its options ask
for, so a chain asking for GPUs without `--nodes` (or setting `#SBATCH --nodes` inside its script) is
injected on the nodes it really held (issue 24: "chains shaped like the user's (node count, GPUs, ...)").
Real SQLite under a tmp CHAINRUN_HOME; the history is the canonical table the refresh passes on. The
real-Slurm side: tests/predict/test_slurm_selftune.py."""

from __future__ import annotations

import pandas as pd

from chainrun import paths
from chainrun.state.records import ENDED, Chain, Segment
from chainrun.state.store import Store
from chainrun.chain.request import requested_nodes
from chainrun.sim.user_chains import WORK_SEGMENTS, allocated, chain_shape

H = 3600


def _chain(cid: str, args: list[str], *, partition="gpu", cluster="c", created=1.0) -> Chain:
    return Chain(id=cid, name=cid, cluster=cluster, script="/s.sh", workdir="/w", run_dir="/w/r", checkpoint_dir="/w/c",
                 total_s=72 * H, segment_s=24 * H, policy="predicted", lead_s=3600, signal="USR2", signal_lead_s=300,
                 retries=1, sbatch_args=args, partition=partition, created=created)


def _store(home, chains: dict[str, tuple[list[str], list[str]]]) -> None:
    """``chains``: id -> (sbatch args, job ids of its segments), created in that order."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(paths.state_db())
    try:
        for i, (cid, (args, jobs)) in enumerate(chains.items()):
            c = _chain(cid, args, created=1.0 + i)
            store.add_chain(c)
            store.save(c, [Segment(cid, k, phase=ENDED, job_id=j) for k, j in enumerate(jobs)])
    finally:
        store.close()


def _history(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"job_id": [r[0] for r in rows], "nodes": [r[1] for r in rows],
                         "gpus": [r[2] for r in rows], "user": "u", "submit": 0.0, "start": 10.0, "end": 20.0})


def test_a_chain_asking_for_gpus_is_injected_on_the_nodes_slurm_gave_it(chainrun_home):
    _store(chainrun_home, {
        "gpus-0001": (["--gpus=8"], ["101", "102;c"]),  # 8 GPUs on 4-GPU nodes: 2 nodes, no --nodes said
        "four-0001": (["--nodes", "4"], ["201"]),  # its job is not in the history: the request counts
        "one-0001": (["-N", "1"], ["301"]),
    })
    hist = _history([("101", 2, 8), ("102", 2, 8), ("301", 1, 4), ("999", 8, 32)])
    shape = chain_shape("c", "gpu", 48 * H, hist)
    assert shape["nodes"] == 2, shape  # median of 2 (given), 4 (asked), 1 (given); was 1 from --nodes alone
    assert shape["gpus"] == 8 and shape["source"] == "your 3 chain(s) on this partition; nodes as Slurm gave them to 2"
    assert (shape["segment_s"], shape["work_s"], shape["signal_lead_s"]) == (24 * H, 72 * H, 300)
    # without a history (the several-cluster tuning reads none) the options decide, as before
    assert chain_shape("c", "gpu", 48 * H)["nodes"] == 1
    assert chain_shape("c", "gpu", 48 * H)["gpus"] is None


def test_what_slurm_gave_is_the_median_of_the_jobs_that_ran_and_unknown_jobs_are_left_out():
    hist = _history([("1", 2, 6), ("2", 3, 9), ("3", 3, 9), ("4", 0, 0)])  # 4 never ran
    got = allocated(hist, {"a": ["1", "2", "3"], "b": ["4"], "c": ["77"], "d": []})
    assert got == {"a": {"nodes": 3, "gpus": 9}}
    cpu = _history([("5", 2, 0)])
    assert allocated(cpu, {"x": ["5"]}) == {"x": {"nodes": 2, "gpus": None}}  # no GPUs recorded: unknown
    assert allocated(None, {"a": ["1"]}) == {} and allocated(hist.iloc[:0], {"a": ["1"]}) == {}


def test_the_request_counts_a_ranges_minimum_and_one_node_when_unsaid():
    assert requested_nodes(["--nodes=2-4"]) == 2
    assert requested_nodes(["-N", "3"]) == 3
    assert requested_nodes(["--gpus=8"]) == 1
    assert requested_nodes(["--nodes", "x"]) == 1


def test_no_chain_of_the_user_here_is_one_node_and_the_partitions_limit(chainrun_home):
    _store(chainrun_home, {"other-0001": (["-N", "4"], ["1"])})  # partition gpu on cluster c
    shape = chain_shape("c", "small", 12 * H, _history([("1", 4, 0)]))
    assert shape == {"source": "no chain of yours here: one node, the partition's limit", "nodes": 1, "gpus": None,
                     "segment_s": 12 * H, "work_s": WORK_SEGMENTS * 12 * H, "signal_lead_s": 300.0}
