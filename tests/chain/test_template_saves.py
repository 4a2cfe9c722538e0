"""How the trainer templates save (docs/templates.md, "How a save is made"), run as real processes.

- A save SIGKILLed while it writes leaves the previous checkpoint as the latest, and the next start
  resumes from it (each of the three templates, with real torch / Lightning / Transformers).
- A stale owner that saves late (a lower CHAINRUN_GENERATION, a higher step) never becomes the
  latest over a newer owner's checkpoint, and never removes it.
- The checkpoint code is one block, the same in every template (users copy one file, so it is
  copied, not imported): a fix made in one template and not the others fails here.

The same kill on the real cluster, through the wrapper and the watcher: tests/ux/test_slurm_ux.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

TEMPLATES = REPO / "templates"
# where each template's save writes before the marker makes it complete, and the file it writes last
STAGED = {"pytorch": ".tmp-step-000000020*/state.pt", "lightning": ".tmp-step-000000020*/model.ckpt",
          "hf": ".tmp-hf*/checkpoint-20/trainer_state.json"}
BEGIN, END = "# ---- checkpoint folders: the same block", "# ---- end of the checkpoint block ----"


def _env(ckpt: Path, gen: int | None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CHAINRUN_"))}
    env.update({"CHAINRUN_CHECKPOINT_DIR": str(ckpt), "CHAINRUN_SIGNAL": "USR2", "SAVE_EVERY": "10",
                "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CHAINRUN_SEGMENT": f"g{gen}"})
    if gen is not None:
        env["CHAINRUN_GENERATION"] = str(gen)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(name: str, ckpt: Path, gen: int | None, **extra) -> str:
    p = subprocess.run([sys.executable, str(TEMPLATES / name / "train.py")], env=_env(ckpt, gen, **extra),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout


def _markers(ckpt: Path) -> dict:
    return {p.name: json.loads(p.read_text()) for p in ckpt.glob("latest*.json")}


@pytest.mark.parametrize("name", ["pytorch", "lightning", "hf"])
def test_a_save_killed_mid_write_leaves_the_previous_checkpoint_latest(tmp_path, name):
    pytest.importorskip({"pytorch": "torch", "lightning": "lightning", "hf": "transformers"}[name])
    ckpt = tmp_path / "ckpt"
    # generation 0 trains; every save takes 15 s (SAVE_SECONDS: a big model); the save of step 10
    # completes, the save of step 20 is killed once its files are written, before it is published
    p = subprocess.Popen([sys.executable, str(TEMPLATES / name / "train.py")], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         env=_env(ckpt, 0, MAX_STEPS=1000, STEP_SECONDS=0.02, SAVE_SECONDS=15))
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not list(ckpt.glob(STAGED[name])):
            assert p.poll() is None, p.communicate()[0][-3000:]
            time.sleep(0.05)
        assert list(ckpt.glob(STAGED[name])), "the save of step 20 never started"
        assert _markers(ckpt)["latest.g0.json"]["step"] == 10
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.communicate()
    assert not (ckpt / "step-000000020.g0").exists()  # only in the staging folder, never renamed
    # the next owner (generation 1) resumes from step 10, not from the half-done 20, and finishes
    out = _run(name, ckpt, 1, MAX_STEPS=25)
    log = (ckpt / "progress.log").read_text()
    assert "segment g1 resumed from step 10" in log, log
    assert "segment g1 finished at step 25" in log, out[-2000:]
    assert (ckpt / "CHAINRUN_DONE").exists()
    assert _markers(ckpt)["latest.g1.json"]["step"] == 25
    assert not list(ckpt.glob(".tmp-*.g0.*")), "the killed save's leftovers were not removed"


def test_a_stale_owner_saving_late_never_becomes_the_latest(tmp_path):
    pytest.importorskip("torch")
    ckpt = tmp_path / "ckpt"
    _run("pytorch", ckpt, 0, MAX_STEPS=10)  # generation 0: steps 1-10
    _run("pytorch", ckpt, 2, MAX_STEPS=20)  # the owner of generation 2 resumes at 10 and saves 20
    # generation 1 was fenced (its node lost, generation 2 claimed past it); it comes back and saves
    # later, and further (step 40), under its own generation
    _run("pytorch", ckpt, 1, MAX_STEPS=40, KEEP_CHECKPOINTS=1)
    m = _markers(ckpt)
    assert m["latest.g2.json"]["step"] == 20 and m["latest.g1.json"]["step"] == 40
    assert (ckpt / "step-000000020.g2").is_dir(), "the stale owner removed a newer generation's checkpoint"
    log = (ckpt / "progress.log").read_text()
    assert "segment g1 resumed from step 10 (step-000000010.g0)" in log  # never from generation 2's
    # the next owner resumes from generation 2's step 20, not the stale step 40
    _run("pytorch", ckpt, 3, MAX_STEPS=22)
    log = (ckpt / "progress.log").read_text()
    assert "segment g3 resumed from step 20 (step-000000020.g2)" in log, log
    # outside chainrun (no generation) the newest of all is taken, and ranks below every generation
    _run("pytorch", ckpt, None, MAX_STEPS=23)
    log = (ckpt / "progress.log").read_text()
    assert "segment gNone resumed from step 22 (step-000000022.g3)" in log, log
    assert _markers(ckpt)["latest.json"]["step"] == 23 and _markers(ckpt)["latest.json"]["generation"] is None


def test_every_template_carries_the_same_checkpoint_block():
    blocks = {}
    for name in ("pytorch", "lightning", "hf"):
        text = (TEMPLATES / name / "train.py").read_text()
        assert text.count(BEGIN) == 1 and text.count(END) == 1, name
        blocks[name] = text[text.index(BEGIN):text.index(END)]
    assert len(set(blocks.values())) == 1, "the checkpoint block differs between templates: copy the fix to all"
    assert re.search(r"def latest_checkpoint\(\)", blocks["pytorch"])


def test_the_toy_trainer_keeps_the_same_generation_rule(tmp_path):
    def toy(gen: int | None, total: int) -> str:
        env = _env(tmp_path, gen, TOY_STEP_SECONDS=0.01, TOY_TOTAL_STEPS=total)
        p = subprocess.run([sys.executable, str(TEMPLATES / "toy_trainer.py")], env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return re.search(r"resumes at step (\d+)", p.stdout).group(1)

    assert toy(0, 10) == "0"
    assert toy(2, 30) == "10"  # generation 2 resumes from generation 0
    assert toy(1, 20) == "10"  # the fenced generation 1 never reads generation 2's file ...
    assert toy(3, 40) == "30"  # ... and its later save (step 20) never outranks it
    assert toy(None, 50) == "40"  # outside chainrun: the newest of all
    assert json.loads((tmp_path / "ckpt.g1.json").read_text())["step"] == 20
