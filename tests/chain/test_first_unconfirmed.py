"""Segment 0's sbatch fails without a refusal: the chain stays active, segment 0 SUBMITTING, and the
watcher adopts the job or submits segment 0 again; only a refusal fails the chain (in-memory Slurm; the
real-Slurm proof is test_first_unconfirmed_slurm.py)."""

from __future__ import annotations

import time

import pytest

from chainrun.chain import create, reconcile, sizing
from chainrun.chain.engine import ADOPT_AFTER_S, Engine
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.state.records import ACTIVE, CANCELLED_OUT, ENDED, FAILED, PENDING, SUBMITTING, Chain
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm

TIMEOUT = (-1, "timed out after 60s")
UNKNOWN = (1, "sbatch: error: Batch job submission failed: Unexpected message received")
REFUSED = (1, "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification")


def world(tmp_path, failure, *, lands: bool, cluster: str = "local", site: str | None = None):
    fake = FakeSlurm(now=time.time(), fail={"sbatch": [failure]}, land_late=lands)
    store = Store(tmp_path / "state.db")
    c = Chain(id="first-0001", name="first", cluster=cluster, script="/s", workdir="/w", run_dir="/r",
              checkpoint_dir="/c", total_s=600, segment_s=1200, policy="reactive", lead_s=60, signal="USR2",
              signal_lead_s=30, retries=1, sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    slurm = SlurmClient(fake)
    first = create._submit_first(store, slurm, fake, c, time_min_s=None, site=site)
    return fake, store, Engine(store, slurm, fake, clock=lambda: fake.now, user="root"), c, first


@pytest.mark.parametrize("failure", [TIMEOUT, UNKNOWN], ids=["timeout", "unrecognised"])
def test_a_job_made_despite_the_failure_is_adopted(tmp_path, failure):
    fake, store, eng, c, first = world(tmp_path, failure, lands=True)
    assert first.phase == SUBMITTING and first.job_id is None
    assert store.chain(c.id).status == ACTIVE
    assert any(ev.message.startswith(create.FIRST_UNCONFIRMED) for _, ev in store.events(c.id))
    eng.tick()
    [s0] = store.segments(c.id)
    assert s0.phase == PENDING and s0.job_id == "100"
    assert [j.name for j in fake.jobs.values()] == [f"cr.{c.id}.0"]  # adopted, never submitted twice


@pytest.mark.parametrize("failure", [TIMEOUT, UNKNOWN], ids=["timeout", "unrecognised"])
def test_no_job_made_means_segment_0_is_planned_again_once_sacct_says_so(tmp_path, failure):
    fake, store, eng, c, _ = world(tmp_path, failure, lands=False)
    eng.tick()  # not in squeue, too young for sacct: it waits
    assert [s.phase for s in store.segments(c.id)] == [SUBMITTING] and not fake.jobs
    fake.now += ADOPT_AFTER_S + 1
    eng.tick()
    s0, s1 = store.segments(c.id)
    assert (s0.phase, s0.outcome, s0.reason) == (ENDED, CANCELLED_OUT, reconcile.UNCONFIRMED)
    # a first training segment: planned for the whole --total, none of it counted as done
    assert s1.phase == PENDING and s1.time_limit_s == sizing.segment_limit(600, segment_s=1200, signal_lead_s=30)
    ch = store.chain(c.id)
    assert ch.status == ACTIVE and ch.credited_s == 0


def test_a_refusal_still_fails_the_chain(tmp_path):
    with pytest.raises(SlurmRefused):
        world(tmp_path, REFUSED, lands=False)
    store = Store(tmp_path / "state.db")
    ch = store.chain("first-0001")
    assert ch.status == FAILED and ch.reason.startswith("first segment refused: sbatch failed: ")


def test_segment_0_placed_on_a_second_cluster_is_adopted_there(tmp_path):
    """--cluster a,b with segment 0 placed on b: create_chain moved the chain to b before _submit_first,
    so the segment names b and b's engine (whose cluster the chain now trains on) adopts it."""
    fake, store, eng, c, first = world(tmp_path, TIMEOUT, lands=True, cluster="b", site="b")
    assert first.cluster == "b" and store.chain(c.id).status == ACTIVE
    eng.tick()
    assert store.segments(c.id)[0].job_id == "100"


def race(tmp_path, chain_id: str, runners: dict):
    """--race on clusters a,b, each reached through ``runners[name]``: (store, chain, segment 0, sites)."""
    from chainrun.chain import site_race
    from chainrun.state.records import ChainSite

    store = Store(tmp_path / "state.db")
    c = Chain(id=chain_id, name="race", cluster="a", script="/s", workdir="/a", run_dir="/a/run",
              checkpoint_dir="/a/ck", total_s=600, segment_s=1200, policy="reactive", lead_s=60, signal="USR2",
              signal_lead_s=30, retries=1, sbatch_args=[], partition="short", created=time.time())
    sites = [ChainSite(c.id, n, i, f"/{n}", f"/{n}/run", f"/{n}/ck", "/s", [], {"segment_s": 1200})
             for i, n in enumerate("ab")]
    store.add_chain(c, sites)
    first = site_race.start(store, c, sites, lambda n: (SlurmClient(runners[n]), runners[n]))
    return store, c, first, sites


def test_a_race_whose_every_sbatch_timed_out_keeps_the_chain_and_its_racers(tmp_path, capsys):
    """--race: each racer's intent is recorded before its sbatch; no racer confirmed is not a refusal."""

    fakes = {n: FakeSlurm(now=time.time(), fail={"sbatch": [TIMEOUT]}, land_late=(n == "a")) for n in "ab"}
    store, c, first, sites = race(tmp_path, "race-0001", fakes)
    assert first.job_id is None and store.chain(c.id).status == ACTIVE
    racers = store.chain(c.id).extra["race"]["racers"]
    assert {n: r["phase"] for n, r in racers.items()} == {"a": SUBMITTING, "b": SUBMITTING}
    assert [j.name for j in fakes["a"].jobs.values()] == [f"cr.{c.id}.0"]  # made on a despite the timeout
    from chainrun.cli.chain_cmd import _print_submitted

    res = create.SubmitResult(store.chain(c.id), first, 1200, sites=tuple(sites), unconfirmed=create.FIRST_UNCONFIRMED)
    _print_submitted(res, json_out=False)
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"chainrun: warning: {create.FIRST_UNCONFIRMED}"]
    assert "segment 0 raced: not confirmed on a (sbatch did not answer" in out and "not confirmed on b" in out
    assert "job None" not in out


def test_submit_says_segment_0_is_not_confirmed_and_claims_no_job(tmp_path, capsys):
    from chainrun.cli.chain_cmd import _print_submitted

    fake, store, eng, c, first = world(tmp_path, TIMEOUT, lands=False)
    _print_submitted(create.SubmitResult(c, first, 1200, unconfirmed=create.FIRST_UNCONFIRMED), json_out=False)
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"chainrun: warning: {create.FIRST_UNCONFIRMED}"]
    assert "segment 0 not confirmed: `chainrun watch` adopts its job or submits it again" in out
    assert "submitted as job" not in out


class DropsOnSbatch:
    """A remote cluster's runner whose connection drops while sbatch runs: ``lands`` says whether the
    sbatch ran on the cluster before the drop (the job exists) or not."""

    def __init__(self, fake: FakeSlurm, lands: bool) -> None:
        self.fake, self.lands = fake, lands

    def run(self, argv, timeout=60.0, **kw):
        from chainrun.runner.base import RemoteUnreachable

        if str(argv[0]).endswith("sbatch"):
            if self.lands:
                self.fake.run(argv, timeout, **kw)
            raise RemoteUnreachable("hpc: connection lost (Connection reset by peer)")
        return self.fake.run(argv, timeout, **kw)

    def __getattr__(self, name):
        return getattr(self.fake, name)


@pytest.mark.parametrize("lands", [True, False], ids=["job-made", "no-job"])
def test_a_connection_lost_while_sbatch_ran_keeps_the_chain_for_the_watcher(tmp_path, lands):
    """The same class as a timeout: a remote cluster's connection lost during segment 0's sbatch may have
    made the job. Raising (exit 8) left the chain active but told the user it failed, inviting a second
    `submit`, so two jobs for one run; now it is unconfirmed, and the watcher settles it once it reaches
    the cluster again."""
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    c = Chain(id="drop-0001", name="drop", cluster="hpc", script="/s", workdir="/w", run_dir="/r",
              checkpoint_dir="/c", total_s=600, segment_s=1200, policy="reactive", lead_s=60, signal="USR2",
              signal_lead_s=30, retries=1, sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    first = create._submit_first(store, SlurmClient(DropsOnSbatch(fake, lands)), fake, c, time_min_s=None)
    assert first.phase == SUBMITTING and first.job_id is None and store.chain(c.id).status == ACTIVE
    assert any(ev.message.startswith(create.FIRST_UNCONFIRMED) and "connection lost" in ev.message
               for _, ev in store.events(c.id))
    eng = Engine(store, SlurmClient(fake), fake, clock=lambda: fake.now, user="root")  # reachable again
    if not lands:
        fake.now += ADOPT_AFTER_S + 1
    eng.tick()
    names = [j.name for j in fake.jobs.values()]
    if lands:
        assert store.segments(c.id)[0].job_id == "100" and names == [f"cr.{c.id}.0"]  # adopted, not twice
    else:
        s0, s1 = store.segments(c.id)
        assert s0.outcome == CANCELLED_OUT and s1.phase == PENDING and names == [f"cr.{c.id}.1"]


def test_a_race_whose_second_cluster_drops_keeps_the_first_racer(tmp_path):
    """--race on a,b: a's racer submitted, then b's connection drops (reservations, then sbatch). Raising
    left a's job racing while `submit` said it failed; now b's racer waits to be settled and a races on."""

    fakes = {n: FakeSlurm(now=time.time()) for n in "ab"}

    class Down(DropsOnSbatch):
        def run(self, argv, timeout=60.0, **kw):
            from chainrun.runner.base import RemoteUnreachable

            raise RemoteUnreachable("b: connection lost")

    store, c, first, _ = race(tmp_path, "race-0002", {"a": fakes["a"], "b": Down(fakes["b"], False)})
    assert first.job_id == "100" and first.cluster == "a" and store.chain(c.id).status == ACTIVE
    racers = store.chain(c.id).extra["race"]["racers"]
    assert racers["a"]["phase"] == PENDING and racers["b"]["phase"] == SUBMITTING
    assert not fakes["b"].jobs
