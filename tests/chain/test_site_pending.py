"""The rule on a successor pending on the chain's cluster (site_plan.weigh_pending, which the watcher's
reconsider and the multi-cluster replay both call): Slurm's plan for it against a new submission elsewhere."""

from chainrun.chain import site_plan
from chainrun.chain.site_choice import SiteOption

H = 3600.0


def _weigh(planned_in_s: float, other_wait_s: float, *, margin_s: float = H, ready_in_s: float = 0.0):
    here = SiteOption("a", {0.5: site_plan.pending_wait_s(1000.0 + planned_in_s, 1000.0)})
    other = SiteOption("b", {0.5: other_wait_s}, transfer_s=900.0)
    return site_plan.weigh_pending(here, [other], remaining_s=20 * H, margin_s=margin_s, ready_in_s=ready_in_s,
                                   segment_s=10 * H, boundary_s=600.0)


def test_it_moves_only_when_the_other_cluster_finishes_more_than_the_margin_sooner():
    c = _weigh(10 * H, H)  # 10 h planned here against 1 h + the 15 min copy there: 8.75 h sooner
    assert c.move and c.site == "b" and c.finish_s["a"] - c.finish_s["b"] == 8.75 * H
    assert not _weigh(10 * H, H, margin_s=9 * H).move
    assert not _weigh(2 * H, H).move  # 0.75 h sooner: within the 1 h margin


def test_a_plan_already_passed_is_no_wait_and_the_hand_over_bounds_both():
    assert site_plan.pending_wait_s(900.0, 1000.0) == 0.0
    # both clusters wait for the live segment's hand-over in 12 h: the copy is all that differs
    c = _weigh(10 * H, H, ready_in_s=12 * H)
    assert not c.move and c.finish_s["b"] - c.finish_s["a"] == 900.0


def test_slurms_plan_bounds_a_wait_only_while_it_lies_ahead_and_is_recent():
    assert site_plan.plan_holds(planned=5000.0, seen_at=1000.0, now=1000.0 + site_plan.PLAN_MEMORY_S)
    assert not site_plan.plan_holds(planned=5000.0, seen_at=1000.0, now=1001.0 + site_plan.PLAN_MEMORY_S)
    assert not site_plan.plan_holds(planned=1000.0, seen_at=1000.0, now=1000.0)


def test_a_pending_successor_is_weighed_on_the_work_left_after_its_running_predecessor():
    """site_plan.work_after_running: the total less the credited work and what the running segment should
    still train to its hand-over point (as planning.plan counts it), the pending successor left out.
    Chain.remaining_s alone (what reconsider read before) still counted the predecessor's work."""
    from chainrun.chain import sizing
    from chainrun.chain.pace import expected_training, segment_overhead
    from chainrun.state.records import PENDING, RUNNING, Chain, Segment

    c = Chain(id="w-0001", name="w", cluster="a", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=100 * H, segment_s=48 * H, policy="predicted", lead_s=3600, signal="USR2", signal_lead_s=300,
              retries=1, sbatch_args=[], partition="gpu", created=0.0, credited_s=20 * H)
    run = Segment(chain_id=c.id, idx=1, time_limit_s=48 * 3600, phase=RUNNING, job_id="11", start=10 * H,
                  end=58 * H)
    succ = Segment(chain_id=c.id, idx=2, time_limit_s=48 * 3600, phase=PENDING, job_id="12")
    left = site_plan.work_after_running(c, [run, succ])
    trains = sizing.expected_work(expected_training(c, run, segment_overhead(c, [run, succ])))
    assert trains > 40 * H and left == sizing.work_after(100 * H, 20 * H, trains)
    assert left < c.remaining_s - 40 * H  # the predecessor's ~48 h are not the successor's to do
    assert site_plan.work_after_running(c, [run]) == left  # the pending successor changes nothing
    assert site_plan.work_after_running(c, [succ]) == c.remaining_s  # nothing runs: all that is not credited


def test_a_pending_jobs_wait_is_slurms_plan_no_longer_than_the_sites_median_now():
    # Slurm plans with every running job taking its whole limit: an upper bound, read against the
    # other sites' medians only up to this site's own median for the same request now
    assert site_plan.pending_wait_s(1000.0 + 30 * H, 1000.0, fresh_s=H) == H
    assert site_plan.pending_wait_s(1000.0 + 2 * H, 1000.0, fresh_s=5 * H) == 2 * H  # Slurm knows better
    assert site_plan.pending_wait_s(1000.0 + 2 * H, 1000.0) == 2 * H  # no model there: the plan
    assert site_plan.pending_wait_s(1000.0 + 2 * H, 1000.0, fresh_s=-5.0) == 0.0


def test_a_pending_jobs_wait_is_capped_by_the_models_own_median_not_one_leaned_on_slurm():
    # a model out of its depth leans its median on the latest planned start of the jobs ahead
    # (chainrun/predict/doubt.py): a plan with every running job at its limit, like the pending job's
    # own. As the cap it capped nothing, and the chain moved to a cluster 40 % slower (the --pace 0.6
    # replay: 9.9 h against 5.4 h at heavy load); the model's own median (an hour) caps the plan
    from chainrun.chain.policies import WaitEstimate

    leaned = WaitEstimate(seconds=40 * H, model="m, leaning on Slurm's squeue --start", p50=30 * H, model_p50=H)
    assert site_plan.own_median_s(leaned) == H and site_plan.median_s(leaned) == 30 * H
    assert site_plan.own_median_s(WaitEstimate(seconds=3 * H, model="m", p50=2 * H)) == 2 * H  # not leaned
    here = SiteOption("a", {0.5: site_plan.pending_wait_s(1000.0 + 30 * H, 1000.0, site_plan.own_median_s(leaned))})
    other = SiteOption("b", {0.5: 10 * H}, transfer_s=900.0, pace=0.6)
    c = site_plan.weigh_pending(here, [other], remaining_s=20 * H, margin_s=H, ready_in_s=0.0, segment_s=10 * H, boundary_s=600.0)
    assert not c.move and c.site == "a"
    capped_by_lean = SiteOption("a", {0.5: site_plan.pending_wait_s(1000.0 + 30 * H, 1000.0, site_plan.median_s(leaned))})
    assert site_plan.weigh_pending(capped_by_lean, [other], remaining_s=20 * H, margin_s=H, ready_in_s=0.0, segment_s=10 * H,
                                   boundary_s=600.0).move  # what the leaned median did
