"""What a chain does while nothing ticks it (chain/untended.py), on the real store and watcher
loop with in-memory Slurms (no services): the per-cluster tick record, one notification per
cluster that waits for a login, and the outlook `status` prints."""

from __future__ import annotations

import time

import pytest

from chainrun.chain import untended
from chainrun.chain.multi import MultiEngine
from chainrun.chain.segments import submit_segment
from chainrun.chain.summary import view_chain
from chainrun.cli.tables import untended_line
from chainrun.context import Context
from chainrun.notify import Notifier, NotifyConfig, load_config
from chainrun.runner.openssh import LoginRequired
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import COMPLETED, ENDED, PENDING, RUNNING, SUBMITTING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm

T0 = 1_800_000_000.0
H = 3600.0


def chain(policy="lead", cluster="a", **kw) -> Chain:
    return Chain(id=f"c{cluster}-{policy}", name="x", cluster=cluster, script="/s", workdir="/w", run_dir="/r",
                 checkpoint_dir="/c", total_s=int(100 * H), segment_s=int(10 * H), policy=policy, lead_s=int(H),
                 signal="USR2", signal_lead_s=300, retries=1, sbatch_args=[], partition="p", created=T0 - 50 * H, **kw)


def seg(idx, phase, **kw) -> Segment:
    return Segment(chain_id="c", idx=idx, phase=phase, time_limit_s=int(10 * H), **kw)


# ---------------------------------------------------------------------------- the outlook
def test_a_running_and_a_queued_segment_the_queued_one_starts_the_next_needs_a_tick_before_its_lead():
    c = chain("lead")
    segs = [seg(0, ENDED, end=T0 - 9 * H), seg(1, RUNNING, start=T0 - 9 * H, end=T0 + H), seg(2, PENDING)]
    o = untended.outlook(c, segs, untended.ClusterTicks("a", ok_at=T0 - 2 * H), now=T0)
    assert o.stale and o.last_tick == T0 - 2 * H and not o.failing
    assert (o.running, o.queued, o.needs_tick) == (1, (2,), 3)
    # the queued segment 2 may start now (no dependency): at the earliest it ends 10 h from now, and
    # segment 3 is due --lead (1 h) before its hand-over point (its end less the 300 s signal lead)
    assert o.stops_at == T0 + 10 * H
    assert o.tick_before == T0 + 10 * H - 300 - H
    v = view_chain(c, segs, now=T0, ticks={"a": untended.ClusterTicks("a", ok_at=T0 - 2 * H)})
    line = untended_line(v, T0)
    assert line.startswith("not ticked since ") and "(2h00m ago)" in line
    assert ". The queued segment 2 will start; segment 3 needs a tick before " in line
    assert "training may stop as early as" in line


def test_behind_a_dependency_the_queued_segment_starts_when_its_predecessor_ends():
    c = chain("dependency")
    segs = [seg(0, RUNNING, start=T0 - H, end=T0 + 9 * H), seg(1, PENDING, dependency="afterany:5")]
    o = untended.outlook(c, segs, None, now=T0)
    assert o.stops_at == T0 + 19 * H
    assert o.tick_before == T0 + 9 * H  # dependency: segment 2 is submitted once segment 1 is alone


def test_reactive_needs_the_tick_at_the_end_and_an_empty_chain_needs_one_now():
    c = chain("reactive")
    o = untended.outlook(c, [seg(0, RUNNING, start=T0 - H, end=T0 + 9 * H)], None, now=T0)
    assert (o.needs_tick, o.tick_before, o.stops_at) == (1, T0 + 9 * H, T0 + 9 * H)
    o = untended.outlook(c, [seg(0, ENDED, start=T0 - 11 * H, end=T0 - H)], None, now=T0)
    assert (o.needs_tick, o.tick_before, o.stops_at, o.queued) == (1, T0 - H, None, ())
    v = view_chain(c, [seg(0, ENDED, start=T0 - 11 * H, end=T0 - H)], now=T0, ticks={})
    assert "no tick has reached a yet" in untended_line(v, T0) and "Segment 1 needs a tick now" in untended_line(v, T0)


def test_an_unconfirmed_submission_is_said_and_a_recent_tick_or_finished_chain_says_nothing():
    c = chain("lead")
    segs = [seg(0, RUNNING, start=T0 - H, end=T0 + 9 * H), seg(1, SUBMITTING)]
    o = untended.outlook(c, segs, untended.ClusterTicks("a", ok_at=T0 - 60), now=T0)
    assert o.unconfirmed == (1,) and not o.stale
    assert untended_line(view_chain(c, segs, now=T0, ticks={"a": untended.ClusterTicks("a", ok_at=T0 - 60)}), T0) == ""
    assert view_chain(c, segs, now=T0).untended is None  # not asked for: the live view, notifications
    done = chain("lead", status=COMPLETED)
    assert untended.outlook(done, segs, None, now=T0) is None


def test_when_the_live_segments_finish_the_chain_no_tick_is_needed():
    c = chain("lead", credited_s=95 * H)  # 5 h left; the running segment trains up to 10 h
    segs = [seg(0, RUNNING, start=T0 - H, end=T0 + 9 * H)]
    o = untended.outlook(c, segs, None, now=T0)
    assert (o.needs_tick, o.tick_before, o.stops_at) == (None, None, T0 + 9 * H)
    line = untended_line(view_chain(c, segs, now=T0, ticks={}), T0)
    assert "training ends by itself" in line and "needs a tick" not in line


def test_failing_ticks_are_said_even_right_after_they_started():
    c = chain("lead")
    segs = [seg(0, RUNNING, start=T0 - H, end=T0 + 9 * H)]
    t = untended.ClusterTicks("a", ok_at=T0 - 120, failed_since=T0 - 60, failed_at=T0 - 1,
                              error="log in again: `chainrun cluster login a`", needs_human=True)
    o = untended.outlook(c, segs, t, now=T0)
    assert o.stale and o.failing.startswith("log in again") and o.failing_since == T0 - 60
    line = untended_line(view_chain(c, segs, now=T0, ticks={"a": t}), T0)
    assert line.startswith("ticks of a fail since ") and "cluster login a" in line and "Segment 1 needs a tick" in line


# ---------------------------------------------------------------------------- the record, the notice
def test_record_survives_reopening_and_a_reached_cluster_clears_the_failure(tmp_path):
    store = Store(tmp_path / "s.db")
    untended.record(store, "a", ok=True, now=T0)
    untended.record(store, "a", ok=False, error="log in again\nsecond line", needs_human=True, now=T0 + 60)
    untended.record(store, "a", ok=False, error="log in again", needs_human=True, now=T0 + 120)
    store.close()
    store = Store(tmp_path / "s.db")
    t = untended.read_all(store)["a"]
    assert (t.ok_at, t.failed_since, t.failed_at, t.error, t.needs_human) == (T0, T0 + 60, T0 + 120, "log in again", True)
    assert [x.cluster for x in untended.to_notify(store)] == ["a"]
    untended.mark_notified(store, "a")
    untended.record(store, "a", ok=False, error="cannot connect", now=T0 + 180)  # the laptop went offline too
    untended.record(store, "a", ok=False, error="log in again", needs_human=True, now=T0 + 240)
    assert untended.to_notify(store) == []  # told once until the cluster is reached again
    untended.record(store, "a", ok=True, now=T0 + 300)
    assert untended.read_all(store)["a"] == untended.ClusterTicks("a", ok_at=T0 + 300)
    store.close()


def test_one_login_notice_per_cluster_across_watch_once_runs(tmp_path):
    store = Store(tmp_path / "s.db")
    sent = []
    cfg = NotifyConfig(webhooks=["http://127.0.0.1:9/hook"])
    for _ in range(3):  # three cron ticks, each a new process with a new notifier
        untended.record(store, "mfa", ok=False, error="no SSH master is open: log in again", needs_human=True)
        Notifier(store, cfg, webhook=lambda url, msg: sent.append(msg)).after_tick()
    assert [(m.kind, m.chain_id) for m in sent] == [("login", "mfa")]
    assert "log in again" in sent[0].text and "mfa" in sent[0].subject
    untended.record(store, "mfa", ok=True)
    untended.record(store, "mfa", ok=False, error="log in again", needs_human=True)  # the next day's expiry
    Notifier(store, cfg, webhook=lambda url, msg: sent.append(msg)).after_tick()
    assert len(sent) == 2
    store.close()


def test_login_is_a_default_kind_and_can_be_left_out(tmp_path):
    assert "login" in NotifyConfig().on
    (tmp_path / "config.toml").write_text('[notify]\non = ["completed"]\n')
    assert "login" not in load_config(tmp_path).on
    (tmp_path / "config.toml").write_text('[notify]\non = ["login"]\n')
    assert load_config(tmp_path).on == {"login"}


# ---------------------------------------------------------------------------- the watcher loop
class Link:
    """A FakeSlurm behind a connection whose site may want a person to log in again."""

    def __init__(self, name: str) -> None:
        self.name, self.user = name, "root"
        self.fake = FakeSlurm(now=time.time())
        self.login_needed = False

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if self.login_needed:
            raise LoginRequired(f"no SSH master is open and the site needs a login: log in again: "
                                f"`chainrun cluster login {self.name}`")
        return self.fake.run(argv, timeout, env=env, stdin=stdin)

    def write_file(self, path, content, mode=0o644):
        pass

    def close(self):
        pass


@pytest.fixture
def world(tmp_path):
    store = Store(tmp_path / "state.db")
    links = {"a": Link("a"), "b": Link("b")}
    for name, link in links.items():
        c = chain("reactive", cluster=name)
        c.created = time.time()
        store.add_chain(c)
        submit_segment(store, SlurmClient(link), c, Segment(chain_id=c.id, idx=0, time_limit_s=120))

    def opener(name, *, store):
        return Context(home=tmp_path, store=store, runner=links[name], slurm=SlurmClient(links[name]), cluster=name,
                       remote=True, user="root")

    yield links, store, MultiEngine(store, open_context=opener)
    store.close()


def test_a_cluster_that_needs_a_login_is_recorded_the_other_is_ticked(world):
    links, store, multi = world
    links["b"].login_needed = True
    report = multi.tick()
    assert [w for w in report.warnings if w.startswith("b: ")] and not report.failed
    ticks = untended.read_all(store)
    assert ticks["a"].ok_at and not ticks["a"].failed_since
    assert ticks["b"].ok_at is None and ticks["b"].needs_human and "cluster login b" in ticks["b"].error
    views = {v.cluster: v for v in (view_chain(c, store.segments(c.id), ticks=ticks) for c in store.chains())}
    assert untended_line(views["a"], time.time()) == ""
    assert "ticks of b fail since" in untended_line(views["b"], time.time())
    links["b"].login_needed = False
    multi.tick()
    assert untended.read_all(store)["b"].failed_since is None
