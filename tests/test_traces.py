"""The trace reader (chainrun/traces.py) on files judges bring: compressed whatever their name, archives
it cannot open, binary junk, and rows it sets aside -- each a one-line error or a note, never a traceback."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import threading
import zipfile
from pathlib import Path

import pytest

from chainrun import traces
from chainrun.traces import TraceFormatError, parse_trace_text, read_trace

from tests.sim.tracegen import frame, sacct_dump, steady

TEXT = sacct_dump(frame(steady(2)))  # 96 jobs, sacct -P


@pytest.fixture
def plain(tmp_path):
    p = tmp_path / "t.log"
    p.write_text(TEXT)
    return read_trace(p)


@pytest.mark.parametrize("name,pack", [
    ("t.log", lambda b: gzip.compress(b)),  # gzip, named as plain text
    ("t.log.xz", lambda b: lzma.compress(b)),
    ("t.log", lambda b: bz2.compress(b)),
    ("t.bz2", lambda b: bz2.compress(b)),
])
def test_compression_is_told_by_content_not_name(tmp_path, plain, name, pack):
    p = tmp_path / name
    p.write_bytes(pack(TEXT.encode()))
    assert read_trace(p).equals(plain)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_a_byte_order_mark_is_no_header(tmp_path, plain, encoding):
    """Saved by a Windows editor or spreadsheet: before, "no column for job_id" (the BOM glued to it)."""
    p = tmp_path / "t.log"
    p.write_text(TEXT, encoding=encoding)
    assert read_trace(p).equals(plain)


def test_a_corrupt_gzip_is_a_one_line_error(tmp_path):
    data = gzip.compress(TEXT.encode() * 20)
    p = tmp_path / "t.log.gz"
    p.write_bytes(data[:40] + bytes(200) + data[240:])  # zlib.error before: an internal error
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        read_trace(p)
    p.write_text(TEXT)  # named .gz, not gzip: a broken archive, not silently something else
    with pytest.raises(TraceFormatError, match="content is not gzip"):
        read_trace(p)


def test_archives_and_binary_files_are_named(tmp_path):
    z = tmp_path / "t.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("t.log", TEXT)
    with pytest.raises(TraceFormatError, match="a zip archive"):
        read_trace(z)
    zst = tmp_path / "t.log.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))
    with pytest.raises(TraceFormatError, match="a zstd archive"):
        read_trace(zst)
    junk = tmp_path / "t.bin"
    junk.write_bytes(b"JobID|User\x00\x01\x02" * 10)
    with pytest.raises(TraceFormatError, match="not a text trace"):
        read_trace(junk)


def test_a_clean_trace_has_no_notes(plain):
    assert traces.trace_notes(plain) == []


def test_what_the_reader_sets_aside_is_noted():
    lines = TEXT.splitlines()
    head, rows = lines[0], lines[1:]
    f = rows[5].split("|")
    bad_submit = "|".join([f[0] + "1", f[1], "2023-13-45", *f[3:]])  # unreadable: the job is skipped
    swapped = "|".join([f[0] + "2", f[1], f[2], f[4], f[3], *f[5:]])  # End before Start
    short = "|".join(f[:4])  # a cut line
    text = "\n".join([head, *rows, bad_submit, swapped, short, short]) + "\n"
    df = parse_trace_text(text)
    assert len(df) == len(rows) + 1
    notes = " / ".join(traces.trace_notes(df))
    assert "2 row(s) without the 8 fields" in notes
    assert "1 unreadable Submit value(s), e.g. '2023-13-45'" in notes and "1 job(s) without a readable Submit" in notes
    assert "1 job(s) end before they start" in notes


def test_concatenated_sacct_outputs_repeat_no_header_as_a_job():
    fixed = "JobID User Submit Start End TimelimitRaw NNodes\n----- ---- ------ ----- --- ------------ ------\n"
    row = "{} u1 2023-01-0{}T00:00:00 2023-01-0{}T00:10:00 2023-01-0{}T01:00:00 60 1\n"
    text = fixed + row.format(1, 1, 1, 1) + fixed + row.format(2, 2, 2, 2)
    df = parse_trace_text(text)
    assert list(df["job_id"]) == ["1", "2"] and traces.trace_notes(df) == []


def test_a_pipe_is_read_once_compressed_or_not(tmp_path, plain):
    """`--trace /dev/stdin`: the compression is sniffed from the bytes read, not by reading the file twice."""
    fifo = tmp_path / "pipe"
    for data in (TEXT.encode(), gzip.compress(TEXT.encode())):
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_bytes, args=(data,))
        writer.start()
        assert read_trace(fifo).equals(plain)
        writer.join()
        fifo.unlink()


def test_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    p = tmp_path / "t.log"
    p.write_text(TEXT)

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)  # root reads a chmod 000 file: refuse as a user's read would
    with pytest.raises(TraceFormatError, match="cannot read trace .*: Permission denied"):
        read_trace(p)
