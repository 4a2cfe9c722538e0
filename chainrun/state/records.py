"""What chainrun remembers: chains, their segments, and events."""

from __future__ import annotations

from dataclasses import dataclass, field

# chain status
ACTIVE = "ACTIVE"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
FINAL_CHAIN = {COMPLETED, FAILED, CANCELLED}

# segment phase (ours, coarser than Slurm's states)
SUBMITTING = "SUBMITTING"  # intent recorded, sbatch not yet confirmed
PENDING = "PENDING"
RUNNING = "RUNNING"
ENDED = "ENDED"
LIVE_PHASES = {SUBMITTING, PENDING, RUNNING}

# segment outcome, decided when it ends
CONTINUE = "continue"  # checkpointed on the signal or reached its limit: the next segment resumes
HANDOFF = "handoff"  # stopped early because its successor started
DONE = "done"  # the payload said training is finished
CRASH = "crash"  # ended on its own with an error, or the node failed
CANCELLED_OUT = "cancelled"  # cancelled by chainrun (or the user) before or while running
SKIPPED = "skipped"  # started after the chain was already finished
UNSTARTED = "unstarted"  # ended while waiting for the chain (signal, limit, kill): never trained, no retry spent
NO_RUN_FOLDER = "no-run-folder"  # the wrapper could not see the run folder on its node: trained nothing
CHECKPOINT_CRASH = "checkpoint-crash"  # trained, got the signal, then failed while saving: a warning


@dataclass
class Chain:
    id: str
    name: str
    cluster: str
    script: str  # the user's script, absolute path on the cluster
    workdir: str  # where segments run (sbatch --chdir)
    run_dir: str  # wrapper, control files and logs of this chain (on the cluster)
    checkpoint_dir: str
    total_s: int
    segment_s: int
    policy: str
    lead_s: int
    signal: str  # e.g. USR2
    signal_lead_s: int  # seconds before the limit
    retries: int
    sbatch_args: list[str]
    partition: str
    status: str = ACTIVE
    reason: str = ""
    credited_s: float = 0.0
    consecutive_failures: int = 0
    created: float = 0.0
    updated: float = 0.0
    finished: float | None = None
    # what chainrun learnt or decided about this chain beyond its columns (e.g. "adapt": changes to
    # the request of later segments: excluded nodes, --exclusive, shape; each also an event)
    extra: dict = field(default_factory=dict)

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.total_s - self.credited_s)

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_CHAIN


@dataclass
class Segment:
    chain_id: str
    idx: int
    phase: str = SUBMITTING
    job_id: str | None = None
    slurm_cluster: str | None = None
    slurm_state: str = ""
    outcome: str | None = None
    reason: str = ""
    time_limit_s: int = 0
    dependency: str = ""
    intent_at: float = 0.0  # our clock when we decided to submit
    submit: float | None = None
    eligible: float | None = None
    start: float | None = None
    end: float | None = None  # real end once ended; the expected end while running
    exit_code: int | None = None
    credit_s: float = 0.0
    overlap_s: float = 0.0
    predicted_wait_s: float | None = None
    predicted_model: str = ""
    is_retry: bool = False
    extra: dict = field(default_factory=dict)
    cluster: str | None = None  # the site it was submitted on; None: the chain's cluster (every chain on one)

    @property
    def wait_s(self) -> float | None:
        if self.start is None or self.eligible is None:
            return None
        return max(0.0, self.start - self.eligible)

    @property
    def is_live(self) -> bool:
        return self.phase in LIVE_PHASES


@dataclass
class ChainSite:
    """One cluster a chain spanning clusters may run on, with the chain's own folders and options there."""

    chain_id: str
    cluster: str
    rank: int  # order of preference, 0 = where the chain starts
    workdir: str
    run_dir: str
    checkpoint_dir: str
    script: str  # the payload on that cluster
    sbatch_args: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # e.g. segment_s, env_file, what the checks at submit found


@dataclass(frozen=True)
class Event:
    ts: float
    chain_id: str
    idx: int | None
    kind: str
    message: str
