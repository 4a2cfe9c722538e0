"""The CLI as a contract: every command documented in docs/cli.md with non-empty help, and
every --json output in the same versioned envelope."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, run_cli
from tests.ux.fixtures import make_chain

ENVELOPE_KEYS = {"chainrun", "schema", "command", "data"}
JSON_SCHEMA = 2  # 2: sim and model eval moved into the envelope

# Commands another engineer owns whose docs/cli.md section is still to be written (they are
# documented in docs/model.md, docs/evaluation.md and docs/remote-clusters.md). New commands
# must not be added here: document them in docs/cli.md.
NOT_YET_IN_CLI_MD: set[str] = set()  # every command is documented
# commands that print no data, so have no --json
NO_DATA = {"cluster default"}


def commands() -> dict[str, object]:
    import typer.main

    from chainrun.cli.main import app

    out = {}

    def walk(cmd, prefix):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, prefix + [name])
        else:
            out[" ".join(prefix)] = cmd

    walk(typer.main.get_command(app), [])
    return out


def headings() -> list[str]:
    return [ln for ln in (REPO / "docs" / "cli.md").read_text().splitlines() if ln.startswith("#")]


def test_every_command_has_help():
    cmds = commands()
    assert {"submit", "status", "watch", "cancel", "report", "init"} <= set(cmds)
    empty = [n for n, c in cmds.items() if not (c.help or "").strip()]
    assert not empty, f"commands without help: {empty}"


def test_every_command_has_a_section_in_cli_md():
    heads = headings()
    missing = [n for n in commands() if n not in NOT_YET_IN_CLI_MD
               and not any(re.match(rf"#+ chainrun {re.escape(n)}(\s|$)", h) for h in heads)]
    assert not missing, f"document these in docs/cli.md (a '## chainrun NAME ...' heading): {missing}"


def test_every_data_command_takes_json():
    lacking = [n for n, c in commands().items()
               if n not in NO_DATA and not any("--json" in getattr(p, "opts", []) for p in c.params)]
    assert not lacking, f"commands that print data without --json: {lacking}"


def _envelope(p, command: str):
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert set(env) == ENVELOPE_KEYS, env.keys()
    assert env["schema"] == JSON_SCHEMA and env["command"] == command
    from chainrun import __version__

    assert env["chainrun"] == __version__
    return env["data"]


def test_envelope_is_pinned(chainrun_home, tmp_path):
    make_chain(chainrun_home).close()
    assert _envelope(run_cli("status", "--json", home=chainrun_home), "status")[0]["id"] == "train-abcd"
    assert _envelope(run_cli("status", "train-abcd", "--json", home=chainrun_home), "status")[0]["segments_detail"]
    assert _envelope(run_cli("report", "train-abcd", "--json", home=chainrun_home), "report")["segments"] == 4
    assert _envelope(run_cli("report", "--json", home=chainrun_home), "report")[0]["chain"] == "train-abcd"
    assert _envelope(run_cli("init", "-t", "toy", str(tmp_path / "t"), "--json", home=chainrun_home),
                     "init")["template"] == "toy"


def test_envelope_matches_render_helper():
    from chainrun.cli.render import JSON_SCHEMA as schema, envelope

    assert schema == JSON_SCHEMA
    assert set(json.loads(envelope("x", [])).keys()) == ENVELOPE_KEYS


@pytest.mark.parametrize("doc", ["README.md", "docs/templates.md", "docs/troubleshooting.md", "docs/cli.md",
                                 "docs/getting-started.md", "docs/checkpoint-contract.md"])
def test_user_guide_pages_exist_and_links_resolve(doc):
    path = REPO / doc
    text = path.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (path.parent / target).exists(), f"{doc} links to {target}, which does not exist"


def _section(text: str, name: str) -> str:
    """The docs/cli.md text of command ``name``: its heading, to the next command heading."""
    m = re.search(rf"(?m)^#+ chainrun {re.escape(name)}(\s|$)", text)
    if m is None:
        return ""
    nxt = re.search(r"(?m)^## ", text[m.end():])
    return text[m.start(): m.end() + nxt.start()] if nxt else text[m.start():]


def test_every_option_is_in_its_command_section_of_cli_md():
    """The reference names every option a command takes (`sim --rolling`, the judges' interface of issue
    #24, was missing, as were a few others: found in the #24/#26 audit)."""
    text = (REPO / "docs" / "cli.md").read_text()
    missing = {}
    for name, cmd in commands().items():
        body = _section(text, name)
        opts = [o for p in cmd.params for o in getattr(p, "opts", []) if o.startswith("--") and o != "--help"]
        if gone := [o for o in opts if not re.search(rf"{re.escape(o)}(?![\w-])", body)]:
            missing[name] = gone
    assert not missing, f"options docs/cli.md does not name in their command's section: {missing}"


def test_troubleshooting_quotes_the_status_word_status_prints(chainrun_home):
    """troubleshooting.md said `chainrun status` shows `ACTIVE` chains; it prints `active` (JSON: "ACTIVE")."""
    make_chain(chainrun_home, "live-0001", status="ACTIVE").close()
    p = run_cli("status", home=chainrun_home)  # a pipe: the plain lines
    word = re.search(r"`chainrun status` shows `(\w+)` chains", (REPO / "docs" / "troubleshooting.md").read_text())[1]
    assert p.returncode == 0 and p.stdout.startswith(f"live-0001  {word}  "), (word, p.stdout)
