"""`predicted` is the default policy wherever the cluster has a queue-delay model; without one
`submit` uses `lead` and says in one line how to get the model (issue 24)."""

from __future__ import annotations

import pytest

from chainrun.chain.create import default_policy
from chainrun.chain.policies import DEFAULT_LEAD_S, PREDICTED_FLOOR_S
from tests.conftest import run_cli


def _save_model(cluster: str) -> None:
    from chainrun.predict.training import fit_predictor
    from chainrun.predict.service import model_dir
    from tests.predict.predict_helpers import synthetic_history

    fit_predictor(synthetic_history(300), per_user="never").save(model_dir(cluster))


def test_without_a_model_the_default_is_lead_and_says_how_to_get_one(chainrun_home):
    policy, note = default_policy("local")
    assert policy == "lead" and "\n" not in note
    assert "`chainrun model refresh --install-cron`" in note
    assert default_policy("ls6")[1].count("`chainrun model refresh --cluster ls6 --install-cron`") == 1


def test_with_a_model_the_default_is_predicted_for_that_cluster_only(chainrun_home):
    _save_model("local")
    assert default_policy("local")[0] == "predicted"
    assert default_policy("ls6")[0] == "lead"


@pytest.mark.slurm
def test_submit_without_policy_follows_the_model(slurm_cluster, chainrun_home, tmp_path):
    from tests.predict.test_slurm_e2e import _ensure_history

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nsleep 1\n")
    chains = []

    def submit(*extra: str) -> str:
        p = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@30", *extra, "--", "--hold",
                    home=chainrun_home, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        chains.append(p.stdout.split()[1].rstrip(":"))
        return p.stdout

    try:
        out = submit()
        lines = [ln for ln in out.splitlines() if "model refresh" in ln]
        assert len(lines) == 1 and lines[0].startswith("policy lead: no queue-delay model for local yet")
        assert f"chain {chains[-1]}:" in out and "policy lead" in out.splitlines()[0]

        _ensure_history()
        r = run_cli("model", "refresh", "--lookback", "2d", "--json", home=chainrun_home, timeout=300)
        assert r.returncode == 0, r.stderr
        out = submit()
        assert "policy predicted" in out.splitlines()[0] and "model refresh" not in out
        out = submit("--policy", "lead")  # a pinned policy is kept, and nothing is said about it
        assert "policy lead" in out.splitlines()[0] and "default" not in out

        from chainrun.context import open_context

        c = open_context("local")
        try:
            got = [(c.store.chain(ch).policy, c.store.chain(ch).lead_s) for ch in chains]
        finally:
            c.close()
        assert got == [("lead", DEFAULT_LEAD_S), ("predicted", PREDICTED_FLOOR_S), ("lead", DEFAULT_LEAD_S)]
    finally:
        for ch in chains:
            run_cli("cancel", ch, home=chainrun_home)
