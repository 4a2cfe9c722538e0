"""`chainrun init --template`: copies a template, refuses to overwrite, one-line errors."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, run_cli


@pytest.mark.parametrize("template,files", [
    ("pytorch", ["train.py", "train.sh"]), ("lightning", ["train.py", "train.sh"]), ("hf", ["train.py", "train.sh"]),
    ("toy", ["toy_trainer.py", "toy_train.sh"]),
])
def test_init_copies_template(template, files, tmp_path, chainrun_home):
    dest = tmp_path / "proj" / "sub"
    p = run_cli("init", "--template", template, str(dest), "--json", home=chainrun_home)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["data"]
    assert d["template"] == template and sorted(os.path.basename(f) for f in d["files"]) == sorted(files)
    src = REPO / "templates" / ("" if template == "toy" else template)
    for f in files:
        assert (dest / f).read_bytes() == (src / f).read_bytes()
        if f.endswith(".sh"):
            assert os.access(dest / f, os.X_OK)


def test_init_refuses_to_overwrite(tmp_path, chainrun_home):
    (tmp_path / "train.py").write_text("my own work\n")
    p = run_cli("init", "--template", "hf", str(tmp_path), home=chainrun_home)
    assert p.returncode == 2 and "refusing to overwrite" in p.stderr and "Traceback" not in p.stderr
    assert (tmp_path / "train.py").read_text() == "my own work\n"
    assert not (tmp_path / "train.sh").exists()  # nothing copied, not even the free name


def test_init_default_folder_is_cwd_and_text_output(tmp_path, chainrun_home):
    p = run_cli("init", "-t", "toy", home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "toy_train.sh").exists() and "chainrun submit" in p.stdout


@pytest.mark.parametrize("args,fragment", [
    (["init", "--template", "jax"], "unknown template"),
    (["init"], "--template"),
])
def test_init_usage_errors(args, fragment, chainrun_home, tmp_path):
    p = run_cli(*args, home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 2 and fragment in p.stderr and "Traceback" not in p.stderr


def test_init_into_a_file_is_refused(tmp_path, chainrun_home):
    (tmp_path / "f").write_text("")
    p = run_cli("init", "-t", "pytorch", str(tmp_path / "f"), home=chainrun_home)
    assert p.returncode == 2 and "not a folder" in p.stderr
