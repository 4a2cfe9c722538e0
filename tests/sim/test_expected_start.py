"""What the replayed partition shows as ``squeue --start``: Slurm's backfill plan, by hand."""

from chainrun.sim.expected_start import expected_start
from chainrun.sim.scheduler import Scheduler


def job(jid, submit, nodes, limit, runtime, dep=-1):
    return (float(submit), jid, nodes, float(limit), float(runtime), dep)


def test_a_wide_job_waits_for_the_running_jobs_limit():
    # 1 of 2 nodes busy until 100 (by its limit): a 2-node job starts then
    assert expected_start(10, 2, [(100, 1)], [(7, 2, 50)], 7) == 100


def test_the_jobs_ahead_hold_their_nodes_for_their_limits():
    # ahead: a 2-node job planned at 100 for 300 s; the 1-node job behind it fits only after it (400),
    # not in the idle node now (it would run past 100)...
    assert expected_start(10, 2, [(100, 1)], [(7, 2, 300), (8, 1, 500)], 8) == 400
    # ...unless it ends (by its limit) before the reservation: then now
    assert expected_start(10, 2, [(100, 1)], [(7, 2, 300), (8, 1, 90)], 8) == 10
    # a 1-node job behind a 1-node job: both fit on the two nodes once they free up
    assert expected_start(10, 2, [(100, 1), (200, 1)], [(7, 1, 500), (8, 1, 500)], 8) == 200


def test_a_gap_between_reservations_is_used_when_long_enough():
    # 3 nodes: job 7 (3 nodes) at 100..200; the idle 2 nodes until 100 are too short for a 150 s job
    # (it must wait for 200), a 1-node 80 s job fits at once
    run = [(100, 1)]
    assert expected_start(0, 3, run, [(7, 3, 100), (8, 2, 150)], 8) == 200
    assert expected_start(0, 3, run, [(7, 3, 100), (8, 1, 80)], 8) == 0


def test_no_plan_beyond_the_depth_for_a_job_that_never_fits_or_is_not_pending():
    assert expected_start(0, 2, [(100, 2)], [(7, 1, 50), (8, 1, 50)], 8, depth=1) is None
    assert expected_start(0, 2, [(100, 2)], [(7, 1, 50), (8, 1, 50)], 8, depth=2) == 100
    assert expected_start(0, 2, [], [(7, 3, 50)], 7) is None
    assert expected_start(0, 2, [], [(7, 3, 50), (8, 2, 50)], 8) == 0  # the unfit job reserves nothing
    assert expected_start(0, 2, [], [(7, 1, 50)], 9) is None
    assert expected_start(0, 2, [], [(7, 1, 50)], 7, open_at=500) == 500


def test_the_partition_plans_with_limits_not_the_true_runtimes():
    # job 0 holds both nodes with a 1000 s limit but really ends at 10: at t=5 the plan for job 1 says
    # 1000 (squeue cannot know better), and the job in fact starts at 10
    sim = Scheduler(2, [job(0, 0, 2, 1000, 10), job(1, 1, 1, 100, 100)])
    sim.run_until(5)
    assert sim.expected_start(1) == 1000
    sim.run_until(20)
    assert sim.expected_start(1) is None  # running: no longer pending


def test_the_plan_is_the_start_when_jobs_run_their_limits_and_nothing_arrives():
    jobs = [job(0, 0, 1, 300, 300), job(1, 0, 1, 200, 200), job(2, 1, 2, 100, 100), job(3, 2, 1, 400, 400),
            job(4, 3, 1, 50, 50)]
    sim = Scheduler(2, jobs, record_starts=True)
    sim.run_until(5)
    plans = {j: sim.expected_start(j) for j in (2, 3, 4)}
    sim.run_until(float("inf"))
    # 2 (the top blocked job) at 300, 4 backfilled at 200 into the node 1 frees (it ends by 300), 3 after 2
    assert plans == {2: 300, 3: 400, 4: 200}
    assert [sim.starts[j] for j in (2, 3, 4)] == [300, 400, 200]


def test_a_job_held_by_a_dependency_has_no_plan():
    sim = Scheduler(2, [job(0, 0, 2, 100, 100)])
    sim.run_until(1)
    sim.submit_after(50, 0, 1, 100, 100)
    assert sim.expected_start(50) is None
    sim.submit(51, 2, 100, 100)
    assert sim.expected_start(51) == 100
