"""`chainrun status CHAIN` for a chain spanning clusters (issue 26: "say every decision and its numbers in
`status`"): its clusters in order of preference and the one it is on, the cluster of every segment, the
latest site decision with its numbers; `--json` carries the decisions the event log kept (newest last,
the last summary.DECISIONS) beside ``site_choice``. A chain on one cluster shows none of it. Real SQLite
under a tmp CHAINRUN_HOME, the real CLI in a subprocess (plain: not a terminal) and the terminal table
rendered by rich at a fixed width."""

from __future__ import annotations

import io
import json

from rich.console import Console

from chainrun import paths
from chainrun.chain import summary
from chainrun.cli import tables
from chainrun.state.records import ACTIVE, ENDED, PENDING, Chain, ChainSite, Segment
from chainrun.state.store import Store
from tests.conftest import run_cli

WIDE = {"COLUMNS": "250"}  # one line per record: the fields are read by position
REASON = ("stay on b: done in ~3 min (start ~0 min), the earliest; next local ~5 min")


def _chain(cid: str, *, sites: bool) -> Chain:
    extra = {}
    if sites:
        extra = {"sites": ["local", "b"], "site_margin_s": 600, "site_margin_source": "--site-margin",
                 "site_choice": {"site": "b", "move": False, "reason": REASON, "margin_s": 600.0, "at": 1000.0,
                                 "for": 2, "estimates": [{"site": "b", "finish_s": 180.0}], "waits": {},
                                 "transfers": {"local": {"transfer_s": 20.1, "from": "size over the rate measured b>local"}}}}
    return Chain(id=cid, name=cid, cluster="b" if sites else "local", script="/w/s", workdir="/w", run_dir="/w/run",
                 checkpoint_dir="/w/ck", total_s=7200, segment_s=3600, policy="lead", lead_s=600, signal="USR2",
                 signal_lead_s=60, retries=1, sbatch_args=[], partition="p", created=1.0, status=ACTIVE, extra=extra)


def _store(chainrun_home) -> Store:
    chainrun_home.mkdir(parents=True, exist_ok=True)
    store = Store(paths.state_db())
    c = _chain("span-0001", sites=True)
    store.add_chain(c, [ChainSite(c.id, n, i, f"/{n}", f"/{n}/run", f"/{n}/ck", f"/{n}/s", [], {"segment_s": 3600})
                        for i, n in enumerate(["local", "b"])])
    segs = [Segment(c.id, 0, phase=ENDED, job_id="11", outcome="handoff", time_limit_s=3600, cluster="local",
                    submit=10.0, eligible=10.0, start=20.0, end=3600.0),
            Segment(c.id, 1, phase=ENDED, job_id="21", outcome="handoff", time_limit_s=3600, cluster="b",
                    submit=3000.0, eligible=3000.0, start=3700.0, end=7000.0),
            Segment(c.id, 2, phase=PENDING, job_id="22", time_limit_s=3600, cluster="b", submit=6000.0,
                    eligible=6000.0)]
    store.save(c, segs)
    for i in range(12):  # more than the view keeps; other kinds are not decisions
        store.add_event(c.id, 0, "site", f"decision {i}")
        store.add_event(c.id, 0, "submit", f"not a decision {i}")
    one = _chain("one-0001", sites=False)
    store.add_chain(one)
    store.save(one, [Segment(one.id, 0, phase=PENDING, job_id="31", time_limit_s=3600, submit=5.0, eligible=5.0)])
    store.add_event(one.id, 0, "site", "never asked for")  # a chain on one cluster: no query, nothing shown
    return store


def test_status_of_a_chain_spanning_clusters_says_its_sites_each_segments_cluster_and_the_decision(chainrun_home):
    _store(chainrun_home).close()
    p = run_cli("status", "span-0001", home=chainrun_home, env=WIDE)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "clusters (in order of preference): local, b; on b; moves only to gain more than 10m" in out, out
    assert f"placement of segment 2 (" in out and REASON.split(";")[0] in out and "next local ~5 min" in out
    assert "12 site decisions" not in out and "10 site decisions kept" in out
    # the transfer that decision weighed to each other cluster, and what it was read from
    assert "checkpoint transfer weighed: to local 20s (size over the rate measured b>local)" in out, out
    segs = [line for line in out.splitlines() if line.startswith("seg=")]
    assert [line.split()[2] for line in segs] == ["cluster=local", "cluster=b", "cluster=b"], segs

    j = json.loads(run_cli("status", "span-0001", "--json", home=chainrun_home).stdout)["data"][0]
    assert j["site_choice"]["reason"] == REASON
    assert [d["decision"] for d in j["site_decisions"]] == [f"decision {i}" for i in range(2, 12)]  # newest last
    assert all(d["segment"] == 0 and d["at"] > 0 for d in j["site_decisions"])
    assert [s["cluster"] for s in j["segments_detail"]] == ["local", "b", "b"]


def test_the_terminal_table_has_a_cluster_column_and_the_decision_above_it(chainrun_home):
    store = _store(chainrun_home)
    try:
        c = store.chain("span-0001")
        v = summary.view_chain(c, store.segments(c.id), decisions=summary.site_decisions(store, c))
        buf = io.StringIO()
        Console(file=buf, width=220, force_terminal=True, color_system=None).print(tables.chain_detail(v))
    finally:
        store.close()
    out = buf.getvalue()
    assert "clusters (in order of preference): local, b; on b" in out and REASON.split(";")[0] in out
    header = next(line for line in out.splitlines() if " seg " in line and " job " in line)
    assert " cluster " in header, out
    rows = [line for line in out.splitlines() if " 11 " in line or " 21 " in line]
    assert " local " in rows[0] and " b " in rows[1], rows


def test_a_chain_on_one_cluster_shows_no_sites_and_no_decisions(chainrun_home):
    _store(chainrun_home).close()
    p = run_cli("status", "one-0001", home=chainrun_home, env=WIDE)
    assert p.returncode == 0, p.stderr
    assert "clusters (" not in p.stdout and "placement of" not in p.stdout and "cluster=" not in \
        "\n".join(line for line in p.stdout.splitlines() if line.startswith("seg=")), p.stdout
    j = json.loads(run_cli("status", "one-0001", "--json", home=chainrun_home).stdout)["data"][0]
    assert j["site_decisions"] == [] and j["sites"] == []


def test_the_overview_names_every_cluster_of_a_chain_spanning_them(chainrun_home):
    """`chainrun status` (no CHAIN) listed only `cluster=` (the one it is on): a chain spanning clusters
    also says all of them, in order of preference; a chain on one cluster does not (found in the #26 audit)."""
    _store(chainrun_home).close()
    p = run_cli("status", "--plain", home=chainrun_home, env=WIDE)
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines() if line.startswith(("span-", "one-"))}
    assert rows["span-0001"][2:4] == ["cluster=b", "clusters=local,b"], p.stdout
    assert rows["one-0001"][2] == "cluster=local" and not any(t.startswith("clusters=") for t in rows["one-0001"])
    store = Store(paths.state_db())
    try:
        views = [summary.view_chain(c, store.segments(c.id)) for c in store.chains(active_only=False)]
    finally:
        store.close()
    buf = io.StringIO()
    Console(file=buf, width=220, force_terminal=True, color_system=None).print(tables.chain_list(views))
    assert "of local,b" in buf.getvalue(), buf.getvalue()
