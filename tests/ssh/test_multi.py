"""The multi-cluster watcher on in-memory Slurms behind connections that can drop (no services).

The invariants of the SSH issue, at the moment they are hardest to keep: one squeue per
cluster per tick, an unreachable cluster is a warning that does not stop the others, and a
connection lost right after ``sbatch`` ran never leads to a second submission.
"""

from __future__ import annotations

import time

import pytest

from chainrun.chain.multi import MultiEngine
from chainrun.chain.segments import submit_segment
from chainrun.context import Context
from chainrun.runner.ssh import RemoteUnreachable
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import PENDING, SUBMITTING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm


class Link:
    """A FakeSlurm reached over a connection that can be down, or drop just after sbatch ran."""

    def __init__(self, name: str) -> None:
        self.name, self.user = name, "root"
        self.fake = FakeSlurm(now=time.time())
        self.down = False
        self.drop_after_sbatch = False

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if self.down:
            raise RemoteUnreachable(f"cannot connect to {self.name}: ConnectionRefusedError")
        res = self.fake.run(argv, timeout, env=env, stdin=stdin)
        if argv[0] == "sbatch" and self.drop_after_sbatch:
            self.drop_after_sbatch = False
            raise RemoteUnreachable(f"connection to {self.name} lost during `sbatch`")
        return res

    def write_file(self, path, content, mode=0o644):
        pass

    def close(self):
        pass


@pytest.fixture
def world(tmp_path):
    store = Store(tmp_path / "state.db")
    links = {"a": Link("a"), "b": Link("b")}
    chains = {}
    for name, link in links.items():
        c = Chain(id=f"c{name}-0001", name=name, cluster=name, script="/s", workdir="/w", run_dir="/r",
                  checkpoint_dir="/c", total_s=3600, segment_s=120, policy="reactive", lead_s=30, signal="USR2",
                  signal_lead_s=30, retries=1, sbatch_args=[], partition="short", created=time.time())
        store.add_chain(c)
        submit_segment(store, SlurmClient(link), c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
        chains[name] = c

    def opener(name, *, store):
        return Context(home=tmp_path, store=store, runner=links[name], slurm=SlurmClient(links[name]), cluster=name,
                       remote=True, user="root")

    multi = MultiEngine(store, open_context=opener)
    yield links, store, multi, chains
    store.close()


def end_segment(link: Link, store: Store, c: Chain) -> None:
    for s in store.segments(c.id):
        if s.phase == PENDING:
            link.fake.start(s.job_id)
            link.fake.now += 125
            link.fake.finish(s.job_id, "TIMEOUT")


def test_one_squeue_per_cluster_and_each_engine_sees_only_its_chains(world):
    links, store, multi, _ = world
    report = multi.tick()
    assert report.chains == 2 and not report.warnings
    assert report.slurm_calls == {"a:squeue": 1, "b:squeue": 1}
    assert [link.fake.count("squeue") for link in links.values()] == [1, 1]
    assert multi.tick().slurm_calls == {"a:squeue": 1, "b:squeue": 1}  # engines and connections are kept


def test_unreachable_cluster_is_a_warning_and_the_other_moves_on(world):
    links, store, multi, chains = world
    links["b"].down = True
    end_segment(links["a"], store, chains["a"])
    report = multi.tick()
    assert any(w.startswith("b: ") and "cannot connect" in w for w in report.warnings), report.warnings
    assert report.submitted == 1 and not report.failed  # a's next segment went out
    links["a"].down = True
    assert multi.tick().failed  # nothing reachable: the loop may back off


def test_connection_lost_after_sbatch_is_adopted_never_resubmitted(world):
    links, store, multi, chains = world
    link, c = links["a"], chains["a"]
    end_segment(link, store, c)
    link.drop_after_sbatch = True
    report = multi.tick()
    assert any("lost during `sbatch`" in w for w in report.warnings)
    seg1 = store.segments(c.id)[1]
    assert seg1.phase == SUBMITTING and not seg1.job_id  # we do not know whether it ran...
    multi.tick()
    seg1 = store.segments(c.id)[1]
    assert seg1.phase == PENDING and seg1.job_id  # ...the next tick finds it by name
    assert len(link.fake.by_name(f"cr.{c.id}.1")) == 1 and link.fake.count("sbatch") == 2
