"""Fuzz the command line: whatever a user types, one line on stderr and a documented exit code.

Commands run in-process through ``chainrun.cli.main.main`` (the console script's body) with
a private home and a PATH without Slurm or SSH, so nothing is submitted anywhere; arguments
are drawn from each command's real options, nasty values and plain random text. A few
cases also go through the real executable to check the same holds end to end.
"""

from __future__ import annotations

import os
import random
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, run_cli

DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7, 8}  # docs/exit-codes.md; 70 (internal error) is a bug
TOY = str(REPO / "templates" / "toy_train.sh")

COMMANDS: dict[tuple[str, ...], list[str]] = {
    ("submit",): ["--total", "--segment", "--policy", "--lead", "--signal", "--name", "--retries",
                  "--checkpoint-dir", "--cluster", "--json"],
    ("status",): ["--all", "--cluster", "--json"],
    ("watch",): ["--interval", "--plain", "--cluster", "--json"],  # always with --once (below)
    ("cancel",): ["--cluster", "--json"],
    ("predict",): ["--nodes", "--gpus", "--time", "--partition", "--qos", "--cpus", "--cluster", "--json"],
    ("model", "status"): ["--cluster", "--json"],
    ("model", "eval"): ["--trace", "--train-until", "--test-until", "--cluster", "--json"],
    ("sim",): ["--trace", "--nodes", "--chains-every", "--handoff", "--priority", "--workers", "--json"],
    ("cluster", "list"): ["--json"],
    ("cluster", "remove"): [],
    ("cluster", "default"): [],
    ("cluster", "add"): ["--host", "--user", "--port", "--key", "--proxy-jump", "--login-shell", "--workdir",
                         "--json"],
}
FLAGS = {"--json", "--all", "--plain", "--login-shell"}


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    """A private home, fuzz input files, and a PATH where sbatch, ssh and crontab do not exist."""
    base = tmp_path_factory.mktemp("fuzz")
    files = base / "files"
    files.mkdir()
    (files / "empty.sh").write_text("")
    (files / "binary.sh").write_bytes(bytes(range(256)) * 4)
    (files / "crlf.sh").write_text("#!/bin/bash\r\necho hi\r\n")
    (files / "sacct.txt").write_text("JobID|State|Submit\n1|COMPLETED|yesterday\n2|||\n")
    (files / "huge-line.txt").write_text("x" * 200_000)
    (files / "dir").mkdir()
    empty_bin = base / "bin"
    empty_bin.mkdir()
    saved = {k: os.environ.get(k) for k in ("CHAINRUN_HOME", "PATH", "SLURM_CONF")}
    os.environ["CHAINRUN_HOME"] = str(base / "home")
    os.environ["PATH"] = str(empty_bin)
    yield {"base": base, "files": files}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _values(files: Path):
    nasty = ["", " ", "-", "--", "0", "-1", "1e999", "nan", "inf", "72", "72h", "1h30m", "1:30", "1-12:00:00",
             "0s", "0.1s", "999999999d", "USR2@300", "USR2@", "@5", "KILL@10", "FOO@1", "lead", "predicted",
             "bogus", "local", "no-such-cluster", "é", "😀", "a" * 300, "../../../etc/passwd", "/dev/null",
             "$(touch /tmp/chainrun-fuzz-pwned)", "`id`", "'; rm -rf /; '", "%s%n", "\\", "\t", "a b", "-v",
             "2026-13-45", "2026-01-01", "yesterday", "cr.x.1", "x" * 5000]
    paths = [TOY, str(files / "empty.sh"), str(files / "binary.sh"), str(files / "crlf.sh"), str(files / "dir"),
             str(files / "sacct.txt"), str(files / "huge-line.txt"), "/nonexistent/file", "/root", "/proc/self/mem"]
    text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
    return st.one_of(st.sampled_from(nasty), st.sampled_from(paths), text)


@st.composite
def command_lines(draw, files: Path):
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    argv = list(cmd)
    values = _values(files)
    if cmd in {("submit",), ("cancel",), ("cluster", "remove"), ("cluster", "default"), ("cluster", "add")} \
            or draw(st.booleans()):
        argv.append(draw(values))  # the positional argument (script, chain, cluster name)
    for _ in range(draw(st.integers(0, 5))):
        opt = draw(st.sampled_from(COMMANDS[cmd] + ["--bogus", "-x", "--total"]))
        argv.append(opt)
        if opt not in FLAGS:
            argv.append(draw(values))
    if draw(st.booleans()):
        argv += ["--", *draw(st.lists(values, max_size=3))]
    if cmd == ("watch",):
        argv.append("--once")
    if draw(st.integers(0, 9)) == 0:
        argv.insert(0, "-q")
    return argv


def _check(argv, code, out, err):
    assert code in DOCUMENTED, f"{argv!r} -> exit {code}\n{err}"
    assert "Traceback" not in out + err, f"{argv!r} printed a traceback:\n{err}"
    if code != 0 and "Usage:" not in err:  # `chainrun model` alone prints its help (exit 2)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if not lines:  # a few commands answer "nothing there" on stdout with a code (model status: 3)
            assert out.strip(), f"{argv!r} -> exit {code} without a word"
            return
        assert len(lines) == 1 and lines[0].startswith("chainrun: "), f"{argv!r} -> not one line:\n{err}"


def test_fuzz_cli_arguments(fuzz_env, capfd):
    from chainrun.cli.main import main

    files = fuzz_env["files"]
    seen = set()

    @settings(max_examples=int(os.environ.get("CHAINRUN_FUZZ_EXAMPLES", "400")), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(command_lines(files))
    def one(argv):
        capfd.readouterr()
        code = main(argv)
        out, err = capfd.readouterr()
        seen.add(code)
        _check(argv, code, out, err)

    one()
    assert not Path("/tmp/chainrun-fuzz-pwned").exists()
    assert {2} <= seen  # the fuzz did reach the error paths


@pytest.mark.parametrize("garbage", [b"[clusters.x\nhost = ", b"\xff\xfe\x00garbage",
                                     b"[clusters.a]\nport = 'x'\n", b"clusters = 5\n",
                                     b"[clusters.a]\nhost = 'h'\nport = 0\n", b"default = 3\n"])
def test_broken_config_file_is_one_line(garbage, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_bytes(garbage)
    for args in (["status"], ["cluster", "list"], ["watch", "--once", "--plain"]):
        p = run_cli(*args, home=home)
        _check(args, p.returncode, p.stdout, p.stderr)
    assert (home / "config.toml").read_bytes() == garbage  # never rewritten


def test_real_executable_never_prints_a_traceback(tmp_path):
    rng = random.Random(7)
    home = tmp_path / "home"
    cases = [["submit", TOY, "--total", "72"], ["status", "--bogus"], ["watch", "--interval", "0"],
             ["submit", "/nonexistent", "--total", "1h"], ["cancel"], ["sim", "--trace", "/proc/self/mem"],
             ["predict", "--time", "soon"], ["cluster", "add", "x", "--host", "h", "--port", "99999"]]
    cases += [["status", "".join(rng.choice(string.printable[:94]) for _ in range(12))] for _ in range(3)]
    for args in cases:
        p = run_cli(*args, home=home, env={"PATH": str(tmp_path)})
        _check(args, p.returncode, p.stdout, p.stderr)


def test_verbose_shows_the_traceback_that_the_log_always_has(tmp_path, monkeypatch, capfd):
    from chainrun import context
    from chainrun.cli.main import EXIT_INTERNAL, main

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))

    def boom(*a, **k):
        raise RuntimeError("a bug in chainrun")

    monkeypatch.setattr(context, "open_context", boom)
    for argv, shown in ((["status"], False), (["-v", "status"], True)):
        capfd.readouterr()
        assert main(argv) == EXIT_INTERNAL
        _, err = capfd.readouterr()
        assert ("Traceback" in err) is shown, err
        assert "internal error: RuntimeError: a bug in chainrun" in err
    log = (tmp_path / "home" / "logs" / "chainrun.log").read_text()
    assert log.count("Traceback") >= 2 and "a bug in chainrun" in log
