"""sacct ingestion (windows, -a fallback, incremental cache), squeue snapshot, cron line."""

from __future__ import annotations

import numpy as np
import pytest

from chainrun.chain import live_score
from chainrun.predict import ingest, service
from chainrun.runner.base import RunResult
from chainrun.paths import home
from chainrun.schedule import begin_marker, end_marker, refresh_name
from chainrun.slurm.client import SACCT_ENV

from .predict_helpers import DATA


class FakeRunner:
    """Answers sacct with canned text; records argv; optionally refuses -a."""

    name = "fake"

    def __init__(self, text="", *, refuse_all=False, crontab=None, uid=1000):
        self.text, self.refuse_all, self.calls, self.uid = text, refuse_all, [], uid
        self.crontab = crontab

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "sacct":
            if self.refuse_all and "-a" in argv:
                return RunResult(tuple(argv), 1, "", "sacct: error: Access denied", 0.0)
            assert env == SACCT_ENV and env["SLURM_TIME_FORMAT"] == "%s"  # epoch out; -S/-E relative to the cluster's now; the user's SACCT_FORMAT unset
            header = "|".join(ingest.LEGACY_FORMAT.split(","))  # the capture's fields, as sacct heads them
            return RunResult(tuple(argv), 0, header + "\n" + self.text if self.text else header + "\n", "", 0.0)
        if argv == ["id", "-u"]:
            return RunResult(tuple(argv), 0, f"{self.uid}\n", "", 0.0)
        if argv[:3] == ["scontrol", "show", "node"]:
            return RunResult(tuple(argv), 0, "".join(f"NodeName=n{i} State=IDLE CPUs=4\n" for i in range(4)), "", 0.0)
        if argv[0] == "squeue":
            return RunResult(tuple(argv), 0, (DATA / "squeue_epoch.txt").read_text(), "", 0.0)
        if argv[:2] == ["crontab", "-l"]:
            if self.crontab is None:
                return RunResult(tuple(argv), 1, "", "no crontab for root", 0.0)
            return RunResult(tuple(argv), 0, self.crontab, "", 0.0)
        if argv[:2] == ["crontab", "-"]:
            self.crontab = stdin
            return RunResult(tuple(argv), 0, "", "", 0.0)
        if argv[:3] == ["scontrol", "show", "config"] or argv[0] == "scrontab":  # no Slurm here: cron only
            return RunResult(tuple(argv), 127, "", f"{argv[0]}: command not found", 0.0)
        raise AssertionError(argv)


EPOCH_ROWS = (DATA / "sacct_P_n_epoch_pending.txt").read_text()


def test_windows_and_all_users():
    r = FakeRunner(EPOCH_ROWS, uid=0)
    res = ingest.fetch_history(r, since=0, now=20 * 86400, window_days=7)
    sacct = [c for c in r.calls if c[0] == "sacct"]
    assert len(sacct) == 3 and all("-a" in c for c in sacct)
    assert res.all_users  # root (on the cluster) sees everyone
    assert res.frame["job_id"].nunique() == len(set(ln.split("|")[0] for ln in EPOCH_ROWS.splitlines()))


def test_falls_back_to_own_jobs_when_a_is_refused():
    r = FakeRunner(EPOCH_ROWS, refuse_all=True)
    res = ingest.fetch_history(r, since=0, now=86400)
    assert not res.all_users and "-a" not in r.calls[-1] and len(res.frame) > 0


def test_private_data_hides_others():
    r = FakeRunner(EPOCH_ROWS)
    res = ingest.fetch_history(r, since=0, now=86400)
    assert not res.all_users  # -a accepted, but only one user came back
    assert ["id", "-u"] in r.calls  # asked where sacct runs (the cluster), not of this process
    assert ingest.fetch_history(FakeRunner(EPOCH_ROWS, uid=0), since=0, now=86400).all_users  # root sees all


def test_history_windows_are_relative_to_the_clusters_now():
    """No wall-clock bound: nothing a time zone (this machine's or the cluster's) could shift."""
    r = FakeRunner(EPOCH_ROWS)
    ingest.fetch_history(r, since=1_700_000_000, now=1_700_000_000 + 20 * 86400, window_days=7)
    bounds = [(c[c.index("-S") + 1], c[c.index("-E") + 1]) for c in r.calls if c[0] == "sacct"]
    assert bounds == [("now-1728000seconds", "now-1123200seconds"), ("now-1123200seconds", "now-518400seconds"),
                      ("now-518400seconds", "now")]


def test_incremental_refresh_merges_and_final_state_wins(tmp_path, monkeypatch):
    from chainrun.predict import training

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    monkeypatch.setattr(training, "MIN_ROWS", 10)  # the capture has 18 started jobs
    pending = EPOCH_ROWS
    now = 1795326600.0 + 3600
    r1 = service.refresh(FakeRunner(pending), cluster="t", now=now)  # no tuner: the tuning: tests/sim/test_selftune.py
    assert r1["new_rows"] >= r1["history_rows"] > 20  # every window answered the same rows
    # the same jobs again, one of them finished meanwhile
    line = next(ln for ln in pending.splitlines() if "|PENDING|" in ln)
    f = line.split("|")
    f[7], f[8], f[14] = str(int(f[5]) + 30), str(int(f[5]) + 90), "COMPLETED"
    r = FakeRunner(pending.replace(line, "|".join(f)))
    r2 = service.refresh(r, cluster="t", now=now + 7200)
    assert r2["history_rows"] == r1["history_rows"]  # no duplicates
    # incremental: from the last refresh less a day of overlap (7200 s + 86400 s before this one)
    assert r.calls[0][r.calls[0].index("-S") + 1] == f"now-{7200 + int(ingest.OVERLAP_S)}seconds"
    hist, info = ingest.load_cache("t")
    assert hist.loc[hist["job_id"] == f[0], "state"].item() == "COMPLETED"
    assert info["last_refresh"] == now + 7200 and info["rows"] == len(hist)


class FailsAtWindow(FakeRunner):
    """sacct times out at its ``fail_at``-th call (1-based); window k's rows carry job ids ``k...``."""

    def __init__(self, fail_at=None, **kw):
        super().__init__(EPOCH_ROWS, uid=0, **kw)
        self.fail_at, self.sacct_calls = fail_at, 0

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if argv[0] != "sacct":
            return super().run(argv, timeout, env=env, stdin=stdin)
        self.sacct_calls += 1
        if self.sacct_calls == self.fail_at:
            self.calls.append(list(argv))
            return RunResult(tuple(argv), -9, "", "", 300.0, timed_out=True)
        k = self.sacct_calls
        self.text = "\n".join(f"{k}{ln}" for ln in EPOCH_ROWS.splitlines() if ln.strip())
        return super().run(argv, timeout, env=env, stdin=stdin)


def test_refresh_keeps_the_windows_read_before_one_fails(tmp_path, monkeypatch):
    """Audit 24, gap 5: each 7-day window is in the cache once read; a failure at window 3 keeps 1-2,
    the refresh still fails in one line, and the next one reads on from window 3."""
    from chainrun.errors import TransientSlurmError
    from chainrun.predict import training

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    monkeypatch.setattr(training, "MIN_ROWS", 10)
    monkeypatch.setattr(ingest, "SAVE_EVERY_S", 0.0)  # every window saved (a slow site's windows take minutes)
    now = 1795326600.0 + 3600
    since = now - 30 * 86400.0  # five windows: 7, 7, 7, 7 and 2 days
    r = FailsAtWindow(fail_at=3)
    with pytest.raises(TransientSlurmError, match="^sacct failed: timed out$"):
        service.refresh(r, cluster="t", now=now, lookback_days=30)
    hist, info = ingest.load_cache("t")
    assert sorted({j[0] for j in hist["job_id"]}) == ["1", "2"]  # windows 1 and 2, each job once
    assert info["last_refresh"] == since + 14 * 86400 and info["rows"] == len(hist) and info["all_users"]
    assert not (tmp_path / "models" / "t" / "meta.json").exists()  # no model from a partial read

    r2 = FailsAtWindow()
    out = service.refresh(r2, cluster="t", now=now)
    first = r2.calls[[c[0] for c in r2.calls].index("sacct")]
    assert first[first.index("-S") + 1] == f"now-{int(now - (since + 14 * 86400) + ingest.OVERLAP_S)}seconds"
    assert out["sacct_calls"] == 3  # 17 days (16 left and the overlap) in three windows, not five
    hist, info = ingest.load_cache("t")
    assert sorted({j[0] for j in hist["job_id"]}) == ["1", "2", "3"]  # the new read's windows 1-3 too
    assert info["last_refresh"] == now and info["rows"] == out["history_rows"] == len(hist)
    assert out["history_rows"] == hist["job_id"].nunique()


def test_live_snapshot_from_squeue():
    snap = ingest.live_snapshot(FakeRunner())
    # job 4 (PartitionTimeLimit) and 2 (Dependency) are not ahead of anyone
    assert sorted(snap["job_id"]) == ["1", "3"]
    assert (snap["state"] == "RUNNING").all() and snap["end"].isna().all()
    assert snap.loc[snap["job_id"] == "3", "gpus"].item() == 1
    assert np.isfinite(snap["start"]).all()


def test_install_cron_is_idempotent(chainrun_home):
    r = FakeRunner(crontab="0 1 * * * backup\n")
    line, changed = service.install_cron(r, "ls6")
    assert changed and r.crontab.splitlines()[:3] == ["0 1 * * * backup", begin_marker(refresh_name("ls6", home())), line]
    line2, changed2 = service.install_cron(r, "ls6")
    assert line2 == line and not changed2 and r.crontab.count("model refresh") == 1
    service.install_cron(r, "other")
    assert r.crontab.count("model refresh") == 2
    assert "--cluster ls6" in line and line.split()[0:5] == ["17", "*/6", "*", "*", "*"]


def test_empty_crontab_gets_the_line(chainrun_home):
    r = FakeRunner(crontab=None)
    line, changed = service.install_cron(r, "local")
    assert changed and r.crontab.splitlines() == [begin_marker(refresh_name("local", home())), line,
                                                  end_marker(refresh_name("local", home()))]


def test_install_cron_replaces_an_earlier_one_line_entry(chainrun_home):
    old = "17 */6 * * * /old/chainrun -q model refresh --cluster ls6 # chainrun-model-refresh ls6\n"
    r = FakeRunner(crontab="0 1 * * * backup\n" + old)
    line, changed = service.install_cron(r, "ls6")
    assert changed and "/old/chainrun" not in r.crontab and r.crontab.startswith("0 1 * * * backup\n")
    assert r.crontab.count("model refresh") == 1 and line in r.crontab


@pytest.mark.parametrize("bad", ["--nodes", "--time"])
def test_predict_rejects_bad_request(bad, tmp_path, monkeypatch, capsys):
    from chainrun.cli.main import main

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    argv = ["predict", "--nodes", "0" if bad == "--nodes" else "1", "--time", "soon" if bad == "--time" else "1h"]
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_predict_without_model_says_refresh(tmp_path, monkeypatch, capsys):
    from chainrun.cli.main import main

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    assert main(["predict", "--nodes", "1", "--time", "1h"]) == 7
    assert "chainrun model refresh" in capsys.readouterr().err


def test_status_scores_what_was_acted_on(tmp_path, monkeypatch):
    """Coverage of the acted-on quantile (at or below it) and the deadline hit rate, from the state store."""
    from chainrun.paths import state_db
    from chainrun.state.records import ENDED, RUNNING, Chain, Segment
    from chainrun.state.store import Store

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    st = Store(state_db())
    c = Chain(id="c1", name="c1", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=4 * 172800, segment_s=172800, policy="predicted", lead_s=3600, signal="USR2",
              signal_lead_s=300, retries=1, sbatch_args=[], partition="p")
    st.add_chain(c)
    segs = [Segment(chain_id="c1", idx=0, phase=ENDED, job_id="1", eligible=0, start=0, end=100_000)]
    # predicted / waited: 2000 / 1000, 500 / 800 (waited longer), 300 / 300 (a tie); each submitted 600 s
    # before its predecessor ended, so only segment 3 (300 s) started in time
    for i, (pred, wait, pend) in enumerate(((2000, 1000, 100_000), (500, 800, 200_000), (300, 300, 300_000)), 1):
        sub = segs[-1].end - 600
        segs.append(Segment(chain_id="c1", idx=i, phase=ENDED if i < 3 else RUNNING, job_id=str(i + 1),
                            eligible=sub, start=sub + wait, end=pend + 100_000, predicted_wait_s=pred))
    # the chance each submission acted on (the slack rule's), kept by the engine; segment 1 predates it
    segs[2].extra["prob_in_time"], segs[3].extra["prob_in_time"] = 0.9, 0.7
    for s in segs:
        st.save_segment(s)
    st.close()
    le = live_score.live_error("local")
    from chainrun.chain.policies import predict_quantile

    assert le["n"] == 3 and le["acted_quantile"] == pytest.approx(predict_quantile(172800))  # the shipped rule's
    assert le["acted_quantile_coverage"] == pytest.approx(2 / 3)  # 800 > 500; 1000 <= 2000 and 300 <= 300
    assert le["waited_longer_than_predicted"] == pytest.approx(1 / 3) and le["verdict"] == "as promised"  # 3 segments cannot tell
    # deadlines decided: segments 1 and 2 (predecessors ended); 3's predecessor (2) ended too
    assert le["deadline_n"] == 3 and le["deadline_hit_rate"] == pytest.approx(1 / 3)
    # segment 2 was sent at 0.9 and started late, segment 3 at 0.7 and in time
    assert le["acted_prob_n"] == 2 and le["acted_prob_mean"] == pytest.approx(0.8)
    assert le["acted_prob_hit_rate"] == pytest.approx(0.5)
    # a segment decided with a tuned boundary cost records the quantile its wait was read at: scored there
    st = Store(state_db())
    for s in segs[1:]:
        s.extra["wait_quantile"] = 0.9
        st.save_segment(s)
    st.close()
    assert live_score.live_error("local")["acted_quantile"] == pytest.approx(0.9)


def test_time_limit_note():
    class Parts(FakeRunner):
        def run(self, argv, timeout=60.0, *, env=None, stdin=None):
            if argv[:3] == ["scontrol", "show", "partition"]:
                text = ("PartitionName=gpu MaxTime=2-00:00:00 Default=YES State=UP TotalNodes=4\n"
                        "PartitionName=dev MaxTime=02:00:00 Default=NO State=UP TotalNodes=1\n")
                return RunResult(tuple(argv), 0, text, "", 0.0)
            return super().run(argv, timeout, env=env, stdin=stdin)

    r = Parts()
    assert service.time_limit_note(r, timelimit_s=24 * 3600) is None
    note = service.time_limit_note(r, timelimit_s=72 * 3600)
    assert "longest partition (gpu) allows 2d" in note and "3d" in note
    assert "partition dev allows at most 2h" in service.time_limit_note(r, timelimit_s=3 * 3600, partition="dev")

    class Broken(FakeRunner):
        def run(self, argv, timeout=60.0, *, env=None, stdin=None):
            return RunResult(tuple(argv), 1, "", "scontrol: error: Invalid user", 0.0)

    assert service.time_limit_note(Broken(), timelimit_s=1e9) is None  # unreadable: no warning, no error


def test_status_verdicts_agree_on_waits_under_a_watcher_tick(tmp_path, monkeypatch):
    """Issue 24: `0 % waited at most the acted-on quantile` beside `100 % within 2x`, for waits of
    a few seconds against a predicted 1 s. Every verdict now compares at the watcher's tick."""
    from chainrun.paths import state_db
    from chainrun.state.records import ENDED, Chain, Segment
    from chainrun.state.store import Store

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    st = Store(state_db())
    st.add_chain(Chain(id="c1", name="c1", cluster="local", script="/s", workdir="/w", run_dir="/r",
                       checkpoint_dir="/c", total_s=600, segment_s=120, policy="predicted", lead_s=3600,
                       signal="USR2", signal_lead_s=30, retries=1, sbatch_args=[], partition="short"))
    for i, wait in enumerate((0, 2, 5, 3, 9)):
        st.save_segment(Segment(chain_id="c1", idx=i, phase=ENDED, job_id=str(i + 1), eligible=1000 * i,
                                start=1000 * i + wait, end=1000 * i + 120, predicted_wait_s=None if i == 0 else 1.0))
    st.close()
    le = live_score.live_error("local")
    assert le["n"] == 4 and le["resolution_s"] == 60
    assert le["acted_quantile_coverage"] == 1.0 and le["within_2x"] == 1.0 and le["waited_longer_than_predicted"] == 0
    assert le["verdict"] == "as promised"


@pytest.mark.parametrize("cov,n,verdict", [(0.0, 4, "too optimistic"), (0.5, 4, "too optimistic"),
                                           (0.75, 4, "as promised"), (0.9, 100, "too optimistic"),
                                           (0.97, 100, "as promised"), (1.0, 1000, "too cautious")])
def test_coverage_verdict_allows_the_binomial_spread_of_n_segments(cov, n, verdict):
    assert live_score.coverage_verdict(cov, 0.98, n) == verdict
