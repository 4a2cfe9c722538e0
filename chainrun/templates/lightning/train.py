#!/usr/bin/env python3
"""Resumable PyTorch Lightning training under chainrun (docs/checkpoint-contract.md, docs/templates.md).

- The signal handler is installed before Lightning is imported (that takes seconds).
- Lightning's own SLURM auto-requeue is switched off (``SLURMEnvironment(auto_requeue=False)``):
  chainrun submits the next segment itself, and Lightning would otherwise handle the signal.
- A small callback checks the flag after every batch: on the signal it saves a checkpoint
  (``trainer.save_checkpoint`` into a temporary folder, fsync, rename, then the marker) and stops the fit.
- ``trainer.fit(..., ckpt_path=latest)`` resumes model, optimizer, loop position and step from the
  latest complete checkpoint (the one its marker names, of a generation below this segment's).
- When ``max_steps`` is reached the script creates ``$CHAINRUN_DONE_FILE``.
"""

import os
import signal
import sys

STOP = {"why": None}


def _request_stop(signum, _frame):
    STOP["why"] = signal.Signals(signum).name


signal.signal(getattr(signal, "SIG" + os.environ.get("CHAINRUN_SIGNAL", "USR2")), _request_stop)
signal.signal(signal.SIGTERM, _request_stop)

import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402

CKPT_DIR = Path(os.environ.get("CHAINRUN_CHECKPOINT_DIR", "checkpoints"))
DONE_FILE = Path(os.environ.get("CHAINRUN_DONE_FILE", CKPT_DIR / "CHAINRUN_DONE"))
SEGMENT = os.environ.get("CHAINRUN_SEGMENT", "-")
MAX_STEPS = int(os.environ.get("MAX_STEPS", "20000"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "500"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))

# Elastic batch: the same global batch whatever number of GPUs this segment got
# (CHAINRUN_GPUS from the wrapper; 0 on CPU): accumulate more batches on fewer devices.
GLOBAL_BATCH = int(os.environ.get("GLOBAL_BATCH", "64"))
PER_DEVICE_BATCH = int(os.environ.get("PER_DEVICE_BATCH", "16"))
GPUS = int(os.environ.get("CHAINRUN_GPUS", "0") or 0)
DEVICES = max(1, GPUS)  # CHAINRUN_GPUS counts every node of the segment
ACCUMULATE = max(1, math.ceil(GLOBAL_BATCH / (PER_DEVICE_BATCH * DEVICES)))


# The progress contract (docs/checkpoint-contract.md#progress-optional), no chainrun import needed:
# one line per step into this rank's own file; chainrun shows steps/s and spots a slow node from it.
_PF = os.environ.get("CHAINRUN_PROGRESS_FILE") and "{}.{}.{}".format(
    os.environ["CHAINRUN_PROGRESS_FILE"], os.environ.get("SLURM_PROCID", "0"), os.environ.get("SLURMD_NODENAME", "local"))


def progress(step: int, samples: int, compute_s: float | None, total: int) -> None:
    if _PF:
        with open(_PF, "a") as f:
            f.write(f"{time.time():.3f} {step} {samples} {'-' if compute_s is None else f'{compute_s:.4f}'} {total}\n")


def note(text: str) -> None:
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


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, _idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Synthetic(torch.utils.data.IterableDataset):
    """Endless random regression data; a real dataset with a sampler resumes the same way."""

    def __iter__(self):
        w = torch.linspace(-1, 1, 16)
        while True:
            x = torch.randn(16)
            yield x, (x @ w).unsqueeze(0)


class ChainrunCheckpoint(pl.Callback):
    """Save and stop on the chainrun signal; a periodic checkpoint as well."""

    def on_train_start(self, trainer, pl_module):
        if trainer.global_step:
            note(f"resumed from step {trainer.global_step}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx % ACCUMULATE == 0:
            self.t0 = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if (batch_idx + 1) % ACCUMULATE == 0:  # one optimizer step done: report it
            progress(step, step * GLOBAL_BATCH, time.time() - getattr(self, "t0", time.time()), MAX_STEPS)
        if STOP["why"]:
            self.save(trainer)
            note(f"saved step {step} on {STOP['why']}; exiting")
            trainer.should_stop = True
        elif step and step % SAVE_EVERY == 0 and (batch_idx + 1) % ACCUMULATE == 0:
            self.save(trainer)
            note(f"checkpoint at step {step}")
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)

    @staticmethod
    def save(trainer):
        tmp = staging_folder(f"step-{trainer.global_step:09d}")
        trainer.save_checkpoint(tmp / "model.ckpt")  # every rank takes part; the global rank 0 writes
        if trainer.is_global_zero:
            publish(tmp, trainer.global_step)


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    pl.seed_everything(0, verbose=False)
    latest = latest_checkpoint()
    resume = str(latest / "model.ckpt") if latest else None
    note(f"resuming from {latest.name}" if latest else "starting from scratch")
    note(f"{DEVICES} device(s): per-device batch {PER_DEVICE_BATCH} x {ACCUMULATE} accumulation steps")
    trainer = pl.Trainer(
        accelerator="gpu" if GPUS else "cpu", devices=GPUS or 1, max_steps=MAX_STEPS,
        accumulate_grad_batches=ACCUMULATE, plugins=[SLURMEnvironment(auto_requeue=False)],
        callbacks=[ChainrunCheckpoint()], enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(CKPT_DIR),
    )
    data = torch.utils.data.DataLoader(Synthetic(), batch_size=PER_DEVICE_BATCH)
    trainer.fit(Regression(), train_dataloaders=data, ckpt_path=resume)
    if STOP["why"] and trainer.global_step < MAX_STEPS:
        return 0  # checkpointed on the signal; the next segment resumes
    ChainrunCheckpoint.save(trainer)
    DONE_FILE.parent.mkdir(parents=True, exist_ok=True)
    DONE_FILE.write_text(f"finished at step {trainer.global_step}\n")
    note(f"finished at step {trainer.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
