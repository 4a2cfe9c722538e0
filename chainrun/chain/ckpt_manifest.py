"""What a checkpoint is made of, read on the site that holds it: the manifest a copy is verified against.

The newest complete checkpoint is found the way the shipped templates resume (docs/templates.md,
"How a save is made"): the marker ``latest.g<G>.json`` of the highest generation (then the
unversioned ``latest.json``) names a folder ``step-<step>.g<G>/``; the toy trainer's single files
``ckpt.g<G>.json`` (then ``ckpt.json``) are the other layout. One remote command (:data:`SCRIPT`,
POSIX sh with coreutils and GNU find, as on any Linux login node; chainrun need not be installed
there) prints the marker, every file's size and sha256; :func:`parse` reads that text, pure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field

from chainrun.errors import CopyError, NotFoundError
from chainrun.runner.base import Runner

FORMAT = "chainrun-manifest 1"
FOLDER, FILE = "folder", "file"
EMBED_MAX = 1 << 20  # a single-file checkpoint up to this size travels inside the manifest (the exact bytes read)

# $1: manifest | size | hash, $2: the folder. `hash` lists every file under the folder (the arrival
# check); `manifest` finds the newest complete checkpoint; `size` too, without reading its files (their
# hashes all zeros: an answer for its sizes only, never to verify a copy against). A marker is read once
# (base64), so the folder it names and the text a copy writes are the same read; a single file's size
# and hash are of that read too.
SCRIPT = r"""
set -u
mode=$1
NOHASH=NOHASH_VALUE
echo "chainrun-manifest 1"
for t in sha256sum base64 find stat; do
  command -v "$t" >/dev/null 2>&1 || { echo "missing $t"; echo end; exit 0; }
done
cd -- "$2" 2>/dev/null || { echo "nodir"; echo end; exit 0; }
files() {
  find . -type f | LC_ALL=C sort | while IFS= read -r p; do
    s=$(stat -c %s -- "$p") || continue
    if [ "$mode" = size ]; then h=$NOHASH; else h=$(sha256sum < "$p" | cut -d' ' -f1); fi
    printf 'f %s %s %s\n' "$s" "$h" "${p#./}"
  done
}
if [ "$mode" = hash ]; then files; echo end; exit 0; fi
gens() { ls -1A | sed -n "s/^$1\.g\([0-9][0-9]*\)\.json\$/\1/p" | sort -rn; echo none; }
for g in $(gens latest); do
  if [ "$g" = none ]; then m=latest.json; else m=latest.g$g.json; fi
  [ -f "$m" ] || continue
  t=$(base64 < "$m" | tr -d '\n') || continue
  d=$(printf %s "$t" | base64 -d | sed -n 's/.*"folder"[[:space:]]*:[[:space:]]*"\([^"/]*\)".*/\1/p' | head -n 1)
  [ -n "$d" ] && [ -d "$d" ] || continue
  printf 'marker %s %s\n' "$m" "$t"
  printf 'folder %s\n' "$d"
  (cd -- "$d" && files)
  echo end; exit 0
done
for g in $(gens ckpt); do
  if [ "$g" = none ]; then m=ckpt.json; else m=ckpt.g$g.json; fi
  [ -f "$m" ] || continue
  s=$(stat -c %s -- "$m") || continue
  if [ "$s" -le EMBED_MAX ]; then
    t=$(base64 < "$m" | tr -d '\n') || continue
    printf 'file %s %s\n' "$m" "$t"
    printf 'f %s %s %s\n' "$(printf %s "$t" | base64 -d | wc -c)" "$(printf %s "$t" | base64 -d | sha256sum | cut -d' ' -f1)" "$m"
  else
    printf 'file %s - %s\n' "$m" "$(head -c HEAD_BYTES -- "$m" | base64 | tr -d '\n')"
    if [ "$mode" = size ]; then h=$NOHASH; else h=$(sha256sum < "$m" | cut -d' ' -f1); fi
    printf 'f %s %s %s\n' "$s" "$h" "$m"
  fi
  echo end; exit 0
done
echo none
echo end
""".replace("EMBED_MAX", str(EMBED_MAX)).replace("HEAD_BYTES", "4096").replace("NOHASH_VALUE", "0" * 64)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the checkpoint (its folder, or the checkpoint folder for a single file)
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The newest complete checkpoint of one site's checkpoint folder."""

    kind: str  # FOLDER (a step-<step>.g<G> folder named by a marker) or FILE (the toy's ckpt.g<G>.json)
    name: str  # the folder's or the file's name in the checkpoint folder
    generation: int | None  # None: written outside chainrun (latest.json / ckpt.json), below every generation
    step: int | None
    files: tuple[FileEntry, ...]
    marker: str | None = None  # FOLDER: latest.g<G>.json, written last on arrival
    marker_text: str | None = None  # ...with exactly these bytes, as read on the source
    content: bytes | None = field(default=None, repr=False)  # FILE up to EMBED_MAX: the bytes hashed

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def summary(self) -> dict:
        """What `status` and the events show (no file list)."""
        return {"kind": self.kind, "name": self.name, "generation": self.generation, "step": self.step,
                "files": len(self.files), "bytes": self.total_bytes}


def _fail(why: str) -> CopyError:
    return CopyError(f"cannot read the checkpoint manifest: {why}")


def parse_files(lines: list[str]) -> tuple[FileEntry, ...]:
    out = []
    for ln in lines:
        parts = ln.split(" ", 3)
        if len(parts) != 4 or parts[0] != "f" or not parts[1].isdigit() or not _HEX64.match(parts[2]):
            raise _fail(f"unexpected line {ln[:120]!r} (a file name with a newline or backslash is not supported)")
        out.append(FileEntry(parts[3], int(parts[1]), parts[2]))
    return tuple(out)


def _body(text: str) -> list[str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != FORMAT:
        raise _fail(f"the site answered {text.strip()[:120]!r}")
    if lines[-1].strip() != "end":
        raise _fail("the answer was cut short")
    body = lines[1:-1]
    if body and body[0].startswith("missing "):
        raise CopyError(f"`{body[0].split()[1]}` is not installed on the site: the manifest needs coreutils and find")
    if body and body[0] == "nodir":
        raise NotFoundError("the checkpoint folder does not exist there")
    return body


def parse_hashes(text: str) -> tuple[FileEntry, ...]:
    """The ``hash`` answer: every file under a folder."""
    return parse_files(_body(text))


def parse(text: str) -> Manifest | None:
    """The ``manifest`` answer; None when the folder holds no checkpoint yet."""
    body = _body(text)
    if body == ["none"]:
        return None
    head, _, b64 = (body[0] if body else "").partition(" ")[2].partition(" ")
    try:
        raw = base64.b64decode(b64, validate=True) if b64 and b64 != "-" and not b64.startswith("- ") else None
    except (binascii.Error, ValueError):
        raise _fail(f"the marker {head} is not readable") from None
    if body and body[0].startswith("marker ") and len(body) >= 2 and body[1].startswith("folder "):
        files = parse_files(body[2:])
        try:
            rec = json.loads(raw or b"")
            gen, step, listed = rec.get("generation"), rec.get("step"), rec.get("files")
        except (ValueError, AttributeError):
            raise _fail(f"the marker {head} is not JSON") from None
        folder = body[1].split(" ", 1)[1]
        if isinstance(listed, dict) and {f.path: f.size for f in files} != listed:
            raise CopyError(f"the newest checkpoint {folder} (marker {head}) is not complete on the source: "
                            "its files are not the ones its marker lists")
        return Manifest(FOLDER, folder, _int(gen), _int(step), files, marker=head, marker_text=raw.decode())
    if body and body[0].startswith("file "):
        files = parse_files(body[1:])
        rec = {}
        if raw is not None:
            try:
                rec = json.loads(raw)
            except ValueError:
                rec = {}
        elif b64.startswith("- "):  # too big to travel here: its first bytes say its step and generation
            rec = _head_fields(b64[2:])
        gen = rec.get("generation") if isinstance(rec, dict) else None
        step = rec.get("step") if isinstance(rec, dict) else None
        if gen is None and (m := re.fullmatch(r"ckpt\.g(\d+)\.json", head)):
            gen = int(m.group(1))
        return Manifest(FILE, head, _int(gen), _int(step), files, content=raw)
    raise _fail(f"unexpected answer {body[:2]!r}")


def _head_fields(b64: str) -> dict:
    """``step`` and ``generation`` from the first bytes of a JSON checkpoint too big to read whole."""
    try:
        head = base64.b64decode(b64, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return {}
    out = {}
    for key in ("step", "generation"):
        if m := re.search(rf'"{key}"\s*:\s*(\d+)', head):
            out[key] = int(m.group(1))
    return out


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def manifest(runner: Runner, ckpt_dir: str, timeout: float = 1800.0) -> Manifest | None:
    """The newest complete checkpoint in ``ckpt_dir`` on ``runner``'s machine (one command), or None.
    Hashing reads every byte: the timeout allows for tens of GB on a login node."""
    res = runner.run(["sh", "-c", SCRIPT, "sh", "manifest", ckpt_dir], timeout)
    if not res.ok:
        raise _fail(f"{runner.name}: {res.first_error_line()}")
    try:
        return parse(res.stdout)
    except NotFoundError:
        raise NotFoundError(f"no checkpoint folder {ckpt_dir} on {runner.name}") from None


def newest_size(runner: Runner, ckpt_dir: str, timeout: float = 60.0) -> int | None:
    """The size in bytes of the newest complete checkpoint in ``ckpt_dir`` (one command that reads
    no file's content: sizes from ``stat``), or None when there is none yet. What a move's transfer
    is weighed by before any copy measured it (chain/ckpt_size_probe.py)."""
    res = runner.run(["sh", "-c", SCRIPT, "sh", "size", ckpt_dir], timeout)
    if not res.ok:
        raise _fail(f"{runner.name}: {res.first_error_line()}")
    try:
        man = parse(res.stdout)
    except NotFoundError:
        return None  # no checkpoint folder yet: nothing saved
    return man.total_bytes if man is not None else None


def hashes(runner: Runner, folder: str, timeout: float = 1800.0) -> tuple[FileEntry, ...]:
    """Every file under ``folder`` with its size and sha256 (one command)."""
    res = runner.run(["sh", "-c", SCRIPT, "sh", "hash", folder], timeout)
    if not res.ok:
        raise _fail(f"{runner.name}: {res.first_error_line()}")
    return parse_hashes(res.stdout)


def differences(expected: tuple[FileEntry, ...], found: tuple[FileEntry, ...]) -> list[str]:
    """What differs, one short phrase per file (empty: the same files, sizes and sha256)."""
    have = {f.path: f for f in found}
    out = []
    for f in expected:
        g = have.pop(f.path, None)
        if g is None:
            out.append(f"{f.path} missing")
        elif g.size != f.size:
            out.append(f"{f.path} has {g.size} bytes, not {f.size}")
        elif g.sha256 != f.sha256:
            out.append(f"{f.path} sha256 differs")
    out += [f"{p} not in the manifest" for p in sorted(have)]
    return out


def content_sha256(man: Manifest) -> str:
    """What says a landed copy is still as it was copied: its marker's sha256, or the single file's."""
    if man.kind == FOLDER:
        return hashlib.sha256((man.marker_text or "").encode()).hexdigest()
    return man.files[0].sha256
