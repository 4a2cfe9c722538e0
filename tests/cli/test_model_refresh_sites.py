"""`chainrun model refresh --cluster X` re-chooses the site margin of every cluster list stored in
site_margins.json that holds X (chainrun/sim/site_selftune.py ``refresh_margins``, the core of `model
sites a,b`), pins respected, and leaves the other lists alone; a failure there (here: a list naming a
cluster gone from config.toml, an unreadable file) keeps that margin, says so in one line and in the
JSON's ``site_margins``, and the refresh still succeeds. The refresh's Slurm reads are canned
(tests/cli/test_model_tuning_cli.py); the files are real. The choice itself on real histories:
tests/sim/test_site_selftune.py."""

from __future__ import annotations

import json

import pytest

from chainrun.chain import site_tuned

from .test_model_tuning_cli import SlurmReads


@pytest.fixture
def refresh(chainrun_home, monkeypatch, capsys):
    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import training

    monkeypatch.setattr(training, "MIN_ROWS", 10)  # the capture has 18 started jobs
    monkeypatch.setattr(model_cmd, "_runner", lambda cluster="local": SlurmReads())
    chainrun_home.mkdir(parents=True, exist_ok=True)
    (chainrun_home / "config.toml").write_text('[clusters.b]\nhost = "127.0.0.1"\n\n[clusters.c]\nhost = "127.0.0.1"\n')

    def run(*args: str):
        code = main(["model", "refresh", "--cluster", "local", *args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def stored(*lists: str) -> dict:
    for k in lists:
        site_tuned.record(k.split(","), {"chosen": True, "margin_s": 7200.0, "reason": "stored before"})
    return json.loads(site_tuned.path().read_text())["lists"]


def test_refresh_re_chooses_the_lists_holding_the_cluster_and_skips_the_others(refresh):
    before = stored("local,b", "b,local", "b,c")
    site_tuned.pin(["b", "local"])
    code, out, err = refresh("--json")
    assert code == 0, err
    sm = json.loads(out)["data"]["site_margins"]
    assert sorted(sm["lists"]) == ["b,local", "local,b"] and sm["file"] == str(site_tuned.path())
    # local's history is cached now, only the test user's jobs (the canned sacct); b's is not: each list
    # keeps its margin and says why (the first cluster is read first)
    why = {"local,b": "other users' jobs are hidden on local", "b,local": "no history cached for b"}
    for k in ("local,b", "b,local"):
        assert not sm["lists"][k]["chosen"] and why[k] in sm["lists"][k]["reason"], sm["lists"][k]
        assert sm["lists"][k]["in_force"]["margin_s"] == 7200.0
    assert sm["lists"]["b,local"]["pinned"] and "kept the pinned margin 2h" in sm["lists"]["b,local"]["summary"]
    after = json.loads(site_tuned.path().read_text())["lists"]
    assert after["b,c"] == before["b,c"]  # not holding local: not re-chosen
    assert [len(after[k]["history"]) for k in ("local,b", "b,local")] == [2, 2]
    code, out, err = refresh()  # the text: one line per list
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("site margin for ")]
    assert len(lines) == 2, out
    assert lines[0].startswith("site margin for b,local: kept the pinned margin 2h") and \
        lines[1].startswith("site margin for local,b: kept the margin in force 2h: other users' jobs are hidden")


def test_a_failing_re_choice_or_an_unreadable_file_leaves_the_refresh_successful(refresh, chainrun_home):
    stored("local,b", "local,zz")  # zz: a cluster since gone from config.toml
    code, out, err = refresh()
    assert code == 0 and (chainrun_home / "models" / "local" / "meta.json").exists(), err
    assert "site margin for local,zz: kept the margin in force 2h: not re-chosen (UsageError: no cluster 'zz'" in out
    assert "site margin for local,b: kept the margin in force 2h: other users' jobs are hidden on local" in out
    assert site_tuned.in_force(["local", "zz"])["margin_s"] == 7200.0
    p = site_tuned.path()
    p.write_text("{not json")
    code, out, err = refresh("--json")
    assert code == 0, err
    sm = json.loads(out)["data"]["site_margins"]
    assert sm["lists"] == {} and sm["unreadable"]["why"] and "model sites" in sm["unreadable"]["hint"]
    assert p.read_text() == "{not json" and not list(p.parent.glob("site_margins.json.corrupt-*"))  # left alone
    code, out, err = refresh()
    assert code == 0 and f"site margins: not re-chosen: unreadable site margin file {p}" in out, err


def test_no_tune_re_chooses_no_site_margin(refresh):
    before = stored("local,b")
    code, out, err = refresh("--no-tune", "--json")
    assert code == 0, err
    assert "site_margins" not in json.loads(out)["data"]
    assert json.loads(site_tuned.path().read_text())["lists"] == before
