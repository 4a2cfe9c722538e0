"""Cluster definitions: the ``[clusters.NAME]`` tables of ``config.toml`` in the chainrun home.

Only connection facts are stored (host, user, port, key *path*, jump host, login shell,
remote workdir); never a password or a key's content. ``~/.ssh/config`` is honoured for
whatever the cluster entry leaves open, looked up by the host and then by the cluster's
name, so ``chainrun cluster add hpc --host hpc`` reuses an existing ``Host hpc`` block.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chainrun import paths
from chainrun.errors import NotFoundError, UsageError
from chainrun.site_config import SITE_TABLES, SiteSettings, check_site_tables, settings_from

LOCAL = "local"
OPENSSH = "openssh"
TRANSPORTS = {OPENSSH, "paramiko"}
RESERVED = {LOCAL, "all"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


@dataclass
class Cluster:
    name: str
    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    proxy_jump: str | None = None
    login_shell: bool = False
    workdir: str | None = None  # remote folder holding chainrun-runs/ (default: the remote home)
    # None: the built-in client (paramiko, keys only); "openssh": the system ssh, `host` is a ~/.ssh/config alias
    transport: str | None = None

    @property
    def openssh(self) -> bool:
        return self.transport == OPENSSH

    def to_toml(self) -> str:
        lines = [f"[clusters.{self.name}]"]
        for k, v in asdict(self).items():
            if k == "name" or v is None:
                continue
            lines.append(f"{k} = {_toml_value(v)}")
        return "\n".join(lines)


@dataclass
class Config:
    default: str | None = None
    clusters: dict[str, Cluster] = field(default_factory=dict)
    # each cluster's site tables ([clusters.NAME.sbatch], .gpu, .job; `local` too), as read: sites.py reads them
    sites: dict[str, dict[str, dict]] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where to connect, after ``~/.ssh/config`` filled the gaps."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    proxy_jump: str | None


def config_path() -> Path:
    return paths.home() / "config.toml"


def known_hosts_path() -> Path:
    """chainrun's own known_hosts (the user's ~/.ssh/known_hosts is read as well)."""
    return paths.home() / "known_hosts"


def check_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise UsageError(f"invalid cluster name {name!r}", hint="letters, digits, '-' and '_', at most 40")
    if name in RESERVED:
        raise UsageError(f"{name!r} is reserved", hint="pick another cluster name")
    return name


def load() -> Config:
    path = config_path()
    if not path.exists():
        return Config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}", hint="fix or remove the file") from None
    default = data.get("default")
    clusters = data.get("clusters") or {}
    if default is not None and not isinstance(default, str):
        raise UsageError(f"{path}: `default` must be a cluster name")
    if not isinstance(clusters, dict) or not all(isinstance(t, dict) for t in clusters.values()):
        raise UsageError(f"{path}: `clusters` must be tables like [clusters.NAME]", hint="fix or remove the file")
    cfg = Config(default=default)
    known = set(Cluster.__dataclass_fields__) - {"name"}
    for name, table in clusters.items():
        site = {k: table.pop(k) for k in SITE_TABLES if k in table}
        if site:
            check_site_tables(path, name, site)
            cfg.sites[name] = site
        if name == LOCAL:  # this machine has no connection facts, only site tables
            if table:
                raise UsageError(f"{path}: [clusters.local] takes only site tables "
                                 f"({', '.join(f'[clusters.local.{t}]' for t in SITE_TABLES)}), not "
                                 f"{', '.join(sorted(table))}")
            continue
        _check_shape(path, name, table)
        unknown = set(table) - known
        if unknown:
            raise UsageError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in [clusters.{name}]")
        if "password" in table:  # belt and braces: known-keys check above already refuses it
            raise UsageError(f"{path}: passwords are never read; use an SSH agent or a key file")
        cfg.clusters[name] = Cluster(name=name, **table)
    return cfg


def site_options(cluster: str) -> list[str]:
    """The sbatch options every segment on this cluster needs (``[sbatch]`` in config.toml), e.g.

        [sbatch]
        local = ["--account=proj42", "--qos=normal"]
        ls6 = ["--account=TG-123", "--constraint=a100"]

    then those of ``[clusters.NAME.sbatch]`` (account, partition, gres, args), which come later and win.
    """
    path = config_path()
    if not path.exists():
        return []
    return _top_site_options(path, cluster) + site_settings(cluster).sbatch_options()


def site_settings(cluster: str, cfg: Config | None = None) -> SiteSettings:
    """What config.toml says a chain needs on this cluster ([clusters.NAME.sbatch], .gpu, .job); empty if nothing."""
    cfg = cfg or load()
    return settings_from(cfg.sites.get(cluster) or {})


def _top_site_options(path: Path, cluster: str) -> list[str]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}", hint="fix or remove the file") from None
    table = data.get("sbatch") or {}
    if not isinstance(table, dict):
        raise UsageError(f"{path}: `sbatch` must be a table of cluster = [options]", hint='e.g. [sbatch] local = ["--account=x"]')
    opts = table.get(cluster) or []
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise UsageError(f"{path}: [sbatch] {cluster} must be a list of strings", hint='e.g. local = ["--account=x"]')
    return list(opts)


DEFAULT_RUN_MODE = 0o700  # model weights and control files are private unless the user says otherwise


def run_mode() -> int:
    """The permissions of a chain's run, control, logs and checkpoint folders (``[run] mode`` in
    config.toml, octal text): 0700 by default; e.g. ``mode = "0750"`` for a team project's group.
    The owner always keeps rwx (chainrun and the wrapper write there)."""
    path = config_path()
    if not path.exists():
        return DEFAULT_RUN_MODE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}", hint="fix or remove the file") from None
    table = data.get("run") or {}
    text = table.get("mode") if isinstance(table, dict) else None
    if text is None:
        return DEFAULT_RUN_MODE
    if not isinstance(text, str) or not re.fullmatch(r"0?[0-7]{3}", text.strip()):
        raise UsageError(f"{path}: [run] mode must be octal permissions in quotes, e.g. \"0750\" (got {text!r})")
    mode = int(text.strip(), 8)
    if mode & 0o700 != 0o700:
        raise UsageError(f"{path}: [run] mode {text} must let you read, write and enter the folders (0700 at least)")
    if mode & 0o002:
        raise UsageError(f"{path}: [run] mode {text} lets every user of the cluster write the chain's folders",
                         hint='use "0700" or "0750"/"0770" for a team project\'s group')
    return mode


_TYPE_WORDS = {str: "a string", int: "a whole number", bool: "true or false"}  # words, not Python type names
_TYPES = {"host": str, "user": str, "port": int, "key": str, "proxy_jump": str, "login_shell": bool, "workdir": str,
          "transport": str}


def _check_shape(path: Path, name: str, table: dict) -> None:
    """Valid TOML of the wrong shape is the user's to fix: say which key, never crash."""
    if "host" not in table:
        raise UsageError(f"{path}: [clusters.{name}] has no host", hint="fix it, or re-add with `chainrun cluster add`")
    for key, typ in _TYPES.items():
        v = table.get(key)
        if v is not None and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
            raise UsageError(f"{path}: [clusters.{name}] {key} must be {_TYPE_WORDS[typ]}, not {v!r}")
    if table.get("transport") not in (None, *TRANSPORTS):
        raise UsageError(f"{path}: [clusters.{name}] transport must be one of {', '.join(sorted(TRANSPORTS))}")
    port = table.get("port")
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"{path}: [clusters.{name}] port {port} is out of range")


_HEADER = "# chainrun clusters: written by `chainrun cluster add`; passwords are never stored"


def save(cfg: Config) -> Path:
    """Write the config atomically, 0600 (it names hosts and key paths).

    The file is shared (``[notify]`` lives there too): only the top-level ``default`` key and
    the ``[clusters.*]`` tables are rewritten; every other line is kept as it was.
    """
    path = config_path()
    top, tables = _others(path.read_text(encoding="utf-8") if path.exists() else "")
    parts = [_HEADER + ("\n" + f"default = {_toml_value(cfg.default)}" if cfg.default else "")]
    if top.strip():
        parts.append(top.strip("\n"))
    if tables.strip():
        parts.append(tables.strip("\n"))
    for c in sorted(cfg.clusters.values(), key=lambda c: c.name):
        parts.append(c.to_toml())
        parts += _site_toml(c.name, cfg.sites.get(c.name) or {})
    parts += _site_toml(LOCAL, cfg.sites.get(LOCAL) or {})  # a removed cluster's site tables go with it
    write_private(path, "\n\n".join(parts) + "\n")
    return path


def _site_toml(name: str, site: dict[str, dict]) -> list[str]:
    return ["\n".join([f"[clusters.{name}.{t}]", *(f"{k} = {_toml_value(v)}" for k, v in site[t].items())])
            for t in SITE_TABLES if t in site]
    return path


def _others(text: str) -> tuple[str, str]:
    """(top-level lines, other tables) of an existing config, without what ``save`` owns."""
    top: list[str] = []
    tables: list[str] = []
    ours = False
    in_table = False
    for line in text.splitlines():
        head = line.strip()
        if head.startswith("["):
            in_table = True
            name = head.strip("[] ").split("]")[0].strip()
            ours = name == "clusters" or name.startswith("clusters.")
        if ours or head == _HEADER:
            continue
        if not in_table and head.split("=")[0].strip() == "default":
            continue
        (tables if in_table else top).append(line)
    return "\n".join(top), "\n".join(tables)


def write_private(path: Path, text: str) -> None:
    paths.ensure_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def get(name: str, cfg: Config | None = None) -> Cluster:
    cfg = cfg or load()
    if name not in cfg.clusters:
        names = ", ".join(["local", *sorted(cfg.clusters)])
        raise NotFoundError(f"no cluster {name!r}", hint=f"clusters: {names}; add one with `chainrun cluster add`")
    return cfg.clusters[name]


def default_name(cfg: Config | None = None) -> str:
    cfg = cfg or load()
    return cfg.default or LOCAL


def resolve(cluster: Cluster, *, ssh_config: Path | None = None) -> Target:
    """Fill the cluster's open fields from ``~/.ssh/config`` (by host, then by cluster name)."""
    found = _ssh_lookup(cluster.host, ssh_config)
    hostname = found.get("hostname") or cluster.host  # --host may be an alias: its HostName
    if not found.get("_matched"):
        # a block for the cluster's name gives user, port, keys, jump; the explicit --host stays
        by_name = _ssh_lookup(cluster.name, ssh_config)
        if by_name.get("_matched"):
            found = by_name
    port = cluster.port or int(found.get("port") or 22)
    user = cluster.user or found.get("user") or _local_user()
    keys = (os.path.expanduser(cluster.key),) if cluster.key else tuple(os.path.expanduser(k) for k in found.get("identityfile", []))
    jump = cluster.proxy_jump or found.get("proxyjump")
    if jump and jump.lower() == "none":
        jump = None
    return Target(hostname=hostname, port=port, user=user, key_files=keys, proxy_jump=jump)


def resolve_jump(spec: str, *, ssh_config: Path | None = None) -> Target:
    """One hop of a ProxyJump list: ``[user@]host[:port]``, itself looked up in ``~/.ssh/config``."""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    m = re.match(r"^\[(.+)\]:(\d+)$", hostport) or re.match(r"^([^:]+):(\d+)$", hostport)
    if m:
        host, port = m.group(1), int(m.group(2))
    c = Cluster(name=host, host=host, user=user or None, port=port)
    t = resolve(c, ssh_config=ssh_config)
    return Target(t.hostname, t.port, t.user, t.key_files, None)  # nested jumps are listed, not recursive


def ssh_config_path() -> Path:
    return Path(os.environ.get("CHAINRUN_SSH_CONFIG") or Path.home() / ".ssh" / "config")


def _ssh_lookup(host: str, path: Path | None) -> dict:
    path = path or ssh_config_path()
    if not path.exists():
        return {}
    import paramiko  # only when a remote cluster is used

    cfg = paramiko.SSHConfig.from_path(str(path))
    entry = dict(cfg.lookup(host))
    # paramiko always answers with hostname=host; anything more means a Host block matched
    entry["_matched"] = bool(set(entry) - {"hostname"}) or entry.get("hostname") != host
    return entry


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string
