"""An in-memory Slurm behind the Runner interface, with faults on demand.

It answers the exact argv SlurmClient builds (squeue/sacct/sbatch/scancel) from a dict of
jobs, so the real Engine runs unchanged. Faults: ``fail[cmd] = [(rc, stderr), ...]`` pops one
scripted failure per call; ``land_late`` makes a failed sbatch still create its job (the
dangerous case: the reply was lost, the job exists); ``squeue_text`` overrides the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chainrun.runner.base import RunResult

SQ_HEAD = "JOBID|USER|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|TIME_LIMIT|TIME|PARTITION|QOS|NODES|CPUS|TRES_PER_NODE|DEPENDENCY|COMMENT|NAME"
SA_HEAD = ("JobIDRaw|JobName|User|Partition|QOS|Submit|Eligible|Start|End|Elapsed|TimelimitRaw|NNodes|NCPUS|AllocTRES|"
           "State|ExitCode|Reason|NodeList")


@dataclass
class Job:
    id: str
    name: str
    submit: float
    state: str = "PENDING"
    start: float | None = None
    end: float | None = None
    limit_s: int = 120
    user: str = "root"
    in_queue: bool = True
    in_acct: bool = True
    node: str = "n1"  # where it runs once started
    exit_code: str = "0:0"  # sacct's ExitCode once it ended


@dataclass
class FakeSlurm:
    now: float = 1_000_000.0
    next_id: int = 100
    jobs: dict = field(default_factory=dict)
    fail: dict = field(default_factory=dict)
    land_late: bool = False
    squeue_text: str | None = None
    calls: list = field(default_factory=list)
    signals: list = field(default_factory=list)  # (job id, signal) sent by scancel --signal: the job goes on
    files: dict = field(default_factory=dict)  # path -> text that `cat` shows (e.g. a wrapper's outcome file)
    acct_only: list = field(default_factory=list)  # Jobs only accounting knows (older jobs of a reused id)
    runs: list = field(default_factory=list)  # earlier runs of requeued jobs: shown by `sacct -D` only
    nodes: dict = field(default_factory=dict)  # node -> State, for `scontrol show node` (empty: not answered)
    reservations: str = ""  # what `scontrol show reservation --oneliner` prints (empty: not answered)
    updates: list = field(default_factory=list)  # (job id, {field: value}) of `scontrol update` on queued jobs
    name = "fake"

    # ---------------------------------------------------------- Runner
    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        argv = tuple(str(a) for a in argv)
        cmd = argv[0]
        self.calls.append(argv)
        if cmd == "cat":
            if argv[1] in self.files:
                return RunResult(argv, 0, self.files[argv[1]], "", 0.0)
            return RunResult(argv, 1, "", "no such file", 0.0)
        if cmd == "test":  # `test -e PATH`: the files the test wrote (e.g. the payload's done marker)
            return RunResult(argv, 0 if argv[-1] in self.files else 1, "", "", 0.0)
        scripted = self.fail.get(cmd)
        if scripted:
            rc, err = scripted.pop(0)
            if cmd == "sbatch" and self.land_late:
                self._sbatch(argv)
            return RunResult(argv, rc, "", err, 0.0, timed_out=(rc == -1))
        if cmd == "squeue":
            if self.squeue_text is not None:
                return RunResult(argv, 0, self.squeue_text, "", 0.0)
            rows = [SQ_HEAD] + [
                f"{j.id}|{j.user}|{j.state}|None|{int(j.submit)}|{int(j.start) if j.start else 'N/A'}|"
                f"{int(j.start + j.limit_s) if j.start else 'N/A'}|2:00|0:00|short|normal|1|1|N/A|(null)|(null)|{j.name}"
                for j in self.jobs.values() if j.in_queue and j.state in ("PENDING", "RUNNING")
            ]
            return RunResult(argv, 0, "\n".join(rows) + "\n", "", 0.0)
        if cmd == "sacct":
            ids = names = None
            if "--jobs" in argv:
                ids = set(argv[argv.index("--jobs") + 1].split(","))
            if "--name" in argv:
                names = set(argv[argv.index("--name") + 1].split(","))
            rows = [SA_HEAD]
            for j in [*self.acct_only, *(self.runs if "-D" in argv else []), *self.jobs.values()]:
                if not j.in_acct or (ids and j.id not in ids) or (names and j.name not in names):
                    continue
                el = int((j.end or self.now) - j.start) if j.start else 0
                rows.append(f"{j.id}|{j.name}|{j.user}|short|normal|{int(j.submit)}|{int(j.submit)}|"
                            f"{int(j.start) if j.start else 'Unknown'}|{int(j.end) if j.end else 'Unknown'}|"
                            f"00:{el // 60:02d}:{el % 60:02d}|2|1|1|cpu=1|{j.state}|{j.exit_code}|None|"
                            f"{j.node if j.start else 'None assigned'}")
            return RunResult(argv, 0, "\n".join(rows) + "\n", "", 0.0)
        if argv[:3] == ("scontrol", "show", "node") and self.nodes:
            text = "".join(f"NodeName={n} State={st} Partitions=short,long\n" for n, st in self.nodes.items())
            return RunResult(argv, 0, text, "", 0.0)
        if argv[:3] == ("scontrol", "show", "reservation") and self.reservations:
            return RunResult(argv, 0, self.reservations, "", 0.0)
        if cmd == "sbatch":
            jid = self._sbatch(argv)
            return RunResult(argv, 0, f"{jid}\n", "", 0.0)
        if cmd == "scancel" and any(a.startswith("--signal=") for a in argv):
            sig = next(a.split("=", 1)[1] for a in argv if a.startswith("--signal="))
            self.signals += [(a, sig) for a in argv[1:] if a in self.jobs and self.jobs[a].state == "RUNNING"]
            return RunResult(argv, 0, "", "", 0.0)
        if cmd == "scancel":
            for a in argv[1:]:
                if a in self.jobs and self.jobs[a].state in ("PENDING", "RUNNING"):
                    self.jobs[a].state, self.jobs[a].end = "CANCELLED", self.now
            return RunResult(argv, 0, "", "", 0.0)
        if cmd == "scontrol" and argv[1:2] == ("update",):  # a queued job's request changed in place
            jid = argv[2].split("=", 1)[1]
            fields = dict(a.split("=", 1) for a in argv[3:])
            if jid not in self.jobs or self.jobs[jid].state != "PENDING":
                return RunResult(argv, 1, "", "scontrol: error: Job is no longer pending execution", 0.0)
            self.updates.append((jid, fields))
            return RunResult(argv, 0, "", "", 0.0)
        return RunResult(argv, 127, "", f"{cmd}: command not found", 0.0)

    def write_file(self, path, content, mode=0o644):
        pass

    def close(self):
        pass

    # ---------------------------------------------------------- cluster side
    def _sbatch(self, argv) -> str:
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        jid = str(self.next_id)
        self.next_id += 1
        self.jobs[jid] = Job(jid, name, self.now)
        return jid

    def count(self, cmd: str) -> int:
        return sum(1 for a in self.calls if a[0] == cmd)

    def by_name(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.name == name]

    def start(self, jid: str) -> None:
        self.jobs[jid].state, self.jobs[jid].start = "RUNNING", self.now

    def finish(self, jid: str, state: str = "TIMEOUT") -> None:
        self.jobs[jid].state, self.jobs[jid].end = state, self.now
        self.jobs[jid].in_queue = False

    def requeue(self, jid: str, state: str = "REQUEUED") -> None:
        """Slurm requeued it (node failure, preemption, `scontrol requeue`): pending again under the
        same id, with a new submit time (job_mgr.c resets it)."""
        j = self.jobs[jid]
        if j.start is not None:  # sacct -D keeps the run that ended as a row of its own
            self.runs.append(Job(jid, j.name, j.submit, state=state, start=j.start, end=self.now, in_queue=False,
                                 node=j.node))
        j.state, j.start, j.end, j.submit, j.in_queue = "PENDING", None, None, self.now, True
