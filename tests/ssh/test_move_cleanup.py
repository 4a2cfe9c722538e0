"""When a move ends, the checkpoint copies it landed and no one uses are removed from the new site
(chain/move_cleanup.py, issue 26: "copies ahead that go unused are cleaned up"): the copy the chain
resumes from, a trainer's own checkpoints there and a partial copy still being written stay. Real
copies over a real OpenSSH server (the fixtures of tests/ssh/test_ckpt_copy.py), a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainrun.chain import ckpt_copy
from chainrun.chain.move_cleanup import Asked, Cleanups
from chainrun.state.store import Store
from tests.ssh.conftest import REMOTE_USER
from tests.ssh.test_ckpt_copy import make_checkpoint, sites  # noqa: F401 - fixture

pytestmark = pytest.mark.ssh


def landed(s) -> Path:
    """On b: gen 2 step 5 copied, gen 3 step 10 copied then superseded by gen 3 step 20 (the newest copy ahead),
    a checkpoint a trainer on b saved itself (gen 4), and a partial copy still being written."""
    here, b = Path(s["here"].ckpt_dir), Path(s["b"].ckpt_dir)
    for gen, step in ((2, 5), (3, 10), (3, 20)):
        make_checkpoint(here, gen, step, {"model.pt": 4096})
        ckpt_copy.copy_checkpoint(s["here"], s["b"], poll_s=None)
    make_checkpoint(b, 4, 30, {"model.pt": 100}, owner=REMOTE_USER)
    partial = b / f"{ckpt_copy.INCOMING}step-000000040.g3"
    s["b"].runner.run(["mkdir", "-p", str(partial)], 30)
    return b


def run(store: Store, asked: Asked, s, keep=()) -> list[str]:
    cl = Cleanups()
    cl.ask(asked, s["b"].runner, s["b"].ckpt_dir, keep=keep)
    cl.close(120)
    cl.harvest(store)
    return [e.message for _, e in store.events(asked.chain_id)]


def test_a_done_move_keeps_the_copy_it_resumes_from_and_removes_older_copies_ahead(sites, tmp_path):
    b = landed(sites)
    store = Store(tmp_path / "s.sqlite")
    # keep: what the mover passes, the name of the copy the successor resumes from
    said = run(store, Asked("c1", 1, "b", "done"), sites, keep=("step-000000020.g3",))
    names = sorted(p.name for p in b.iterdir())
    assert "step-000000020.g3" in names and "latest.g3.json" in names  # resumed from: kept
    assert "step-000000030.g4" in names and "latest.g4.json" in names  # the trainer's own: never touched
    assert f"{ckpt_copy.INCOMING}step-000000040.g3" in names  # being written: kept
    assert "step-000000010.g3" not in names and "step-000000005.g2" not in names and "latest.g2.json" not in names
    assert len(said) == 1 and said[0].startswith("removed ") and "on b (older copies ahead of the move)" in said[0]


def test_an_abandoned_move_removes_every_unused_copy_but_not_the_trainers_or_a_fresh_partial(sites, tmp_path):
    b = landed(sites)
    store = Store(tmp_path / "s.sqlite")
    said = run(store, Asked("c1", 1, "b", "abandoned"), sites)
    names = sorted(p.name for p in b.iterdir())
    assert names == sorted(["step-000000030.g4", "latest.g4.json", f"{ckpt_copy.INCOMING}step-000000040.g3"]), names
    assert len(said) == 1 and "(the move was abandoned)" in said[0], said


def test_a_site_that_cannot_be_reached_is_said_once_and_nothing_else_happens(sites, tmp_path):
    from chainrun.clusters import Cluster
    from chainrun.runner.openssh import OpenSSHRunner

    gone = OpenSSHRunner(Cluster(name="z", host="nonexistent.invalid", transport="openssh"))
    store = Store(tmp_path / "s.sqlite")
    said = run(store, Asked("c1", 1, "z", "abandoned"), {**sites, "b": ckpt_copy.site_for("z", gone, "/scratch/ck")})
    assert len(said) == 1 and said[0].startswith("unused checkpoint copies on z not removed (cannot connect to z"), said
