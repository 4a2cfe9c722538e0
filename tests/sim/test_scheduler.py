"""The partition model on traces small enough to schedule by hand."""

from chainrun.sim.scheduler import Scheduler


def job(jid, submit, nodes, limit, runtime, dep=-1):
    return (float(submit), jid, nodes, float(limit), float(runtime), dep)


def starts(nodes, jobs, **kw):
    sim = Scheduler(nodes, jobs, record_starts=True, **kw)
    sim.run_until(float("inf"))
    return sim.starts


def test_fcfs_order_when_nothing_can_backfill():
    jobs = [job(0, 0, 2, 100, 100), job(1, 1, 2, 100, 100), job(2, 2, 2, 100, 100)]
    assert starts(2, jobs) == [0, 100, 200]


def test_older_job_goes_first_even_if_a_younger_one_is_smaller():
    # 0 holds 1 of 2 nodes until 100; 1 (2 nodes) is older than 2 (1 node, would fit now but
    # runs past 1's reservation), so 2 must wait behind 1
    jobs = [job(0, 0, 1, 100, 100), job(1, 1, 2, 50, 50), job(2, 2, 1, 500, 500)]
    assert starts(2, jobs) == [0, 100, 150]


def test_short_job_is_backfilled_before_the_reservation():
    # 1 waits for 2 nodes at t=100; 2 fits in the idle node and ends (by its limit) before 100
    jobs = [job(0, 0, 1, 100, 100), job(1, 1, 2, 100, 100), job(2, 2, 1, 60, 60)]
    assert starts(2, jobs) == [0, 100, 2]


def test_backfill_uses_the_limit_not_the_true_run_time():
    # 2 would really finish in 10 s, but asks for 200 s: it may not jump ahead of 1's reservation
    jobs = [job(0, 0, 1, 100, 100), job(1, 1, 2, 100, 100), job(2, 2, 1, 200, 10)]
    assert starts(2, jobs) == [0, 100, 200]


def test_backfill_into_nodes_the_reservation_does_not_need():
    # 3 nodes: 0 holds 2 until 100; 1 needs 2 at t=100 (1 spare then); 2 (1 node, long) takes the spare
    jobs = [job(0, 0, 2, 100, 100), job(1, 1, 2, 100, 100), job(2, 2, 1, 1000, 1000)]
    assert starts(3, jobs) == [0, 100, 2]


def test_job_ends_at_its_limit_at_the_latest():
    # 0 ran 500 s in the trace but asked for 100 s: it is killed at 100 and 1 starts then
    jobs = [job(0, 0, 1, 100, 500), job(1, 1, 1, 100, 100)]
    assert starts(1, jobs) == [0, 100]


def test_dependency_waits_for_its_predecessor_and_ages_from_its_end():
    # 2 depends on 0; when 0 ends at 100, 1 (eligible since 50) is older and goes first
    jobs = [job(0, 0, 1, 100, 100), job(2, 10, 1, 100, 100, dep=0), job(1, 50, 1, 100, 100)]
    jobs.sort()
    sim = Scheduler(1, jobs, record_starts=True)
    sim.run_until(float("inf"))
    assert sim.starts == [0, 100, 200]


def test_nothing_starts_before_the_partition_opens():
    jobs = [job(0, 0, 1, 100, 100), job(1, 5, 1, 100, 100)]
    assert starts(2, jobs, open_at=1000.0) == [1000, 1000]


def test_fork_is_independent_and_submit_starts_at_once_when_it_fits():
    jobs = [job(0, 0, 1, 100, 100)]
    sim = Scheduler(2, jobs, n_ids=1)
    sim.run_until(10)
    f = sim.fork()
    f.submit(99, 1, 50, 50)
    assert f.watched[99] == 10  # a free node: no waiting for the next event
    assert 99 not in sim.watched and sim.free == 1


def test_a_job_running_when_sacct_was_dumped_holds_its_nodes():
    import math

    from chainrun.sim.workload import build_workload

    from .tracegen import frame

    df = frame([{"submit": 0, "start": 0, "end": 100, "limit_s": 1000},
                {"submit": 10, "start": 10, "end": 5000, "limit_s": 1000}])
    df.loc[0, "end"] = math.nan  # still running at the dump: runs to its limit (1000 s)
    w = build_workload(df)
    assert [j[4] for j in w.jobs] == [1000.0, 1000.0]  # (the second ran 4990 s: cut at its limit)


def test_multifactor_job_size_lets_a_wide_job_overtake_a_slightly_older_narrow_one():
    # 0 holds the only 2 nodes until 100; 1 (1 node) is 10 s older than 2 (2 nodes), but the
    # size term (worth 50 s of age per full-partition job) puts 2 first when 0 ends
    jobs = [job(0, 0, 2, 100, 100), job(1, 1, 1, 100, 100), job(2, 11, 2, 100, 100)]
    assert starts(2, jobs)[1:] == [100, 200]
    assert starts(2, jobs, size_weight_s=50.0)[1:] == [200, 100]


def test_json_has_no_nan():
    from chainrun.sim.jsonsafe import finite

    assert finite({"fidelity": {"spearman": float("nan")}, "p": [{"x": float("nan"), "y": 1.0}], "t": (2, "a")}) == \
        {"fidelity": {"spearman": None}, "p": [{"x": None, "y": 1.0}], "t": [2, "a"]}


def _fs(users, n_users, **kw):
    from chainrun.sim.fairshare import FairShare

    base = dict(users=users, n_users=n_users, since=[0.0] * n_users, weight_s=4 * 86400.0, size_weight_s=0.0, max_age_s=7 * 86400.0,
                half_life_s=2 * 86400.0, period_s=300.0)
    return FairShare(**{**base, **kw})


def test_fair_share_lets_a_light_user_overtake_a_heavy_users_older_job():
    # user 0 ran job 0 on the only node for a day; at t=86400 its job 1 (submitted at 1000) and
    # user 1's job 2 (submitted at 2000) both wait: by age 1 goes first, by fair share 2 does
    day = 86400.0
    jobs = [job(0, 0, 1, day, day), job(1, 1000, 1, 100, 100), job(2, 2000, 1, 100, 100)]
    assert starts(1, jobs) == [0, day, day + 100]
    assert starts(1, jobs, fairshare=_fs([0, 0, 1], 2)) == [0, day + 100, day]


def test_fair_share_is_weighed_against_age():
    # user 0's use ranks it below user 1 (factor 1/3 against 1), but the fair share difference
    # (2/3 x 1800 s of age) is less than the hour of age job 1 has on job 2: age wins
    day = 86400.0
    jobs = [job(0, 0, 1, day, day), job(1, 1000, 1, 100, 100), job(2, 1000 + 3600, 1, 100, 100)]
    assert starts(1, jobs, fairshare=_fs([0, 0, 1], 2, weight_s=1800.0)) == [0, day, day + 100]


def test_age_counts_only_up_to_the_max_age_under_fair_share():
    # 1 (heavy user) has waited far longer than 2, but both are past PriorityMaxAge: fair share decides
    jobs = [job(0, 0, 1, 10 * 86400, 10 * 86400), job(1, 10, 1, 100, 100), job(2, 3 * 86400, 1, 100, 100)]
    fs = _fs([0, 0, 1], 2, max_age_s=86400.0, weight_s=3600.0)
    assert starts(1, jobs, fairshare=fs) == [0, 10 * 86400 + 100, 10 * 86400]
    assert starts(1, jobs) == [0, 10 * 86400, 10 * 86400 + 100]


def test_a_fork_has_its_own_usage():
    day = 86400.0
    jobs = [job(0, 0, 1, day, day)]
    sim = Scheduler(2, jobs, fairshare=_fs([0], 1))
    sim.run_until(10.0)
    f = sim.fork()
    f.submit(5, 1, 100, 100)  # the chain's user (beyond the trace)
    f.run_until(day + 10)
    sim.run_until(day + 10)
    assert f.usage.done[1] > 0 and 1 not in sim.usage.done
    assert sim.usage.done[0] == f.usage.done[0] > 0


def test_fair_share_config_from_the_shipped_ls6_weights():
    import pandas as pd
    import pytest

    from chainrun.errors import UsageError
    from chainrun.sim.fairshare import _duration_s, fair_share_for, priority_terms

    assert _duration_s("2-0") == 2 * 86400 and _duration_s("1:00:00") == 3600 and _duration_s("5") == 300
    table = pd.DataFrame({"user": ["b", "a", "b"], "submit": [10.0, 20.0, 30.0]})
    fs = fair_share_for(table)
    # LS6: fair share 4000 and job size 100 against age 7000 over 7 days, half-life 2 days
    assert fs.weight_s == pytest.approx(4000 / 7000 * 7 * 86400)
    assert fs.size_weight_s == pytest.approx(100 / 7000 * 7 * 86400)
    assert fs.half_life_s == 2 * 86400 and fs.max_age_s == 7 * 86400
    assert fs.users == [1, 0, 1] and fs.n_users == 2 and list(fs.since) == [10.0, 20.0]

    class W:
        jobs = [(10.0, 0, 1, 60.0, 60.0, -1)]

    W.table = table
    assert priority_terms("age", W, 123.0) == (0.0, None)
    assert priority_terms("multifactor", W, 123.0) == (123.0, None)
    assert priority_terms("fairshare", W, 123.0)[1].n_users == 2
    with pytest.raises(UsageError):
        priority_terms("lottery", W, 0.0)
