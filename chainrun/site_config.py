"""A cluster's site tables in config.toml: what a chain needs there, beyond how to connect.

    [clusters.hpc.sbatch]          # options of every job chainrun submits there
    account = "proj42"
    partition = "gpu"
    gres = "gpu:a100:4"
    args = ["--qos=normal"]

    [clusters.hpc.gpu]             # declared facts, checked against `submit --gpu-mem/--dtype`
    memory = "80G"
    dtypes = ["bf16", "fp16", "fp32"]

    [clusters.hpc.job]
    script = "/work/me/train-hpc.sh"   # this cluster's own script (a path there), instead of the uploaded one
    env_file = "/work/me/env-hpc.sh"   # sourced before the script (modules, conda, paths)
    preflight = "test -d /scratch/me/data && python -c 'import torch'"   # a tiny job at submit
    preflight_time = "2m"              # its time limit
    pace = 0.6                         # work per wall second here, against a cluster at 1.0 (the default)
    restart = "3m"                     # the payload's restart here: model load, data loader warm-up

``pace`` and ``restart`` are what the site rule (chain/site_choice.py) assumes before the chain has
measured them there (chain/site_pace.py); a measurement wins.

``local`` takes the same tables (``[clusters.local.sbatch]`` ...). Every error is one line naming
the file and the key. This module reads config values only: no I/O, no import of the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from chainrun.errors import UsageError

SITE_TABLES = ("sbatch", "gpu", "job")
_KEYS: dict[str, dict[str, type]] = {
    "sbatch": {"account": str, "partition": str, "gres": str, "qos": str, "args": list},
    "gpu": {"memory": str, "dtypes": list},
    "job": {"script": str, "env_file": str, "preflight": str, "preflight_time": str, "pace": float, "restart": str},
}
# what a GPU may support (names as frameworks spell them); an unknown word is a typo, not a new type
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_MEM_UNIT = {"": 1024, "B": 1 / 2 ** 20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}
DEFAULT_PREFLIGHT_S = 120
MAX_PACE = 100.0  # a declared pace beyond this (or below its inverse) is a typo, not a GPU
MAX_RESTART_S = 86400  # a restart longer than a day is a typo


@dataclass(frozen=True)
class SiteSettings:
    account: str | None = None
    partition: str | None = None
    gres: str | None = None
    qos: str | None = None
    args: tuple[str, ...] = ()
    gpu_memory_mb: int | None = None
    gpu_dtypes: tuple[str, ...] | None = None  # None: not declared (nothing to check against)
    script: str | None = None
    env_file: str | None = None
    preflight: str | None = None
    preflight_s: int = DEFAULT_PREFLIGHT_S
    pace: float | None = None  # declared work per wall second, against a cluster at 1.0; None: not declared
    restart_s: int | None = None  # declared restart cost; None: not declared
    raw: dict = field(default_factory=dict, compare=False)

    def sbatch_options(self) -> list[str]:
        named = [f"--{k}={v}" for k, v in (("account", self.account), ("partition", self.partition),
                                           ("gres", self.gres), ("qos", self.qos)) if v]
        return named + list(self.args)


def parse_memory_mb(text: str) -> int | None:
    """``80G``, ``80GB``, ``81920M``, ``80`` (GB) -> MB; None if it is not a size."""
    m = _MEM_RE.match(str(text))
    if not m:
        return None
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B") if (m.group(2) or "").upper() != "B" else "B"
    return int(round(float(m.group(1)) * _MEM_UNIT[unit]))


def parse_dtype(word: str) -> str | None:
    w = word.strip().lower().replace("float", "fp").replace("bfloat", "bf").replace("bfp", "bf")
    return w if w in DTYPES else None


def check_site_tables(path: Path, name: str, site: dict) -> None:
    """Refuse a site table of the wrong shape: one line naming the file and the key."""
    for table, values in site.items():
        where = f"[clusters.{name}.{table}]"
        if not isinstance(values, dict):
            raise UsageError(f"{path}: {where} must be a table",
                             hint=f"write it as a [clusters.{name}.{table}] section")
        for key, value in values.items():
            typ = _KEYS[table].get(key)
            if typ is None:
                raise UsageError(f"{path}: {where} has an unknown key {key!r} "
                                 f"(known: {', '.join(_KEYS[table])})")
            if table == "gpu" and key == "memory" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # a bare number is gigabytes
            if typ is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not 1 / MAX_PACE <= value <= MAX_PACE:
                    raise UsageError(f"{path}: {where} {key} must be a number from {1 / MAX_PACE:g} to "
                                     f"{MAX_PACE:g}, e.g. 0.6 (work per wall second against a cluster at 1.0), "
                                     f"not {value!r}")
                continue
            if typ is list:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise UsageError(f"{path}: {where} {key} must be a list of strings, e.g. [\"--qos=normal\"]")
            elif not isinstance(value, str) or not value.strip():
                raise UsageError(f"{path}: {where} {key} must be a non-empty string, not {value!r}")
            _check_value(path, where, key, value)


def _check_value(path: Path, where: str, key: str, value) -> None:
    if key == "memory" and parse_memory_mb(value) is None:
        raise UsageError(f"{path}: {where} memory {value!r} is not a size, e.g. \"80G\"")
    if key == "dtypes":
        bad = [d for d in value if parse_dtype(d) is None]
        if bad:
            raise UsageError(f"{path}: {where} dtypes: unknown {', '.join(map(repr, bad))} "
                             f"(known: {', '.join(DTYPES)})")
    if key in ("script", "env_file") and not value.startswith(("/", "~")):
        raise UsageError(f"{path}: {where} {key} must be an absolute path on that cluster, not {value!r}")
    if key == "preflight_time" and _seconds(value) is None:
        raise UsageError(f"{path}: {where} preflight_time {value!r} is not a duration, e.g. \"2m\"")
    if key == "restart" and _seconds(value, what="restart", maximum=MAX_RESTART_S) is None:
        raise UsageError(f"{path}: {where} restart {value!r} is not a duration of a day or less, e.g. \"3m\"")
    if key == "args":
        for a in value:
            if a.split("=", 1)[0] in ("--job-name", "-J", "--signal", "--time", "-t", "--parsable", "--array", "-a",
                                      "--wrap"):
                raise UsageError(f"{path}: {where} args: {a} is chainrun's to set")


def _seconds(text: str, *, what: str = "preflight_time", maximum: int | None = None) -> int | None:
    from chainrun.durations import MAX_S, parse_duration

    try:
        return parse_duration(text, what=what, maximum=maximum or MAX_S)
    except UsageError:
        return None


def settings_from(site: dict) -> SiteSettings:
    """Settings from checked site tables (check_site_tables ran when config.toml was read)."""
    sb, gpu, job = (site.get(t) or {} for t in SITE_TABLES)
    mem = gpu.get("memory")
    dtypes = gpu.get("dtypes")
    return SiteSettings(
        account=sb.get("account"), partition=sb.get("partition"), gres=sb.get("gres"), qos=sb.get("qos"),
        args=tuple(sb.get("args") or ()),
        gpu_memory_mb=parse_memory_mb(str(mem)) if mem is not None else None,
        gpu_dtypes=tuple(parse_dtype(d) for d in dtypes) if dtypes is not None else None,
        script=job.get("script"), env_file=job.get("env_file"), preflight=job.get("preflight"),
        preflight_s=_seconds(job["preflight_time"]) if job.get("preflight_time") else DEFAULT_PREFLIGHT_S,
        pace=float(job["pace"]) if job.get("pace") is not None else None,
        restart_s=_seconds(job["restart"], what="restart") if job.get("restart") else None,
        raw=site,
    )
