"""Property tests for every parser chainrun applies to text it did not write, and the duration grammar.

Two kinds of property: *round trip* (what Slurm would print for a value parses back to that
value) and *closed failure* (on any text at all, a parser returns or raises its own error
type, never anything a user would see as a traceback).
"""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from chainrun.chain.contract import parse_outcome
from chainrun.durations import format_duration, parse_duration, to_slurm_minutes, to_slurm_time
from chainrun.errors import ChainrunError, SlurmError, TransientSlurmError, UsageError
from chainrun.runner.base import RunResult
from chainrun.slurm import parsers
from chainrun.slurm.client import SlurmClient, SlurmRefused, is_refusal, is_transient
from chainrun.slurm.parsers import SlurmParseError
from chainrun.slurm.timefmt import parse_slurm_duration, parse_slurm_timestamp

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
YEAR = 365 * 86400

# ------------------------------------------------------------------ the duration grammar
parts = st.tuples(st.integers(0, 364), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))


def _seconds(p):
    d, h, m, s = p
    return d * 86400 + h * 3600 + m * 60 + s


@FAST
@given(parts, st.permutations("dhms"), st.booleans())
def test_unit_form_round_trips(p, order, upper):
    assume(0 < _seconds(p) <= YEAR)
    value = dict(zip("dhms", p))
    text = "".join(f"{value[u]}{u}" for u in order if value[u])
    assert parse_duration(text.upper() if upper else text) == _seconds(p)


@FAST
@given(parts)
def test_clock_form_round_trips(p):
    assume(0 < _seconds(p) <= YEAR)
    d, h, m, s = p
    assert parse_duration(f"{d}-{h:02d}:{m:02d}:{s:02d}") == _seconds(p)
    if d == 0:
        assert parse_duration(f"{h}:{m:02d}:{s:02d}") == _seconds(p)


@FAST
@given(st.integers(1, YEAR))
def test_formatted_durations_parse_back_within_display_precision(seconds):
    back = parse_duration(format_duration(seconds))
    # format_duration drops seconds past an hour and minutes past a day: it is for display
    assert abs(back - seconds) < (3600 if seconds >= 86400 else 60 if seconds >= 3600 else 1)


@FAST
@given(st.integers(1, YEAR))
def test_slurm_time_is_never_shorter_and_under_a_minute_longer(seconds):
    t = to_slurm_time(seconds)
    m = re.fullmatch(r"(\d+)-(\d\d):(\d\d):00", t)
    assert m, t
    total = int(m.group(1)) * 86400 + int(m.group(2)) * 3600 + int(m.group(3)) * 60
    assert seconds <= total < seconds + 60 and total == to_slurm_minutes(seconds) * 60
    assert parse_slurm_duration(t) == total  # what Slurm echoes back reads as what we asked


@FAST
@given(st.text(max_size=24))
@example("1h1h")
@example("99999999999999999999d")
@example("1:60:00")
def test_duration_never_raises_anything_but_usage_error(text):
    try:
        v = parse_duration(text, what="--total")
    except UsageError as e:
        assert "\n" not in str(e)  # one line
        return
    assert isinstance(v, int) and 0 <= v <= YEAR


@settings(deadline=None)
@given(st.text(alphabet="0123456789.dhms", max_size=8))
@example("0.1s")
def test_duration_is_never_zero(text):
    try:
        assert parse_duration(text) >= 1
    except UsageError:
        pass


def test_duration_accepts_only_ascii_digits():
    with pytest.raises(UsageError):
        parse_duration("\u0663h")


# ------------------------------------------------------------------ Slurm times and durations
@FAST
@given(parts)
def test_slurm_duration_forms_round_trip(p):
    d, h, m, s = p
    total = _seconds(p)
    assert parse_slurm_duration(f"{d}-{h:02d}:{m:02d}:{s:02d}") == total
    assert parse_slurm_duration(f"{h:02d}:{m:02d}:{s:02d}") == total - d * 86400
    assert parse_slurm_duration(f"{m}:{s:02d}") == m * 60 + s
    assert parse_slurm_duration(str(m)) == m * 60  # TimelimitRaw: minutes


@FAST
@given(st.sampled_from(["UNLIMITED", "Partition_Limit", "INVALID", "N/A", "None", "Unknown", "(null)", ""]))
def test_slurm_sentinels_are_none(text):
    assert parse_slurm_duration(text) is None and parse_slurm_timestamp(text) is None


@FAST
@given(st.integers(1, 4_000_000_000))
def test_epoch_timestamps_round_trip(epoch):
    assert parse_slurm_timestamp(str(epoch)) == epoch


@FAST
@given(st.datetimes(min_value=__import__("datetime").datetime(1971, 1, 2),
                    max_value=__import__("datetime").datetime(2200, 1, 1)))
def test_iso_timestamps_round_trip(dt):
    dt = dt.replace(microsecond=0)
    assert parse_slurm_timestamp(dt.isoformat()) == dt.timestamp()


@FAST
@given(st.text(max_size=40))
def test_time_parsers_raise_only_valueerror(text):
    for fn in (parse_slurm_duration, parse_slurm_timestamp):
        try:
            v = fn(text)
        except ValueError:
            continue
        assert v is None or isinstance(v, float)


# ------------------------------------------------------------------ squeue / sacct tables
names = st.text(alphabet=string.ascii_letters + string.digits + "._-|", min_size=1, max_size=30).filter(
    lambda s: s.strip() == s)
states = st.sampled_from(["PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"])
epochs = st.integers(1_600_000_000, 2_000_000_000)


@FAST
@given(st.lists(st.tuples(st.integers(1, 10**9), names, states, epochs, st.integers(1, 10**6)), max_size=8))
def test_squeue_round_trip(jobs):
    head = "JOBID|USER|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|TIME_LIMIT|TIME|PARTITION|QOS|NODES|CPUS|" \
           "TRES_PER_NODE|DEPENDENCY|COMMENT|NAME"
    lines = [head] + [f"{j}|u|{s}|None|{t}|N/A|N/A|{lim}|0:00|short|normal|1|1|N/A|(null)|(null)|{n}"
                      for j, n, s, t, lim in jobs]
    rows = parsers.parse_squeue("\n".join(lines) + "\n")
    assert [(r.job_id, r.name, r.state, r.submit, r.time_limit_s) for r in rows] == \
           [(str(j), n, s, float(t), lim * 60.0) for j, n, s, t, lim in jobs]


@FAST
@given(st.lists(st.tuples(st.integers(1, 10**9), names.filter(lambda n: "|" not in n),
                          st.sampled_from(["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED by 0", "NODE_FAIL"]),
                          epochs, st.integers(0, 86400), st.integers(0, 255), st.integers(0, 64)), max_size=8))
def test_sacct_round_trip(jobs):
    head = "JobIDRaw|JobName|User|Partition|QOS|Submit|Eligible|Start|End|Elapsed|TimelimitRaw|NNodes|NCPUS|" \
           "AllocTRES|State|ExitCode|Reason"
    lines = [head]
    for j, n, state, t, el, code, sig in jobs:
        lines.append(f"{j}|{n}|u|short|normal|{t}|{t}|{t}|{t + el}|{el // 3600:02d}:{el % 3600 // 60:02d}:{el % 60:02d}"
                     f"|2|1|1|cpu=1|{state}|{code}:{sig}|None")
        lines.append(f"{j}.batch|batch||||{t}|{t}|{t}|{t + el}|00:00:01||1|1||{state}|0:0|")  # a step: skipped
    rows = parsers.parse_sacct("\n".join(lines))
    assert [(r.job_id, r.name, r.state, r.elapsed_s, r.exit_code, r.exit_signal, r.end) for r in rows] == \
           [(str(j), n, s.split()[0], float(el), c, g, float(t + el)) for j, n, s, t, el, c, g in jobs]


table_noise = st.text(alphabet=string.printable + "é|", max_size=300)


@FAST
@given(table_noise)
def test_table_parsers_raise_only_parse_errors(text):
    for fn in (parsers.parse_squeue, parsers.parse_sacct, parsers.parse_partitions):
        try:
            fn(text)
        except SlurmParseError as e:
            assert "\n" not in str(e).strip()


@FAST
@given(st.sampled_from(["squeue", "sacct"]), st.lists(st.text(alphabet="0123456789:-TNA/|x ", max_size=12),
                                                    min_size=17, max_size=17))
def test_rows_with_garbage_fields_raise_only_parse_errors(which, fields):
    head = ("JOBID|USER|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|TIME_LIMIT|TIME|PARTITION|QOS|NODES|CPUS|"
            "TRES_PER_NODE|DEPENDENCY|COMMENT|NAME") if which == "squeue" else \
           ("JobIDRaw|JobName|User|Partition|QOS|Submit|Eligible|Start|End|Elapsed|TimelimitRaw|NNodes|NCPUS|"
            "AllocTRES|State|ExitCode|Reason")
    text = head + "\n" + "|".join(f.replace("|", "") for f in fields) + "\n"
    try:
        (parsers.parse_squeue if which == "squeue" else parsers.parse_sacct)(text)
    except SlurmParseError:
        pass


# ------------------------------------------------------------------ sbatch, scontrol, control files
@FAST
@given(st.integers(1, 10**9), st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)),
       st.lists(st.sampled_from(["sbatch: warning: x", "note: y", ""]), max_size=3))
def test_sbatch_parsable_round_trip(jid, cluster, noise):
    out = "\n".join(noise + [f"{jid};{cluster}" if cluster else str(jid)]) + "\n"
    assert parsers.parse_sbatch_parsable(out) == (str(jid), cluster)


@FAST
@given(st.text(max_size=80))
def test_sbatch_parsable_noise(text):
    try:
        jid, _ = parsers.parse_sbatch_parsable(text)
        assert jid.isdigit()
    except SlurmParseError:
        pass


@FAST
@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), st.integers(1, 10**5),
                          st.booleans()), min_size=1, max_size=5, unique_by=lambda t: t[0]))
def test_partitions_round_trip(parts_):
    text = "\n".join(f"PartitionName={n} AllowGroups=ALL Default={'YES' if d else 'NO'} MaxTime={m} "
                     f"DefaultTime=UNLIMITED State=UP TotalNodes=4" for n, m, d in parts_)
    got = parsers.parse_partitions(text)
    assert {n: (p.max_time_s, p.is_default) for n, p in got.items()} == {n: (m * 60.0, d) for n, m, d in parts_}


@FAST
@given(st.text(max_size=200), st.text(max_size=20))
def test_config_and_outcome_readers_never_raise(text, key):
    parsers.parse_config_value(text, key or "x")
    info = parse_outcome(text)
    assert isinstance(info, dict)


# ------------------------------------------------------------------ error classification
class _Canned:
    name = "canned"

    def __init__(self, rc, out, err, timed_out=False):
        self.res = (rc, out, err, timed_out)

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        rc, out, err, to = self.res
        return RunResult(tuple(argv), rc, out, err, 0.0, timed_out=to)


@FAST
@given(st.integers(-1, 255), st.text(max_size=60), st.text(max_size=120), st.booleans())
def test_every_slurm_failure_is_a_classified_chainrun_error(rc, out, err, timed_out):
    client = SlurmClient(_Canned(rc, out, err, timed_out))
    res = RunResult(("sbatch",), rc, out, err, 0.0, timed_out=timed_out)
    assert not (is_transient(res) and is_refusal(res))
    for call in (lambda: client.queue(), lambda: client.accounting(["1"]), lambda: client.submit("/w", []),
                 lambda: client.partitions(), lambda: client.cancel(["1"], pause_s=0)):
        try:
            call()
        except (TransientSlurmError, SlurmRefused, SlurmParseError, SlurmError) as e:
            assert isinstance(e, ChainrunError) and e.exit_code in (4, 5)
            if timed_out:
                assert isinstance(e, TransientSlurmError) or rc == 0


@pytest.mark.parametrize("err,kind", [
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", TransientSlurmError),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     TransientSlurmError),
    ("sbatch: error: Munge encode failed: Failed to access \"/run/munge/munge.socket.2\": No such file or directory",
     TransientSlurmError),
    ("sbatch: error: Batch job submission failed: Protocol authentication error", TransientSlurmError),
    ("sbatch: error: slurm_receive_msg: Connection reset by peer", TransientSlurmError),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", SlurmRefused),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", SlurmRefused),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
     "size and/or time limits)", SlurmRefused),
    ("sbatch: error: Batch job submission failed: Unexpected message received", SlurmError),
])
def test_known_sbatch_messages_are_classified(err, kind):
    with pytest.raises(kind) as e:
        SlurmClient(_Canned(1, "", err)).submit("/w", [])
    assert type(e.value) is kind
