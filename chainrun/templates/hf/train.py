#!/usr/bin/env python3
"""Resumable Hugging Face Trainer training under chainrun (docs/checkpoint-contract.md, docs/templates.md).

- The signal handler is installed before transformers is imported (that takes seconds).
- A ``TrainerCallback`` turns the signal into ``should_save`` + ``should_training_stop``:
  the Trainer writes ``checkpoint-<step>/`` into a staging folder (its ``output_dir``); the
  callback's ``on_save`` fsyncs it, renames it into ``$CHAINRUN_CHECKPOINT_DIR`` and writes the
  marker that makes it complete.
- At start, the marker (not a directory listing, which a network filesystem may cache, and which
  shows a half-written ``checkpoint-N/`` as the newest) names the checkpoint, and
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

import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

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
        elif state.global_step >= state.max_steps:
            control.should_save = True  # the finished state is a complete checkpoint too
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # the Trainer wrote checkpoint-N in its staging folder: make it complete
            publish(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step)
            how = f"on {STOP['why']}; exiting" if STOP["why"] else "(periodic)"
            note(f"saved step {state.global_step} {how}")


def main() -> int:
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
    last = latest_checkpoint()
    note(f"resuming from {last.name}" if last else "starting from scratch")
    note(f"{DEVICES} device(s): per-device batch {PER_DEVICE_BATCH} x {ACCUMULATE} accumulation steps")
    args = TrainingArguments(
        output_dir=str(staging_folder("hf")), max_steps=MAX_STEPS, per_device_train_batch_size=PER_DEVICE_BATCH,
        gradient_accumulation_steps=ACCUMULATE, learning_rate=1e-2, save_strategy="steps", save_steps=SAVE_EVERY,
        logging_steps=SAVE_EVERY, report_to="none", use_cpu=not GPUS, dataloader_num_workers=0,
        disable_tqdm=True, seed=0,
    )
    trainer = Trainer(model=Regression(), args=args, train_dataset=Synthetic(), callbacks=[ChainrunStop()])
    trainer.train(resume_from_checkpoint=str(last) if last else None)
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
