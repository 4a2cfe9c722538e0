"""Traces shipped with chainrun (chainrun/data), by built-in name, and plain files.

``chainrun sim --trace ls6-a100-dev`` works from a plain install: the development slice of the
TACC Lonestar6 A100 trace (Mirage, SC'23; CC BY 4.0, attribution in chainrun/data/README.md).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN = {"ls6-a100-dev": "ls6-a100-dev.log.xz"}


def builtin_path(name: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("chainrun") / "data" / BUILTIN[name]))


def load_trace(name_or_path: str):
    """A built-in name or a file (sacct text or ``sacct -P``; ``.xz``/``.gz`` are decompressed)."""
    from chainrun.traces import parse_trace_text, read_trace

    if name_or_path in BUILTIN and not Path(name_or_path).exists():
        p = builtin_path(name_or_path)
    else:
        p = Path(name_or_path)
    if p.suffix in (".xz", ".gz"):
        import gzip
        import lzma

        from chainrun.traces import TraceFormatError

        opener = lzma.open if p.suffix == ".xz" else gzip.open
        try:
            with opener(p, "rt", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            raise TraceFormatError(f"trace file not found: {p}") from None
        except (OSError, EOFError, lzma.LZMAError) as e:
            raise TraceFormatError(f"cannot read trace {p}: {e}") from None
        return parse_trace_text(text, source=str(p))
    return read_trace(p)
