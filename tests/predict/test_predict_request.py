"""Audit 24, gap 4: `predict` refuses a request Slurm would refuse (the real cluster's case is in
test_slurm_e2e.py); here the fallback when the partitions cannot be read, and a one-node partition."""

from __future__ import annotations

import pytest

from chainrun.errors import UsageError
from chainrun.predict import service
from chainrun.runner.base import RunResult

PARTS = ("PartitionName=gpu Default=YES MaxTime=1-00:00:00 DefaultTime=01:00:00 State=UP TotalNodes=1 Nodes=g1\n"
         "PartitionName=cpu Default=NO MaxTime=UNLIMITED DefaultTime=NONE State=UP TotalNodes=8 Nodes=c[1-8]\n")


class Slurm:
    """scontrol answers ``parts`` (or fails when None); sbatch --test-only answers ``test_only``."""

    name = "fake"

    def __init__(self, parts, test_only=(0, "sbatch: Job 7 to start at 2026-01-01T00:00:00 using 1 processors")):
        self.parts, self.test_only = parts, test_only

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if argv[:3] == ["scontrol", "show", "partition"]:
            if self.parts is None:
                return RunResult(tuple(argv), 1, "", "scontrol: error: slurm_load_partitions: timeout", 0.0)
            return RunResult(tuple(argv), 0, self.parts, "", 0.0)
        if argv[:2] == ["sbatch", "--test-only"]:
            return RunResult(tuple(argv), self.test_only[0], "", self.test_only[1], 0.0)
        raise AssertionError(argv)


def test_unknown_partition_and_too_many_nodes():
    with pytest.raises(UsageError, match="no partition 'nosuch' on this cluster.*partitions: gpu, cpu"):
        service.check_request(Slurm(PARTS), nodes=1, partition="nosuch")
    with pytest.raises(UsageError, match="--nodes 2: partition 'gpu' has 1 node$"):
        service.check_request(Slurm(PARTS), nodes=2)  # the default partition
    with pytest.raises(UsageError, match="--nodes 9: partition 'cpu' has 8 nodes"):
        service.check_request(Slurm(PARTS), nodes=9, partition="cpu,gpu")
    service.check_request(Slurm(PARTS), nodes=8, partition="cpu")
    service.check_request(Slurm(None), nodes=99, partition="nosuch")  # unreadable: nothing to check against


def test_test_only_naming_the_partition_invalid_is_refused():
    bad = (1, "sbatch: error: invalid partition specified: nosuch\nallocation failure: Invalid partition name specified")
    with pytest.raises(UsageError, match="no partition 'nosuch'.*invalid partition specified: nosuch"):
        service.slurm_view(Slurm(None, bad), [], cluster="t", now=0.0, nodes=1, gpus=0, cpus=0,
                           timelimit_s=60.0, partition="nosuch")
    # any other refusal leaves the estimate empty, as before: the model answers without it
    other = (1, "allocation failure: Requested node configuration is not available")
    v = service.slurm_view(Slurm(None, other), [], cluster="t", now=0.0, nodes=1, gpus=0, cpus=0,
                           timelimit_s=60.0, partition="gpu")
    assert v.test_only_s is None
    assert v.refused == "allocation failure: Requested node configuration is not available"  # said, not hidden


def test_a_test_only_that_could_not_ask_is_no_refusal():
    slow = (1, "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
    v = service.slurm_view(Slurm(None, slow), [], cluster="t", now=0.0, nodes=1, gpus=0, cpus=0, timelimit_s=60.0)
    assert v.test_only_s is None and v.refused == ""
    ok = service.slurm_view(Slurm(None), [], cluster="t", now=0.0, nodes=1, gpus=0, cpus=0, timelimit_s=60.0)
    assert ok.refused == ""  # a job Slurm would start
