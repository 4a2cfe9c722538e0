"""Scheduled ticks (chainrun/schedule.py): entry rendering and parsing, the choice of scrontab or cron,
what a tick records and what `status` makes of it. Fast: tables behind a fake runner, except the last
test, which edits the real crontab (when the `crontab` command is installed) and puts it back.
The real scrontab run is tests/chain/test_schedule_slurm.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from chainrun import schedule
from chainrun.errors import SlurmError, StateError, UsageError
from chainrun.runner.base import RunResult
from chainrun.schedule import begin_marker, end_marker, merge_table, split_table
from chainrun.state.store import Store
from tests.conftest import run_cli


class Tables:
    """A login node's scrontab and crontab, as their commands answer; None: no table yet."""

    name = "fake"

    def __init__(self, *, scron_params="enable", scrontab=None, crontab=None, cron_tool=True, scron_tool=True):
        self.params, self.cron_tool, self.scron_tool = scron_params, cron_tool, scron_tool
        self.tables = {"scrontab": scrontab, "crontab": crontab}
        self.calls = []

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        argv = list(argv)
        self.calls.append(argv)
        ok = lambda out="": RunResult(tuple(argv), 0, out, "", 0.0)  # noqa: E731
        if argv[:3] == ["scontrol", "show", "config"]:
            return ok(f"ScronParameters         = {self.params or '(null)'}\n")
        if argv[:3] == ["scontrol", "show", "partition"]:
            return ok("PartitionName=short Default=YES MaxTime=00:02:00 Nodes=n[1-4] State=UP\n"
                      "PartitionName=long Default=NO MaxTime=01:00:00 Nodes=n[1-4] State=UP\n")
        tool = argv[0]
        if tool in self.tables:
            if (tool == "crontab" and not self.cron_tool) or (tool == "scrontab" and not self.scron_tool):
                return RunResult(tuple(argv), 127, "", f"{tool}: command not found", 0.0)
            if tool == "scrontab" and "enable" not in (self.params or ""):
                return RunResult(tuple(argv), 1, "", "scrontab: fatal: scrontab is disabled on this cluster", 0.0)
            if argv[1] == "-l":
                t = self.tables[tool]
                return ok(t) if t is not None else RunResult(tuple(argv), 1, "no crontab for alice\n", "", 0.0)
            if argv[1] == "-":
                self.tables[tool] = stdin
                return ok()
            if argv[1] == "-r":
                self.tables[tool] = None
                return ok()
        raise AssertionError(argv)


USER = "#SCRON --job-name=mine -p long\n0 3 * * * /home/alice/backup.sh\n"


@pytest.fixture
def store(chainrun_home):
    st = Store(chainrun_home / "state.sqlite")
    yield st
    st.close()


# ------------------------------------------------------------------------------------------- period
@pytest.mark.parametrize("text,secs,spec", [("1m", 60, "* * * * *"), ("5m", 300, "*/5 * * * *"),
                                            ("30m", 1800, "*/30 * * * *"), ("1h", 3600, "7 * * * *"),
                                            ("6h", 21600, "7 */6 * * *")])
def test_every_and_its_cron_spec(text, secs, spec):
    assert schedule.parse_every(text) == secs and schedule.cron_spec(secs) == spec


@pytest.mark.parametrize("bad", ["7m", "90s", "30s", "5h", "1d", "soon"])
def test_every_that_cannot_repeat_evenly_is_refused(bad):
    with pytest.raises(UsageError):
        schedule.parse_every(bad)


def test_next_fire_is_the_next_multiple_in_local_time():
    now = time.mktime((2026, 11, 26, 10, 3, 20, 0, 0, -1))
    assert schedule.next_fire(300, now) == time.mktime((2026, 11, 26, 10, 5, 0, 0, 0, -1))
    assert schedule.next_fire(60, now) == time.mktime((2026, 11, 26, 10, 4, 0, 0, 0, -1))
    assert schedule.next_fire(7200, now) == time.mktime((2026, 11, 26, 10, 7, 0, 0, 0, -1))  # "7 */2 * * *"
    assert schedule.next_fire(7200, now + 300) == time.mktime((2026, 11, 26, 12, 7, 0, 0, 0, -1))


# ------------------------------------------------------------------------------------------- entries
def test_command_has_absolute_paths_and_its_environment(tmp_path):
    home = tmp_path / "my home;x"
    cmd = schedule.tick_command(home=home, source="scrontab", argv=["/opt/py/bin/python", "-m", "chainrun.cli.main"],
                                log=home / "logs" / "tick.log", environ={"SLURM_CONF": "/etc/s.conf", "PATH": "/x"})
    words = __import__("shlex").split(cmd.split(" >> ")[0])
    assert words[0] == f"CHAINRUN_HOME={home}" and "CHAINRUN_TICK=scrontab" in words
    assert "SLURM_CONF=/etc/s.conf" in words and words[-3:] == ["/opt/py/bin/python", "-m", "chainrun.cli.main"]
    path = next(w for w in words if w.startswith("PATH=")).split("=", 1)[1].split(":")
    assert all(p.startswith("/") for p in path)
    with pytest.raises(UsageError):
        schedule.tick_command(home=tmp_path / "100%", source="x", argv=["/p"], log=tmp_path / "l", environ={})


def test_block_replaces_only_itself_and_repeats_to_the_same_table():
    block = schedule.render_block("tick", "scrontab", "*/5 * * * *", "run-it", ["--job-name=cr.tick", "--time=2"])
    assert block == [begin_marker("tick"), "#SCRON --job-name=cr.tick", "#SCRON --time=2", "*/5 * * * * run-it",
                     end_marker("tick")]
    once = merge_table(USER, "tick", block)
    assert once.startswith(USER) and merge_table(once, "tick", block) == once
    assert merge_table(once, "tick", []) == USER
    # another entry of chainrun's (a model refresh) is not this one
    both = merge_table(once, "model-refresh ls6", ["# chainrun:model-refresh ls6 begin", "x", end_marker("model-refresh ls6")])
    assert merge_table(both, "tick", []).count("model-refresh") == 2 and "run-it" not in merge_table(both, "tick", [])


def test_a_block_scrontab_disabled_or_the_user_cut_is_still_found():
    disabled = [begin_marker("tick"), "#DISABLED: #SCRON --time=2", "#DISABLED: */5 * * * * run-it", end_marker("tick")]
    kept, ours = split_table(USER + "\n".join(disabled) + "\n# after\n", "tick")
    assert ours == disabled and "\n".join(kept) + "\n" == USER + "# after\n"
    # the end marker deleted: the block ends at its command line, the user's lines after it stay
    cut = USER + begin_marker("tick") + "\n*/5 * * * * run-it\n1 1 * * * /home/alice/other.sh\n"
    kept, ours = split_table(cut, "tick")
    assert ours == [begin_marker("tick"), "*/5 * * * * run-it"] and kept[-1] == "1 1 * * * /home/alice/other.sh"


# ------------------------------------------------------------------------------------------- choice
def test_scrontab_where_the_site_enables_it_else_cron_and_why():
    assert schedule.choose_via(Tables()).via == "scrontab"
    c = schedule.choose_via(Tables(scron_params=None))
    assert c.via == "cron" and "ScronParameters=(null)" in c.why
    c = schedule.choose_via(Tables(scron_tool=False))
    assert c.via == "cron" and "not installed" in c.why
    with pytest.raises(SlurmError, match="cannot use scrontab: ScronParameters"):
        schedule.choose_via(Tables(scron_params="", crontab=""), "scrontab")
    with pytest.raises(SlurmError, match="scrontab: .*cron: the crontab command is not installed"):
        schedule.choose_via(Tables(scron_params=None, cron_tool=False))
    with pytest.raises(UsageError):
        schedule.choose_via(Tables(), "at")


def test_install_twice_then_uninstall_leaves_the_users_entries(store, monkeypatch):
    t = Tables(scrontab=USER)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/test.conf")
    first = schedule.install_ticks(t, store, every_s=300)
    assert first.via == "scrontab" and first.changed
    text = t.tables["scrontab"]
    assert text.startswith(USER) and "#SCRON --job-name=cr.tick" in text and "#SCRON --partition=short" in text
    assert "#SCRON --time=2" in text  # within short's MaxTime of 2 min
    assert "SLURM_CONF=/etc/slurm/test.conf" in text and "watch --once --plain" in text
    assert not schedule.install_ticks(t, store, every_s=300).changed and t.tables["scrontab"] == text
    rec = schedule.schedule_record(store, "tick")
    assert rec["via"] == "scrontab" and rec["every_s"] == 300
    gone = schedule.uninstall_ticks(t, store)
    assert list(gone.lines) == ["scrontab"] and t.tables["scrontab"] == USER
    assert schedule.schedule_record(store, "tick") is None


def test_the_installed_refresh_entry_is_the_printed_one_and_niced(store, monkeypatch):
    """`model refresh --install-cron` installs exactly what `--print-cron` shows (one command builder,
    schedule.refresh_argv): niced, in cron and in scrontab alike."""
    from chainrun.predict.service import cron_line

    for tables, via in ((Tables(scron_params="", crontab=USER), "cron"), (Tables(scrontab=USER, cron_tool=False), "scrontab")):
        res = schedule.install_refresh(tables, "ls6")
        table = tables.tables["crontab" if via == "cron" else via]
        installed = [ln for ln in table.splitlines() if "model refresh --cluster ls6" in ln]
        assert installed == [cron_line("ls6")], (installed, cron_line("ls6"))
        words = installed[0].split()
        assert words[words.index("-n") - 1].endswith("nice") and words[words.index("-n") + 1] == "10", words
        assert res.via == via


def test_each_home_has_its_own_entry(store, tmp_path, monkeypatch):
    t = Tables(scrontab=USER)
    schedule.install_ticks(t, store)  # this home
    other = tmp_path / "other-home"
    monkeypatch.setenv("CHAINRUN_HOME", str(other))
    st2 = Store(other / "state.sqlite")
    try:
        schedule.install_ticks(t, st2)
        assert t.tables["scrontab"].count("watch --once --plain") == 2
        schedule.uninstall_ticks(t, st2)
    finally:
        st2.close()
    kept = t.tables["scrontab"]
    assert kept.count("watch --once --plain") == 1 and str(other) not in kept and kept.startswith(USER)


def test_moving_to_cron_removes_the_scrontab_entry(store):
    t = Tables(scrontab=USER, crontab="0 1 * * * backup\n")
    schedule.install_ticks(t, store, every_s=300)
    res = schedule.install_ticks(t, store, every_s=600, via="cron")
    assert res.via == "cron" and t.tables["scrontab"] == USER
    assert t.tables["crontab"].startswith("0 1 * * * backup\n") and "*/10 * * * *" in t.tables["crontab"]
    assert f"CHAINRUN_TICK=cron@{res.host}" in t.tables["crontab"]  # a crontab line records its host


def test_a_crontab_on_another_login_node_is_refused(store, monkeypatch):
    t = Tables(scron_params=None, crontab="")
    monkeypatch.setattr(schedule.socket, "gethostname", lambda: "login1")
    schedule.install_ticks(t, store)
    monkeypatch.setattr(schedule.socket, "gethostname", lambda: "login2")
    with pytest.raises(StateError, match="ticks already come from the crontab on login1"):
        schedule.install_ticks(Tables(scron_params=None, crontab=""), store)
    gone = schedule.uninstall_ticks(Tables(scron_params=None, crontab=""), store)  # the host is gone for good
    assert "login1" in gone.note and schedule.install_ticks(Tables(scron_params=None, crontab=""), store).changed


# ------------------------------------------------------------------------------------------- a tick
def test_a_tick_inside_a_job_drops_the_jobs_slurm_variables_and_records_itself(store):
    env = {"SLURM_JOB_ID": "41", "SLURM_CPUS_PER_TASK": "1", "SLURM_MEM_PER_NODE": "1024", "SLURM_CONF": "/c",
           "SLURM_JOB_NAME": "cr.tick", "SBATCH_ACCOUNT": "p", "PATH": "/bin", schedule.TICK_ENV: "scrontab"}
    removed = schedule.tick_started(store, env, now=1000.0)
    assert "SLURM_CPUS_PER_TASK" in removed and not [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]
    assert env["SLURM_CONF"] == "/c" and env["SBATCH_ACCOUNT"] == "p"  # the user's sbatch defaults stay
    tick = json.loads(store.get_meta("schedule:last_tick"))
    assert tick["source"] == "scrontab" and tick["job"] == "41" and tick["at"] == 1000.0
    outside = {"SLURM_CONF": "/c", "SLURM_TIME_FORMAT": "%s"}  # not in a job: nothing removed, nothing recorded
    assert schedule.tick_started(store, outside) == [] and outside == {"SLURM_CONF": "/c", "SLURM_TIME_FORMAT": "%s"}


def test_status_shows_the_source_last_next_and_late_ticks(store):
    assert schedule.tick_status(store) is None
    schedule.set_record(store, "tick", {"via": "cron", "host": "login1", "every_s": 300, "installed": 0.0,
                                        "log": "/h/logs/tick.log"})
    now = time.mktime((2026, 11, 26, 10, 3, 20, 0, 0, -1))
    store.set_meta("schedule:last_tick", json.dumps({"at": now - 200, "source": "cron@login1"}))
    ts = schedule.tick_status(store, now)
    assert ts.source == "cron on login1" and ts.last == now - 200 and ts.next == now + 100 and not ts.late
    ts = schedule.tick_status(store, now + 900)
    assert ts.late.startswith("ticks are late: last tick 18m20s ago, expected every 5m") and "login1" in ts.late
    from chainrun.cli.tables import tick_lines

    lines = tick_lines(ts, 200, now=now + 900)
    assert lines[0].startswith("ticks: cron on login1 every 5m; last ") and lines[1].startswith("warning: ticks")


def test_history_ignores_tick_jobs():
    import pandas as pd

    from chainrun.predict.ingest import merge_history

    rows = pd.DataFrame({"job_id": ["1", "2", "3"], "name": ["train", schedule.TICK_JOB_NAME, schedule.REFRESH_JOB_NAME],
                         "submit": [1.0, 2.0, 3.0]})
    assert list(merge_history(None, rows)["job_id"]) == ["1"]


# ------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("args", [["--install-schedule", "--uninstall-schedule"], ["--every", "5m"],
                                  ["--install-schedule", "--every", "7m"], ["--install-schedule", "--once"],
                                  ["--uninstall-schedule", "--via", "cron"]])
def test_bad_schedule_options_are_one_line_errors(args, chainrun_home):
    p = run_cli("watch", *args, home=chainrun_home)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr


@pytest.mark.skipif(not shutil.which("crontab"), reason="the crontab command is not installed (apt-get install cron)")
def test_real_crontab_install_repeat_uninstall(chainrun_home):
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    seed = "# the user's own\n0 4 * * * /bin/true\n"
    subprocess.run(["crontab", "-"], input=seed, text=True, check=True)
    try:
        p = run_cli("watch", "--install-schedule", "--via", "cron", "--every", "10m", home=chainrun_home)
        assert p.returncode == 0, p.stderr
        assert "the crontab of" in p.stdout and "why cron: asked for with --via cron" in p.stdout
        table = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout
        assert table.startswith(seed) and "*/10 * * * * CHAINRUN_HOME=" in table
        again = run_cli("watch", "--install-schedule", "--via", "cron", "--every", "10m", home=chainrun_home)
        assert "already in" in again.stdout
        assert subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout == table
        st = run_cli("status", "--plain", home=chainrun_home, env={"COLUMNS": "200"})
        assert "ticks: cron on " in st.stdout and "last none yet" in st.stdout, st.stdout
        p = run_cli("watch", "--uninstall-schedule", home=chainrun_home)
        assert "removed from your crontab" in p.stdout
        assert subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout == seed
    finally:
        if before.returncode == 0:
            subprocess.run(["crontab", "-"], input=before.stdout, text=True)
        else:
            subprocess.run(["crontab", "-r"], capture_output=True)
