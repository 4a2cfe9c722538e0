"""Reservations and pending reasons, parsed from output captured on the real test cluster."""

from pathlib import Path

from chainrun.chain.maintenance import fit_maintenance
from chainrun.slurm.parsers import parse_squeue
from chainrun.slurm.reasons import explain
from chainrun.slurm.reservations import Reservation, expand_nodes, fit_before, parse_reservations
from chainrun.state.records import Chain, Segment

DATA = Path(__file__).resolve().parents[1] / "data"


def test_reservation_from_scontrol_with_epoch_times():
    (r,) = parse_reservations((DATA / "scontrol_reservation_epoch.txt").read_text())
    assert r.name == "maint_probe" and r.is_maintenance and r.nodes == {"n4"} and r.node_count == 1
    assert r.end - r.start == 20 * 60
    assert parse_reservations("No reservations in the system\n") == []
    # times not in epoch seconds are not guessed at
    assert parse_reservations((DATA / "scontrol_reservation.txt").read_text()) == []


def test_host_lists():
    assert expand_nodes("n[1-3,7],gpu01") == ["n1", "n2", "n3", "n7", "gpu01"]
    assert expand_nodes("c[001-003]") == ["c001", "c002", "c003"]
    assert expand_nodes("ALL") == [] and expand_nodes("") == []


def res(start, *, nodes=("n4",), count=1, flags=("MAINT",), all_nodes=False):
    return Reservation("m", start, start + 3600, frozenset(nodes), count, frozenset(flags), "", all_nodes)


def test_fit_before_shortens_only_when_the_window_is_in_the_way():
    kw = dict(pinned_nodes=set(), job_nodes=1, partition="p", partition_nodes=4)
    # the whole cluster goes down in 19 h: a 48 h segment ends before it
    fit = fit_before(0, 48 * 3600, 600, [res(19 * 3600, all_nodes=True)], **kw)
    assert fit.shortened and fit.limit_s == 19 * 3600 - 60
    # one node of four reserved: a 1-node job runs elsewhere
    assert not fit_before(0, 48 * 3600, 600, [res(3600)], **kw).shortened
    # ... unless it is pinned to that node, or needs every node
    assert fit_before(0, 48 * 3600, 600, [res(3600)], **{**kw, "pinned_nodes": {"n4"}}).shortened
    assert fit_before(0, 48 * 3600, 600, [res(3600)], **{**kw, "job_nodes": 4}).shortened
    # not maintenance, already started, after the segment's end: nothing to do
    assert fit_before(0, 7200, 600, [res(3600, all_nodes=True, flags=("IGNORE_JOBS",))], **kw).reservation is None
    assert fit_before(100, 7200, 600, [res(50, all_nodes=True)], **kw).reservation is None
    assert fit_before(0, 3000, 600, [res(3600, all_nodes=True)], **kw).reservation is None
    # too little room: keep the limit, the segment starts after the window
    fit = fit_before(0, 7200, 600, [res(500, all_nodes=True)], **kw)
    assert fit.reservation is not None and not fit.shortened and fit.limit_s == 7200


def test_fit_maintenance_notes_what_it_decided():
    c = Chain(id="c", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/k",
              total_s=10**6, segment_s=48 * 3600, policy="lead", lead_s=3600, signal="USR2", signal_lead_s=300,
              retries=1, sbatch_args=["--nodelist=n4"], partition="p", extra={"partition_nodes": 4})
    seg = Segment(chain_id="c", idx=4, time_limit_s=48 * 3600)
    fit_maintenance(c, seg, [res(19 * 3600 + 1000)], 1000)
    assert seg.time_limit_s == 19 * 3600 - 60 and seg.extra["time_min_s"] == 360
    assert seg.extra["plan_note"].startswith("segment 4 shortened to 18h59m: maintenance at ")


def test_fit_maintenance_counts_the_nodes_slurm_gave_the_chain_before_its_options():
    """Three of four nodes go down in 19 h. A chain whose options say nothing of nodes fits on the fourth
    if it is one node, not if its script (``#SBATCH --nodes=2``) or ``--gpus`` made it two: the node
    count Slurm gave its previous job (planning passes it from the tick's squeue) counts first."""
    c = Chain(id="c", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/k",
              total_s=10**6, segment_s=48 * 3600, policy="lead", lead_s=3600, signal="USR2", signal_lead_s=300,
              retries=1, sbatch_args=["--gpus=8"], partition="p", extra={"partition_nodes": 4})
    down = [res(19 * 3600 + 1000, nodes=("n2", "n3", "n4"), count=3)]
    one = Segment(chain_id="c", idx=4, time_limit_s=48 * 3600)
    fit_maintenance(c, one, down, 1000)
    assert one.time_limit_s == 48 * 3600 and "plan_note" not in one.extra  # 1 node: runs on n1
    two = Segment(chain_id="c", idx=4, time_limit_s=48 * 3600)
    fit_maintenance(c, two, down, 1000, given_nodes=2)
    assert two.time_limit_s == 19 * 3600 - 60 and two.extra["plan_note"].startswith("segment 4 shortened to")
    # an elastic segment's own shape still decides
    elastic = Segment(chain_id="c", idx=4, time_limit_s=48 * 3600, extra={"nodes": 1})
    fit_maintenance(c, elastic, down, 1000, given_nodes=2)
    assert elastic.time_limit_s == 48 * 3600


def test_pending_reasons_in_words():
    rows = {r.name: r for r in parse_squeue((DATA / "squeue_pending_reasons.txt").read_text())}
    assert explain(rows["probe-ptl"].reason).hopeless
    assert "partition allows" in explain(rows["probe-ptl"].reason).words
    maint = explain(rows["probe-maint"].reason)
    assert maint.code == "ReqNodeNotAvail" and not maint.hopeless and "May be reserved" in maint.words
    assert rows["probe-maint"].start is not None  # Slurm's own start estimate, from the same squeue
    assert explain(rows["probe-dep"].reason).words == "waiting for its dependency"
    assert explain(rows["probe-hold"].reason).hint
    assert explain("SomethingNew").words == "SomethingNew" and not explain("SomethingNew").hopeless
    assert explain("None").words == ""


def test_planning_reads_the_node_count_of_the_chains_latest_queued_job():
    """What planning passes to fit_maintenance: the tick's squeue row of the chain's latest job that is
    queued (running or pending), None when none is."""
    from types import SimpleNamespace

    from chainrun.chain.planning import _given_nodes
    from chainrun.slurm.parsers import QueueRow

    def row(job, nodes):
        return QueueRow(job_id=job, user="u", state="RUNNING", reason="", submit=0.0, start=0.0, end=None,
                        time_limit_s=3600.0, elapsed_s=0.0, partition="p", qos="", nodes=nodes, cpus=0, gpus=8,
                        dependency="", comment="", name="cr.c.3")
    segs = [Segment(chain_id="c", idx=i, job_id=j) for i, j in enumerate(["11", "12", "13"])]
    t = SimpleNamespace(queue=[row("12", 3), row("13", 2), row("99", 5)])
    assert _given_nodes(t, segs) == 2  # the latest of the chain's jobs in the queue
    assert _given_nodes(SimpleNamespace(queue=[row("11", 4)]), segs) == 4
    assert _given_nodes(SimpleNamespace(queue=[row("99", 5)]), segs) is None
