"""chainrun.chain.first_wait: segment 0 of a chain spanning clusters is placed on each site's model where
one was trained (as the watcher estimates a later segment's wait), else on Slurm's ``--test-only`` start."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from chainrun.chain import first_wait, site_plan
from chainrun.chain.policies import WaitEstimate
from chainrun.errors import SlurmError
from chainrun.state.records import Chain

H = 3600.0
T0 = 1.7e9


def chain() -> Chain:
    return Chain(id="train-1a2b", name="train", cluster="a", script="/s.sh", workdir="/w", run_dir="/w/r",
                 checkpoint_dir="/w/c", total_s=int(10 * H), segment_s=int(4 * H), policy="predicted", lead_s=60,
                 signal="USR2", signal_lead_s=300, retries=1, sbatch_args=[], partition="gpu",
                 extra={"sites": ["a", "b"]})


class Queue:
    """A site's Slurm client as far as the model asks it: everyone's queue (counted), or a failure."""

    def __init__(self, rows=(), fails: bool = False):
        self.rows, self.fails, self.asked = list(rows), fails, 0

    def queue(self, *, all_users: bool = False):
        assert all_users, "the model reads the queue ahead: everyone's jobs"
        self.asked += 1
        if self.fails:
            raise SlurmError("squeue: error: Unable to contact slurm controller")
        return self.rows


def models(**hours):
    """predictor_for: site -> a model answering that many hours (absent: no model there)."""
    def predictor_for(name):
        if name not in hours:
            return None
        return lambda view, probe, queue: WaitEstimate(seconds=hours[name] * 2 * H, model=f"model-{name}",
                                                       p10=0.0, p50=hours[name] * H, p90=hours[name] * 3 * H)
    return predictor_for


@pytest.fixture(autouse=True)
def nothing_declared(monkeypatch):
    monkeypatch.setattr(site_plan, "declared_by_site", lambda names: {})


def test_a_model_that_says_the_first_site_is_5_hours_away_starts_the_chain_on_the_second():
    c = chain()
    qa, qb = Queue(), Queue()
    starts = {"a": T0, "b": T0 + 60}  # Slurm's --test-only: a would start at once
    waits = first_wait.first_waits([("a", qa, c), ("b", qb, c)], starts, T0, predictor_for=models(a=5))
    assert waits["a"].model == "model-a" and waits["b"].model == site_plan.TEST_ONLY
    assert (qa.asked, qb.asked) == (1, 0)  # one squeue where there is a model, none where there is not
    choice = site_plan.first_site(c, ["a", "b"], waits)
    assert (choice.site, choice.move) == ("b", False), choice.reason
    est = {e.name: e for e in choice.estimates}
    assert est["a"].wait_s == 5 * H and est["b"].wait_s == 60  # the model's median, not its target quantile
    assert site_plan.wait_sources(waits) == {"a": {"wait_s": 5 * H, "from": "model-a"},
                                         "b": {"wait_s": 60.0, "from": "slurm --test-only"}}
    assert first_wait.note(waits) == "a 5h00m (model-a), b 1m (slurm --test-only)"


def test_without_a_model_the_test_only_starts_place_it_as_before():
    c = chain()
    starts = {"a": T0, "b": T0 + 60}
    waits = first_wait.first_waits([("a", Queue(), c), ("b", Queue(), c)], starts, T0, predictor_for=models())
    assert {n: w.model for n, w in waits.items()} == {"a": "slurm --test-only", "b": "slurm --test-only"}
    assert site_plan.first_site(c, ["a", "b"], waits).site == "a"
    # and a 5 h start there (Slurm's own) moves it as the model did
    waits = first_wait.first_waits([("a", Queue(), c), ("b", Queue(), c)], {"a": T0 + 5 * H, "b": T0}, T0,
                                   predictor_for=models())
    assert site_plan.first_site(c, ["a", "b"], waits).site == "b"
    no_start = first_wait.first_waits([("a", Queue(), c), ("b", Queue(), c)], {"a": T0, "b": None}, T0,
                                      predictor_for=models())
    assert no_start["b"] is None  # then the first site, naming b (tests/chain/test_first_left_out.py)
    assert site_plan.first_site(c, ["a", "b"], no_start).left_out == (("b", site_plan.NO_START),)


def test_a_model_that_cannot_answer_falls_back_to_slurms_start(caplog):
    c = chain()
    caplog.set_level(logging.WARNING)
    starts = {"a": T0 + 120, "b": T0}
    down = Queue(fails=True)
    waits = first_wait.first_waits([("a", down, c), ("b", Queue(), c)], starts, T0, predictor_for=models(a=5))
    assert waits["a"].model == site_plan.TEST_ONLY and waits["a"].p50 == 120
    assert "cluster a: no model estimate for segment 0" in caplog.text and "Unable to contact" in caplog.text
    silent = lambda name: (lambda view, probe, queue: None)  # noqa: E731  (make_predictor's answer to a broken model)
    waits = first_wait.first_waits([("a", Queue(), c), ("b", Queue(), c)], starts, T0, predictor_for=silent)
    assert {n: w.model for n, w in waits.items()} == {"a": site_plan.TEST_ONLY, "b": site_plan.TEST_ONLY}


def test_a_real_trained_model_of_a_full_site_sends_segment_0_elsewhere(tmp_path, monkeypatch):
    """The model chainrun trains and saves (model_dir(site)/meta.json), read as the watcher reads it
    (chain/prediction.py: widened, leaning on Slurm where out of its depth): its jobs all waited ~5 h."""
    from chainrun.predict.service import model_dir
    from chainrun.predict.training import fit_predictor
    from tests.predict.predict_helpers import synthetic_history

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    df = synthetic_history(300)
    df["start"] = df["eligible"] + 5 * H * np.random.default_rng(1).lognormal(0, 0.05, len(df))
    df["end"] = df["start"] + 600
    fit_predictor(df, per_user="never").save(model_dir("a"))
    c = chain()
    waits = first_wait.first_waits([("a", Queue(), c), ("b", Queue(), c)], {"a": T0, "b": T0 + 60}, T0)
    assert waits["a"].model != site_plan.TEST_ONLY and waits["b"].model == site_plan.TEST_ONLY
    assert 4 * H < waits["a"].p50 < 6 * H, waits["a"]
    choice = site_plan.first_site(c, ["a", "b"], waits)
    assert choice.site == "b" and choice.reason.startswith("start on b:"), choice.reason
