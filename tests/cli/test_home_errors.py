"""A CHAINRUN_HOME that cannot be created or written: exit 6, one line naming CHAINRUN_HOME and the fix."""

from __future__ import annotations

import pytest

from chainrun.errors import HomeError, StateError
from tests.conftest import REPO, run_cli

TOY = str(REPO / "templates" / "toy_train.sh")

# every command path that opens the home: the store, the config, the models, the log file
COMMANDS = [
    ["status"],
    ["cancel", "x"],
    ["watch", "--once", "--plain"],
    ["cluster", "list"],
    ["cluster", "add", "x", "--host", "127.0.0.1"],
    ["cluster", "default", "local"],
    ["model", "status"],
    ["submit", TOY, "--total", "1h"],
]


def _bad_homes(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    return {
        "cannot be created": "/proc/chainrun-no-such-home",  # /proc takes no new folders, not even from root
        "is a file": str(blocker),
        "parent is a file": str(blocker / "home"),
    }


def _one_home_line(p, home: str) -> str:
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("chainrun: error: cannot use CHAINRUN_HOME " + home), line
    assert "set CHAINRUN_HOME to a folder you can create and write" in line
    assert "<no log file>" not in line
    return line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_unusable_home_is_exit_6_with_one_line(args, tmp_path):
    for why, home in _bad_homes(tmp_path).items():
        p = run_cli(*args, home=home, cwd=tmp_path)
        assert p.returncode == 6, (why, p.returncode, p.stderr)
        _one_home_line(p, home)


def test_the_reason_is_said_in_plain_words(tmp_path):
    homes = _bad_homes(tmp_path)
    assert "a file is in the way" in run_cli("status", home=homes["is a file"]).stderr
    assert "Not a directory" in run_cli("status", home=homes["parent is a file"]).stderr
    assert "No such file or directory" in run_cli("status", home=homes["cannot be created"]).stderr


def test_a_file_in_the_way_inside_the_home_names_it(tmp_path):
    home = tmp_path / "home"
    (home / "config.toml").mkdir(parents=True)  # a folder where the config file should be
    for args in (["cluster", "list"], ["cluster", "default", "local"]):
        p = run_cli(*args, home=home)
        assert p.returncode == 6, p.stderr
        line = _one_home_line(p, str(home))
        assert f"{home / 'config.toml'}: Is a directory" in line


def test_commands_that_need_no_home_still_work(tmp_path):
    home = _bad_homes(tmp_path)["is a file"]
    p = run_cli("init", "--template", "toy", str(tmp_path / "t"), home=home)
    assert p.returncode == 0, p.stderr
    assert run_cli("--version", home=home).returncode == 0


def test_unwritable_existing_home(tmp_path, monkeypatch):
    """An existing folder we may not write (a shared or read-only home): the same error, in-process."""
    from chainrun import paths

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    monkeypatch.setattr(paths.os, "access", lambda *a, **k: False)
    with pytest.raises(HomeError) as e:
        paths.home()
    assert e.value.exit_code == StateError.exit_code == 6
    assert "CHAINRUN_HOME" in str(e.value) and "not writable" in str(e.value)


def test_default_home_is_named_when_not_overridden(tmp_path, monkeypatch):
    from chainrun import paths

    monkeypatch.delenv("CHAINRUN_HOME", raising=False)
    monkeypatch.setattr(paths, "home_path", lambda: tmp_path / "file" / "home")
    (tmp_path / "file").write_text("")
    with pytest.raises(HomeError) as e:
        paths.home()
    assert str(e.value).startswith(f"cannot use the chainrun home {tmp_path / 'file' / 'home'}")
    assert "set CHAINRUN_HOME" in str(e.value)
