"""The checkpoint manifest and the copy's pure parts, on real output: the shipped templates'
checkpoints read by the manifest's own command on this machine, real rsync --stats, and answers
captured from those commands pinned for the parser. The copies themselves run against the real
sshd in tests/ssh/test_ckpt_copy.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.chain import ckpt_cleanup, ckpt_copy, ckpt_manifest, ckpt_rsync
from chainrun.errors import CopyError, CopyPermissionDenied, DiskFull, NotFoundError, RsyncMissing, UsageError
from chainrun.runner.base import RunResult
from chainrun.runner.local import LocalRunner
from tests.conftest import REPO

TEMPLATES = REPO / "chainrun" / "templates"

# the answer of the manifest command for a checkpoint of templates/pytorch/train.py (generation 2, step 20),
# captured on the test machine
PYTORCH_ANSWER = """chainrun-manifest 1
marker latest.g2.json eyJnZW5lcmF0aW9uIjogMiwgInN0ZXAiOiAyMCwgImZvbGRlciI6ICJzdGVwLTAwMDAwMDAyMC5nMiIsICJmaWxlcyI6IHsic3RhdGUucHQiOiAxNzI4Mn0sICJ0aW1lIjogMTc5NTcwMjk4MC40MzQ3OTkyLCAiam9iIjogbnVsbCwgInNlZ21lbnQiOiBudWxsfQ==
folder step-000000020.g2
f 17282 20f59be25fe7aa1a2687019e64d15d687e5dd89a5ec324c2ef8fc0e2f00017e4 state.pt
end
"""
# ...and for the toy trainer's single file (generation 2, step 5)
TOY_ANSWER = """chainrun-manifest 1
file ckpt.g2.json eyJzdGVwIjogNSwgInNlZ21lbnQiOiAiPyIsICJnZW5lcmF0aW9uIjogMiwgImpvYiI6ICItIiwgInRpbWUiOiAxNzk1NzAyOTgxLjg5MzA3NX0=
f 83 d4c27c4e5729493a6ece6b123cbbb979d1fba220134835e683281af2847edb09 ckpt.g2.json
end
"""


def test_parse_the_pinned_answers():
    m = ckpt_manifest.parse(PYTORCH_ANSWER)
    assert (m.kind, m.name, m.generation, m.step, m.marker) == ("folder", "step-000000020.g2", 2, 20, "latest.g2.json")
    assert m.files == (ckpt_manifest.FileEntry("state.pt", 17282, "20f59be25fe7aa1a2687019e64d15d687e5dd89a5ec324c2ef8fc0e2f00017e4"),)
    assert json.loads(m.marker_text)["folder"] == m.name and m.total_bytes == 17282
    t = ckpt_manifest.parse(TOY_ANSWER)
    assert (t.kind, t.name, t.generation, t.step, t.total_bytes) == ("file", "ckpt.g2.json", 2, 5, 83)
    assert hashlib.sha256(t.content).hexdigest() == t.files[0].sha256  # the bytes sent are the bytes hashed


def test_parse_refuses_what_is_not_a_whole_answer_in_one_line():
    incomplete = PYTORCH_ANSWER.replace("f 17282 ", "f 17000 ")  # the marker lists 17282 bytes
    cases = {
        incomplete: "is not complete on the source",
        PYTORCH_ANSWER.replace("end\n", ""): "cut short",
        "Permission denied\n": "the site answered",
        "chainrun-manifest 1\nmissing sha256sum\nend\n": "`sha256sum` is not installed",
        PYTORCH_ANSWER.replace("f 17282 20f5", "f 17282 zz"): "unexpected line",
    }
    for text, said in cases.items():
        with pytest.raises(CopyError) as e:
            ckpt_manifest.parse(text)
        assert said in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(NotFoundError):
        ckpt_manifest.parse("chainrun-manifest 1\nnodir\nend\n")
    assert ckpt_manifest.parse("chainrun-manifest 1\nnone\nend\n") is None


def _run_template(script: Path, ckpt: Path, generation: int, **env: str) -> None:
    pytest.importorskip("torch")  # the templates extra (scripts/test.sh installs it; `--core` does not)
    full = {**os.environ, "CHAINRUN_CHECKPOINT_DIR": str(ckpt), "CHAINRUN_GENERATION": str(generation),
            "CHAINRUN_DONE_FILE": str(ckpt.parent / "done"), **env}
    p = subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=300,
                       cwd=ckpt.parent)
    assert p.returncode == 0, p.stderr[-2000:]


def test_manifest_of_real_template_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run_template(TEMPLATES / "pytorch" / "train.py", ckpt, 1, MAX_STEPS="10", SAVE_EVERY="5")
    _run_template(TEMPLATES / "pytorch" / "train.py", ckpt, 2, MAX_STEPS="20", SAVE_EVERY="5")
    (ckpt / "step-000000025.g2").mkdir()  # a save killed before its marker is never the newest
    m = ckpt_manifest.manifest(LocalRunner(), str(ckpt))
    assert (m.name, m.generation, m.step) == ("step-000000020.g2", 2, 20)
    for f in m.files:
        data = (ckpt / m.name / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert m.marker_text == (ckpt / "latest.g2.json").read_text()
    assert ckpt_manifest.hashes(LocalRunner(), str(ckpt / m.name)) == m.files

    toy = tmp_path / "toy"
    _run_template(TEMPLATES / "toy_trainer.py", toy, 3, TOY_TOTAL_STEPS="4", TOY_STEP_SECONDS="0.01", TOY_SAVE_EVERY="2")
    t = ckpt_manifest.manifest(LocalRunner(), str(toy))
    assert (t.kind, t.name, t.generation, t.step) == ("file", "ckpt.g3.json", 3, 4)
    assert t.content == (toy / "ckpt.g3.json").read_bytes()
    assert ckpt_manifest.manifest(LocalRunner(), str(tmp_path)) is None  # no checkpoint there yet
    with pytest.raises(NotFoundError):
        ckpt_manifest.manifest(LocalRunner(), str(tmp_path / "nowhere"))


def test_differences_name_each_file():
    e = (ckpt_manifest.FileEntry("a", 1, "0" * 64), ckpt_manifest.FileEntry("b", 2, "1" * 64),
         ckpt_manifest.FileEntry("c", 3, "2" * 64))
    f = (ckpt_manifest.FileEntry("a", 1, "0" * 64), ckpt_manifest.FileEntry("b", 2, "f" * 64),
         ckpt_manifest.FileEntry("d", 4, "3" * 64))
    assert ckpt_manifest.differences(e, f) == ["b sha256 differs", "c missing", "d not in the manifest"]
    assert ckpt_manifest.differences(e, e) == []


def test_rsync_stats_of_a_real_run_and_the_route_throughput(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(os.urandom(3_000_000))
    res = LocalRunner().run(ckpt_rsync.rsync_argv(f"{tmp_path}/a/", f"{tmp_path}/b/"))
    assert res.ok, res.stderr
    stats = ckpt_rsync.parse_stats(res.stdout)
    assert stats["Literal data"] == stats["Total transferred file size"] == 3_000_000
    assert ckpt_rsync.parse_stats("Literal data: 1.234.567 bytes\n") == {"Literal data": 1234567}  # a de_DE locale
    legs = [ckpt_rsync.Leg("pull", 100 << 20, 1.0), ckpt_rsync.Leg("push", 100 << 20, 3.0)]
    assert ckpt_rsync.route_throughput(legs) == pytest.approx((100 << 20) / 4.0)  # sequential legs add up
    assert ckpt_rsync.route_throughput([ckpt_rsync.Leg("push", 1000, 1.0)]) is None  # too little to measure


def test_rsync_argv_keeps_each_ssh_word_whole_for_rsyncs_own_split(tmp_path):
    argv = ckpt_rsync.rsync_argv("a/", "h:b/", ssh=["ssh", "-F", "/x y/cfg", "-o", "ControlPath=/t/%C"],
                                 remote_rsync="/opt/rsync", bwlimit_kbps=100)
    assert argv[argv.index("-e") + 1] == "ssh -F '/x y/cfg' -o ControlPath=/t/%C"
    assert "--bwlimit=100" in argv and "--rsync-path=/opt/rsync" in argv and argv[-2:] == ["a/", "h:b/"]
    with pytest.raises(CopyError):
        ckpt_rsync.rsync_argv("a", "b", ssh=["ssh", "it's \"odd\""])


def _res(rc: int, stderr: str) -> RunResult:
    return RunResult(("rsync",), rc, "", stderr, 1.0)


def test_rsync_failures_are_typed_one_line_errors():
    here = LocalRunner().run(["/nonexistent/rsync", "-a", "x", "y"])  # a real missing command here
    # stderr as rsync 3.5 prints it, captured against the test sshd (the far side's shell, ssh, the receiver)
    cases = [
        (here, RsyncMissing, "rsync is not installed on this machine"),
            (_res(12, "bash: /nonexistent/rsync: No such file or directory\nrsync: connection unexpectedly "
                  "closed (0 bytes received so far) [sender]\n"), RsyncMissing, "rsync is not installed on b"),
        (_res(12, "bash: line 1: rsync: command not found\nrsync: connection unexpectedly closed (0 bytes received "
                  "so far) [sender]\n"), RsyncMissing, "rsync is not installed on b"),
        (_res(254, "Warning: Identity file /nokey not accessible: No such file or directory.\nchainrun@127.0.0.1: "
                   "Permission denied (publickey).\nrsync: connection unexpectedly closed (0 bytes received so far) "
                   "[sender]\n"), CopyPermissionDenied, "a cannot log in to b without a prompt"),
        (_res(3, 'rsync: [Receiver] ERROR: cannot stat destination "/root/x/": Permission denied (13)\n'),
         CopyPermissionDenied, "permission denied"),
        (_res(23, 'rsync: [receiver] mkstemp "/x/.m.pt.Ab" failed: Permission denied (13)\n'),
         CopyPermissionDenied, "permission denied"),
        (_res(11, 'rsync: [receiver] write failed on "/x/m.pt": No space left on device (28)\n'), DiskFull, "no space left"),
        (_res(20, "rsync error: received SIGINT, SIGTERM, or SIGHUP (code 20) at rsync.c(713)\n"), CopyError, "interrupted"),
        (_res(24, 'file has vanished: "/c/step-1.g2/m.pt"\n'), CopyError, "changed or was removed"),
    ]
    for res, typ, said in cases:
        e = ckpt_rsync.failure(res, what="copy of s from a to b", runs_on="this machine" if res is here else "a", far="b")
        assert type(e) is typ and said in str(e) and "\n" not in str(e), (said, str(e))


def test_land_and_cleanup_plan_on_a_real_folder(tmp_path):
    here = ckpt_copy.site_for("here", LocalRunner(), str(tmp_path / "src"))
    there = ckpt_copy.site_for("there", LocalRunner(), str(tmp_path / "dst"))
    _run_template(TEMPLATES / "pytorch" / "train.py", tmp_path / "src", 2, MAX_STEPS="10", SAVE_EVERY="5")
    r = ckpt_copy.copy_checkpoint(here, there, poll_s=None)
    assert (tmp_path / "dst" / "latest.g2.json").read_text() == (tmp_path / "src" / "latest.g2.json").read_text()
    assert r.route == "driver" and not r.already
    listing = LocalRunner().run(["sh", "-c", ckpt_cleanup.LISTING, "sh", there.ckpt_dir]).stdout
    assert ckpt_cleanup.plan(listing, keep=["latest.g2.json"]).remove == ()
    assert set(ckpt_cleanup.plan(listing).remove) == {"latest.g2.json", "step-000000010.g2",
                                                      ".chainrun-copied.step-000000010.g2.json"}
    (tmp_path / "dst" / ".chainrun-incoming.step-000000099.g2").mkdir()
    listing = LocalRunner().run(["sh", "-c", ckpt_cleanup.LISTING, "sh", there.ckpt_dir]).stdout
    assert ckpt_cleanup.plan(listing, partial_age_s=3600).kept == (".chainrun-incoming.step-000000099.g2",)  # fresh
    assert ".chainrun-incoming.step-000000099.g2" in ckpt_cleanup.plan(listing, partial_age_s=0).remove

    # a newer checkpoint of the same generation copied over the first (its marker was ours: replaced)...
    _run_template(TEMPLATES / "pytorch" / "train.py", tmp_path / "src", 2, MAX_STEPS="20", SAVE_EVERY="5")
    ckpt_copy.copy_checkpoint(here, there, poll_s=None)
    marker = tmp_path / "dst" / "latest.g2.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "job": "8"}))  # ...then a trainer rewrote it
    listing = LocalRunner().run(["sh", "-c", ckpt_cleanup.LISTING, "sh", there.ckpt_dir]).stdout
    p = ckpt_cleanup.plan(listing, partial_age_s=3600)
    assert set(p.remove) == {".chainrun-copied.step-000000010.g2.json", ".chainrun-copied.step-000000020.g2.json",
                             "step-000000010.g2"}  # the first copy is no one's latest now
    assert p.forgotten == ("step-000000020.g2",)  # named by the marker a trainer rewrote: its own now


def test_copy_routes_from_config(tmp_path, monkeypatch):
    import tomllib

    from chainrun.chain import ckpt_routes

    text = """
[copy.ls6]
rsync = "/usr/bin/rsync"
bwlimit_kbps = 50000
[copy.frontera]
bwlimit_kbps = 20000
[copy.ls6.direct]
frontera = "frontera"
vista = { dest = "me@vista", ssh_options = ["-i", "~/.ssh/id_xfer"] }
"""
    s = ckpt_routes.settings(tomllib.loads(text), "ls6")
    assert s.rsync == "/usr/bin/rsync" and s.bwlimit_kbps == 50000
    assert s.direct == {"frontera": ckpt_copy.DirectRoute("frontera"),
                        "vista": ckpt_copy.DirectRoute("me@vista", ("-i", "~/.ssh/id_xfer"))}
    assert ckpt_routes.settings(tomllib.loads(text), "vista") == ckpt_routes.CopySettings()
    for bad in ('[copy.a]\nspeed = 1', '[copy.a]\nbwlimit_kbps = "20M"', '[copy.a]\nbwlimit_kbps = 0', '[copy.a.direct]\nb = 3', '[copy.a.direct]\nb = "-oProxyCommand=x"',
                '[copy.a.direct]\nb = { dest = "b", ssh_options = "-v" }', '[copy.a]\nrsync = ""'):
        with pytest.raises(UsageError) as e:
            ckpt_routes.settings(tomllib.loads(bad), "a")
        assert "[copy.a" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(text)
    site = ckpt_routes.configured_site("ls6", LocalRunner(), "/scratch/ckpt")
    # a copy between two capped sites goes at the lower cap; an uncapped pair has none
    assert ckpt_routes.bwlimit_kbps("ls6", "frontera") == 20000 and ckpt_routes.bwlimit_kbps("ls6", "vista") == 50000
    assert ckpt_routes.bwlimit_kbps("vista", "elsewhere") is None
    here = ckpt_copy.site_for("here", LocalRunner(), "/x")
    assert ckpt_copy.choose_route(site, ckpt_copy.site_for("frontera", LocalRunner(), "/y")) == "direct"
    assert ckpt_copy.choose_route(here, site) == "driver"
    with pytest.raises(UsageError):
        ckpt_copy.choose_route(here, site, "direct")


def test_single_file_checkpoints_travel_in_the_manifest_or_by_rsync(tmp_path):
    import dataclasses

    _run_template(TEMPLATES / "toy_trainer.py", tmp_path / "toy", 2, TOY_TOTAL_STEPS="4", TOY_STEP_SECONDS="0.01",
                  TOY_SAVE_EVERY="2")
    src = ckpt_copy.site_for("a", LocalRunner(), str(tmp_path / "toy"))
    want = (tmp_path / "toy" / "ckpt.g2.json").read_bytes()
    for n, man in enumerate([None, dataclasses.replace(ckpt_manifest.manifest(src.runner, src.ckpt_dir), content=None)]):
        dst = ckpt_copy.site_for("b", LocalRunner(), str(tmp_path / f"dst{n}"))
        r = ckpt_copy.copy_checkpoint(src, dst, manifest=man, poll_s=None)
        assert (tmp_path / f"dst{n}" / "ckpt.g2.json").read_bytes() == want
        assert len(r.legs) == n  # embedded: no rsync; over EMBED_MAX: one rsync leg
        assert sorted(p.name for p in (tmp_path / f"dst{n}").iterdir()) == [".chainrun-copied.ckpt.g2.json.json",
                                                                            "ckpt.g2.json"]


def test_a_single_file_too_big_to_travel_in_the_manifest_still_says_its_step(tmp_path):
    """Over EMBED_MAX the file goes by rsync; its first bytes still give the step and generation that the
    move records and the go-ahead names (a 40 MiB toy checkpoint said "step None" in the move test)."""
    _run_template(TEMPLATES / "toy_trainer.py", tmp_path / "toy", 3, TOY_TOTAL_STEPS="6", TOY_STEP_SECONDS="0.01",
                  TOY_SAVE_EVERY="3", TOY_CKPT_PAD_KIB=str(2 * ckpt_manifest.EMBED_MAX >> 10))
    m = ckpt_manifest.manifest(LocalRunner(), str(tmp_path / "toy"))
    assert m.content is None and m.total_bytes > ckpt_manifest.EMBED_MAX
    assert (m.kind, m.name, m.generation, m.step) == ("file", "ckpt.g3.json", 3, 6)


def test_a_copy_never_replaces_a_checkpoint_a_trainer_saved_there_under_the_same_generation(tmp_path):
    _run_template(TEMPLATES / "pytorch" / "train.py", tmp_path / "src", 2, MAX_STEPS="10", SAVE_EVERY="5")
    _run_template(TEMPLATES / "pytorch" / "train.py", tmp_path / "dst", 2, MAX_STEPS="10", SAVE_EVERY="5",
                  GLOBAL_BATCH="32")  # the destination's own generation 2: same names, other weights
    theirs = {p.relative_to(tmp_path / "dst"): p.read_bytes() for p in (tmp_path / "dst").rglob("*") if p.is_file()}
    src = ckpt_copy.site_for("a", LocalRunner(), str(tmp_path / "src"))
    dst = ckpt_copy.site_for("b", LocalRunner(), str(tmp_path / "dst"))
    with pytest.raises(CopyError) as e:
        ckpt_copy.copy_checkpoint(src, dst, poll_s=None)
    assert "b has its own latest.g2.json" in str(e.value) and "\n" not in str(e.value)
    assert {p.relative_to(tmp_path / "dst"): p.read_bytes() for p in (tmp_path / "dst").rglob("*")
            if p.is_file() and not p.relative_to(tmp_path / "dst").parts[0].startswith(".chainrun-incoming")} == theirs
    from chainrun.chain.ckpt_land import replaceable

    assert replaceable("", "a" * 64) and replaceable(f"current {'a' * 64}\n", "a" * 64)
    assert replaceable(f"current {'b' * 64}\nours {'b' * 64}\n", "a" * 64)  # an earlier copy of ours
    assert not replaceable(f"current {'b' * 64}\nours {'c' * 64}\n", "a" * 64)
