"""`chainrun submit --cluster local,b` on two real Slurm clusters with their own ClusterName: ``local`` is
this process's cluster (SLURM_CONF), ``b`` a second cluster reached through a real OpenSSH server on
127.0.0.1 (the system ssh, `cluster add --ssh`), whose sessions get that cluster's SLURM_CONF from
sshd's own SetEnv (a server of this module's: the shared ones are left as they are).

Every check at submit is proven on the real thing: both sites accept the chain's job with
`sbatch --test-only` and pass a preflight job that runs there (on b it reads b's ClusterName); each
site gets its run and checkpoint folders; the chain and its sites are recorded and it starts on the
first site, where it runs to the end like a single-cluster chain. Each failure is one line naming the
cluster and leaves nothing behind: a script option refused by b's `--test-only`, declared GPUs that do
not fit, a failing preflight, a site that asks for a login (MFA, no master) or whose host key is unknown.

The second cluster: ``CHAINRUN_TEST_SITE_B_CONF`` (a running cluster's slurm.conf), else one started
here (scripts/start-cluster.sh /tmp/chainrun-slurm-sites, ClusterName crsites, ports 9017+/3311).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO, run_cli
from tests.ssh.conftest import REMOTE_HOME, REMOTE_USER, Server, host_block

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]

B_DIR = Path("/tmp/chainrun-slurm-sites")
SSHD_DIR = Path(os.environ.get("CHAINRUN_TEST_SITE_B_SSHD_DIR", "/tmp/chainrun-sshd-sites"))
SSHD_PORT = int(os.environ.get("CHAINRUN_TEST_SITE_B_SSHD_PORT", "2228"))
N4 = "--exclude=n1,n2,n3"  # the chain's own jobs: n1-n3 belong to other tests on the shared cluster


def _need(why: str):
    if IN_CI:
        pytest.fail(why)
    pytest.skip(why)


def _cluster_name(conf: str) -> str:
    p = subprocess.run(["scontrol", "show", "config"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True,
                       text=True, timeout=60)
    m = re.search(r"^ClusterName\s*=\s*(\S+)", p.stdout, re.MULTILINE)
    return m.group(1) if m else ""


@pytest.fixture(scope="module")
def second_cluster(slurm_cluster) -> str:
    """The slurm.conf of a second real cluster whose ClusterName differs from this process's."""
    conf = os.environ.get("CHAINRUN_TEST_SITE_B_CONF")
    if not conf:
        if os.geteuid() != 0:
            _need("a second Slurm cluster needs root to start (or set CHAINRUN_TEST_SITE_B_CONF)")
        env = {**os.environ, "CHAINRUN_SLURM_PORT_BASE": "9017", "CHAINRUN_SLURM_DB_PORT": "3311",
               "CHAINRUN_SLURM_ETC_LINK": "0", "CHAINRUN_SLURM_CLUSTER": "crsites",
               "CHAINRUN_SLURM_USERS": REMOTE_USER}
        p = subprocess.run(["bash", str(REPO / "scripts" / "start-cluster.sh"), str(B_DIR)], env=env,
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            _need(f"the second cluster did not start: {p.stderr.strip()[-500:]}")
        conf = str(B_DIR / "etc" / "slurm.conf")
    here, there = _cluster_name(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")), _cluster_name(conf)
    if not there or here == there:
        _need(f"two clusters with their own ClusterName are needed (got {here!r} and {there!r})")
    return conf


@pytest.fixture(scope="module")
def site_b(second_cluster, ssh_server) -> Server:
    """A key-only sshd whose sessions reach the second cluster (sshd_config SetEnv SLURM_CONF=...)."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "start-sshd.sh"), str(SSHD_DIR)],
                       env={**os.environ, "CHAINRUN_SSH_PORT": str(SSHD_PORT),
                            "CHAINRUN_SSH_SETENV": f"SLURM_CONF={second_cluster}"},
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        _need(f"the second cluster's sshd did not start: {p.stderr.strip()[-500:]}")
    return Server(SSHD_DIR, SSHD_PORT)


@pytest.fixture(scope="module")
def env(site_b, tmp_path_factory):
    """A chainrun home with cluster b (`--ssh crb`, its own workdir), and the environment of its commands."""
    home = tmp_path_factory.mktemp("sites") / "home"
    cm = Path(tempfile.mkdtemp(prefix="crst", dir="/tmp"))
    (cm / "config").write_text(host_block("crb", site_b))
    workdir = REMOTE_HOME / f"cr-sites-{uuid.uuid4().hex[:8]}"
    extra = {"CHAINRUN_SSH_CONFIG": str(cm / "config"), "CHAINRUN_SSH_CONTROL_DIR": str(cm)}
    p = run_cli("cluster", "add", "b", "--ssh", "crb", "--workdir", str(workdir), home=home, env=extra)
    assert p.returncode == 0, p.stderr
    base = (home / "config.toml").read_text()
    # b's environment file (sourced by its preflight and its copy of the script)
    got = site_b.ssh(f"mkdir -p {workdir} && printf 'export SITE_B_ENV=yes\\n' > {workdir}/env.sh")
    assert got.returncode == 0, got.stderr
    yield {"home": home, "extra": extra, "base": base, "workdir": workdir, "server": site_b,
           "cm": cm, "b_cluster": _cluster_name(os.environ.get("CHAINRUN_TEST_SITE_B_CONF")
                                                or str(B_DIR / "etc" / "slurm.conf"))}
    for sock in cm.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=30)
    shutil.rmtree(cm, ignore_errors=True)
    site_b.ssh(f"rm -rf {workdir}")


def configure(env, sites: str) -> None:
    (env["home"] / "config.toml").write_text(env["base"] + "\n" + sites.replace("@WORKDIR@", str(env["workdir"])))


def submit(env, work: Path, *args: str):
    env["before"] = chain_ids(env)
    env["before_folders"] = run_folders(env, work)
    script = work / "train.sh"
    if not script.exists():  # the toy trainer, beside its script (it finds the trainer there)
        shutil.copy(REPO / "templates" / "toy_train.sh", script)
        shutil.copy(REPO / "templates" / "toy_trainer.py", work / "toy_trainer.py")
    return run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@50", "--policy", "lead", "--json",
                   *args, home=env["home"], cwd=work, env=env["extra"], timeout=600)


def run_folders(env, work: Path) -> tuple[list[Path], list[str]]:
    """Run folders on this machine and on b (the witness is the plain ssh client, not chainrun)."""
    here = sorted((work / "chainrun-runs").glob("*")) if (work / "chainrun-runs").exists() else []
    there = env["server"].ssh(f"ls {env['workdir']}/chainrun-runs 2>/dev/null").stdout.split()
    return here, sorted(there)


GOOD = """
[clusters.local.gpu]
memory = "80G"
dtypes = ["bf16", "fp16"]

[clusters.local.job]
preflight = "test -d \\"$CHAINRUN_CHECKPOINT_DIR\\" && echo ready on $CHAINRUN_CLUSTER"

[clusters.b.sbatch]
partition = "long"

[clusters.b.gpu]
memory = "40G"
dtypes = ["bf16", "fp16"]

[clusters.b.job]
env_file = "@WORKDIR@/env.sh"
preflight = "test \\"$SITE_B_ENV\\" = yes && scontrol show config | grep ClusterName > \\"$CHAINRUN_RUN_DIR/preflight-saw\\""
"""


def test_checks_pass_folders_on_both_and_the_chain_runs_on_its_first_site(env, tmp_path):
    configure(env, GOOD)
    t0 = time.monotonic()
    p = submit(env, tmp_path, "--cluster", "local,b", "--gpu-mem", "40G", "--dtype", "bf16", "--",
               N4, "--export=ALL,TOY_TOTAL_STEPS=10")
    assert p.returncode == 0, p.stderr
    submit_s = time.monotonic() - t0
    data = json.loads(p.stdout)["data"]
    chain = data["chain"]
    assert data["cluster"] == "local" and data["moves"] == "by the rule"
    a, b = data["sites"]
    assert (a["cluster"], a["rank"], b["cluster"], b["rank"]) == ("local", 0, "b", 1)
    for site in (a, b):
        checks = site["checks"]
        assert checks["test_only"].startswith("accepted by sbatch --test-only"), checks
        assert checks["preflight"].startswith("preflight passed (job "), checks
        assert "GPUs support bf16" in checks["gpu"], checks
    assert "--partition=long" in b["sbatch_args"] and "--partition=long" not in a["sbatch_args"]  # b's own options
    assert b["run_dir"] == f"{env['workdir']}/chainrun-runs/{chain}"
    # each site has its own run and checkpoint folder and wrapper, and the wrapper says where it runs
    assert Path(a["checkpoint_dir"]).is_dir() and (Path(a["run_dir"]) / "control" / "token").is_file()
    assert "export CHAINRUN_CLUSTER=local" in (Path(a["run_dir"]) / "wrapper.sh").read_text()
    got = env["server"].ssh(f"test -d {b['checkpoint_dir']} && test -f {b['run_dir']}/control/token && "
                            f"grep -h CHAINRUN_CLUSTER= {b['run_dir']}/wrapper.sh && cat {b['run_dir']}/preflight-saw")
    assert got.returncode == 0, got.stderr
    assert "export CHAINRUN_CLUSTER=b" in got.stdout
    # b runs a copy of the script that sources b's environment file after the #SBATCH header
    copy = env["server"].ssh(f"cat {b['script']}").stdout
    assert b["script"].startswith(b["run_dir"] + "/") and f". '{env['workdir']}/env.sh' ||" in copy, copy
    assert re.search(rf"ClusterName\s*=\s*{env['b_cluster']}\b", got.stdout), got.stdout  # it ran on the other cluster
    # recorded: the chain with its sites, segment 0 on the first
    from chainrun.state.store import Store

    store = Store(env["home"] / "state.sqlite")
    try:
        assert [(s.cluster, s.rank) for s in store.sites(chain)] == [("local", 0), ("b", 1)]
        assert store.sites(chain)[1].extra["checks"]["preflight"] == b["checks"]["preflight"]
        assert store.segments(chain)[0].cluster == "local"
    finally:
        store.close()
    # it runs on its first site like any chain: to the end, every segment there
    w = run_cli("watch", "--plain", "--interval", "3", "--until-done", home=env["home"], env=env["extra"], timeout=600)
    assert w.returncode == 0, w.stderr
    st = json.loads(run_cli("status", chain, "--json", home=env["home"]).stdout)["data"][0]
    assert st["status"] == "COMPLETED", st
    print(f"submit with both sites' checks took {submit_s:.1f}s")


def test_the_text_result_names_each_site_and_the_move_rule(env, tmp_path):
    configure(env, "")
    script = tmp_path / "train.sh"
    shutil.copy(REPO / "templates" / "toy_train.sh", script)
    p = run_cli("submit", str(script), "--total", "2m", "--signal", "USR2@50", "--policy", "lead",
                "--cluster", "local,b", "--", N4, "--hold", home=env["home"], cwd=tmp_path, env=env["extra"],
                timeout=600)
    assert p.returncode == 0, p.stderr
    assert "it starts on local; each next segment runs where the chain is expected to finish first" in p.stdout
    assert "margin (1h00m)" in p.stdout
    assert re.search(r"^site 2 b: .*reached without a prompt; accepted by sbatch --test-only", p.stdout, re.M), p.stdout
    chain = re.search(r"^chain (\S+):", p.stdout, re.M).group(1)
    # `status CHAIN` says where the chain may run, where it is, and the decision that put segment 0 there
    s = run_cli("status", chain, home=env["home"], env={**env["extra"], "COLUMNS": "250"})
    assert s.returncode == 0, s.stderr
    assert "clusters (in order of preference): local, b; on local" in s.stdout, s.stdout
    assert re.search(r"placement of segment 0 \(.*\): start on local: done in ~", s.stdout), s.stdout
    assert re.search(r"^seg=0 +job=\d+ +cluster=local ", s.stdout, re.M), s.stdout
    assert run_cli("cancel", chain, home=env["home"], env=env["extra"]).returncode == 0


def test_a_chain_whose_first_cluster_is_full_starts_on_the_second(env, tmp_path):
    """Segment 0 is placed by the rule: local's n4 (the chain's only node there) is held for an hour by
    another job, so sbatch --test-only expects the chain an hour from now there and at once on b."""
    configure(env, "")
    blocker = subprocess.run(["sbatch", "--parsable", "-J", "other-user", "-p", "long", "-w", "n4", "--exclusive",
                              "-t", "60", "--wrap", "sleep 3600"], capture_output=True, text=True, check=True,
                             env={**os.environ, **env["extra"]}).stdout.strip().split(";")[0]
    try:
        # running, not just queued: Slurm's --test-only plans around running jobs (asked while the blocker
        # was still pending, it said local would start the chain at once)
        deadline = time.time() + 60
        while subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True,
                             env={**os.environ, **env["extra"]}).stdout.strip() != "RUNNING":
            assert time.time() < deadline, f"the blocker {blocker} did not start"
            time.sleep(1)
        p = submit(env, tmp_path, "--cluster", "local,b", "--site-margin", "5m", "--", N4)
        assert p.returncode == 0, p.stderr
    finally:
        subprocess.run(["scancel", blocker], capture_output=True, timeout=60, env={**os.environ, **env["extra"]})
    data = json.loads(p.stdout)["data"]
    chain = data["chain"]
    try:
        assert data["cluster"] == "b", data
        from chainrun.state.store import Store

        store = Store(env["home"] / "state.sqlite")
        try:
            seg0 = store.segments(chain)[0]
            said = [e.message for _, e in store.events(chain, limit=100) if e.kind == "site"]
            assert store.chain(chain).cluster == "b" and store.chain(chain).run_dir == data["sites"][1]["run_dir"]
        finally:
            store.close()
        assert seg0.cluster == "b" and seg0.job_id, seg0
        assert said and said[0].startswith("segment 0: start on b: ") and "against ~" in said[0], said
        # the job is b's (its own queue lists it), and local's queue has none of the chain's
        # -t all: the toy payload may already have ended there (b's user cannot read the test's tmp folder,
        # so it can fail at once), and squeue lists an ended job only when asked for every state
        got = env["server"].ssh(f"squeue -h -t all -j {seg0.job_id} -o %j")
        assert got.stdout.split() == [f"cr.{chain}.0"], (got.stdout, got.stderr)
        here = subprocess.run(["squeue", "-h", "-n", f"cr.{chain}.0", "-o", "%i"], capture_output=True, text=True,
                              env={**os.environ, **env["extra"]})
        assert here.returncode == 0 and here.stdout.strip() == "", (here.stdout, here.stderr)
    finally:
        assert run_cli("cancel", chain, home=env["home"], env=env["extra"]).returncode == 0


def test_a_model_that_expects_hours_on_the_first_cluster_starts_the_chain_on_the_second(env, tmp_path, monkeypatch):
    """Segment 0 is placed on each site's queue-delay model where one was trained: local's (a real model,
    saved where `chainrun model refresh` saves it, trained on jobs that all waited ~5 h) expects hours
    although Slurm would start the chain at once there; b has no model, its `--test-only` start stands."""
    import numpy as np

    from chainrun.predict.service import model_dir
    from chainrun.predict.training import fit_predictor
    from tests.predict.predict_helpers import synthetic_history

    configure(env, "")
    monkeypatch.setenv("CHAINRUN_HOME", str(env["home"]))
    mdir = model_dir("local")
    df = synthetic_history(300)
    df["start"] = df["eligible"] + 5 * 3600 * np.random.default_rng(1).lognormal(0, 0.05, len(df))
    df["end"] = df["start"] + 600
    fit_predictor(df, per_user="never").save(mdir)
    try:
        p = submit(env, tmp_path, "--cluster", "local,b", "--", N4, "--hold")
    finally:
        shutil.rmtree(mdir)  # the module's other chains place on Slurm's starts
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain = data["chain"]
    try:
        assert data["cluster"] == "b", data
        local = data["sites"][0]["checks"]
        assert local["wait"].startswith("queue-delay model ") and "wait" not in data["sites"][1]["checks"], local
        st = json.loads(run_cli("status", chain, "--json", home=env["home"]).stdout)["data"][0]
        waits = st["site_choice"]["waits"]
        assert waits["b"]["from"] == "slurm --test-only" and waits["local"]["from"] != "slurm --test-only", waits
        assert waits["local"]["wait_s"] > 4 * 3600 and waits["b"]["wait_s"] < 600, waits
        from chainrun.state.store import Store

        store = Store(env["home"] / "state.sqlite")
        try:  # the site event (`watch` and notifications show it) says where each wait came from
            said = [e.message for _, e in store.events(chain, limit=100) if e.kind == "site"]
        finally:
            store.close()
        assert said and said[0].startswith("segment 0: start on b: "), said
        assert "(slurm --test-only)" in said[0] and f"({waits['local']['from']})" in said[0], said
    finally:
        assert run_cli("cancel", chain, home=env["home"], env=env["extra"]).returncode == 0


def test_a_clusters_own_script_is_used_in_place(env, tmp_path):
    own = f"{env['workdir']}/own train.sh"
    got = env["server"].ssh(f"printf '#!/bin/bash\\n#SBATCH --comment=own\\ntouch \"$CHAINRUN_DONE_FILE\"\\n' "
                            f"> '{own}' && chmod 700 '{own}'")
    assert got.returncode == 0, got.stderr
    configure(env, f'[clusters.b.job]\nscript = "{own}"\n')
    p = submit(env, tmp_path, "--cluster", "local,b", "--", N4, "--hold")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    a, b = data["sites"]
    assert a["script"] == str(tmp_path / "train.sh") and b["script"] == own  # in place on both, nothing uploaded
    wrapper = env["server"].ssh(f"cat {b['run_dir']}/wrapper.sh").stdout
    assert "#SBATCH --comment=own" in wrapper and "CHAINRUN_PAYLOAD='" + own + "'" in wrapper
    assert run_cli("cancel", data["chain"], home=env["home"], env=env["extra"]).returncode == 0


def chain_ids(env) -> set[str]:
    p = run_cli("status", "--json", home=env["home"])
    assert p.returncode == 0, p.stderr
    return {c["id"] for c in json.loads(p.stdout)["data"]}


def _refused(env, work: Path, p, *words: str) -> None:
    """One line on stderr naming the cluster, exit 2, and nothing left on either site or in the store."""
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert run_folders(env, work) == env["before_folders"], "a refused chain left folders behind"
    assert chain_ids(env) == env["before"], "a refused chain was recorded"


def test_an_option_refused_by_test_only_on_one_cluster(env, tmp_path):
    configure(env, GOOD.replace('partition = "long"', 'args = ["--constraint=nosuchfeature"]'))
    p = submit(env, tmp_path, "--cluster", "local,b", "--", N4)
    _refused(env, tmp_path, p, "cluster b: sbatch --test-only refused the chain's job", "Invalid feature specification")


def test_declared_gpus_that_do_not_fit(env, tmp_path):
    configure(env, GOOD)
    p = submit(env, tmp_path, "--cluster", "local,b", "--gpu-mem", "64G", "--", N4)
    _refused(env, tmp_path, p, "cluster b: its GPUs have 40G of memory, the chain needs 64G (--gpu-mem)")
    configure(env, GOOD.replace('dtypes = ["bf16", "fp16"]\n\n[clusters.b.job]',
                                'dtypes = ["fp16"]\n\n[clusters.b.job]'))
    p = submit(env, tmp_path, "--cluster", "local,b", "--dtype", "bf16", "--", N4)
    _refused(env, tmp_path, p, "cluster b: its GPUs do not support bf16 (declared: fp16)")


def test_a_failing_preflight(env, tmp_path):
    configure(env, GOOD.replace(
        'preflight = "test \\"$SITE_B_ENV',  # b's only: local's passes
        'preflight = "test -d /nonexistent/data || { echo data missing on $CHAINRUN_CLUSTER; exit 4; }; '
        'test \\"$SITE_B_ENV'))
    p = submit(env, tmp_path, "--cluster", "local,b", "--", N4)
    _refused(env, tmp_path, p, "cluster b: preflight `test -d /nonexistent/data", "failed (job ", "exit 4",
             ": data missing on b")


def test_a_site_that_asks_for_a_login_or_has_an_unknown_host_key(env, tmp_path, mfa_server, ssh_server):
    cfg = env["cm"] / "config"
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    # the untrusted one is another server: an alias of b's would share b's open master (ssh's %C is
    # host, port and user) and never check a host key again
    cfg.write_text(host_block("crb", env["server"]) + host_block("crmfa", mfa_server)
                   + host_block("crnew", ssh_server, known_hosts=unknown))
    (env["home"] / "config.toml").write_text(env["base"])
    for name, alias in (("m", "crmfa"), ("u", "crnew")):
        assert run_cli("cluster", "add", name, "--ssh", alias, "--no-check", home=env["home"],
                       env=env["extra"]).returncode == 0
    env2 = {**env, "base": (env["home"] / "config.toml").read_text()}
    try:
        configure(env2, "")
        p = submit(env2, tmp_path, "--cluster", "local,m")
        _refused(env2, tmp_path, p, "cluster m: needs a login (MFA or a password) and no SSH master is open; "
                 "a chain spanning clusters needs a driver that reaches every cluster without a prompt",
                 "chainrun cluster login m")
        p = submit(env2, tmp_path, "--cluster", "b,u")
        _refused(env2, tmp_path, p, "cluster u: its host key is not trusted")
    finally:
        (env["home"] / "config.toml").write_text(env["base"])


def _history_on_b(env, need: int = 30) -> None:
    """At least ``need`` started jobs in b's accounting: a model needs 20 to train (predict/training.py). On a
    machine whose second cluster is new, the module's earlier tests may have run fewer there: run tiny ones."""
    def started() -> int:
        out = env["server"].ssh("sacct -a -X -n -P -S now-30days -o Start").stdout.split()
        return sum(1 for s in out if s[:1].isdigit())

    short = need - started()
    if short <= 0:
        return
    p = env["server"].ssh(f"for i in $(seq {short}); do sbatch -Q -p long -t 1 -J history --wrap true; done")
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 180
    while started() < need:
        assert time.monotonic() < deadline, f"{short} tiny jobs did not all run on b within 180 s"
        time.sleep(2)


def test_the_site_margin_is_chosen_on_both_clusters_history_and_a_chain_takes_it(env, tmp_path, monkeypatch):
    """`chainrun model sites local,b` on the two real clusters' histories, read by `model refresh` (sacct
    here and over SSH on b): too little past there, so the shipped margin is kept with its one-line reason,
    recorded; pinned, b's real `model refresh` re-chooses it, records and keeps it; a chain submitted after
    it records that margin and where it came from; a margin put in force in the store is what the next real
    submit takes."""
    from chainrun.chain import site_tuned
    from chainrun.predict import ingest
    from chainrun.predict.service import model_dir

    configure(env, "")
    monkeypatch.setenv("CHAINRUN_HOME", str(env["home"]))
    _history_on_b(env)
    try:
        for name in ("local", "b"):  # the real caches; the models they train are removed below
            r = run_cli("model", "refresh", "--cluster", name, "--no-tune", home=env["home"], env=env["extra"],
                        timeout=600)
            assert ingest.history_paths(name)[0].exists(), (name, r.returncode, r.stderr)
    finally:
        for name in ("local", "b"):  # the module's other chains place on Slurm's starts
            shutil.rmtree(model_dir(name), ignore_errors=True)
    hidden = not ingest.load_cache("b")[1].get("all_users", True)  # b's user may see only its own jobs
    p = run_cli("model", "sites", "local,b", home=env["home"], env=env["extra"], timeout=600)
    assert p.returncode == 0, p.stderr
    said = "other users' jobs are hidden on b" if hidden else "history too short on "
    first = p.stdout.splitlines()[0]
    assert first.startswith("site margin for local,b: kept the shipped margin 1h: ") and said in first, p.stdout
    assert "in force: 1h (shipped)" in p.stdout
    print(first)
    st = json.loads(run_cli("model", "sites", "local,b", "--show", "--json", home=env["home"]).stdout)["data"]
    e = st["lists"]["local,b"]
    assert e["in_force"]["margin_s"] == 3600 and e["in_force"]["source"] == "shipped"
    assert said in e["last"]["reason"] and "\n" not in e["last"]["reason"]
    # pinned, then b's real refresh (what cron runs, tuning included) re-chooses the stored list holding b:
    # recorded, the pinned margin kept, the refresh successful
    assert run_cli("model", "sites", "local,b", "--pin", home=env["home"]).returncode == 0
    try:
        r = run_cli("model", "refresh", "--cluster", "b", "--json", home=env["home"], env=env["extra"], timeout=600)
    finally:
        shutil.rmtree(model_dir("b"), ignore_errors=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["data"]["site_margins"]["lists"]
    assert list(got) == ["local,b"] and got["local,b"]["pinned"] and said in got["local,b"]["reason"], got
    assert got["local,b"]["summary"].startswith("kept the pinned margin 1h"), got
    print("refresh b:", got["local,b"]["summary"])
    assert len(json.loads(site_tuned.path().read_text())["lists"]["local,b"]["history"]) == 2
    assert run_cli("model", "sites", "local,b", "--unpin", home=env["home"]).returncode == 0
    s = submit(env, tmp_path, "--cluster", "local,b", "--", N4, "--hold")
    assert s.returncode == 0, s.stderr
    data = json.loads(s.stdout)["data"]
    assert data["site_margin_s"] == 3600, data
    assert data["site_margin_source"].startswith("shipped (choose one on the clusters' past: chainrun model sites local,b)")
    st = json.loads(run_cli("status", data["chain"], "--json", home=env["home"]).stdout)["data"][0]
    assert st["site_margin"] == {"margin_s": 3600, "source": data["site_margin_source"]}, st
    assert run_cli("cancel", data["chain"], home=env["home"], env=env["extra"]).returncode == 0
    # a margin in force (as a choice on a longer past would put it) is what the next submit records
    site_tuned.record(["local", "b"], {"chosen": True, "margin_s": 3 * 3600.0, "reason": "test", "rows": {},
                                       "window": {"from": "x", "until": "y", "finished": 12}})
    try:
        s = submit(env, tmp_path, "--cluster", "local,b", "--", N4, "--hold")
    finally:
        site_tuned.path().unlink()  # the module's other chains: the shipped margin
    assert s.returncode == 0, s.stderr
    data = json.loads(s.stdout)["data"]
    assert data["site_margin_s"] == 3 * 3600 and data["site_margin_source"].startswith("chosen "), data
    assert run_cli("cancel", data["chain"], home=env["home"], env=env["extra"]).returncode == 0


def test_a_missing_env_file_or_a_site_no_checkpoint_copy_can_reach(env, tmp_path):
    """b's env_file is read there (`test -r` over its transport); q, b's own server added with the built-in
    client (`cluster add --host`), could never carry rsync: both refused before anything is written."""
    configure(env, '[clusters.b.job]\nenv_file = "@WORKDIR@/no-such-env.sh"\n')
    p = submit(env, tmp_path, "--cluster", "local,b", "--", N4)
    _refused(env, tmp_path, p, f"cluster b: cannot read its env_file {env['workdir']}/no-such-env.sh",
             "[clusters.b.job] env_file")
    (env["home"] / "config.toml").write_text(env["base"])
    try:
        add = run_cli(*env["server"].add_args("q"), "--accept-new-host-key", home=env["home"], env=env["extra"])
        assert add.returncode == 0, add.stderr
        env2 = {**env, "base": (env["home"] / "config.toml").read_text()}
        p = submit(env2, tmp_path, "--cluster", "local,q", "--", N4)
        _refused(env2, tmp_path, p, "cluster q: checkpoint copies to or from q need the OpenSSH transport",
                 "chainrun cluster add q --ssh ALIAS")
    finally:
        (env["home"] / "config.toml").write_text(env["base"])
