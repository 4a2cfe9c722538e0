"""A copy's arrival: verify what is in the partial folder against the manifest, then put it in place
(the folder or file renamed, the marker written last), and record it for cleanup_unused."""

from __future__ import annotations

import json
import time

from chainrun.chain import ckpt_manifest as cm
from chainrun.chain import ckpt_rsync as cr
from chainrun.chain.ckpt_site import COPIED, INCOMING, CopySite
from chainrun.errors import CopyError, NotFoundError, VerifyMismatch

# $1: the checkpoint folder, $2: the name a copy replaces (its marker, or its single file). Prints that
# file's sha256 now, and the sha256 of every copy chainrun landed there (its records).
_THEIRS = r"""
cd -- "$1" 2>/dev/null || exit 0
[ -f "$2" ] || exit 0
echo "current $(sha256sum < "$2" | cut -d' ' -f1)"
for r in .chainrun-copied.*.json; do
  # echo: a record has no final newline (json.dumps), and sed then prints none: two records would run together
  [ -f "$r" ] && { sed -n 's/.*"sha256": *"\([0-9a-f]*\)".*/ours \1/p' "$r"; echo; }
done
exit 0
"""


def replaceable(answer: str, mine: str) -> bool:
    """Whether the file a copy would replace is absent, the same, or one chainrun copied there before
    (pure, from the _THEIRS answer). Anything else is a trainer's own save on that site."""
    lines = [ln.split() for ln in answer.splitlines() if ln.strip()]
    current = [w[1] for w in lines if len(w) == 2 and w[0] == "current"]
    ours = {w[1] for w in lines if len(w) == 2 and w[0] == "ours"}
    return not current or current[0] == mine or current[0] in ours


def _guard(dst: CopySite, man: cm.Manifest) -> None:
    """Refuse to replace a checkpoint a trainer saved on the destination under the same name: the two
    sites' generations collide (the successor there did not claim a generation above the copy's)."""
    name = man.marker or man.name
    res = dst.runner.run(["sh", "-c", _THEIRS, "sh", dst.ckpt_dir, name], 120)
    if not res.ok:
        raise CopyError(f"cannot read {name} on {dst.name}: {res.first_error_line()}")
    if not replaceable(res.stdout, cm.content_sha256(man)):
        raise CopyError(f"{dst.name} has its own {name} (generation {man.generation}) from a segment that trained "
                        f"there: the copy from the other site would replace it, so it was not made latest",
                        hint="a segment resuming from a copied checkpoint must claim a higher generation")


def landed(dst: CopySite, man: cm.Manifest) -> bool:
    """Whether the destination holds this checkpoint in place already (then only its marker is rewritten)."""
    try:
        found = cm.hashes(dst.runner, f"{dst.ckpt_dir}/{man.name}")
    except NotFoundError:
        return False
    if cm.differences(man.files, found):
        return False
    _guard(dst, man)
    dst.runner.write_file(f"{dst.ckpt_dir}/{man.marker}", man.marker_text or "", 0o600)
    return True


def land(dst: CopySite, man: cm.Manifest, partial: str, *, source: str = "") -> None:
    """Verify what arrived in ``partial`` against the manifest and put it in place: the folder (or file)
    is renamed, then the marker written; a mismatch raises VerifyMismatch and changes nothing in place."""
    try:
        found = cm.hashes(dst.runner, partial)
    except NotFoundError:
        found = ()
    diff = cm.differences(man.files, found)
    if diff:
        have = {f.path for f in found}
        expected = {f.path for f in man.files}
        bad = [f"{partial}/{p}" for p in sorted(have)
               if p not in expected or any(d.startswith(p + " ") for d in diff)]
        if bad:  # sent again next time, not kept by rsync's size-and-time check
            dst.runner.run(["rm", "-f", "--", *bad], 60)
        raise VerifyMismatch(f"the copy of {man.name} on {dst.name} does not match the source's manifest "
                             f"({len(diff)} file(s): {'; '.join(diff[:3])}); it was not made latest",
                             hint="a re-run sends the differing files again")
    _guard(dst, man)
    if man.kind == cm.FOLDER:  # a folder of that name no marker there names is a leftover of an earlier landing
        place = 'cd -- "$1" && rm -rf -- "$3" && mv -T -- "$2" "$3"'
        argv = ["sh", "-c", place, "sh", dst.ckpt_dir, f"{INCOMING}{man.name}", man.name]
    else:
        place = 'cd -- "$1" && mv -f -T -- "$2/$3" "$3" && rmdir -- "$2"'
        argv = ["sh", "-c", place, "sh", dst.ckpt_dir, f"{INCOMING}{man.name}", man.name]
    res = dst.runner.run(argv, 120)
    if not res.ok:
        raise cr.failure(res, what=f"cannot put {man.name} in place on {dst.name}", runs_on=dst.name, far=dst.name)
    if man.marker:  # last: from here on the copy is the destination's latest of its generation
        dst.runner.write_file(f"{dst.ckpt_dir}/{man.marker}", man.marker_text or "", 0o600)
    record = {"source": source, "kind": man.kind, "name": man.name, "marker": man.marker,
              "generation": man.generation, "step": man.step, "bytes": man.total_bytes, "time": time.time(),
              "sha256": cm.content_sha256(man)}
    dst.runner.write_file(f"{dst.ckpt_dir}/{COPIED}{man.name}.json", json.dumps(record) + "\n", 0o600)
