"""The checkpoint contract between chainrun and a training script.

Pure functions: render the per-chain wrapper from the template, copy the user's
``#SBATCH`` lines, read the outcome file a segment leaves behind. ``done_main`` is the
``chainrun-done`` console script a payload may call when training is finished.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from importlib import resources
from pathlib import Path

from chainrun import __version__
from chainrun.errors import UsageError
from chainrun.state.records import CHECKPOINT_CRASH, CONTINUE, CRASH, DONE, HANDOFF, SKIPPED, UNSTARTED

DONE_FILE_NAME = "CHAINRUN_DONE"
# A successor waits for its predecessor's hand-off at most max(signal lead + HANDOFF_MARGIN_S, --save-timeout),
# and never past the predecessor's own end (the wrapper computes it: CHAINRUN_HANDOFF_TIMEOUT)
HANDOFF_MARGIN_S = 60
NO_RUN_FOLDER = "no-run-folder"  # the wrapper did not see control/token: the run folder is not visible on the node
NO_RUN_FOLDER_EXIT = 86  # ... and exits with this code (the watcher's sign when not even the outcome could be written)
_SBATCH_RE = re.compile(r"^#SBATCH\s+(.*)$")
_OUTCOMES = {CONTINUE, CRASH, DONE, HANDOFF, SKIPPED, UNSTARTED, CHECKPOINT_CRASH, NO_RUN_FOLDER}
# options chainrun sets itself; the user's values for these are refused or overridden
OWNED_OPTIONS = ("--job-name", "-J", "--signal", "--time", "-t", "--parsable", "--array", "-a", "--wrap")


def wrapper_template() -> str:
    return resources.files("chainrun").joinpath("templates/wrapper.sh").read_text(encoding="utf-8")


def sbatch_lines(script_text: str) -> list[str]:
    """The ``#SBATCH`` lines of a batch script: those before the first command line, as sbatch reads them."""
    out = []
    for line in script_text.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if stripped.startswith("#SBATCH"):
            out.append(stripped)
            continue
        break  # sbatch stops reading directives at the first command
    return out


def sbatch_options(script_text: str) -> list[str]:
    """The options of the ``#SBATCH`` lines, split like a shell would (comments dropped)."""
    opts: list[str] = []
    for line in sbatch_lines(script_text):
        body = _SBATCH_RE.match(line).group(1)  # type: ignore[union-attr]
        try:
            opts += shlex.split(body, comments=True)
        except ValueError as e:
            raise UsageError(f"cannot read the line {line!r}: {e}") from None
    return opts


def option_value(opts: list[str], *names: str) -> str | None:
    """The last value given for an option (``--x=v``, ``--x v``, ``-xv``, ``-x v``)."""
    value = None
    for i, o in enumerate(opts):
        for n in names:
            if o == n and i + 1 < len(opts):
                value = opts[i + 1]
            elif n.startswith("--") and o.startswith(n + "="):
                value = o[len(n) + 1 :]
            elif not n.startswith("--") and o.startswith(n) and len(o) > len(n):
                value = o[len(n) :]
    return value


def render_wrapper(
    *, chain_id: str, run_dir: str, checkpoint_dir: str, payload: str, signal: str, script_text: str,
    ref_nodes: int | None = None, signal_lead_s: int = 300, save_timeout_s: int = 0, cluster: str = "local",
) -> str:
    """The batch script every segment of a chain runs.

    ``signal_lead_s`` and ``save_timeout_s`` bound a successor's wait after its hand-off request."""
    values = {
        "VERSION": __version__,
        "CHAIN_ID_COMMENT": re.sub(r"[^A-Za-z0-9._-]", "_", chain_id),
        "SBATCH_LINES": "\n".join(sbatch_lines(script_text)) or "# (no #SBATCH lines in the user's script)",
        "CHAIN_ID": shlex.quote(chain_id),
        "CHECKPOINT_DIR": shlex.quote(checkpoint_dir),
        "SIGNAL": shlex.quote(signal),
        "RUN_DIR": shlex.quote(run_dir),
        "PAYLOAD": shlex.quote(payload),
        "SIGNAL_LEAD": str(int(signal_lead_s)),
        "SAVE_TIMEOUT": str(int(save_timeout_s)),
        "HANDOFF_MARGIN": str(HANDOFF_MARGIN_S),
        "REF_NODES": str(int(ref_nodes)) if ref_nodes else "",  # elastic chains: the first of --shapes
        "CLUSTER": shlex.quote(cluster),  # CHAINRUN_CLUSTER: the site this copy of the wrapper runs on
    }
    text = wrapper_template()
    for key, val in values.items():
        text = text.replace(f"@@{key}@@", val)
    return text


def parse_outcome(text: str) -> dict[str, str]:
    """The ``key=value`` lines a segment's wrapper writes when it ends."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip():
            info[k.strip()] = v.strip()
    if info.get("outcome") not in _OUTCOMES:
        info.pop("outcome", None)
    return info


def token_text(chain_id: str) -> str:
    """``control/token``, written at submit: the wrapper trains only where it reads its own chain id there."""
    return f"chain={chain_id}\n"


def _kv(**fields: object) -> str:
    return "".join(f"{k}={v}\n" for k, v in fields.items() if v is not None)


def moved_text(chain_id: str, gen: int, *, to: str = "", at: float | None = None) -> str:
    """``control/moved.<gen>``, written by the driver into the control folder of the site a chain leaves,
    before anything else of the move: from then on no segment there claims a generation (a running owner
    trains on until asked to hand off). docs/remote-clusters.md, "Moving between clusters"."""
    return _kv(chain=chain_id, gen=gen, to=to or None, at=None if at is None else int(at))


def go_text(chain_id: str, gen: int, *, seg: int | None = None, ckpt_gen: int | None = None, step: int | None = None,
            manifest: str | None = None, manifest_sha256: str | None = None, at: float | None = None) -> str:
    """``control/go.<gen>``, written by the driver into the control folder of the site a chain moves to,
    once the old site's owner released and the copied checkpoint was verified: a segment there submitted
    with ``CHAINRUN_GATED=1`` (segment ``seg`` only, when given) then claims ``gen``. ``manifest`` (a path,
    relative to the checkpoint folder unless absolute) and its ``manifest_sha256`` are checked by the
    wrapper before it claims."""
    return _kv(chain=chain_id, gen=gen, seg=seg, ckpt_gen=ckpt_gen, step=step, manifest=manifest,
               manifest_sha256=manifest_sha256, at=None if at is None else int(at))


def handoff_text(requested: float, *, by: str, seg: int | str = "") -> str:
    """``control/handoff.<gen>``: a request to the owner of ``gen`` to save and release (its monitor sends it
    the signal). Successors write it; the driver writes it for a successor on another site."""
    return _kv(requested=int(requested), by=by, seg=seg)


def control_path(run_dir: str, idx: int, kind: str) -> str:
    return f"{run_dir}/control/seg-{idx}.{kind}"


def done_file(chain) -> str:
    """The payload's done marker, as the wrapper sets CHAINRUN_DONE_FILE: in the checkpoint folder."""
    return f"{chain.checkpoint_dir}/{DONE_FILE_NAME}"


def done_main(argv: list[str] | None = None) -> None:
    """``chainrun-done``: tell chainrun that training is finished (run inside a segment)."""
    ckpt = os.environ.get("CHAINRUN_CHECKPOINT_DIR")
    target = os.environ.get("CHAINRUN_DONE_FILE") or (ckpt and str(Path(ckpt) / DONE_FILE_NAME))
    if not target:
        print("chainrun-done: not inside a chainrun segment (CHAINRUN_DONE_FILE is not set)", file=sys.stderr)
        sys.exit(2)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(f"segment={os.environ.get('CHAINRUN_SEGMENT', '')}\n", encoding="utf-8")
    print(f"chainrun-done: marked chain {os.environ.get('CHAINRUN_CHAIN_ID', '')} finished")
