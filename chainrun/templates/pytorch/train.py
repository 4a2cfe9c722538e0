#!/usr/bin/env python3
"""Resumable plain-PyTorch training under chainrun (the checkpoint contract, docs/checkpoint-contract.md).

1. The signal handler is installed first, before the slow imports: a signal that arrives
   while torch loads only sets a flag; nothing is lost.
2. At start, resume from the latest complete checkpoint in $CHAINRUN_CHECKPOINT_DIR, if there is
   one: the one its marker names, of a generation below this segment's (CHAINRUN_GENERATION).
3. On the signal (CHAINRUN_SIGNAL, USR2 by default) or TERM: finish the current step, save
   atomically (a temporary folder, fsync, rename, then the marker), exit 0.
4. When training is finished: save, create $CHAINRUN_DONE_FILE, exit 0.

Replace the model, data and loss with yours; keep the four steps. The model here is tiny on
purpose, so the example runs on a CPU in seconds.
"""

import os
import signal
import sys

STOP = {"why": None}


def _request_stop(signum, _frame):
    STOP["why"] = signal.Signals(signum).name  # checked between steps; never save inside a handler


signal.signal(getattr(signal, "SIG" + os.environ.get("CHAINRUN_SIGNAL", "USR2")), _request_stop)
signal.signal(signal.SIGTERM, _request_stop)

import json  # noqa: E402  (after the handler on purpose)
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

CKPT_DIR = Path(os.environ.get("CHAINRUN_CHECKPOINT_DIR", "checkpoints"))
DONE_FILE = Path(os.environ.get("CHAINRUN_DONE_FILE", CKPT_DIR / "CHAINRUN_DONE"))
SEGMENT = os.environ.get("CHAINRUN_SEGMENT", "-")
MAX_STEPS = int(os.environ.get("MAX_STEPS", "20000"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "500"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))  # >0 slows a step down, to watch a demo

# Elastic segments (docs/templates.md, docs/elastic.md): a resumed segment may run on another shape
# (fewer nodes) and must continue the same optimisation. So the GLOBAL batch and the learning-rate
# schedule (in samples) never change; gradient accumulation makes up for fewer devices:
#   accumulation = CHAINRUN_REF_GPUS / CHAINRUN_GPUS  (= CHAINRUN_REF_NODES / CHAINRUN_NODES: GPUs per node stay)
# One process per GPU (or per node on CPU), started by srun; every step trains on the same samples at
# every shape (sample i is a function of i, see micro_batch).
GLOBAL_BATCH = int(os.environ.get("GLOBAL_BATCH", "64"))
WORLD = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")) or 1)  # processes of this segment
RANK = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")) or 0)
NODES = int(os.environ.get("CHAINRUN_NODES", "1") or 1)
REF_NODES = int(os.environ.get("CHAINRUN_REF_NODES", "0") or 0) or NODES
REF_WORLD = max(1, REF_NODES * WORLD // NODES)  # the processes the reference shape has (same per node)
PER_DEVICE_BATCH = int(os.environ.get("PER_DEVICE_BATCH", "0")) or max(1, GLOBAL_BATCH // REF_WORLD)
ACCUMULATE = max(1, math.ceil(GLOBAL_BATCH / (PER_DEVICE_BATCH * WORLD)))  # REF_WORLD / WORLD by default
BASE_LR = float(os.environ.get("LR", "1e-2"))
WARMUP_SAMPLES = int(os.environ.get("WARMUP_SAMPLES", str(GLOBAL_BATCH * 10)))


def lr_at(samples: int) -> float:
    """The schedule in samples seen (not steps, not segments): linear warm-up, then cosine to MAX_STEPS."""
    total = MAX_STEPS * GLOBAL_BATCH
    if samples < WARMUP_SAMPLES:
        return BASE_LR * (samples + GLOBAL_BATCH) / (WARMUP_SAMPLES + GLOBAL_BATCH)
    return BASE_LR * 0.5 * (1 + math.cos(math.pi * min(1.0, (samples - WARMUP_SAMPLES) / max(1, total - WARMUP_SAMPLES))))


def micro_batch(step: int, k: int, n: int, true_w, device):
    """The k-th micro-batch of ``n`` samples of a step: samples step*GLOBAL_BATCH + k*n ... (each a
    function of its index), so any shape's split of a step covers the same global batch."""
    first = step * GLOBAL_BATCH + k * n
    gen = torch.Generator()
    xs = []
    for i in range(first, first + n):
        gen.manual_seed(1_000_003 + i)
        xs.append(torch.randn(16, generator=gen))
    x = torch.stack(xs).to(device)
    return x, (x @ true_w).unsqueeze(1)


# The progress contract (docs/checkpoint-contract.md#progress-optional), no chainrun import needed:
# one line per step into this rank's own file; chainrun shows steps/s and spots a slow node from it.
_PF = os.environ.get("CHAINRUN_PROGRESS_FILE") and "{}.{}.{}".format(
    os.environ["CHAINRUN_PROGRESS_FILE"], os.environ.get("SLURM_PROCID", "0"), os.environ.get("SLURMD_NODENAME", "local"))


def progress(step: int, samples: int, compute_s: float | None, total: int) -> None:
    if _PF:
        with open(_PF, "a") as f:
            f.write(f"{time.time():.3f} {step} {samples} {'-' if compute_s is None else f'{compute_s:.4f}'} {total}\n")


def note(text: str) -> None:
    """One line per event in the checkpoint folder: what each segment did, across the chain (rank 0)."""
    if RANK:
        return
    line = f"{time.time():.3f} segment {SEGMENT} {text}"
    print(line, flush=True)
    with open(CKPT_DIR / "progress.log", "a") as f:
        f.write(line + "\n")


# ---- checkpoint folders: the same block in every template (docs/templates.md, "How a save is made") ----
# A checkpoint is a folder step-<step>.g<generation>; it is complete only once the marker
# latest.g<generation>.json names it. CHAINRUN_GENERATION is the ownership generation this segment
# claimed (docs/checkpoint-contract.md); without it (a run outside chainrun, or an older chainrun)
# the folder has no .g part and the marker is latest.json, which ranks below every generation.
_GEN = os.environ.get("CHAINRUN_GENERATION", "").strip()
GENERATION = int(_GEN) if _GEN.isdigit() else None
_TAG = "" if GENERATION is None else f".g{GENERATION}"
KEEP = max(1, int(os.environ.get("KEEP_CHECKPOINTS", "2")))  # complete checkpoints kept
SAVE_SECONDS = float(os.environ.get("SAVE_SECONDS", "0"))  # >0: every save takes that much longer (try a slow save)
_OURS = os.environ.get("SLURM_JOB_ID") or str(os.getpid())  # the same for every rank of a job


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # a folder too: its entries (a rename) reach the disk
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _marker(gen: int | None) -> Path:
    return CKPT_DIR / ("latest.json" if gen is None else f"latest.g{gen}.json")


def _rank(gen: int | None, step: int) -> tuple[int, int]:
    return (-1 if gen is None else gen, step)  # newest = highest generation, then highest step


def _read_marker(path: Path) -> dict | None:
    """The marker's record if its folder still holds every file at the size it was saved with."""
    try:
        m = json.loads(path.read_text())
        folder = CKPT_DIR / m["folder"]
        if all((folder / name).stat().st_size == size for name, size in m["files"].items()):
            return m
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def latest_checkpoint() -> Path | None:
    """The newest complete checkpoint this segment may resume from. Only markers of a generation below
    ours count: one of our generation or above can only come from a later owner (then this copy is the
    stale one, and the wrapper stops it). Markers have known names and are opened, not listed: a
    network filesystem may serve a stale listing, but revalidates a file it opens. A fenced old owner
    that finishes a save late writes the marker of its own, lower generation, which never outranks
    its successor's."""
    if GENERATION is None:  # outside chainrun: whatever markers there are
        paths = list(CKPT_DIR.glob("latest*.json"))
    else:
        paths = [_marker(g) for g in range(GENERATION - 1, -1, -1)] + [_marker(None)]
    found = [m for m in map(_read_marker, paths) if m]
    if not found:
        return None
    return CKPT_DIR / max(found, key=lambda m: _rank(m["generation"], m["step"]))["folder"]


def staging_folder(what: str) -> Path:
    """Where a save writes before it is complete: never resumed from, removed by a later save."""
    return CKPT_DIR / f".tmp-{what}{_TAG}.{_OURS}"


def publish(tmp: Path, step: int) -> Path:
    """Make a written folder the latest checkpoint: fsync every file and folder, rename it into place,
    fsync the parent, then replace this generation's marker the same way. Killed at any point before
    the marker's rename, the previous marker stays and names the previous, whole checkpoint."""
    final = CKPT_DIR / f"step-{step:09d}{_TAG}"
    mine = _read_marker(_marker(GENERATION))
    if mine and mine["folder"] == final.name:  # this step is saved already (periodic, then on the signal)
        shutil.rmtree(tmp)
        return final
    if SAVE_SECONDS:
        time.sleep(SAVE_SECONDS)
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            _fsync(p)
            files[str(p.relative_to(tmp))] = p.stat().st_size
    for d in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
        _fsync(d)
    shutil.rmtree(final, ignore_errors=True)  # a killed save's folder that no marker names
    os.rename(tmp, final)
    _fsync(CKPT_DIR)
    record = {"generation": GENERATION, "step": step, "folder": final.name, "files": files, "time": time.time(),
              "job": os.environ.get("SLURM_JOB_ID"), "segment": os.environ.get("CHAINRUN_SEGMENT")}
    part = CKPT_DIR / f".{_marker(GENERATION).name}.{_OURS}"
    with open(part, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, _marker(GENERATION))
    _fsync(CKPT_DIR)
    _prune()
    return final


def save_checkpoint(step: int, write) -> Path:
    """``write(folder)`` puts the checkpoint's files into an empty folder; then publish() it."""
    tmp = staging_folder(f"step-{step:09d}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    return publish(tmp, step)


def _prune() -> None:
    """Keep the KEEP newest checkpoints of generations up to ours. A later generation's files are a
    newer owner's and never touched; a listing that is stale only delays a removal."""
    def gen_of(name: str) -> int | None:
        g = re.search(r"\.g(\d+)(?=\.|$)", name)
        return int(g.group(1)) if g else None

    def ours_to_clean(gen: int | None) -> bool:
        return gen == GENERATION if GENERATION is None else gen is None or gen <= GENERATION

    done = []
    for p in CKPT_DIR.glob("step-*"):
        m = re.fullmatch(r"step-(\d+)(?:\.g(\d+))?", p.name)
        if m and ours_to_clean(gen := None if m.group(2) is None else int(m.group(2))):
            done.append((_rank(gen, int(m.group(1))), gen, p))
    done.sort(reverse=True)
    for _, gen, p in done[KEEP:]:
        if gen != GENERATION and (_read_marker(_marker(gen)) or {}).get("folder") == p.name:
            _marker(gen).unlink(missing_ok=True)  # first the marker, so it never names a missing folder
        shutil.rmtree(p, ignore_errors=True)
    # a killed save's leftovers (staging folders, marker temp files), from an earlier generation
    for p in [*CKPT_DIR.glob(".tmp-*"), *CKPT_DIR.glob(".latest*")]:
        gen = gen_of(p.name)
        if GENERATION is not None and (gen is None or gen < GENERATION):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
# ---- end of the checkpoint block ----


def save(model, opt, step: int) -> None:
    if RANK:
        return  # rank 0 keeps the checkpoint
    save_checkpoint(step, lambda folder: torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                                     "step": step, "rng": torch.get_rng_state()},
                                                    folder / "state.pt"))


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    torch.manual_seed(0)
    if WORLD > 1:  # one process per device (srun): gradients are averaged over the processes
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=RANK, world_size=WORLD)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    true_w = torch.linspace(-1, 1, 16, device=device)
    step = 0
    latest = latest_checkpoint()
    if latest:
        state = torch.load(latest / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        step = state["step"]
        note(f"resumed from step {step} ({latest.name})")
    else:
        note("starting from scratch")
    note(f"{NODES} node(s), {WORLD} process(es) ({REF_NODES} node(s), {REF_WORLD} at the reference shape): per-device "
         f"batch {PER_DEVICE_BATCH} x {ACCUMULATE} accumulation steps -> global batch "
         f"{PER_DEVICE_BATCH * WORLD * ACCUMULATE}")
    loss = torch.zeros(())
    while step < MAX_STEPS:
        if _stop_agreed():
            save(model, opt, step)
            note(f"saved step {step} on {STOP['why'] or 'a peer signal'}; exiting")
            return 0
        t0 = time.time()
        lr = lr_at(step * GLOBAL_BATCH)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        for a in range(ACCUMULATE):  # this process's share of the global batch: micro-batch a*WORLD + rank
            x, y = micro_batch(step, a * WORLD + RANK, PER_DEVICE_BATCH, true_w, device)
            # the mean over the global batch: each micro-batch's mean weighs PER_DEVICE_BATCH / GLOBAL_BATCH
            loss = torch.nn.functional.mse_loss(model(x), y) * PER_DEVICE_BATCH / GLOBAL_BATCH
            loss.backward()
        if WORLD > 1:
            for p in model.parameters():  # what DistributedDataParallel does, spelled out
                dist.all_reduce(p.grad)
        opt.step()
        step += 1
        progress(step, step * GLOBAL_BATCH, time.time() - t0, MAX_STEPS)
        if step % SAVE_EVERY == 0:
            save(model, opt, step)
            note(f"checkpoint at step {step}, lr {lr:.3g}, loss {loss.item() * GLOBAL_BATCH / PER_DEVICE_BATCH:.4f}")
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)
    save(model, opt, step)
    if RANK == 0:
        DONE_FILE.parent.mkdir(parents=True, exist_ok=True)
        DONE_FILE.write_text(f"finished at step {step}\n")  # the chain completes; queued segments are cancelled
    note(f"finished at step {step}")
    return 0


def _stop_agreed() -> bool:
    """Every process stops at the same step: one signalled process stops them all."""
    if WORLD == 1:
        return bool(STOP["why"])
    import torch.distributed as dist

    flag = torch.tensor([1.0 if STOP["why"] else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _leave(code: int) -> None:
    """Several processes leave together and skip the interpreter's teardown. Every rank waits for the
    others (rank 0 may still be saving), then exits at once: gloo's threads, torn down by the exit
    handlers or by destroy_process_group while a peer is leaving, can abort a rank after a clean save
    ("terminate called without an active exception", exit -6) and the step then fails. Everything
    this script writes is closed by now; only stdout/stderr need a flush. Only on a normal return:
    after an error a barrier would wait for the group's timeout."""
    if WORLD > 1:
        import torch.distributed as dist

        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    code = main()
    _leave(code)
    sys.exit(code)
