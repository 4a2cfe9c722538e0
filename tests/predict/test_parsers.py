"""sacct parsing on captures from the real test cluster and on hostile values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrun.predict.ingest import SACCT_FORMAT, parse_sacct_rows, sacct_argv
from chainrun.predict.prep import prepare
from chainrun.slurm.timefmt import parse_slurm_duration
from chainrun.traces import TraceFormatError, parse_trace_text, read_trace

from .predict_helpers import DATA, LS6


def test_real_sacct_P_with_pending_running_cancelled():
    df = read_trace(DATA / "sacct_P_iso_pending.txt")
    assert set(df["state"]) >= {"PENDING", "RUNNING", "COMPLETED", "CANCELLED", "FAILED"}
    pend = df[df["state"] == "PENDING"]
    assert pend["start"].isna().all() and pend["end"].isna().all()  # "Unknown"
    run = df[df["state"] == "RUNNING"]
    assert run["start"].notna().all() and run["end"].isna().all()
    assert df["eligible_known"].all()
    # gres/gpu from AllocTRES, or ReqTRES while pending
    assert (df.loc[df["job_id"] == "3", "gpus"] == 1).all()
    assert df["timelimit_s"].dropna().isin([60.0, 120.0, 300.0, 600.0, 3600.0]).all()


def test_real_sacct_epoch_no_header_matches_iso():
    from chainrun.predict.ingest import LEGACY_FORMAT

    e = parse_sacct_rows((DATA / "sacct_P_n_epoch_pending.txt").read_text(), fields=LEGACY_FORMAT)
    i = read_trace(DATA / "sacct_P_iso_pending.txt")
    both = e.merge(i, on="job_id", suffixes=("_e", "_i"))
    assert len(both) >= 40
    # the capture machine runs in UTC, so naive ISO read as UTC equals epoch
    for c in ("submit", "start", "end"):
        a, b = both[f"{c}_e"].to_numpy(), both[f"{c}_i"].to_numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)])


def test_real_sacct_fixed_width_text_with_steps_and_cancelled_by():
    df = read_trace(DATA / "sacct_text_pending.txt")
    assert not df["job_id"].str.contains(r"\.").any()  # 1.batch etc. dropped
    assert "4" in set(df["job_id"])  # "CANCELLED by 0": spaces inside a value
    assert df.loc[df["job_id"] == "4", "state"].item() == "CANCELLED"
    assert df.loc[df["job_id"] == "1", "timelimit_s"].item() == 60.0  # 00:01:00


def test_censored_jobs_are_not_zero_waits():
    p = prepare(read_trace(DATA / "sacct_P_iso_pending.txt"), now=2e9)
    pend = p[p["state"] == "PENDING"]
    assert pend["censored"].all() and pend["wait"].isna().all()
    assert (pend["wait_lb"] > 0).all()
    cancelled = p[(p["state"] == "CANCELLED") & p["start"].isna()]
    assert len(cancelled) and cancelled["censored"].all() and cancelled["wait"].isna().all()
    done = p[p["state"] == "COMPLETED"]
    assert (~done["censored"]).all() and (done["wait"] >= 0).all()


@pytest.mark.parametrize("text,expected", [
    ("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0), ("1-02", 93600.0), ("45", 2700.0),
    ("UNLIMITED", None), ("Partition_Limit", None), ("Unknown", None), ("None", None), ("INVALID", None),
    ("", None), ("  12:00:00 ", 43200.0),
])
def test_durations(text, expected):
    assert parse_slurm_duration(text) == expected


HEADER = "JobIDRaw|User|Submit|Eligible|Start|End|TimelimitRaw|NNodes|AllocTRES|ReqTRES|State|JobName"


def test_hostile_values_in_a_P_dump():
    rows = [
        "10|alice|1700000000|Unknown|None|Unknown|UNLIMITED|1|||PENDING|x",
        "11|alice|1700000000|1700000100|1700000200|1700000300|Partition_Limit|2||gres/gpu=4|COMPLETED|a|b|c",
        "12|bob|1700000000|1700000000|0|1700000010|4294967295|1|||CANCELLED by 0|y",
        "13|bob|garbage|1|2|3|4|5|||COMPLETED|z",
        "14|bob|1700000000|1700000000|1700000000|1700000005|60",  # too few fields: skipped
        "14.batch|bob|1700000000|1700000000|1700000000|1700000005|60|1|||COMPLETED|batch",
        "15|carol|2023-01-01T00:00:00|2023-01-01T00:00:00|2023-01-01T01:00:00|2023-01-01T02:00:00|1440|1|gres/gpu:a100=3,node=1||TIMEOUT|n",
    ]
    df = parse_trace_text(HEADER + "\n" + "\n".join(rows))
    by = df.set_index("job_id")
    assert sorted(by.index) == ["10", "11", "12", "15"]  # 13: no Submit; 14: short row; step dropped
    assert math.isnan(by.loc["10", "timelimit_s"]) and math.isnan(by.loc["10", "start"])
    assert by.loc["10", "eligible"] == 1700000000  # Unknown eligible: submit
    assert math.isnan(by.loc["11", "timelimit_s"]) and by.loc["11", "name"] == "a|b|c"
    assert by.loc["11", "gpus"] == 4  # ReqTRES when AllocTRES is empty
    assert math.isnan(by.loc["12", "timelimit_s"]) and math.isnan(by.loc["12", "start"])
    assert by.loc["12", "state"] == "CANCELLED"
    assert by.loc["15", "timelimit_s"] == 86400.0 and by.loc["15", "gpus"] == 3
    assert by.loc["15", "start"] - by.loc["15", "submit"] == 3600.0


def test_not_a_trace():
    with pytest.raises(TraceFormatError):
        parse_trace_text("")
    with pytest.raises(TraceFormatError):
        parse_trace_text("hello world\n1 2\n")


_field = st.one_of(st.sampled_from(["Unknown", "None", "UNLIMITED", "Partition_Limit", "", "0", "-1", "1-02:03:04",
                                    "2023-02-30T25:61:00", "1700000000", "gres/gpu=x", "CANCELLED by 0", "|", "\t"]),
                   st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r"), max_size=12))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_field, min_size=12, max_size=12), min_size=1, max_size=6))
def test_any_garbage_is_a_clean_error_or_a_frame(rows):
    text = HEADER + "\n" + "\n".join("|".join(r) for r in rows)
    try:
        df = parse_trace_text(text)
    except TraceFormatError:
        return
    assert (df["submit"] > 0).all()
    assert df["nodes"].dtype.kind == "i" and df["gpus"].dtype.kind == "i"


def test_sacct_argv_and_format():
    from chainrun.slurm.parsers import SACCT_FIELDS

    argv = sacct_argv(1_700_000_000, 1_700_086_400, all_users=True)
    assert argv[:3] == ["sacct", "-X", "-P"] and "-n" not in argv and "-a" in argv  # a header: read by name
    assert SACCT_FORMAT == SACCT_FIELDS  # one field list for the watcher and the model
    assert SACCT_FORMAT.split(",")[-1] == "JobName"  # names may hold "|"
    assert "-a" not in sacct_argv(0, 1, all_users=False)


def test_ls6_trace_head():
    if not LS6.exists():
        pytest.skip("LS6 trace not present")
    text = "\n".join(LS6.read_text().splitlines()[:300])
    df = parse_trace_text(text)
    assert len(df) == 298 and not df["eligible_known"].any()
    assert (df["gpus"] == df["nodes"] * 3).all()
    assert df["priority"].notna().all()  # read, but never a feature (test_features checks)


def test_one_sacct_reader_two_speeds():
    """The watcher's row parser and the model's column parser read the same text the same way."""
    from chainrun.slurm.parsers import SACCT_FIELDS, parse_sacct

    head = SACCT_FIELDS.replace(",", "|")
    text = head + "\n" + "\n".join([
        "11|ann|gpu|normal|proj|1700000000|1700000010|1700000100|1700003700|01:00:00|120|2|16|"
        "cpu=16,gres/gpu=4,gres/gpu:a100=4|cpu=16,gres/gpu=4|COMPLETED|0:0|None|n[1-2]|train|a|b",
        "12|bob|gpu|normal|proj|1700000000|1700000000|Unknown|Unknown|00:00:00|60|1|8||gres/gpu:a100=2|PENDING|0:0|Priority|None assigned|x",
        "13|bob|gpu|normal|proj|1700000000|1700000000|1700000005|1700000050|00:00:45|60|1|8||gres/gpu=1|CANCELLED by 0|0:15|None|n3|y",
        "13.batch|bob|gpu|normal|proj|1700000000|1700000000|1700000005|1700000050|00:00:45|60|1|8|||COMPLETED|0:0|None|n3|batch",
    ])
    rows = {r.job_id: r for r in parse_sacct(text)}
    df = parse_sacct_rows(text).set_index("job_id")
    assert sorted(rows) == sorted(df.index) == ["11", "12", "13"]
    for j, r in rows.items():
        d = df.loc[j]
        assert (r.user, r.partition, r.qos, r.account, r.state) == (d.user, d.partition, d.qos, d.account, d.state)
        assert (r.nodes, r.cpus, r.gpus) == (d.nodes, d.cpus, d.gpus)
        assert r.time_limit_s == d.timelimit_s and r.name == d["name"]
        for a, b in ((r.submit, d.submit), (r.eligible, d.eligible), (r.start, d.start), (r.end, d.end)):
            assert (a is None and math.isnan(b)) or a == b
    assert rows["11"].gpus == 4 and rows["11"].name == "train|a|b"  # the typed duplicate is not counted twice
    assert rows["12"].gpus == 2  # pending: ReqTRES
    assert (rows["11"].nodelist, rows["12"].nodelist) == ("n[1-2]", "")  # where it ran; nothing before it ran
