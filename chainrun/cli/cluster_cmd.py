"""``chainrun cluster add/list/test/remove/default``: the clusters chains can run on.

paramiko is imported only inside the commands that connect (``test``, and ``add`` unless
``--no-check``), never on the ``chainrun --help`` path.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from chainrun.cli.render import envelope
from chainrun.errors import RemoteError, UsageError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of text.")]
cluster_app = typer.Typer(help="Remote clusters reached over SSH (`local` is always there).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")


@cluster_app.command("add", help="Add (or replace) a cluster reached over SSH. Keys and agents only: no passwords.")
def add(
    name: Annotated[str, typer.Argument(help="A short name for the cluster, used with --cluster.")],
    host: Annotated[Optional[str], typer.Option("--host", help="Login node host name (or a Host alias from ~/.ssh/config), reached with the built-in SSH client (keys only).")] = None,
    ssh: Annotated[Optional[str], typer.Option("--ssh", help="A Host alias from ~/.ssh/config, reached with the system ssh as configured (MFA, certificates, ProxyCommand); see `cluster login`.")] = None,
    user: Annotated[Optional[str], typer.Option("--user", help="Remote user (default: ~/.ssh/config, else yours).")] = None,
    port: Annotated[Optional[int], typer.Option("--port", min=1, max=65535, help="SSH port (default: ~/.ssh/config, else 22).")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="Private key file (its path is stored, never its content).")] = None,
    proxy_jump: Annotated[Optional[str], typer.Option("--proxy-jump", help="Bastion(s) like ssh -J: [user@]host[:port][,...].")] = None,
    login_shell: Annotated[bool, typer.Option("--login-shell", help="Run commands in `bash -lc` (sites where Slurm comes from `module load`).")] = False,
    workdir: Annotated[Optional[str], typer.Option("--workdir", help="Remote folder for chain folders (default: the remote home).")] = None,
    default: Annotated[bool, typer.Option("--default", help="Make this the default cluster for commands without --cluster.")] = False,
    accept_new_host_key: Annotated[bool, typer.Option("--accept-new-host-key", help="Trust the server's key if it is not known yet (a changed key is still refused).")] = False,
    no_check: Annotated[bool, typer.Option("--no-check", help="Save without connecting (offline); `chainrun cluster test` checks it later.")] = False,
    json_out: JsonOpt = False,
) -> None:
    from chainrun import clusters

    from chainrun.errors import UsageError

    clusters.check_name(name)
    cfg = clusters.load()
    if (host is None) == (ssh is None):
        raise UsageError("give --host (built-in SSH, keys only) or --ssh ALIAS (the system ssh), not both or neither")
    if ssh is not None:
        given = [o for o, v in (("--user", user), ("--port", port), ("--key", key), ("--proxy-jump", proxy_jump)) if v]
        if given:
            raise UsageError(f"{', '.join(given)} cannot go with --ssh",
                             hint=f"put User, Port, IdentityFile or ProxyJump in the `Host {ssh}` block of ~/.ssh/config")
    if key and not key.startswith(("/", "~")):  # relative to here: ticks run from other folders (cron, scrontab)
        import os

        key = os.path.abspath(key)
    spec = clusters.Cluster(name=name, host=host or ssh, user=user, port=port, key=key, proxy_jump=proxy_jump,
                            login_shell=login_shell, workdir=workdir, transport=clusters.OPENSSH if ssh else None)
    if no_check and accept_new_host_key:
        raise UsageError("--accept-new-host-key needs a connection", hint="drop --no-check, or drop --accept-new-host-key")
    trusted: list[dict] = []
    login_needed = False
    if spec.openssh:
        from chainrun.runner.openssh import check_alias, ensure_control_dir

        check_alias(ssh)
        ensure_control_dir()  # a socket path too long for this machine is refused now, not at the first tick
        if not no_check:
            login_needed = _check_openssh(spec, accept_new=accept_new_host_key)
    elif not no_check:  # connect now: a wrong host, port, user, key or an untrusted host key saves nothing
        trusted = _check_connection(spec, accept_new=accept_new_host_key)
    cfg.clusters[name] = spec
    if default:
        cfg.default = name
    path = clusters.save(cfg)
    if json_out:
        typer.echo(envelope("cluster add", {"cluster": _public(spec), "default": cfg.default, "trusted_keys": trusted,
                                            "login_needed": login_needed}))
        return
    for k in trusted:
        typer.echo(f"trusted host key for {k['host']}: {k['type']} {k['fingerprint']}")
    typer.echo(f"cluster {name} saved in {path}" + (" (default)" if cfg.default == name else ""))
    if no_check:
        typer.echo(f"not checked: check it with `chainrun cluster test {name}`")
    if login_needed:
        typer.echo(f"{name} asks for a login (MFA): open one with `chainrun cluster login {name}`")


def _check_openssh(spec, *, accept_new: bool) -> bool:
    """Run ``true`` over the system ssh, never prompting. True when the host answered but wants a
    human to log in (its host key was verified before that, so the cluster is saved)."""
    from chainrun.runner.openssh import LoginRequired, OpenSSHRunner

    runner = OpenSSHRunner(spec, accept_new_host_key=accept_new)
    try:
        res = runner.run(["true"], 60)
    except LoginRequired as e:
        if e.methods.lower() != "publickey":
            return True  # a prompt (one-time code, password) a human answers once in `cluster login`
        # only a key would do and ours was refused: no prompt to answer, nothing `cluster login` could fix
        raise RemoteError(
            f"{spec.name} (ssh {spec.host}" + (f", user {runner.user}" if runner.user else "")
            + ") did not accept our key (Permission denied (publickey))",
            hint=f"check User and IdentityFile in the `Host {spec.host}` block of ~/.ssh/config; a key with a "
            "passphrase: load it with ssh-add; an expired certificate: renew it; nothing was saved; "
            "--no-check saves without connecting") from None
    except RemoteError as e:
        fix = f"{e.hint}; " if e.hint else ""
        raise type(e)(e.message, hint=f"{fix}nothing was saved; --no-check saves without connecting") from None
    if not res.ok:
        raise RemoteError(f"connected to {spec.name}, but `true` failed: {res.first_error_line()}",
                          hint="check that the account has a working shell; nothing was saved")
    return False


@cluster_app.command("login", help="Open the SSH master of a --ssh cluster on this terminal: answer the site's MFA prompt once; ticks reuse it and never prompt.")
def login(
    name: Annotated[str, typer.Argument(help="The cluster (added with --ssh).")],
    persist: Annotated[str, typer.Option("--persist", help="How long the master stays open when idle (ssh's ControlPersist: yes = until the connection drops, or e.g. 12h).")] = "yes",
    json_out: JsonOpt = False,
) -> None:
    from chainrun import clusters
    from chainrun.errors import UsageError
    from chainrun.runner import openssh

    spec = clusters.get(name)
    if not spec.openssh:
        raise UsageError(f"cluster {name} uses the built-in SSH client (keys only): there is no login to open",
                         hint=f"for a site with MFA, re-add it with `chainrun cluster add {name} --ssh ALIAS`")
    done = openssh.login(spec, persist=persist)
    if json_out:
        typer.echo(envelope("cluster login", done))
        return
    if done["already_open"]:
        typer.echo(f"{name}: already logged in (an SSH master is open); commands run over it")
    else:
        typer.echo(f"{name}: logged in; ticks run over this SSH master until it closes (ControlPersist={persist})")
    if done["sessions"] == "one":
        typer.echo(f"{name} allows one SSH session at a time (sshd MaxSessions 1, multiplexing limited): chainrun's "
                   "commands take turns over this login, a refused one waits and is sent again")


@cluster_app.command("logout", help="Close the SSH master of a --ssh cluster (`ssh -O exit`).")
def logout(name: Annotated[str, typer.Argument(help="The cluster (added with --ssh).")], json_out: JsonOpt = False) -> None:
    from chainrun import clusters
    from chainrun.errors import UsageError
    from chainrun.runner import openssh

    spec = clusters.get(name)
    if not spec.openssh:
        raise UsageError(f"cluster {name} uses the built-in SSH client: it keeps no SSH master")
    closed = openssh.master_exit(spec.host)
    if json_out:
        typer.echo(envelope("cluster logout", {"cluster": name, "closed": closed}))
        return
    typer.echo(f"{name}: " + ("SSH master closed" if closed else "no SSH master was open"))


def _check_connection(spec, *, accept_new: bool) -> list[dict]:
    """Log in and run ``true``; with accept-new, record keys not known yet in chainrun's known_hosts (0600).

    Any failure raises a RemoteError whose hint says how to fix it and that nothing was saved.
    """
    from chainrun import clusters
    from chainrun.runner.ssh import SSHRunner, fingerprint

    kh = clusters.known_hosts_path()
    runner = SSHRunner(spec, known_hosts=kh, accept_new_host_key=accept_new)
    try:
        res = runner.run(["true"], 30)
        if not res.ok:
            raise RemoteError(f"connected to {spec.name}, but `true` failed: {res.first_error_line()}",
                              hint="check that the account has a working shell")
    except RemoteError as e:
        fix = f"{e.hint}; " if e.hint else ""
        raise type(e)(e.message, hint=f"{fix}nothing was saved; --no-check saves without connecting") from None
    finally:
        runner.close()
    if not runner.new_host_keys:
        return []
    old = kh.read_text(encoding="utf-8") if kh.exists() else ""
    lines = [f"{host} {key.get_name()} {key.get_base64()}" for host, key in runner.new_host_keys]
    clusters.write_private(kh, old + ("" if not old or old.endswith("\n") else "\n") + "\n".join(lines) + "\n")
    return [{"host": h, "type": k.get_name(), "fingerprint": fingerprint(k)} for h, k in runner.new_host_keys]


@cluster_app.command("list", help="List clusters (the default is marked).")
def list_(json_out: JsonOpt = False) -> None:
    from chainrun import clusters

    cfg = clusters.load()
    rows = [{"name": "local", "host": "(this machine)", "default": cfg.default in (None, "local")}]
    rows += [{**_public(c), "default": cfg.default == c.name} for c in sorted(cfg.clusters.values(), key=lambda c: c.name)]
    if json_out:
        typer.echo(envelope("cluster list", rows))
        return
    from chainrun.cli.render import console
    from chainrun.cli.tables import flow

    width = console().width  # one cluster per line; a long address goes on over an indented line
    for r in rows:
        where = r["host"] if r["name"] == "local" else _where(r)
        for line in flow([f"{'*' if r['default'] else ' '} {r['name']:<16}", *where.split(" ")], width, sep=" "):
            typer.echo(line)


@cluster_app.command("remove", help="Forget a cluster (its chains' records stay in the state store).")
def remove(name: Annotated[str, typer.Argument(help="The cluster to remove.")], json_out: JsonOpt = False) -> None:
    from chainrun import clusters

    if name == clusters.LOCAL:  # clusters.get would say "no cluster 'local' (clusters: local; ...)"
        raise UsageError("`local` is this machine: it is always there and cannot be removed",
                         hint="`chainrun cluster default NAME` makes another cluster the default")
    cfg = clusters.load()
    clusters.get(name, cfg)
    del cfg.clusters[name]
    if cfg.default == name:
        cfg.default = None
    clusters.save(cfg)
    left = _active_chains(name)
    typer.echo(envelope("cluster remove", {"removed": name, "active_chains": left}) if json_out
               else f"cluster {name} removed")
    if left:  # their jobs run on: no tick moves them and `cancel` cannot reach them until the cluster is back
        typer.echo(f"warning: {len(left)} active chain(s) on {name} ({', '.join(left)}): their jobs keep running, "
                   f"and no tick or `chainrun cancel` reaches them until you `chainrun cluster add {name} ...` again",
                   err=True)


def _active_chains(name: str) -> list[str]:
    from chainrun import paths
    from chainrun.state.store import Store

    if not paths.state_db().exists():
        return []
    store = Store(paths.state_db())
    try:
        return [c.id for c in store.chains(active_only=True) if c.cluster == name]
    finally:
        store.close()


@cluster_app.command("default", help="Set the cluster used when --cluster is not given.")
def set_default(name: Annotated[str, typer.Argument(help="A cluster name, or local.")]) -> None:
    from chainrun import clusters

    cfg = clusters.load()
    if name != clusters.LOCAL:
        clusters.get(name, cfg)
    cfg.default = None if name == clusters.LOCAL else name
    clusters.save(cfg)
    typer.echo(f"default cluster: {name}")


@cluster_app.command("test", help="Connect; show the Slurm version, partitions and limits, and whether other users' jobs are "
                                  "visible. With --probe, also run a 1-minute job that checks a compute node sees the run folder.")
def test(
    name: Annotated[str | None, typer.Argument(help="The cluster to test (default: the default cluster, as for "
                                                    "submit).")] = None,
    probe: Annotated[bool, typer.Option("--probe", help="Submit a 1-minute job: does a compute node see a token written "
                                                        "here in --folder, and on what filesystem type?")] = False,
    folder: Annotated[str | None, typer.Option("--folder", help="The folder to probe (default: where `submit` puts run "
                                                                "folders: this directory, or the cluster's workdir).")] = None,
    probe_args: Annotated[str | None, typer.Option("--sbatch", help="sbatch options for the probe job, e.g. "
                                                                    "'--partition=gpu --account=x'.")] = None,
    json_out: JsonOpt = False,
) -> None:
    import time

    from chainrun import clusters
    from chainrun.context import open_runner
    from chainrun.slurm.client import SlurmClient

    # optional: submit's warnings say `chainrun cluster test --probe` about the cluster it submitted to
    name = name or clusters.default_name()
    runner, _spec = open_runner(name)
    try:
        t0 = time.monotonic()
        ver = runner.run(["sinfo", "--version"], 30)
        connect_s = time.monotonic() - t0
        if ver.returncode == 127:
            hint = ("put Slurm's commands on PATH (e.g. `module load slurm`) and run it again" if _spec is None else
                    "if Slurm comes from `module load`, re-add the cluster with --login-shell")  # local has no re-add
            raise RemoteError(f"{name}: Slurm commands not found", hint=hint)
        slurm = SlurmClient(runner)
        parts = slurm.partitions()
        users = {line.strip() for line in slurm._call(["squeue", "--all", "-h", "-o", "%u"], what="squeue").stdout.splitlines() if line.strip()}
        private = (slurm.config_value("PrivateData") or "none").lower()
        me = getattr(runner, "user", None) or _me()
        probed = _probe(name, runner, slurm, folder, probe_args) if probe else None
    finally:
        runner.close()
    hidden = "jobs" in private
    data = {
        "cluster": name, "slurm_version": ver.stdout.strip() or ver.first_error_line(), "connect_and_first_call_s": round(connect_s, 3),
        "partitions": [{"name": p.name, "default": p.is_default, "max_time_s": p.max_time_s, "nodes": p.total_nodes,
                        "state": p.state} for p in parts.values()],
        "others_jobs_visible": not hidden, "private_data": private, "other_users_in_queue": len(users - {me}),
    }
    if probed is not None:
        data["probe"] = probed.as_dict()
    if json_out:
        typer.echo(envelope("cluster test", data))
        if probed is not None and not probed.sees_token:
            raise typer.Exit(1)
        return
    from chainrun.durations import format_duration

    typer.echo(f"{name}: connected, {data['slurm_version']} ({connect_s:.2f}s to first answer)")
    for p in parts.values():
        limit = format_duration(p.max_time_s) if p.max_time_s else "unlimited"
        typer.echo(f"  partition {p.name}{' (default)' if p.is_default else ''}: max {limit}, {p.total_nodes} node(s), {p.state}")
    vis = "hidden (PrivateData=jobs): the predicted policy sees only your jobs" if hidden else "visible"
    typer.echo(f"  other users' jobs: {vis}; {data['other_users_in_queue']} other user(s) in the queue now")
    if probed is not None:
        typer.echo(f"  probe (job {probed.job_id}, {probed.seconds:.0f}s): {probed.verdict}")
        if probed.node_mount or probed.submit_fstype:
            typer.echo(f"    the node's mount: {probed.node_mount or '?'}; here: {probed.submit_fstype or '?'}")
        if not probed.sees_token:
            raise typer.Exit(1)


def _probe(name: str, runner, slurm, folder: str | None, probe_args: str | None):
    """The probe's core (chainrun/probe.py) with the folder `submit` would use and the cluster's [sbatch] options."""
    import os
    import shlex

    from chainrun import clusters
    from chainrun.probe import probe

    if folder is None:
        folder = os.getcwd() if name == clusters.LOCAL else (getattr(runner.cluster, "workdir", None) or runner.home())
    args = clusters.site_options(name) + (shlex.split(probe_args) if probe_args else [])
    return probe(runner, slurm, folder, sbatch_args=args)


def _public(c) -> dict:
    from dataclasses import asdict

    return {k: v for k, v in asdict(c).items() if v is not None}


def _where(r: dict) -> str:
    s = f"{r.get('user') + '@' if r.get('user') else ''}{r['host']}{':' + str(r['port']) if r.get('port') else ''}"
    if r.get("proxy_jump"):
        s += f" via {r['proxy_jump']}"
    if r.get("login_shell"):
        s += " (login shell)"
    if r.get("transport") == "openssh":
        s = f"ssh {r['host']}" + s[len(r["host"]):]
    return s


def _me() -> str:
    import getpass

    return getpass.getuser()
