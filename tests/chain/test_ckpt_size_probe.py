"""A chain spanning clusters has its checkpoint's size read where it trains before any copy
(chainrun/chain/ckpt_size_probe.py), so its first move is weighed at that size over the default rate,
not at a flat 15 minutes (issue 26: "the checkpoint transfer time (measured size over measured
throughput ...)"). The manifest command's `size` mode runs for real on this machine (LocalRunner);
over the real sshd in tests/ssh/test_ckpt_copy.py. Real SQLite under a tmp CHAINRUN_HOME."""

from __future__ import annotations

import json
import os
from pathlib import Path

from chainrun.chain import ckpt_manifest, site_plan
from chainrun.chain.ckpt_size_probe import EVERY_S, PROBED_AT, SizeProbe
from chainrun.runner.local import LocalRunner
from chainrun.state.records import ACTIVE, PENDING, RUNNING, Chain, ChainSite, Segment
from chainrun.state.store import Store

T0 = 1_800_000_000.0


def checkpoint(ckpt: Path, generation: int, step: int, sizes: dict[str, int]) -> None:
    """Laid out as the templates' publish() leaves it: the folder, then its marker."""
    folder = ckpt / f"step-{step:09d}.g{generation}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
    rec = {"generation": generation, "step": step, "folder": folder.name, "files": sizes}
    (ckpt / f"latest.g{generation}.json").write_text(json.dumps(rec))


def test_the_size_mode_reads_sizes_not_contents(tmp_path):
    ck = tmp_path / "ck"
    assert ckpt_manifest.newest_size(LocalRunner(), str(ck)) is None  # no folder yet
    ck.mkdir()
    assert ckpt_manifest.newest_size(LocalRunner(), str(ck)) is None  # a folder, nothing saved
    checkpoint(ck, 1, 10, {"model.pt": 5000})
    checkpoint(ck, 2, 20, {"model.pt": 7000, "opt.pt": 3000})
    (ck / "step-000000030.g2").mkdir()  # a save killed before its marker: never the newest
    assert ckpt_manifest.newest_size(LocalRunner(), str(ck)) == 10000
    answer = LocalRunner().run(["sh", "-c", ckpt_manifest.SCRIPT, "sh", "size", str(ck)], 30).stdout
    assert [ln.split()[2] for ln in answer.splitlines() if ln.startswith("f ")] == ["0" * 64] * 2  # no file read
    (ck / "ckpt.g3.json").write_text('{"step": 5, "generation": 3}')  # the toy's single file: not newer
    assert ckpt_manifest.newest_size(LocalRunner(), str(ck)) == 10000
    toy = tmp_path / "toy"
    toy.mkdir()
    (toy / "ckpt.g1.json").write_bytes(b"x" * (ckpt_manifest.EMBED_MAX + 10))  # too big to travel in the answer
    assert ckpt_manifest.newest_size(LocalRunner(), str(toy)) == ckpt_manifest.EMBED_MAX + 10


class Sites:
    """The watcher's engines as the probe uses them: a runner per cluster (both this machine)."""

    def __init__(self, fail: set[str] = frozenset()):
        self.asked: list[str] = []
        self.fail = fail

    def __call__(self, name: str):
        self.asked.append(name)
        if name in self.fail:
            from chainrun.errors import RemoteError

            raise RemoteError(f"{name}: ssh: connect to host {name}.example.org port 22: Connection timed out")
        return type("E", (), {"runner": LocalRunner()})()


def _chain(store: Store, tmp_path: Path, cid: str, *, spans=True, phase=RUNNING, seg_cluster="a") -> Chain:
    c = Chain(id=cid, name=cid, cluster="a", script="/s", workdir=str(tmp_path), run_dir=str(tmp_path / "run"),
              checkpoint_dir=str(tmp_path / cid), total_s=7200, segment_s=3600, policy="predicted", lead_s=600,
              signal="USR2", signal_lead_s=60, retries=1, sbatch_args=[], partition="p", status=ACTIVE,
              extra={"sites": ["a", "b"]} if spans else {})
    sites = [ChainSite(cid, n, i, str(tmp_path), str(tmp_path / "run"), str(tmp_path / cid), "/s")
             for i, n in enumerate(["a", "b"])] if spans else []
    store.add_chain(c, sites)
    store.save(c, [Segment(cid, 0, phase=phase, job_id="1", start=T0, cluster=seg_cluster if spans else None)])
    checkpoint(tmp_path / cid, 1, 100, {"model.pt": 4_000_000})
    return c


def test_a_spanning_chain_gets_its_size_once_and_the_next_decision_weighs_it(tmp_path):
    store = Store(tmp_path / "state.sqlite")
    now = [T0]
    try:
        c = _chain(store, tmp_path, "span-0001")
        _chain(store, tmp_path, "one-0001", spans=False)  # one cluster: no move to weigh
        _chain(store, tmp_path, "pend-0001", phase=PENDING)  # nothing running: nothing saved yet
        _chain(store, tmp_path, "away-0001", seg_cluster="b")  # running elsewhere: the mover's business
        assert site_plan.transfer_s(store.chain(c.id), "b") == site_plan.DEFAULT_TRANSFER_S  # before: 15 min flat
        sites = Sites()
        probe = SizeProbe(store, sites, clock=lambda: now[0])
        assert [x.id for x in probe.due()] == ["span-0001"]
        probe.tick()
        got = store.chain(c.id)
        assert got.extra["checkpoint_bytes"] == 4_000_000 and got.extra[PROBED_AT] == T0
        assert site_plan.transfer_s(got, "b") == 4_000_000 / site_plan.DEFAULT_COPY_BPS
        said = [e.message for _, e in store.events(c.id) if e.kind == "copy"]
        assert said == ["checkpoint size 4000000 bytes read on a: a move's transfer is weighed at it (over the "
                        "default rate until a copy measures the link)"]
        assert site_plan.transfer_sources(got, ["a", "b"]) == {
            "b": {"transfer_s": 0.1, "from": "size over the default rate"}}
        asked = len(sites.asked)
        now[0] += 10 * EVERY_S
        probe.tick()  # known now: never asked again (copies keep it up to date)
        assert len(sites.asked) == asked and probe.due() == []
    finally:
        store.close()


def test_a_site_that_does_not_answer_is_asked_again_after_the_interval(tmp_path):
    store = Store(tmp_path / "state.sqlite")
    now = [T0]
    try:
        c = _chain(store, tmp_path, "span-0001")
        sites = Sites(fail={"a"})
        probe = SizeProbe(store, sites, clock=lambda: now[0])
        probe.tick()  # no traceback, nothing recorded but when it asked
        got = store.chain(c.id)
        assert "checkpoint_bytes" not in got.extra and got.extra[PROBED_AT] == T0
        now[0] += EVERY_S - 1
        assert probe.due() == []
        now[0] += 1
        sites.fail = set()
        probe.tick()
        assert store.chain(c.id).extra["checkpoint_bytes"] == 4_000_000
    finally:
        store.close()
