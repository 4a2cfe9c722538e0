"""A request change reaches a successor that is already queued (chain/placement.py queued_update,
TickContext.update_queued): pure rule, then `scontrol update` on a real pending job."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from chainrun.chain import placement
from chainrun.chain.engine import Engine
from chainrun.chain.request import describe, segment_args
from chainrun.runner.local import LocalRunner
from chainrun.slurm.client import SlurmClient
from chainrun.slurm.parsers import expand_hostlist
from chainrun.state.records import ENDED, PENDING, Chain, Segment
from chainrun.state.store import Store


def _chain(**adapt) -> Chain:
    return Chain(id="q-0001", name="q", cluster="local", script="/s", workdir="/tmp", run_dir="/tmp/q", checkpoint_dir="/c",
                 total_s=600, segment_s=120, policy="lead", lead_s=60, signal="USR2", signal_lead_s=30, retries=1,
                 sbatch_args=["--exclude=n4"], partition="short", created=time.time(), extra={"adapt": adapt})


def test_queued_update_asks_only_what_changed():
    c = _chain()
    seg = Segment(chain_id=c.id, idx=1, time_limit_s=120, phase=PENDING, job_id="7")
    seg.extra["request"] = describe(segment_args(c, seg))
    assert placement.queued_update(c, seg) == {}
    c.extra["adapt"] = {"exclude": ["n1"], "switches": "1@00:05:00"}
    fields = placement.queued_update(c, seg)
    assert sorted(fields["ExcNodeList"].split(",")) == ["n1", "n4"], fields  # the user's own exclude kept
    assert fields["Switches"] == "1@00:05:00"
    msg = placement.note_queued_update(seg, fields)
    assert f"--exclude={fields['ExcNodeList']}" in seg.extra["request"] and "--exclude=n4 " not in seg.extra["request"] + " "
    assert "job 7" in msg and "scontrol update" in msg
    assert placement.queued_update(c, seg) == {}  # recorded: asked once


@pytest.mark.slurm
def test_a_pending_successor_is_updated_in_place_on_real_slurm(slurm_cluster, tmp_path):
    job = subprocess.run(["sbatch", "--parsable", "--hold", "-N1", "-t", "1", "-o", "/dev/null", "--job-name=q-held",
                          "--wrap", "true"], capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        store = Store(tmp_path / "state.db")
        c = _chain()
        store.add_chain(c)
        done = Segment(chain_id=c.id, idx=0, time_limit_s=120, phase=ENDED, job_id="1")
        queued = Segment(chain_id=c.id, idx=1, time_limit_s=120, phase=PENDING, job_id=job)
        queued.extra["request"] = describe(segment_args(c, queued))
        store.save(c, [done, queued])
        c.extra["adapt"] = {"exclude": ["n2"], "switches": "1@00:02:00"}
        eng = Engine(store, SlurmClient(LocalRunner()), LocalRunner(), user="root")
        events = eng.update_queued(c, store.segments(c.id))
        assert [k for _, k, _ in events] == ["adapt"], events
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        excluded = re.search(r"ExcNodeList=(\S+)", shown)
        assert excluded and sorted(expand_hostlist(excluded.group(1))) == ["n2", "n4"], shown
        assert "Switches=1@00:02:00" in shown, shown
        assert "n2" in store.segments(c.id)[1].extra["request"]
        # a job that is no longer pending keeps its request, said as a placement event, never an error
        subprocess.run(["scancel", job], check=True)
        time.sleep(1)
        c.extra["adapt"] = {"exclude": ["n3"]}
        events = eng.update_queued(c, store.segments(c.id))
        assert [k for _, k, _ in events] == ["placement"] and "keeps its request" in events[0][2], events
    finally:
        subprocess.run(["scancel", job], capture_output=True)
