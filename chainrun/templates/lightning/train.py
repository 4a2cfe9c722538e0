#!/usr/bin/env python3
"""Resumable PyTorch Lightning training under chainrun (docs/checkpoint-contract.md, docs/templates.md).

- The signal handler is installed before Lightning is imported (that takes seconds).
- Lightning's own SLURM auto-requeue is switched off (``SLURMEnvironment(auto_requeue=False)``):
  chainrun submits the next segment itself, and Lightning would otherwise handle the signal.
- A small callback checks the flag after every batch: on the signal it saves a checkpoint
  (``trainer.save_checkpoint`` to a temporary name, then rename) and stops the fit.
- ``trainer.fit(..., ckpt_path=latest)`` resumes model, optimizer, loop position and step.
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

import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402

CKPT_DIR = Path(os.environ.get("CHAINRUN_CHECKPOINT_DIR", "checkpoints"))
LATEST = CKPT_DIR / "latest.ckpt"
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
        tmp = CKPT_DIR / "latest.tmp.ckpt"
        trainer.save_checkpoint(tmp)
        os.replace(tmp, LATEST)  # atomic


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    pl.seed_everything(0, verbose=False)
    resume = str(LATEST) if LATEST.exists() else None
    if not resume:
        note("starting from scratch")
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
