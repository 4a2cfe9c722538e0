"""Parsers on output captured from the real test cluster (tests/data) and on hostile text."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrun.slurm import parsers
from chainrun.slurm.parsers import SlurmParseError
from chainrun.slurm.timefmt import parse_slurm_duration, parse_slurm_timestamp

DATA = Path(__file__).resolve().parents[1] / "data"


def test_sbatch_parsable_forms():
    assert parsers.parse_sbatch_parsable("123\n") == ("123", None)
    assert parsers.parse_sbatch_parsable("123;cluster-a\n") == ("123", "cluster-a")
    # some sites print warnings before the id
    assert parsers.parse_sbatch_parsable("sbatch: warning: foo\n456\n") == ("456", None)
    with pytest.raises(SlurmParseError):
        parsers.parse_sbatch_parsable("Submitted batch job 12 on cluster x\n")
    with pytest.raises(SlurmParseError):
        parsers.parse_sbatch_parsable("")


@pytest.mark.parametrize("name", ["squeue_iso.txt", "squeue_epoch.txt"])
def test_squeue_real_output(name):
    rows = {r.job_id: r for r in parsers.parse_squeue((DATA / name).read_text())}
    assert set(rows) == {"1", "2", "3", "4"}
    assert rows["2"].state == "PENDING" and rows["2"].reason == "Dependency"
    assert rows["2"].dependency == "afterany:1(unfulfilled)" and rows["2"].start is None
    assert rows["4"].reason == "PartitionTimeLimit" and rows["4"].time_limit_s == 300
    run = rows["1"]
    assert run.state == "RUNNING" and run.name == "cr.demo.0" and run.comment == "chainrun demo 0"
    assert run.end - run.start == 60  # the real end squeue reports: start + limit
    assert rows["3"].gpus == 1 and rows["3"].cpus == 2


def test_squeue_iso_and_epoch_agree():
    iso = parsers.parse_squeue((DATA / "squeue_iso.txt").read_text())
    ep = parsers.parse_squeue((DATA / "squeue_epoch.txt").read_text())
    # ISO is read as this machine's local time; the capture was made in UTC
    import os, time
    if time.strftime("%z") == "+0000" or os.environ.get("TZ") in ("UTC", "Etc/UTC"):
        assert [r.submit for r in iso] == [r.submit for r in ep]


def test_squeue_name_with_separator_and_bad_rows():
    text = "JOBID|USER|STATE|NAME\n7|u|RUNNING|a|b|c\nbroken line\n"
    rows = parsers.parse_squeue(text)
    assert len(rows) == 1 and rows[0].name == "a|b|c"


@pytest.mark.parametrize("name", ["sacct_iso.txt", "sacct_epoch.txt"])
def test_sacct_real_output(name):
    rows = {r.job_id: r for r in parsers.parse_sacct((DATA / name).read_text())}
    assert rows["1"].state == "FAILED" and rows["1"].exit_signal == 12  # killed by USR2 without a trap
    assert rows["2"].wait_s == 0 and rows["2"].eligible - rows["2"].submit == 14  # eligible after its dependency
    assert rows["3"].gpus == 1 and rows["3"].time_limit_s == 120
    assert rows["4"].state == "CANCELLED" and rows["4"].state_detail == "CANCELLED by 0"
    assert rows["4"].start is None and rows["4"].wait_s is None  # never started: censored, not zero


def test_sacct_skips_steps_and_reads_hostile_values():
    text = (
        "JobIDRaw|JobName|State|ExitCode|Start|End|Eligible|Elapsed|TimelimitRaw\n"
        "9|x|RUNNING|0:0|Unknown|Unknown|None|INVALID|UNLIMITED\n"
        "9.batch|batch|RUNNING|0:0|Unknown|Unknown|None|00:00:01|\n"
        "10|y|PENDING|0:0|None|None|Unknown|00:00:00|Partition_Limit\n"
    )
    rows = parsers.parse_sacct(text)
    assert [r.job_id for r in rows] == ["9", "10"]
    assert rows[0].time_limit_s is None and rows[0].start is None and rows[0].elapsed_s is None
    with pytest.raises(SlurmParseError, match="unreadable START"):
        parsers.parse_sacct("JobIDRaw|Start\n11|yesterday\n")


def test_partitions_real_output():
    parts = parsers.parse_partitions((DATA / "scontrol_partition.txt").read_text())
    assert parts["short"].max_time_s == 120 and parts["short"].is_default
    assert parts["long"].max_time_s == 3600 and not parts["long"].is_default
    assert parsers.parse_partitions("PartitionName=gpu MaxTime=UNLIMITED Default=NO\n")["gpu"].max_time_s is None


def test_test_only_and_config():
    err = "sbatch: Job 19 to start at 2026-11-22T04:59:14 using 1 processors on nodes n1 in partition short"
    assert parsers.parse_test_only(err) is not None
    assert parsers.parse_test_only("nothing") is None
    assert parsers.parse_config_value("PriorityFlags           = ACCRUE_ALWAYS\n", "priorityflags") == "ACCRUE_ALWAYS"


@pytest.mark.parametrize(
    "text,seconds",
    [("1-02:03:04", 93784), ("02:03", 123), ("00:01.234", 1.234), ("2880", 172800), ("1-12", 129600),
     ("12:00:00", 43200), ("UNLIMITED", None), ("Partition_Limit", None), ("INVALID", None), ("", None)],
)
def test_slurm_durations(text, seconds):
    got = parse_slurm_duration(text)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


@given(st.text(max_size=30))
def test_duration_and_timestamp_parsers_only_raise_valueerror(text):
    for fn in (parse_slurm_duration, parse_slurm_timestamp):
        try:
            fn(text)
        except ValueError:
            pass


@given(st.text(alphabet="0123456789|:-TNoneUknw\n ", max_size=200))
def test_table_parsers_never_crash_on_noise(text):
    for fn in (parsers.parse_squeue, parsers.parse_sacct):
        try:
            fn(text)
        except SlurmParseError:
            pass


@pytest.mark.parametrize("text,n", [
    ("gres/gpu=4,gres/gpu:a100=4", 4),  # the total and the typed count of the same GPUs
    ("gres/gpu:a100=4,gres/gpu=4", 4),
    ("cpu=8,mem=64G,node=1,billing=8,gres/gpu:a100=2", 2),
    ("gres/gpu:a100:2,gres/gpu:v100:1", 3),
    ("gres:gpu:2", 2), ("gpu:a100:2(IDX:0-1)", 2), ("gres/gpu=1,gres/gpumem=40G", 1),
    ("N/A", 0), ("", 0), (None, 0), ("cpu=1,mem=1G", 0),
])
def test_one_tres_reader(text, n):
    assert parsers.gpus_from_tres(text) == n
    from chainrun.traces import parse_trace_text

    if text:  # the trace reader uses the same function
        df = parse_trace_text(f"JobID|User|Submit|Start|End|TimelimitRaw|AllocTRES\n1|u|1700000000|1700000001|1700000002|10|{text}\n")
        assert df["gpus"].item() == n


@pytest.mark.parametrize("name", ["sacct_fields_epoch_steps.txt", "sacct_epoch.txt", "sacct_iso.txt",
                                  "sacct_P_iso_pending.txt"])
def test_row_and_column_readers_agree_on_real_output(name):
    """The watcher's row parser and the columnar reader (model history, replay traces) read the
    same captured sacct output the same way: one header mapping, one set of value rules."""
    import math

    from chainrun.traces import parse_trace_text

    text = (DATA / name).read_text()
    rows = {r.job_id: r for r in parsers.parse_sacct(text)}
    df = parse_trace_text(text).set_index("job_id")
    steps = [ln.split("|")[0] for ln in text.splitlines()[1:] if "." in ln.split("|")[0]]
    assert sorted(rows) == sorted(df.index) and not set(steps) & set(rows)
    if name.startswith("sacct_fields"):  # the capture made with the one field list, steps included
        assert steps and len(rows) > 50 and {r.state for r in rows.values()} >= {"COMPLETED", "FAILED", "TIMEOUT",
                                                                                   "CANCELLED"}
        assert any(r.gpus for r in rows.values())
    iso = "iso" in name  # zone-less ISO: the watcher reads local time, traces keep the wall clock (UTC)
    for j, r in rows.items():
        d = df.loc[j]
        assert (r.user, r.name, r.partition, r.qos, r.account, r.state) == \
               (d.user, d["name"], d.partition, d.qos, d.account, d.state)
        assert (r.nodes, r.cpus, r.gpus) == (d.nodes, d.cpus, d.gpus)
        assert r.time_limit_s == d.timelimit_s or (r.time_limit_s is None and math.isnan(d.timelimit_s))
        assert f"{r.exit_code}:{r.exit_signal}" == d.exit_code
        for a, b in ((r.submit, d.submit), (r.eligible, d.eligible), (r.start, d.start), (r.end, d.end)):
            if a is None:
                assert math.isnan(b) or b == d.submit  # eligible unknown: the columnar reader copies Submit
            elif iso:
                assert b - d.submit == a - r.submit
            else:
                assert a == b


def test_sacct_value_rules():
    """The rules both readers call (parsers.acct_*): sentinels, NO_VAL, garbage."""
    assert parsers.acct_limit_s("120") == 7200 and parsers.acct_limit_s("1-00:00:00") == 86400
    assert parsers.acct_limit_s("4294967294") is None and parsers.acct_limit_s("UNLIMITED") is None
    assert parsers.acct_limit_s("Partition_Limit") is None
    with pytest.raises(ValueError):
        parsers.acct_limit_s("soon")
    assert parsers.acct_count("4", 1) == 4 and parsers.acct_count("", 1) == 1 and parsers.acct_count("-3", 0) == 0
    assert parsers.acct_count("²", 0) == 0 and parsers.acct_count("9" * 12, 1) == 1
    assert parsers.acct_time("1700000000") == 1.7e9 and parsers.acct_time("0") is None
    assert parsers.acct_time("Unknown") is None
    assert parsers.acct_time("2023-11-14T22:13:20", naive_utc=True) == 1.7e9
    assert parsers.acct_gpus("", "gres/gpu=2") == 2 and parsers.acct_gpus("gres/gpu=4", "gres/gpu=2") == 4
    assert parsers.is_step("12.batch") and not parsers.is_step("12")


_value = st.one_of(st.sampled_from(["", "Unknown", "None", "0", "UNLIMITED", "Partition_Limit", "4294967294", "N/A",
                                    "1-00:00:00", "02:03", "2023-01-02T03:04:05+02:00", "2023-01-02T03:04:05", "gres/gpu=2", "gres/gpu:a100=4",
                                    "-1", "1.5", "²"]),
                   st.integers(0, 2_000_000_000).map(str), st.text(alphabet="0123456789:-TNUa/=,", max_size=12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_value, _value, _value, _value, _value, _value), min_size=1, max_size=6))
def test_row_and_column_readers_agree_on_any_values(rows):
    """Hostile values, field by field: where the row parser reads a value, the columnar reader
    reads the same; where the row parser refuses it (SlurmParseError), the columnar one says unknown."""
    import math

    from chainrun.traces import parse_trace_text

    head = "JobIDRaw|User|Submit|Start|End|TimelimitRaw|NNodes|NCPUS|AllocTRES|ReqTRES|JobName"
    lines = [head] + [f"{i + 1}|u|1700000000|{a}|{b}|{c}|{d}|{e}|{f}|{a}|n" for i, (a, b, c, d, e, f) in enumerate(rows)]
    text = "\n".join(lines) + "\n"
    df = parse_trace_text(text).set_index("job_id")
    for ln in lines[1:]:
        one = head + "\n" + ln + "\n"
        j = ln.split("|")[0]
        try:
            (r,) = parsers.parse_sacct(one)
        except SlurmParseError:
            continue
        d = df.loc[j]
        raw = ln.split("|")
        for a, b, iso in ((r.start, d.start, not raw[3].strip().isdigit()), (r.end, d.end, not raw[4].strip().isdigit()),
                          (r.time_limit_s, d.timelimit_s, False)):
            if a is not None and iso:  # zone-less ISO: local time for the watcher, wall clock for traces, by design
                assert not math.isnan(b)
                continue
            assert (a is None and math.isnan(b)) or a == b
        assert (r.nodes, r.cpus, r.gpus) == (d.nodes, d.cpus, d.gpus)
