#!/usr/bin/env python3
"""Resumable Hugging Face Trainer training under chainrun (docs/checkpoint-contract.md, docs/templates.md).

- The signal handler is installed before transformers is imported (that takes seconds).
- A ``TrainerCallback`` turns the signal into ``should_save`` + ``should_training_stop``:
  the Trainer writes ``checkpoint-<step>/`` in ``$CHAINRUN_CHECKPOINT_DIR`` and returns.
- At start, ``get_last_checkpoint`` finds the newest complete checkpoint and
  ``trainer.train(resume_from_checkpoint=...)`` restores model, optimizer, scheduler, RNG and step.
- When ``max_steps`` is reached the script creates ``$CHAINRUN_DONE_FILE``.

The model is a tiny ``torch.nn.Module`` so the example runs on a CPU in seconds; a
``PreTrainedModel`` (``AutoModelFor...from_pretrained``) resumes the same way.
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
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

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


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n=100_000):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x @ torch.linspace(-1, 1, 16)).unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class ChainrunStop(TrainerCallback):
    """On the chainrun signal: save a checkpoint now and stop training."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step:
            note(f"resumed from step {state.global_step}")

    def on_step_begin(self, args, state, control, **kwargs):
        self.t0 = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step, state.global_step * GLOBAL_BATCH, time.time() - getattr(self, "t0", time.time()),
                 MAX_STEPS)
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)
        if STOP["why"]:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        how = f"on {STOP['why']}; exiting" if STOP["why"] else "(periodic)"
        note(f"saved step {state.global_step} {how}")


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    last = get_last_checkpoint(str(CKPT_DIR)) if CKPT_DIR.is_dir() else None
    if not last:
        note("starting from scratch")
    note(f"{DEVICES} device(s): per-device batch {PER_DEVICE_BATCH} x {ACCUMULATE} accumulation steps")
    args = TrainingArguments(
        output_dir=str(CKPT_DIR), max_steps=MAX_STEPS, per_device_train_batch_size=PER_DEVICE_BATCH,
        gradient_accumulation_steps=ACCUMULATE, learning_rate=1e-2, save_strategy="steps", save_steps=SAVE_EVERY,
        save_total_limit=2, logging_steps=SAVE_EVERY, report_to="none", use_cpu=not GPUS, dataloader_num_workers=0,
        disable_tqdm=True, seed=0,
    )
    trainer = Trainer(model=Regression(), args=args, train_dataset=Synthetic(), callbacks=[ChainrunStop()])
    trainer.train(resume_from_checkpoint=last)
    step = trainer.state.global_step
    if STOP["why"] and step < MAX_STEPS:
        return 0  # checkpointed on the signal; the next segment resumes
    trainer.save_model(str(CKPT_DIR / "final"))
    DONE_FILE.parent.mkdir(parents=True, exist_ok=True)
    DONE_FILE.write_text(f"finished at step {step}\n")
    note(f"finished at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
