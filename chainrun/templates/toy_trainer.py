#!/usr/bin/env python3
"""A toy trainer that follows chainrun's checkpoint contract, with no dependencies.

It counts steps (one every TOY_STEP_SECONDS), saves a checkpoint every TOY_SAVE_EVERY
steps and whenever CHAINRUN_SIGNAL (or TERM) arrives (ckpt.g<CHAINRUN_GENERATION>.json, atomically),
resumes from the newest checkpoint of a lower generation,
and says "done" once it reaches TOY_TOTAL_STEPS (0 = never: the chain ends by --total).
Every step is appended to steps.log in the checkpoint folder, so a test can check that
no step was lost or trained twice and that no two segments trained at once.
TOY_CRASH_AT_STEP makes it exit 1 at that step (to exercise retries; TOY_CRASH_RANK limits it to one rank); TOY_IGNORE_SIGNAL=1 makes it
ignore CHAINRUN_SIGNAL (many real trainers do: only TERM at the limit stops it); TOY_CRASH_ON_SAVE=1
makes it fail with a traceback while saving after a signal; TOY_CKPT_PAD_KIB=N makes each checkpoint N KiB
(a copy between clusters then takes a while). Each line of steps.log ends with the
Slurm job id and SLURM_RESTART_COUNT, so a test can tell which job (and which run of a requeued job) trained when.
Progress (the optional contract): every step appends "<time> <step> - <step seconds> [<total>]" to this
rank's $CHAINRUN_PROGRESS_FILE.<SLURM_PROCID>.<SLURMD_NODENAME>. TOY_SLOW_NODES="n2=2.0" makes steps on
that Slurm node (SLURMD_NODENAME: test nodes share one hostname) that many times slower; TOY_SWITCHES=
"n1+n2:n3+n4" with TOY_SPREAD_SLOW=1.3 slows a job whose nodes span more than one group; TOY_BUSY=1 spins
the CPU through a step instead of sleeping (so a CPU-heavy neighbour slows it). Elastic segments: the
global batch (TOY_GLOBAL_BATCH) is kept by accumulation = CHAINRUN_REF_GPUS / CHAINRUN_GPUS (nodes when no
GPUs), each step taking that many times longer; every segment's batch arithmetic goes to batch.log. Under srun with several
ranks only rank 0 (SLURM_PROCID) writes the checkpoint, steps.log and the done file.
"""

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

ckpt_dir = Path(os.environ.get("CHAINRUN_CHECKPOINT_DIR", "./toy-ckpt"))
ckpt_dir.mkdir(parents=True, exist_ok=True)
# one checkpoint file per ownership generation (CHAINRUN_GENERATION; absent: ckpt.json, ranked below every
# generation): a fenced old owner that saves late writes its own generation's file, never the newer owner's
_gen = os.environ.get("CHAINRUN_GENERATION", "").strip()
generation = int(_gen) if _gen.isdigit() else None


def ckpt_of(gen: int | None) -> Path:
    return ckpt_dir / ("ckpt.json" if gen is None else f"ckpt.g{gen}.json")


def resume_step() -> int:
    """The step of the newest checkpoint of a generation below ours: highest generation, then step.
    Known names are opened (a network filesystem may list stale); outside chainrun, every file there is."""
    paths = (list(ckpt_dir.glob("ckpt*.json")) if generation is None
             else [ckpt_of(g) for g in range(generation)] + [ckpt_of(None)])
    best = (-2, 0)
    for p in paths:
        try:
            d = json.loads(p.read_text())
            best = max(best, (-1 if d.get("generation") is None else int(d["generation"]), int(d["step"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # only a whole file is ever renamed into place; anything else is not a checkpoint
    return best[1]


steps_log = ckpt_dir / "steps.log"
segment = os.environ.get("CHAINRUN_SEGMENT", "?")
step_s = float(os.environ.get("TOY_STEP_SECONDS", "0.5"))
save_every = int(os.environ.get("TOY_SAVE_EVERY", "10"))
total_steps = int(os.environ.get("TOY_TOTAL_STEPS", "0"))
crash_at = int(os.environ.get("TOY_CRASH_AT_STEP", "0"))
crash_rank = os.environ.get("TOY_CRASH_RANK")  # only this rank crashes (default: every rank)
sig_name = os.environ.get("CHAINRUN_SIGNAL", "USR2")
ignore_signal = os.environ.get("TOY_IGNORE_SIGNAL") == "1"
crash_on_save = os.environ.get("TOY_CRASH_ON_SAVE") == "1"
# a checkpoint of this many KiB (a "pad" field): big enough that copying it between clusters takes a while
pad_kib = int(os.environ.get("TOY_CKPT_PAD_KIB", "0") or 0)
job = os.environ.get("SLURM_JOB_ID", "-")
restart = os.environ.get("SLURM_RESTART_COUNT") or "0"  # a requeued job runs again under its id: which run
rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
node = os.environ.get("SLURMD_NODENAME", "") or "local"
slow = dict((k, float(v)) for k, _, v in (x.partition("=") for x in os.environ.get("TOY_SLOW_NODES", "").split(",")) if v)
step_s *= slow.get(node, 1.0)
# TOY_SWITCHES="n1+n2:n3+n4" TOY_SPREAD_SLOW=1.3: a job whose nodes sit under more than one of those
# groups (leaf switches) steps that many times slower, as an all-reduce crossing switches does
if os.environ.get("TOY_SWITCHES") and os.environ.get("SLURM_JOB_NODELIST"):
    import subprocess

    _mine = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True).stdout.split()
    _groups = [set(g.split("+")) for g in os.environ["TOY_SWITCHES"].split(":")]
    if sum(1 for g in _groups if g & set(_mine)) > 1:
        step_s *= float(os.environ.get("TOY_SPREAD_SLOW", "1.3"))
# Elastic segments (docs/elastic.md): the global batch stays TOY_GLOBAL_BATCH at every shape. A device is
# a GPU, or a node when the job has none (one rank per node); accumulation = reference devices / devices,
# so one step is the same work at every shape and, on fewer devices, takes that many times as long.
nodes = int(os.environ.get("CHAINRUN_NODES", "1") or 1)
devices = int(os.environ.get("CHAINRUN_GPUS", "0") or 0) or nodes
ref_devices = (int(os.environ.get("CHAINRUN_REF_GPUS", "0") or 0) or int(os.environ.get("CHAINRUN_REF_NODES", "0") or 0)
               or devices)
global_batch = int(os.environ.get("TOY_GLOBAL_BATCH", "64"))
per_device = max(1, global_batch // ref_devices)
accumulate = max(1, -(-ref_devices // devices))
step_s *= accumulate
busy = os.environ.get("TOY_BUSY") == "1"
progress = os.environ.get("CHAINRUN_PROGRESS_FILE")
progress = progress and open(f"{progress}.{rank}.{node}", "a")


def spin(seconds: float) -> None:  # fixed CPU work, calibrated once: a busy neighbour makes it slower
    global per_s
    if "per_s" not in globals():
        t0 = time.perf_counter()
        for _ in range(200_000):
            pass
        per_s = 200_000 / max(1e-6, time.perf_counter() - t0)
    for _ in range(int(per_s * seconds)):
        pass

stop = {"why": None}


def on_signal(signum, _frame):
    stop["why"] = signal.Signals(signum).name


signal.signal(getattr(signal, "SIG" + sig_name), signal.SIG_IGN if ignore_signal else on_signal)
signal.signal(signal.SIGTERM, on_signal)


def save(step: int) -> None:
    if rank:
        return  # rank 0 keeps the checkpoint
    ckpt = ckpt_of(generation)
    tmp = ckpt.with_name(f".{ckpt.name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(json.dumps({"step": step, "segment": segment, "generation": generation, "job": job,
                            "time": time.time(), **({"pad": "0" * (pad_kib << 10)} if pad_kib else {})}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt)  # atomic: a checkpoint is either the old one or the new one
    fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # and the rename reaches the disk
    finally:
        os.close(fd)


step = resume_step()
print(f"toy: segment {segment} resumes at step {step} on {socket.gethostname()}", flush=True)
if rank == 0:  # what each segment's shape did to the batch: the global batch must never change
    with (ckpt_dir / "batch.log").open("a") as f:
        f.write(f"segment={segment} job={job} start_step={step} nodes={nodes} devices={devices} "
                f"ref_devices={ref_devices} per_device={per_device} accumulate={accumulate} "
                f"global_batch={per_device * devices * accumulate}\n")
with (steps_log.open("a") if rank == 0 else open(os.devnull, "w")) as log:
    while True:
        if stop["why"]:
            if crash_on_save:
                raise RuntimeError(f"toy: cannot write the checkpoint for step {step} (TOY_CRASH_ON_SAVE)")
            save(step)
            log.write(f"save {segment} {step} {time.time():.3f} {job} {restart}\n")
            print(f"toy: {stop['why']} -> saved step {step}, exiting", flush=True)
            sys.exit(0)
        if total_steps and step >= total_steps:
            save(step)
            if rank == 0:
                Path(os.environ.get("CHAINRUN_DONE_FILE", ckpt_dir / "CHAINRUN_DONE")).write_text("done\n")
            log.write(f"done {segment} {step} {time.time():.3f} {job} {restart}\n")
            print(f"toy: reached {total_steps} steps, training finished", flush=True)
            sys.exit(0)
        t0 = time.time()
        spin(step_s) if busy else time.sleep(step_s)
        step += 1
        if progress:
            progress.write(f"{time.time():.3f} {step} - {time.time() - t0:.4f}{f' {total_steps}' if total_steps else ''}\n")
            progress.flush()
        log.write(f"step {segment} {step} {time.time():.3f} {job} {restart}\n")
        log.flush()
        if crash_at and step == crash_at and (crash_rank is None or str(rank) == crash_rank):
            print(f"toy: crashing at step {step} as asked", flush=True)
            sys.exit(1)
        if step % save_every == 0:
            save(step)
