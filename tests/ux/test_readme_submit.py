"""README's first example is what `chainrun submit` prints: the same lines from `_print_submitted` for the
chain it shows, and a chain id of the form `make_chain_id` gives (the name and 8 hex digits)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from chainrun.chain.create import default_policy, make_chain_id
from chainrun.cli.chain_cmd import _print_submitted
from chainrun.state.records import Chain
from tests.conftest import REPO

ID = re.compile(r"train-[0-9a-f]{8}")


def _example() -> list[str]:
    """The README's first code block, from `$ chainrun submit` to the next prompt."""
    block = (REPO / "README.md").read_text().split("```\n")[1].splitlines()
    assert block[0] == "$ chainrun submit train.sh --total 72h", block[0]
    return block[1:next(i for i, ln in enumerate(block) if i and ln.startswith("$ "))]


def test_readme_submit_example_is_what_submit_prints(chainrun_home, capsys):
    shown = _example()
    cid = re.search(r"^chain (\S+):", shown[0]).group(1)
    assert ID.fullmatch(cid) and ID.fullmatch(make_chain_id("train")), cid
    job = re.search(r"^segment 0 submitted as job (\d+)$", shown[2]).group(1)
    ckpt = re.search(r"^checkpoints: (\S+)$", shown[3]).group(1)
    assert ckpt.endswith(f"/chainrun-runs/{cid}/checkpoint")  # create_chain's default folder
    ch = Chain(id=cid, name="train", cluster="local", script="train.sh", workdir=ckpt.split("/chainrun-runs/")[0],
               run_dir=ckpt.rsplit("/", 1)[0], checkpoint_dir=ckpt, total_s=72 * 3600, segment_s=48 * 3600,
               policy="lead", lead_s=3600, signal="USR2", signal_lead_s=300, retries=1, sbatch_args=[],
               partition="gpu-a100", created=0.0)
    policy, note = default_policy("local")  # a fresh home: no queue-delay model, so lead and how to get one
    assert policy == "lead"
    _print_submitted(SimpleNamespace(chain=ch, first=SimpleNamespace(job_id=job), warnings=(), policy_note=note,
                                     sites=()), False)
    assert capsys.readouterr().out.splitlines() == shown
