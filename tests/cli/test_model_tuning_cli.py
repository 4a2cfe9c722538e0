"""`model status`, `model tune` and `model refresh` with the tuning file (chainrun/chain/tuned.py)
unreadable or asked about a partition the cluster does not know: status shows the rest and one line
naming the file; refresh and rollback set it aside (kept) and go on; pin and roll back refuse an
unknown partition in one line and write nothing; status text shows the latest check's scores and the
last choices whether or not they were adopted (issue #24). No Slurm: the refresh's Slurm reads are
canned (tests/predict/test_ingest.py, tests/sim/test_selftune.py)."""

from __future__ import annotations

import json

import pytest

from chainrun.chain import tuned
from tests.conftest import run_cli

from .test_cli_errors import no_traceback

NEW = {"rule": "quantile", "transition_cost_s": 5400.0, "lead_share": 0.4, "floor_s": 10800.0}
SCORES = {"chosen": 1.1, "in_force": 1.3, "reactive": 2.5, "oracle": 0.4, "best_fixed": 1.6}
WINDOW = {"choice_from": "2026-09-01T00:00:00", "choice_until": "2026-10-01T00:00:00",
          "check_from": "2026-10-01T00:00:00", "check_until": "2026-10-15T00:00:00", "choice_chains": 40,
          "check_chains": 20}

WIDE = {"COLUMNS": "1000"}  # the plain lines wrap at the terminal's width: one line each here


@pytest.fixture
def with_model(chainrun_home):
    """A real saved model for cluster `local` (its history names partitions gpu and small)."""
    from chainrun.predict import fit_predictor
    from tests.predict.predict_helpers import synthetic_history

    fit_predictor(synthetic_history(900, seed=5), per_user="never").save(chainrun_home / "models" / "local")
    return chainrun_home


def broken(home, text="{not json"):
    p = home / "models" / "local" / "tuning.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_status_on_an_unreadable_tuning_file_shows_the_rest_and_one_line_naming_it(with_model):
    p = broken(with_model)
    out = run_cli("model", "status", home=with_model, env=WIDE)
    assert out.returncode == 0 and not no_traceback(out), out.stderr
    assert "trained: " in out.stdout and "\nfiles: " in out.stdout  # everything else is there
    lines = [ln for ln in out.stdout.splitlines() if "tuning file" in ln]
    assert len(lines) == 1 and f"unreadable tuning file {p}" in lines[0], out.stdout
    assert "shipped values" in lines[0] and "--rollback" in lines[0] and "model refresh" in lines[0]
    out = run_cli("model", "status", "--json", home=with_model)
    assert out.returncode == 0 and not no_traceback(out), out.stderr
    data = json.loads(out.stdout)["data"]
    assert data["model"]["trained_at"] and data["tuning"]["unreadable"]["why"] and data["tuning"]["file"] == str(p)
    assert p.read_text() == "{not json"  # status never touches it


def test_status_text_shows_the_latest_check_and_the_last_choices_when_the_shipped_values_stay(with_model):
    tuned.record("local", "gpu", {"adopted": False, "reason": "history too short: 3.0 days",
                                  "previous": tuned.shipped(),
                                  "summary": "kept shipped defaults: history too short: 3.0 days"})
    tuned.record("local", "gpu", {
        "adopted": False, "chosen": NEW, "previous": tuned.shipped(), "window": WINDOW,
        "check": {"scores_h": SCORES}, "reason": "the choice does not beat the values in force on the check",
        "summary": "kept shipped defaults: the choice does not beat the values in force on the check"})
    out = run_cli("model", "status", "--plain", home=with_model, env=WIDE)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "predicted on gpu: rule slack" in text and "(shipped defaults)" in text
    assert ("last check: " in text and "mean overhead a chain: chosen 1.10 h, in force 1.30 h, reactive 2.50 h, "
            "oracle 0.40 h, best fixed lead 1.60 h") in text, text
    refreshes = [ln for ln in text.splitlines() if ln.startswith("  refresh ")]
    assert len(refreshes) == 2, text  # newest first
    assert "on 2026-09-01 .. 2026-10-15: chose rule quantile, boundary cost 1.5 h, guard share 0.4, floor 3 h; " \
           "kept shipped defaults: the choice does not beat" in refreshes[0]
    assert refreshes[1].endswith("kept shipped defaults: history too short: 3.0 days")
    assert "2 refreshes, 0 put in force" in text


def test_status_names_the_command_that_made_each_choice(with_model):
    """`model tune` chooses too: its runs are listed as tune, not as refresh (found in the #24 audit)."""
    tuned.record("local", "gpu", {"adopted": False, "reason": "history too short: 3.0 days", "by": "refresh",
                                  "summary": "kept shipped defaults: history too short: 3.0 days"})
    tuned.record("local", "gpu", {"adopted": True, "chosen": NEW, "window": WINDOW, "by": "tune",
                                  "check": {"scores_h": SCORES}, "reason": "beats the values in force",
                                  "summary": "put in force: beats the values in force"})
    text = run_cli("model", "status", "--plain", home=with_model, env=WIDE).stdout
    runs = [ln.split()[0] for ln in text.splitlines() if ln.startswith(("  refresh ", "  tune "))]
    assert runs == ["tune", "refresh"], text  # newest first
    assert "2 runs (1 by model tune), 1 put in force" in text, text
    data = json.loads(run_cli("model", "status", "--json", home=with_model).stdout)["data"]
    assert [c["by"] for c in data["tuning"]["partitions"]["gpu"]["recent"]] == ["tune", "refresh"]


@pytest.mark.parametrize("args", [["--pin"], ["--unpin"], ["--rollback"]])
def test_tune_without_a_model_refuses_in_one_line_and_writes_nothing(args, chainrun_home):
    out = run_cli("model", "tune", "--partition", "ANY", *args, home=chainrun_home)
    errors = no_traceback(out)
    assert out.returncode == 7 and out.stdout == "" and len(errors) == 1, (out.returncode, out.stdout, out.stderr)
    assert "no queue-delay model for cluster local" in errors[0] and "chainrun model refresh" in errors[0]
    assert not (chainrun_home / "models" / "local" / "tuning.json").exists()


@pytest.mark.parametrize("args", [["--pin"], ["--unpin"], ["--rollback"]])
def test_tune_on_a_partition_the_cluster_does_not_know_refuses_and_names_those_it_knows(args, with_model):
    out = run_cli("model", "tune", "--partition", "ANY", *args, home=with_model)
    errors = no_traceback(out)
    assert out.returncode == 3 and out.stdout == "" and len(errors) == 1, (out.returncode, out.stdout, out.stderr)
    assert "no partition 'ANY' on cluster local: known gpu, small" in errors[0]
    assert not (with_model / "models" / "local" / "tuning.json").exists()
    ok = run_cli("model", "tune", "--partition", "small", *args, home=with_model)
    assert ok.returncode == 0 and "local/small: " in ok.stdout, ok.stderr


def test_pin_on_an_unreadable_file_refuses_and_rollback_sets_it_aside(with_model):
    p = broken(with_model)
    out = run_cli("model", "tune", "--partition", "gpu", "--pin", home=with_model)
    errors = no_traceback(out)
    assert out.returncode == 7 and len(errors) == 1 and "unreadable" in errors[0] and "--rollback" in errors[0]
    assert p.read_text() == "{not json"
    out = run_cli("model", "tune", "--partition", "gpu", "--rollback", home=with_model)
    assert out.returncode == 0 and not no_traceback(out), out.stderr
    warned = [ln for ln in out.stderr.splitlines() if ln.startswith("warning: set aside the unreadable tuning file")]
    assert len(warned) == 1 and "tuning.json.corrupt-" in warned[0], out.stderr
    assert "local/gpu: rolled back to rule slack" in out.stdout
    kept = list(p.parent.glob("tuning.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json"
    assert tuned.status("local")["partitions"]["gpu"]["pinned"]


class SlurmReads:
    """sacct, scontrol show node (tests/predict/test_ingest.py) and the partition and priority reads
    of the tuning step (tests/sim/test_selftune.py), canned."""

    name = "fake"

    def __init__(self) -> None:
        from tests.predict.test_ingest import EPOCH_ROWS, FakeRunner
        from tests.sim.test_selftune import Canned

        self.sacct, self.scontrol = FakeRunner(EPOCH_ROWS), Canned()

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if list(argv[:3]) in (["scontrol", "show", "partition"], ["scontrol", "show", "config"]):
            return self.scontrol.run(argv, timeout)
        return self.sacct.run(argv, timeout, env=env, stdin=stdin)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("json_out", [False, True])
def test_refresh_sets_an_unreadable_tuning_file_aside_and_tunes_from_the_shipped_values(json_out, chainrun_home,
                                                                                      monkeypatch, capsys):
    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import training

    monkeypatch.setattr(training, "MIN_ROWS", 10)  # the capture has 18 started jobs
    monkeypatch.setattr(model_cmd, "_runner", lambda cluster="local": SlurmReads())
    p = broken(chainrun_home)
    code = main(["model", "refresh", "--cluster", "local", *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    kept = list(p.parent.glob("tuning.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json"  # nothing lost
    assert (p.parent / "meta.json").exists()  # the model is saved
    st = tuned.status("local")  # the tuning step recorded its outcome in a fresh file
    assert "unreadable" not in st and st["partitions"]["gpu"]["in_force"]["source"] == "shipped"
    if json_out:
        data = json.loads(out)["data"]
        assert data["tuning_set_aside"]["moved_to"] == str(kept[0]) and "gpu" in data["tuning"]
    else:
        warned = [ln for ln in err.splitlines() if ln.startswith("warning: set aside the unreadable tuning file")]
        assert len(warned) == 1 and str(kept[0]) in warned[0] and "shipped values" in warned[0], err
        assert "predicted on gpu: kept shipped defaults" in out
    # the next refresh finds a readable file: nothing more set aside
    assert main(["model", "refresh", "--cluster", "local", "--json"]) == 0
    assert "tuning_set_aside" not in json.loads(capsys.readouterr().out)["data"]
    assert len(list(p.parent.glob("tuning.json.corrupt-*"))) == 1


class NoWeights(SlurmReads):
    """As SlurmReads, but neither ``scontrol show config`` nor ``sprio -w`` answers: age-only priority."""

    def __init__(self) -> None:
        from tests.sim.test_selftune import Canned

        super().__init__()
        self.scontrol = Canned(config=None)

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if argv[0] == "sprio":
            return self.scontrol.run(argv, timeout)
        return super().run(argv, timeout, env=env, stdin=stdin)


@pytest.mark.parametrize("reads, said", [
    (SlurmReads, "multifactor priority (age, fair share, job size); partition and QOS weights are not replayed"),
    (NoWeights, "age-only priority; priority weights unreadable (scontrol show config, sprio -w): age-only priority")])
def test_refresh_and_status_say_the_replays_priority_model_and_its_notes(reads, said, chainrun_home, monkeypatch,
                                                                         capsys):
    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import training

    monkeypatch.setattr(training, "MIN_ROWS", 10)
    monkeypatch.setattr(model_cmd, "_runner", lambda cluster="local": reads())
    assert main(["model", "refresh", "--cluster", "local"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(out) if ln.startswith("predicted on gpu: "))
    assert out[at + 1].startswith(f"  replay: {said}"), out  # one line, under the partition's outcome
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["model", "status", "--cluster", "local", "--plain"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  latest replay: ")]
    assert len(lines) == 1 and lines[0].startswith(f"  latest replay: {said}"), lines


def test_status_names_no_replay_for_a_partition_whose_refreshes_predate_it(with_model):
    tuned.record("local", "gpu", {"adopted": False, "reason": "history too short: 3.0 days",
                                  "previous": tuned.shipped(), "summary": "kept shipped defaults: history too short"})
    out = run_cli("model", "status", "--plain", home=with_model, env=WIDE)
    assert out.returncode == 0 and "predicted on gpu: " in out.stdout and "latest replay" not in out.stdout


def test_refresh_no_tune_leaves_an_unreadable_tuning_file_and_says_so(chainrun_home, monkeypatch, capsys):
    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import training

    monkeypatch.setattr(training, "MIN_ROWS", 10)
    monkeypatch.setattr(model_cmd, "_runner", lambda cluster="local": SlurmReads())
    p = broken(chainrun_home)
    assert main(["model", "refresh", "--cluster", "local", "--no-tune"]) == 0
    out, err = capsys.readouterr()
    warned = [ln for ln in err.splitlines() if ln.startswith("warning: unreadable tuning file")]
    assert len(warned) == 1 and str(p) in warned[0] and "shipped values" in warned[0], err
    assert "not tuned (--no-tune)" in out
    assert p.read_text() == "{not json" and not list(p.parent.glob("tuning.json.corrupt-*"))  # --no-tune: untouched
    assert main(["model", "refresh", "--cluster", "local", "--no-tune", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["tuning_unreadable"]["file"] == str(p) and data["tuning_unreadable"]["why"]
    assert p.read_text() == "{not json"


def test_tune_on_an_unknown_partition_refuses_before_anything_is_set_aside_or_written(chainrun_home, monkeypatch,
                                                                                        capsys):
    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import training

    monkeypatch.setattr(training, "MIN_ROWS", 10)
    monkeypatch.setattr(model_cmd, "_runner", lambda cluster="local": SlurmReads())
    assert main(["model", "refresh", "--cluster", "local", "--no-tune"]) == 0  # a model and a cached history
    p = broken(chainrun_home)
    capsys.readouterr()
    assert main(["model", "tune", "--cluster", "local", "--partition", "gpux"]) == 3
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert out == "" and "no partition 'gpux' on cluster local: known long, short" in lines[0], err
    assert "Traceback" not in err
    assert p.read_text() == "{not json" and not list(p.parent.glob("tuning.json.corrupt-*"))
    assert main(["model", "tune", "--cluster", "local", "--partition", "short", "--json"]) == 0  # a known one tunes
    assert "short" in json.loads(capsys.readouterr().out)["data"]
    assert tuned.status("local")["partitions"]["short"]["last"]


@pytest.mark.parametrize("json_out", [False, True])
def test_status_of_a_cluster_that_is_not_configured_says_so_not_run_a_refresh(json_out, chainrun_home):
    out = run_cli("model", "status", "--cluster", "nope", *(["--json"] if json_out else []), home=chainrun_home)
    assert out.returncode == 3 and out.stdout == "", out.stderr
    assert no_traceback(out) == [
        "chainrun: error: no cluster 'nope' (clusters: local; add one with `chainrun cluster add`)"]
    local = run_cli("model", "status", home=chainrun_home)  # `local` always exists: no model yet, how to get one
    assert local.returncode == 3 and "model refresh --cluster local" in local.stderr
