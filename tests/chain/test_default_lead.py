"""`predicted`'s floor is its own default (the tuning procedure's pick), not the `lead` policy's lead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chainrun.chain.policies import DEFAULT_LEAD_S, PREDICTED_FLOOR_S, default_lead_s
from tests.conftest import run_cli

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "sim-tune-ls6.json"


def test_each_policy_has_its_default_lead():
    assert default_lead_s("predicted") == PREDICTED_FLOOR_S
    assert default_lead_s("lead") == DEFAULT_LEAD_S and default_lead_s("reactive") == DEFAULT_LEAD_S


def test_the_shipped_floor_and_target_are_what_the_committed_procedure_picked():
    from chainrun.chain.policies import predict_quantile

    doc = json.loads(RESULTS.read_text())
    picked = doc["data"]["tune"]["choose"]["picked"]
    segment_s = doc["data"]["tune"]["score"]["chains"]["segment_h"] * 3600
    assert picked["floor_s"] == PREDICTED_FLOOR_S
    assert picked["target"] is None or predict_quantile(segment_s) == pytest.approx(picked["target"])


def test_the_shipped_guard_share_is_what_the_committed_procedure_picked():
    from chainrun.chain.policies import MAX_LEAD_SHARE

    picked = json.loads(RESULTS.read_text())["data"]["tune"]["choose"]["picked"]
    assert picked["lead_share"] == pytest.approx(MAX_LEAD_SHARE)


def test_the_shipped_rule_and_boundary_cost_are_what_the_committed_procedure_picked():
    from chainrun.chain.policies import PREDICTED_RULE, TRANSITION_COST_S, Predicted, get_policy

    picked = json.loads(RESULTS.read_text())["data"]["tune"]["choose"]["picked"]
    assert picked["rule"] == PREDICTED_RULE
    assert picked["transition_cost_s"] == pytest.approx(TRANSITION_COST_S)
    shipped = get_policy("predicted")  # what `chainrun submit --policy predicted` runs
    assert isinstance(shipped, Predicted) and shipped.rule == PREDICTED_RULE


@pytest.mark.slurm
def test_submit_stores_the_policy_default_unless_lead_is_given(slurm_cluster, chainrun_home, tmp_path):
    from chainrun.context import open_context

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nsleep 1\n")
    chains = {}
    for key, args in {"pred": ["--policy", "predicted"], "pred10m": ["--policy", "predicted", "--lead", "10m"],
                      "lead": ["--policy", "lead"]}.items():
        p = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@30", *args, "--json", "--", "--hold",
                    home=chainrun_home, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        chains[key] = json.loads(p.stdout)["data"]["chain"]
    try:
        c = open_context("local")
        try:
            lead = {k: c.store.chain(v).lead_s for k, v in chains.items()}
        finally:
            c.close()
        assert lead == {"pred": PREDICTED_FLOOR_S, "pred10m": 600, "lead": DEFAULT_LEAD_S}
    finally:
        for v in chains.values():
            run_cli("cancel", v, home=chainrun_home)
