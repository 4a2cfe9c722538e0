#!/usr/bin/env python3
"""Resumable plain-PyTorch training under chainrun (the checkpoint contract, docs/checkpoint-contract.md).

1. The signal handler is installed first, before the slow imports: a signal that arrives
   while torch loads only sets a flag; nothing is lost.
2. At start, resume from the latest checkpoint in $CHAINRUN_CHECKPOINT_DIR, if there is one.
3. On the signal (CHAINRUN_SIGNAL, USR2 by default) or TERM: finish the current step, save
   atomically (write a temporary file, then rename), exit 0.
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

import math  # noqa: E402  (after the handler on purpose)
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

CKPT_DIR = Path(os.environ.get("CHAINRUN_CHECKPOINT_DIR", "checkpoints"))
LATEST = CKPT_DIR / "latest.pt"
DONE_FILE = Path(os.environ.get("CHAINRUN_DONE_FILE", CKPT_DIR / "CHAINRUN_DONE"))
SEGMENT = os.environ.get("CHAINRUN_SEGMENT", "-")
MAX_STEPS = int(os.environ.get("MAX_STEPS", "20000"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "500"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))  # >0 slows a step down, to watch a demo

# Elastic batch: keep the global batch constant whatever number of GPUs this segment got.
# The wrapper exports CHAINRUN_GPUS (GPUs on this node for this job; 0 when unknown or on CPU).
GLOBAL_BATCH = int(os.environ.get("GLOBAL_BATCH", "64"))
PER_DEVICE_BATCH = int(os.environ.get("PER_DEVICE_BATCH", "16"))
DEVICES = max(1, int(os.environ.get("CHAINRUN_GPUS", "0") or 0)) * int(os.environ.get("SLURM_NNODES", "1"))
ACCUMULATE = max(1, math.ceil(GLOBAL_BATCH / (PER_DEVICE_BATCH * DEVICES)))  # the CHAINRUN_BATCH_SCALE


# The progress contract (docs/checkpoint-contract.md#progress-optional), no chainrun import needed:
# one line per step into this rank's own file; chainrun shows steps/s and spots a slow node from it.
_PF = os.environ.get("CHAINRUN_PROGRESS_FILE") and "{}.{}.{}".format(
    os.environ["CHAINRUN_PROGRESS_FILE"], os.environ.get("SLURM_PROCID", "0"), os.environ.get("SLURMD_NODENAME", "local"))


def progress(step: int, samples: int, compute_s: float | None, total: int) -> None:
    if _PF:
        with open(_PF, "a") as f:
            f.write(f"{time.time():.3f} {step} {samples} {'-' if compute_s is None else f'{compute_s:.4f}'} {total}\n")


def note(text: str) -> None:
    """One line per event in the checkpoint folder: what each segment did, across the chain."""
    line = f"{time.time():.3f} segment {SEGMENT} {text}"
    print(line, flush=True)
    with open(CKPT_DIR / "progress.log", "a") as f:
        f.write(line + "\n")


def save(model, opt, step: int) -> None:
    tmp = LATEST.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "rng": torch.get_rng_state()}, tmp)
    os.replace(tmp, LATEST)  # atomic: the latest checkpoint is always a whole one


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    true_w = torch.linspace(-1, 1, 16, device=device)
    step = 0
    if LATEST.exists():
        state = torch.load(LATEST, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        step = state["step"]
        note(f"resumed from step {step}")
    else:
        note("starting from scratch")
    note(f"{DEVICES} device(s): per-device batch {PER_DEVICE_BATCH} x {ACCUMULATE} accumulation steps "
         f"-> global batch {PER_DEVICE_BATCH * DEVICES * ACCUMULATE}")
    while step < MAX_STEPS:
        if STOP["why"]:
            save(model, opt, step)
            note(f"saved step {step} on {STOP['why']}; exiting")
            return 0
        t0 = time.time()
        opt.zero_grad()
        for _ in range(ACCUMULATE):
            x = torch.randn(PER_DEVICE_BATCH, 16, device=device)
            y = (x @ true_w).unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUMULATE
            loss.backward()
        opt.step()
        step += 1
        progress(step, step * GLOBAL_BATCH, time.time() - t0, MAX_STEPS)
        if step % SAVE_EVERY == 0:
            save(model, opt, step)
            note(f"checkpoint at step {step}, loss {loss.item() * ACCUMULATE:.4f}")
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)
    save(model, opt, step)
    DONE_FILE.parent.mkdir(parents=True, exist_ok=True)
    DONE_FILE.write_text(f"finished at step {step}\n")  # the chain completes; queued segments are cancelled
    note(f"finished at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
