"""Replay results as strict JSON: NaN (e.g. a Spearman of constant waits) becomes null."""

from __future__ import annotations


def finite(x):
    """``x`` with every NaN float, at any depth of dicts, lists and tuples, replaced by None (strict JSON
    parsers refuse NaN)."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x
