"""`model refresh` tunes `predicted` for the real test cluster from its own history: it reads the
partition's size and the priority weights from Slurm, reports and stores either an adopted choice or
"kept shipped defaults: <reason>", and `model status` / `model tune` show, pin and roll back."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from chainrun.cli.main import main

from .test_slurm_e2e import _ensure_history

pytestmark = pytest.mark.slurm


def _partition(name: str) -> dict:
    out = subprocess.run(["scontrol", "show", "partition", name, "--oneliner"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _default_partition() -> str:
    out = subprocess.run(["scontrol", "show", "partition", "--oneliner"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return next(line.split()[0].split("=", 1)[1] for line in out.splitlines() if "Default=YES" in line)


def _two_node_chain(home, partition: str) -> str:
    """A chain of the user's whose script asked for 2 nodes itself (#SBATCH, not in its sbatch options):
    its one segment a real 2-node job that has ended, as the store records it."""
    from chainrun.state.records import ENDED, Chain, Segment
    from chainrun.state.store import Store

    job = subprocess.run(["sbatch", "--parsable", "-N", "2", "-p", partition, "-t", "1", "-J", "cr.shape-0001.0",
                          "--wrap", "sleep 1"], capture_output=True, text=True, timeout=30, check=True
                         ).stdout.strip().split(";")[0]
    # ended, and in the windowed sacct the refresh reads: slurmdbd records a job that started at once
    # with an unknown eligible time for a few seconds, and a time window (-S/-E) leaves it out until then
    # (`sacct -j` shows it at once; the refresh's next read overlaps the last by a day, so it never misses it)
    deadline = time.time() + 120
    while f"{job}|COMPLETED" not in subprocess.run(
            ["sacct", "-n", "-X", "-P", "-a", "-S", "now-3600seconds", "-E", "now", "-o", "JobIDRaw,State"],
            capture_output=True, text=True, timeout=30).stdout.split():
        assert time.time() < deadline, f"the 2-node job {job} did not complete"
        time.sleep(1)
    home.mkdir(parents=True, exist_ok=True)
    store = Store(home / "state.sqlite")
    try:
        c = Chain(id="shape-0001", name="shape", cluster="local", script="/s.sh", workdir="/w", run_dir="/w/r",
                  checkpoint_dir="/w/c", total_s=7200, segment_s=120, policy="predicted", lead_s=60, signal="USR2",
                  signal_lead_s=30, retries=1, sbatch_args=[], partition=partition)
        store.add_chain(c)
        store.save(c, [Segment(c.id, 0, phase=ENDED, job_id=job)])
    finally:
        store.close()
    return job


def test_refresh_tunes_from_the_clusters_history_and_status_shows_it(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    _ensure_history()
    default = _default_partition()
    _two_node_chain(tmp_path, default)
    assert main(["model", "refresh", "--cluster", "local", "--lookback", "2d", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["data"]
    assert list(res["tuning"]) == [default]  # the cluster's default partition (and no chain elsewhere)
    t = res["tuning"][default]
    # the injected chains are shaped like the user's: on the 2 nodes Slurm gave its job, though its
    # options said nothing of nodes (the chain's script asked for them)
    assert t["shape"]["nodes"] == 2 and t["shape"]["source"].endswith("nodes as Slurm gave them to 1"), t["shape"]
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
