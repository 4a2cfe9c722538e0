"""`model refresh` tunes `predicted` for the real test cluster from its own history: it reads the
partition's size and the priority weights from Slurm, reports and stores either an adopted choice or
"kept shipped defaults: <reason>", and `model status` / `model tune` show, pin and roll back."""

from __future__ import annotations

import json
import subprocess

import pytest

from chainrun.cli.main import main

from .test_slurm_e2e import _ensure_history

pytestmark = pytest.mark.slurm


def _partition(name: str) -> dict:
    out = subprocess.run(["scontrol", "show", "partition", name, "--oneliner"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def test_refresh_tunes_from_the_clusters_history_and_status_shows_it(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    _ensure_history()
    assert main(["model", "refresh", "--cluster", "local", "--lookback", "2d", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["data"]
    default = next(p for p in res["tuning"])  # the cluster's default partition (and no chain elsewhere)
    t = res["tuning"][default]
    assert t["summary"].startswith("adopted ") or t["summary"].startswith("kept shipped defaults: ")
    # this cluster's history is days, not weeks: the reason says so
    assert t["summary"].startswith("kept shipped defaults: history too short")
    facts = t["facts"]  # read from Slurm, not LS6's shipped file
    assert facts["nodes"] == int(_partition(default)["TotalNodes"]) and default in facts["sharing"]
    kind = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    assert facts["priority"] == ("fairshare" if "priority/multifactor" in kind else "age")
    assert res["seconds"]["tune"] >= 0

    stored = json.loads((tmp_path / "models" / "local" / "tuning.json").read_text())
    assert stored["partitions"][default]["last"]["summary"] == t["summary"]
    assert stored["partitions"][default]["in_force"]["source"] == "shipped"

    assert main(["model", "status", "--cluster", "local", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["data"]["tuning"]["partitions"][default]
    assert st["last"]["summary"] == t["summary"] and len(st["history"]) == 1
    assert main(["model", "status", "--cluster", "local", "--plain"]) == 0
    text = capsys.readouterr().out
    assert f"predicted on {default}: rule " in text and "(shipped defaults)" in text
    assert "kept shipped defaults: history too short" in text and "--rollback" in text
    # the replay's priority model as read from this cluster, on one line (age-only says so)
    assert f"  latest replay: {'age-only' if facts['priority'] == 'age' else 'multifactor'} priority" in text, text

    # --no-tune: the model only, the stored values untouched
    assert main(["model", "refresh", "--cluster", "local", "--no-tune", "--json"]) == 0
    assert "tuning" not in json.loads(capsys.readouterr().out)["data"]

    assert main(["model", "tune", "--cluster", "local", "--partition", default, "--pin"]) == 0
    assert "pinned" in capsys.readouterr().out
    assert main(["model", "tune", "--cluster", "local"]) == 0  # on the cached history, no sacct
    assert f"predicted on {default}: kept shipped defaults: history too short" in capsys.readouterr().out
    assert main(["model", "status", "--cluster", "local", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["data"]["tuning"]["partitions"][default]
    assert st["pinned"] and len(st["history"]) == 2
    assert [h["by"] for h in st["history"]] == ["refresh", "tune"]  # each run says which command chose
    assert main(["model", "tune", "--cluster", "local", "--partition", default, "--rollback"]) == 0
    assert "rolled back to rule" in capsys.readouterr().out
    assert main(["model", "tune", "--cluster", "local", "--pin", "--rollback", "--partition", default]) != 0
