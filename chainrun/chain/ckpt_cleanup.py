"""Remove checkpoint copies that went unused, and abandoned partial copies, from a site.

A copy ahead is made while the current segment trains, for a move that may not happen; scratch
filesystems purge by age and count quota, so what was not used is removed rather than left. Only
what chainrun itself landed (each landed copy leaves ``.chainrun-copied.<name>.json``, see
ckpt_copy.land) is ever removed, and only while it is unchanged: a marker or file that a trainer on
that site has since rewritten is the trainer's, and only the record is dropped. One command lists,
a pure function decides (:func:`plan`), one ``rm`` removes.
"""

from __future__ import annotations

import base64
import binascii
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from chainrun.chain.ckpt_site import COPIED, INCOMING, CopySite
from chainrun.errors import CopyError

LISTING = r"""
echo "chainrun-cleanup 1"
cd -- "$1" 2>/dev/null || { echo end; exit 0; }
echo "now $(date +%s)"
for r in .chainrun-copied.*.json; do
  [ -f "$r" ] || continue
  t=$(base64 < "$r" | tr -d '\n')
  n=${r#.chainrun-copied.}; n=${n%.json}
  mk=$(printf %s "$t" | base64 -d | sed -n 's/.*"marker": *"\([^"/]*\)".*/\1/p')
  if [ -n "$mk" ]; then c=$mk; else c=$n; fi
  h=-; [ -f "$c" ] && h=$(sha256sum < "$c" | cut -d' ' -f1)
  d=-; [ -n "$mk" ] && [ -f "$mk" ] && d=$(sed -n 's/.*"folder"[[:space:]]*:[[:space:]]*"\([^"/]*\)".*/\1/p' "$mk" | head -n 1)
  printf 'copied %s %s %s %s\n' "$r" "$h" "${d:--}" "$t"
done
for p in .chainrun-incoming.*; do
  [ -e "$p" ] || continue
  m=$(find "$p" -printf '%T@\n' | sort -n | tail -n 1)
  printf 'partial %s %s\n' "${m%.*}" "$p"
done
echo end
"""
PARTIAL_AGE_S = 6 * 3600  # a partial copy untouched this long was abandoned (a running rsync writes every second)


@dataclass(frozen=True)
class CleanupPlan:
    remove: tuple[str, ...]  # names in the checkpoint folder
    kept: tuple[str, ...]  # copies kept: named in `keep`, or partials still fresh
    forgotten: tuple[str, ...]  # copies a trainer there has rewritten: only their record goes


def _name_ok(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


def plan(text: str, keep: Iterable[str] = (), partial_age_s: float = PARTIAL_AGE_S) -> CleanupPlan:
    """What to remove, from the LISTING's answer. ``keep``: checkpoint names (folder, file or marker)
    still wanted, e.g. the copy the next segment will resume from."""
    keep = set(keep)
    lines = text.splitlines()
    if not lines or lines[0].strip() != "chainrun-cleanup 1" or lines[-1].strip() != "end":
        raise CopyError(f"cannot read the list of checkpoint copies: {text.strip()[:120]!r}")
    now = None
    remove: list[str] = []
    kept: list[str] = []
    forgotten: list[str] = []
    for ln in lines[1:-1]:
        kind, _, rest = ln.partition(" ")
        if kind == "now":
            now = int(rest)
        elif kind == "copied":
            record, sha, named, b64 = (rest.split(" ", 3) + ["", "", ""])[:4]
            if not (record.startswith(COPIED) and _name_ok(record)):
                continue
            try:
                rec = json.loads(base64.b64decode(b64, validate=True))
            except (binascii.Error, ValueError):
                remove.append(record)  # a record we cannot read names nothing we may touch
                continue
            name, marker = rec.get("name", ""), rec.get("marker")
            if not _name_ok(name) or (marker is not None and not _name_ok(marker)):
                continue
            if name in keep or marker in keep:
                kept.append(name)
            elif sha == rec.get("sha256"):
                remove += [*([marker] if marker else []), name, record]  # the marker first: never a dangling latest
            elif marker and named != name:  # the marker names another checkpoint now (a newer copy, a trainer's
                remove += [name, record]  # save): this folder is no one's latest any more
            else:  # rewritten in place by a trainer there: its own now
                forgotten.append(name)
                remove.append(record)
        elif kind == "partial":
            mtime, _, name = rest.partition(" ")
            fresh = now is None or not mtime.lstrip("-").isdigit() or now - int(mtime) < partial_age_s
            if name.startswith(INCOMING) and (name[len(INCOMING):] in keep or fresh):
                kept.append(name)
            elif name.startswith(INCOMING) and _name_ok(name):
                remove.append(name)
    return CleanupPlan(tuple(remove), tuple(kept), tuple(forgotten))


def cleanup_unused(site: CopySite, *, keep: Iterable[str] = (), partial_age_s: float = PARTIAL_AGE_S,
                   staging_dir: str | None = None) -> CleanupPlan:
    """Remove the copies chainrun landed on ``site`` that are not in ``keep``, partial copies untouched
    for ``partial_age_s``, and the driver's staging folder for copies to this site (if given)."""
    res = site.runner.run(["sh", "-c", LISTING, "sh", site.ckpt_dir], 120)
    if not res.ok:
        raise CopyError(f"cannot list checkpoint copies on {site.name}: {res.first_error_line()}")
    p = plan(res.stdout, keep, partial_age_s)
    if p.remove:
        gone = site.runner.run(["rm", "-rf", "--", *(f"{site.ckpt_dir}/{n}" for n in p.remove)], 600)
        if not gone.ok:
            raise CopyError(f"cannot remove unused checkpoint copies on {site.name}: {gone.first_error_line()}")
    if staging_dir:
        for d in Path(staging_dir).glob(f"*-{site.name}"):
            shutil.rmtree(d, ignore_errors=True)
    return p
