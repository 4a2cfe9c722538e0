"""A chain written straight into a state store: a gap, an overlap, a retry, a prediction.

Lets the report and notifier be tested in milliseconds; the real-Slurm tests check the same
code on chains the watcher drove.
"""

from __future__ import annotations

from pathlib import Path

from chainrun.state.records import Chain, Segment
from chainrun.state.store import Store

T0 = 1_700_000_000.0


def make_chain(home: Path, chain_id: str = "train-abcd", *, status: str = "COMPLETED", running_last: bool = False) -> Store:
    home.mkdir(parents=True, exist_ok=True)
    store = Store(home / "state.sqlite")
    ch = Chain(id=chain_id, name="train", cluster="local", script="/x/train.sh", workdir="/x", run_dir="/x/run",
               checkpoint_dir="/x/ckpt", total_s=4 * 3600, segment_s=3600, policy="predicted", lead_s=600,
               signal="USR2", signal_lead_s=300, retries=1, sbatch_args=[], partition="short", created=T0)
    store.add_chain(ch)
    segs = [
        # seg 0 ran an hour, checkpointed
        Segment(ch.id, 0, phase="ENDED", job_id="100", slurm_state="COMPLETED", outcome="continue", time_limit_s=3600,
                submit=T0, eligible=T0, start=T0 + 120, end=T0 + 3720, credit_s=3600),
        # seg 1 started 15 min after seg 0 ended (a gap), predicted 5 min, waited 20 min
        Segment(ch.id, 1, phase="ENDED", job_id="101", slurm_state="FAILED", outcome="crash", reason="payload exit code 1",
                time_limit_s=3600, submit=T0 + 3000, eligible=T0 + 3000, start=T0 + 3720 + 900, end=T0 + 5000,
                predicted_wait_s=300, predicted_model="lgbm", extra={"gap_s": 900.0}),
        # seg 2 (retry) started 2 min before seg 1 ended? no: seg 1 crashed; seg 2 starts 60 s later
        Segment(ch.id, 2, phase="ENDED", job_id="102", slurm_state="COMPLETED", outcome="handoff", time_limit_s=3600,
                submit=T0 + 5000, eligible=T0 + 5000, start=T0 + 5060, end=T0 + 8000, credit_s=2940, is_retry=True,
                predicted_wait_s=90, predicted_model="lgbm", extra={"gap_s": 60.0}),
        # seg 3 started 3 min before seg 2 ended: an overlap (hand-off)
        Segment(ch.id, 3, phase="ENDED", job_id="103", slurm_state="COMPLETED", outcome="done", time_limit_s=3600,
                submit=T0 + 7000, eligible=T0 + 7000, start=T0 + 7820, end=T0 + 9000, credit_s=1180,
                overlap_s=180, predicted_wait_s=700, predicted_model="lgbm", extra={"gap_s": -180.0}),
    ]
    if running_last:  # segment 3 still trains
        segs[-1].phase, segs[-1].outcome, segs[-1].slurm_state, segs[-1].credit_s = "RUNNING", None, "RUNNING", 0.0
    for s in segs:
        store.save_segment(s)
    ch.status, ch.reason, ch.finished, ch.credited_s = status, "training finished in segment 3", T0 + 9010, 7720
    store.save_chain(ch)
    return store
