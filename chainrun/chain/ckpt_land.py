"""A copy's arrival: verify what is in the partial folder against the manifest, then put it in place
(the folder or file renamed, the marker written last), and record it for cleanup_unused."""

from __future__ import annotations

import json
import time

from chainrun.chain import ckpt_manifest as cm
from chainrun.chain import ckpt_rsync as cr
from chainrun.chain.ckpt_site import COPIED, INCOMING, CopySite
from chainrun.errors import NotFoundError, VerifyMismatch


def landed(dst: CopySite, man: cm.Manifest) -> bool:
    """Whether the destination holds this checkpoint in place already (then only its marker is rewritten)."""
    try:
        found = cm.hashes(dst.runner, f"{dst.ckpt_dir}/{man.name}")
    except NotFoundError:
        return False
    if cm.differences(man.files, found):
        return False
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
    if man.kind == cm.FOLDER:
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
    dst.runner.write_file(f"{dst.ckpt_dir}/{COPIED}{man.name}.json", json.dumps(record), 0o600)
