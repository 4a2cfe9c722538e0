"""Bad input: one clear line on stderr, a documented non-zero exit, never a traceback, nothing lost."""

import pytest

from tests.conftest import REPO, run_cli

TOY = str(REPO / "templates" / "toy_train.sh")


def no_traceback(p):
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    return errors


@pytest.mark.parametrize(
    "args,code,fragment",
    [
        (["submit", "/nonexistent/train.sh", "--total", "72h"], 2, "script not found"),
        (["submit", TOY, "--total", "72"], 2, "has no unit"),
        (["submit", TOY, "--total", "soon"], 2, "invalid --total"),
        (["submit", TOY, "--total", "1h", "--segment", "0h"], 2, "at least one second"),
        (["submit", TOY, "--total", "1h", "--lead", "1:30"], 2, "ambiguous"),
        (["submit", str(REPO), "--total", "1h"], 2, "is a folder"),
        (["status", "no-such-chain"], 3, "no chain"),
        (["cancel", "no-such-chain"], 3, "no chain"),
        (["cluster", "remove", "local"], 2, "`local` is this machine: it is always there"),  # not "no cluster 'local'"
    ],
)
def test_bad_input_one_line(args, code, fragment, chainrun_home):
    p = run_cli(*args, home=chainrun_home)
    assert p.returncode == code, (p.returncode, p.stderr)
    errors = no_traceback(p)
    assert len(errors) == 1 and fragment in errors[0], p.stderr


def test_corrupt_state_is_refused_and_kept(chainrun_home):
    chainrun_home.mkdir(parents=True)
    db = chainrun_home / "state.sqlite"
    db.write_bytes(b"\x00garbage" * 1000)
    before = db.read_bytes()
    p = run_cli("status", home=chainrun_home)
    assert p.returncode == 6
    assert len(no_traceback(p)) == 1 and "not a chainrun state store" in p.stderr
    assert db.read_bytes() == before


def test_unknown_option_is_a_usage_error(chainrun_home):
    p = run_cli("status", "--bogus", home=chainrun_home)
    assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize("cmd", ["submit", "status", "watch", "cancel"])
def test_every_command_has_help(cmd, chainrun_home):
    p = run_cli(cmd, "--help", home=chainrun_home)
    assert p.returncode == 0 and "Usage" in p.stdout


def test_version(chainrun_home):
    from chainrun import __version__

    p = run_cli("--version", home=chainrun_home)
    assert p.returncode == 0 and p.stdout.strip() == f"chainrun {__version__}"


def test_help_does_not_import_heavy_libraries():
    import subprocess
    import sys

    code = ("import sys; from chainrun.cli import main; "
            "heavy = [m for m in ('pandas', 'lightgbm', 'paramiko', 'sklearn', 'numpy', 'matplotlib') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"imported on the --help path: {out}"


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["status", "--plain"]])
def test_status_on_an_unreadable_config_is_a_one_line_error(args, chainrun_home):
    chainrun_home.mkdir(parents=True)
    (chainrun_home / "config.toml").write_text("garbage [[[ =\n")
    p = run_cli(*args, home=chainrun_home)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
    errors = no_traceback(p)
    assert len(errors) == 1 and "cannot read" in errors[0] and "config.toml" in errors[0], p.stderr


def test_model_status_without_a_model_is_an_error_line(chainrun_home):
    p = run_cli("model", "status", home=chainrun_home)
    assert p.returncode == 3 and p.stdout == ""
    errors = no_traceback(p)
    assert len(errors) == 1 and "no queue-delay model for cluster local" in errors[0], p.stderr
    assert "chainrun model refresh --cluster local" in errors[0]


def test_model_status_in_a_pipe_is_plain_lines(chainrun_home):
    from chainrun.predict import fit_predictor
    from tests.predict.predict_helpers import synthetic_history

    fit_predictor(synthetic_history(900, seed=5), per_user="never").save(chainrun_home / "models" / "local")
    p = run_cli("model", "status", home=chainrun_home)  # stdout is a pipe here
    assert p.returncode == 0, p.stderr
    # "files:" alone: a long tmp path wraps onto the next line (the plain lines keep the terminal's width)
    assert not any(c in p.stdout for c in "┃┏━│─╭") and "trained: " in p.stdout and "\nfiles:" in p.stdout


def test_cluster_test_local_without_slurm_on_path_names_path_not_login_shell(chainrun_home, tmp_path):
    """`local` cannot be re-added with --login-shell: without Slurm on PATH the hint is about PATH."""
    empty = tmp_path / "bin"
    empty.mkdir()
    p = run_cli("cluster", "test", "local", home=chainrun_home, env={"PATH": str(empty)})
    assert p.returncode == 8, p.stderr
    errors = no_traceback(p)
    assert len(errors) == 1 and "Slurm commands not found" in errors[0] and "PATH" in errors[0], p.stderr
    assert "re-add" not in errors[0], errors[0]


def test_predict_without_a_model_names_the_cluster_to_refresh(chainrun_home):
    """The hint is a command that works: `model refresh` alone would refresh local, not this cluster."""
    p = run_cli("cluster", "add", "far", "--host", "far.invalid", "--user", "u", "--no-check", home=chainrun_home)
    assert p.returncode == 0, p.stderr
    p = run_cli("predict", "--cluster", "far", "--time", "1h", home=chainrun_home)
    assert p.returncode == 7, p.stderr
    errors = no_traceback(p)
    assert len(errors) == 1 and "chainrun model refresh --cluster far" in errors[0], p.stderr


def test_exit_codes_md_examples_are_what_chainrun_prints(chainrun_home):
    """docs/exit-codes.md's error line and its runnable examples (no Slurm needed) against the product."""
    import re

    doc = (REPO / "docs" / "exit-codes.md").read_text()
    line = re.search(r"a bad option: ``(chainrun: error: .*?)``", doc).group(1)
    p = run_cli("status", "--bogus", home=chainrun_home)
    assert p.stderr.strip() == line, (p.stderr, line)
    rows = {int(m[1]): m[2] for m in re.finditer(r"^\| *(\d+) \|[^|]*\|(.*)\|$", doc, re.M)}
    for code, cmd in [(3, "chainrun status no-such-chain"), (3, "chainrun model status"),
                      (7, "chainrun predict --time 1h")]:
        assert f"`{cmd}`" in rows[code], (code, cmd)
        p = run_cli(*cmd.split()[1:], home=chainrun_home)
        assert p.returncode == code and len(no_traceback(p)) == 1, (cmd, p.returncode, p.stderr)
