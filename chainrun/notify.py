"""Notifications: a chain completed, failed, or has been interrupted for too long.

The watcher already writes every event to the store; a :class:`Notifier` reads the events
that are new since its high-water mark (kept in the store's ``meta`` table, so a cron
``watch --once`` carries on where the previous run stopped) after each tick, and sends a
short text to every target: a Slack/Mattermost-compatible webhook (``{"text": ...}``) or a
mail address (through the local ``sendmail``, else ``mail``). A long interruption is
noticed while it lasts: the chain's last segment ended more than ``gap`` ago and no
successor runs yet. Sending never stops the watcher and costs a tick at most ``SEND_BUDGET_S`` in total: every
message goes out at once on worker threads; what has not finished by then is reported by a
later tick (or when the watcher stops), and a failed send is tried again on the next ticks, up
to ``MAX_ATTEMPTS`` times, then logged as dropped. Nothing is lost without a log line.

Defaults come from the ``[notify]`` table of ``config.toml`` in the chainrun home::

    [notify]
    webhook = "https://hooks.slack.com/services/..."   # one URL or a list
    mail = "me@example.org"                            # one address or a list
    on = ["completed", "failed", "gap", "login"]       # event kinds; "gap" = long interruption, "login" = a
                                                       # cluster waits for `chainrun cluster login` (told once)
    gap = "30m"                                         # what counts as long
    mail_command = "sendmail"                           # or "mail"; default: whichever exists

Named targets live in the ``[notifiers]`` table, so a secret webhook URL never appears on a
command line (where ``ps`` shows it to every user of a shared login node)::

    [notifiers]
    team = "https://hooks.slack.com/services/..."
    me = "me@example.org"

``chainrun watch --notify NAME`` adds that target for this watcher (a mail address may also be
given directly; a URL is refused with a hint).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import urlsplit

from chainrun.errors import UsageError

log = logging.getLogger(__name__)

EVENT_KINDS = {"created", "submitted", "started", "continue", "handoff", "done", "crash", "retry", "completed",
               "failed", "cancelled", "warning", "adopted", "lost", "shape",  # shape: an elastic segment's node count changed
               "total",  # total: --total reached, the training segment was signalled to stop
               "settled"}  # settled: a cancelled segment's end and training read from Slurm (chain/settle.py)
DEFAULT_ON = ("completed", "failed", "gap", "login")  # login: a cluster's ticks wait for a person (once)
DEFAULT_GAP_S = 1800
MARK_KEY = "notify.last_event"
GAP_KEY = "notify.gaps_sent"
TIMEOUT_S = 10.0  # one send
SEND_BUDGET_S = 3.0  # what one tick waits for all its sends together
MAX_ATTEMPTS = 3  # a failed send is tried again on the next ticks, then dropped with a log line
SEND_THREADS = 8
_NAME_RE = __import__("re").compile(r"^[A-Za-z0-9_.-]{1,40}$")


@dataclass
class NotifyConfig:
    webhooks: list[str] = field(default_factory=list)
    mails: list[str] = field(default_factory=list)
    on: set[str] = field(default_factory=lambda: set(DEFAULT_ON))
    gap_s: int = DEFAULT_GAP_S
    mail_command: str | None = None

    @property
    def targets(self) -> list[str]:
        return self.webhooks + self.mails


@dataclass(frozen=True)
class Message:
    chain_id: str
    kind: str
    subject: str
    text: str


def config_path(home: Path | None = None) -> Path:
    from chainrun import paths

    return (home or paths.home()) / "config.toml"


def load_config(home: Path | None = None, extra_targets: Iterable[str] = ()) -> NotifyConfig:
    """The ``[notify]`` table of config.toml (absent: no targets), plus ``--notify`` targets."""
    path = config_path(home)
    table: dict = {}
    if path.exists():
        import tomllib

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read {path}: {e}") from None
        table = data.get("notify", {})
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [notify] must be a table")
    cfg = NotifyConfig()
    named = _notifiers(data, path) if path.exists() else {}
    unknown = set(table) - {"webhook", "mail", "on", "gap", "mail_command"}
    if unknown:
        raise UsageError(f"{path}: unknown key(s) in [notify]: {', '.join(sorted(unknown))}",
                         hint="known: webhook, mail, on, gap, mail_command")
    for target in _as_list(table.get("webhook"), path, "webhook"):
        cfg.webhooks.append(_check_url(target))
    cfg.mails += [_check_mail(m) for m in _as_list(table.get("mail"), path, "mail")]
    if "on" in table:
        on = set(_as_list(table["on"], path, "on"))
        bad = on - EVENT_KINDS - {"gap", "login"}
        if bad:
            raise UsageError(f"{path}: [notify] on: unknown kind(s) {', '.join(sorted(bad))}",
                             hint="use gap or event kinds such as completed, failed, crash, retry, lost")
        cfg.on = on
    if "gap" in table:
        from chainrun.durations import parse_duration

        cfg.gap_s = parse_duration(str(table["gap"]), what=f"{path}: [notify] gap")
    if table.get("mail_command") is not None:
        if table["mail_command"] not in ("sendmail", "mail"):
            raise UsageError(f"{path}: [notify] mail_command must be \"sendmail\" or \"mail\"")
        cfg.mail_command = table["mail_command"]
    for target in extra_targets:
        resolved = _resolve(target, named, path)
        if resolved.startswith(("http://", "https://")):
            cfg.webhooks.append(resolved)
        else:
            cfg.mails.append(resolved)
    return cfg


def _notifiers(data: dict, path: Path) -> dict[str, str]:
    """The ``[notifiers]`` table: name -> webhook URL or mail address, each checked."""
    table = data.get("notifiers", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [notifiers] must be a table of NAME = \"URL or address\"")
    out = {}
    for name, target in table.items():
        if not isinstance(target, str):
            raise UsageError(f"{path}: [notifiers] {name} must be a webhook URL or a mail address")
        out[name] = _check_url(target) if target.startswith(("http://", "https://")) else _check_mail(target)
    return out


def _resolve(target: str, named: dict[str, str], path: Path) -> str:
    """A ``--notify`` value: a notifier's name, or a mail address; a URL is refused (``ps`` shows it)."""
    if "://" in target:
        raise UsageError(f"a webhook URL on the command line is visible to every user of this machine ({redact(target)})",
                         hint=f'put it in {path} as [notifiers] NAME = "<url>" and pass --notify NAME')
    if target in named:
        return named[target]
    if "@" in target:
        return _check_mail(target)
    if not _NAME_RE.match(target):
        raise UsageError(f"not a notifier name or a mail address: {target!r}",
                         hint=f"name a notifier of the [notifiers] table in {path}, or give me@example.org")
    known = ", ".join(sorted(named)) or "none yet"
    raise UsageError(f"no notifier named {target!r}", hint=f'known: {known}; add one to {path} as '
                     f'[notifiers] {target} = "https://..." (or a mail address)')


def _as_list(value, path: Path, key: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise UsageError(f"{path}: [notify] {key} must be a string or a list of strings")
    return items


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"not a webhook URL: {redact(url)}", hint="give an http(s):// URL")
    return url


def _check_mail(addr: str) -> str:
    addr = addr.removeprefix("mailto:")
    if "@" not in addr or addr.startswith("-") or any(c.isspace() or c in ",;<>" for c in addr):
        raise UsageError(f"not a webhook URL or a mail address: {addr!r}",
                         hint="a mail address looks like me@example.org")
    return addr


def redact(url: str) -> str:
    """A webhook URL without its secret path, for logs: scheme://host/..."""
    parts = urlsplit(url)
    host = (parts.hostname or "?") + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{host}/..." if parts.path not in ("", "/") or parts.query else f"{parts.scheme}://{host}/"


# ---------------------------------------------------------------------------- sending
def send_webhook(url: str, msg: Message, timeout: float = TIMEOUT_S) -> None:
    body = json.dumps({"text": msg.text}).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "chainrun"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (the user's own URL)
        if not 200 <= resp.status < 300:
            raise OSError(f"HTTP {resp.status}")


def mail_program(preferred: str | None = None) -> list[str] | None:
    """``sendmail -t -oi`` (headers on stdin) or ``mail -s``; None if neither exists."""
    for name in ([preferred] if preferred else ["sendmail", "mail"]):
        path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
        if path:
            return [path]
    return None


def send_mail(addr: str, msg: Message, preferred: str | None = None, timeout: float = 30.0) -> None:
    prog = mail_program(preferred)
    if prog is None:
        raise OSError("no sendmail or mail command found")
    if Path(prog[0]).name == "mail":
        argv, stdin = prog + ["-s", msg.subject, "--", addr], msg.text + "\n"
    else:
        argv = prog + ["-t", "-oi"]
        stdin = (f"To: {addr}\nSubject: {msg.subject}\nContent-Type: text/plain; charset=utf-8\n"
                 f"Auto-Submitted: auto-generated\n\n{msg.text}\n")
    p = subprocess.run(argv, input=stdin, text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise OSError(f"{Path(argv[0]).name} exited {p.returncode}: {(p.stderr or p.stdout).strip()[:200]}")


# ---------------------------------------------------------------------------- the notifier
class Notifier:
    """Turns new store events into messages after every watcher tick. Never raises."""

    def __init__(self, store, cfg: NotifyConfig, *, clock: Callable[[], float] = time.time,
                 webhook: Callable = send_webhook, mail: Callable = send_mail, budget_s: float = SEND_BUDGET_S) -> None:
        self.store, self.cfg, self.clock = store, cfg, clock
        self._webhook, self._mail = webhook, mail
        self.budget_s = budget_s
        self.sent: list[tuple[Message, str, bool]] = []  # (message, target, ok), for the views and tests
        self._pool: ThreadPoolExecutor | None = None  # made on the first send
        self._inflight: dict[Future, _Delivery] = {}
        self._retry: list[_Delivery] = []
        try:
            if self._meta(MARK_KEY) is None:  # first run: start from now, not from the whole history
                recent = store.events(limit=1)
                self._set_meta(MARK_KEY, str(recent[-1][0] if recent else 0))
        except Exception:  # noqa: BLE001 - a notifier must never stop the watcher
            log.warning("notify: cannot read or write the high-water mark", exc_info=True)

    # the mark lives in the store's meta table (key/value), beside the schema version
    def _meta(self, key: str) -> str | None:
        with self.store.reading():  # on a shared home a read holds the write lease (state/store.py)
            row = self.store.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        with self.store.tx() as db:
            db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                       (key, value))

    def after_tick(self) -> list[tuple[Message, str, bool]]:
        """Read new events and send what is wanted, all at once, waiting at most ``budget_s``.
        Returns the sends that finished meanwhile (ok or not), this tick's or earlier ones'."""
        try:
            messages = self._collect()
        except Exception:  # noqa: BLE001
            log.warning("notify: cannot read new events", exc_info=True)
            messages = []
        todo, self._retry = self._retry, []
        todo += [d for msg in messages for d in self._deliveries(msg)]
        for d in todo:
            self._start(d)
        return self._finished(self.budget_s)

    def close(self, timeout: float = TIMEOUT_S) -> list[tuple[Message, str, bool]]:
        """The watcher stops: wait for the sends still going (at most ``timeout``), log what is left."""
        out = self._finished(timeout) if self._inflight else []
        for d in list(self._inflight.values()) + self._retry:
            log.warning("notify: not sent %s %s to %s: the watcher stopped before it went out", d.msg.chain_id,
                        d.msg.kind, d.shown)
        self._inflight, self._retry = {}, []
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return out

    def _collect(self) -> list[Message]:
        mark = int(self._meta(MARK_KEY) or 0)
        events = self.store.events(after_id=mark, limit=100_000)
        msgs: list[Message] = []
        for eid, ev in events:
            mark = eid
            if ev.kind in self.cfg.on:
                msgs.append(self._event_message(ev))
            elif ev.kind == "started" and "gap" in self.cfg.on and ev.idx is not None:
                msgs += self._gap_at_start(ev.chain_id, ev.idx)
        if events:
            self._set_meta(MARK_KEY, str(mark))
        if "gap" in self.cfg.on:
            msgs += self._ongoing_gaps()
        if "login" in self.cfg.on:
            msgs += self._login_notices()
        return msgs

    def _login_notices(self) -> list[Message]:
        """One message per cluster whose ticks wait for a person, until a tick reaches it again."""
        from chainrun.chain import untended

        msgs = []
        for t in untended.to_notify(self.store):
            untended.mark_notified(self.store, t.cluster)
            msgs.append(Message(t.cluster, "login", f"chainrun: {t.cluster} needs you to log in",
                                f"chainrun: cluster {t.cluster}: chains there are not ticked: {t.error}"))
        return msgs

    def _summary(self, chain_id: str) -> str:
        from chainrun.chain.summary import view_chain
        from chainrun.durations import format_duration as dur

        v = view_chain(self.store.chain(chain_id), self.store.segments(chain_id))
        return (f"{dur(v.done_s)} of {dur(v.total_s)} in {v.segments} segment(s), {v.retries_used} retries, "
                f"interruption {dur(v.interruption_s)}, overlap {dur(v.overlap_s)}")

    def _event_message(self, ev) -> Message:
        subject = f"chainrun: {ev.chain_id} {ev.kind}"
        try:
            detail = self._summary(ev.chain_id)
        except Exception:  # noqa: BLE001 - the chain may be unreadable; the event alone still helps
            detail = ""
        text = f"chainrun: chain {ev.chain_id} {ev.kind}: {ev.message}" + (f" ({detail})" if detail else "")
        return Message(ev.chain_id, ev.kind, subject, text)

    def _sent_gaps(self) -> set[str]:
        return set(json.loads(self._meta(GAP_KEY) or "[]"))

    def _mark_gap(self, key: str) -> bool:
        """Record a gap as notified; False if it was already."""
        sent = self._sent_gaps()
        if key in sent:
            return False
        keep = sorted(sent)[-200:]  # bounded: old chains' keys fall out
        self._set_meta(GAP_KEY, json.dumps(keep + [key]))
        return True

    def _ongoing_gaps(self) -> list[Message]:
        from chainrun.durations import format_duration as dur

        now = self.clock()
        msgs = []
        for ch in self.store.chains(active_only=True):
            segs = self.store.segments(ch.id)
            ran = [s for s in segs if s.start is not None]
            if not ran or any(s.phase == "RUNNING" for s in segs):
                continue
            last = ran[-1]
            if last.outcome is None or last.end is None or now - last.end < self.cfg.gap_s:
                continue
            if not self._mark_gap(f"{ch.id}:{last.idx}"):
                continue
            waiting = [s for s in segs if s.idx > last.idx and s.phase in ("PENDING", "SUBMITTING")]
            shape = (waiting[0].extra.get("shape") or {}).get("reason") if waiting else None  # elastic chains
            why = (f"segment {waiting[0].idx} (job {waiting[0].job_id}) is still queued"
                   + (f" (shape {shape})" if shape else "") if waiting else "no successor is queued")
            msgs.append(Message(ch.id, "gap", f"chainrun: {ch.id} interrupted for {dur(now - last.end)}",
                                f"chainrun: chain {ch.id} has not trained for {dur(now - last.end)}: segment "
                                f"{last.idx} ended ({last.outcome}) and {why}"))
        return msgs

    def _gap_at_start(self, chain_id: str, idx: int) -> list[Message]:
        from chainrun.durations import format_duration as dur

        seg = next((s for s in self.store.segments(chain_id) if s.idx == idx), None)
        gap = (seg.extra.get("gap_s") if seg else None) or 0
        if gap < self.cfg.gap_s:
            return []
        prev = max((s.idx for s in self.store.segments(chain_id) if s.idx < idx and s.start is not None), default=idx - 1)
        if not self._mark_gap(f"{chain_id}:{prev}"):  # already told while it lasted
            return []
        return [Message(chain_id, "gap", f"chainrun: {chain_id} resumed after {dur(gap)}",
                        f"chainrun: chain {chain_id}: segment {idx} started after an interruption of {dur(gap)}")]

    def _deliveries(self, msg: Message) -> list["_Delivery"]:
        out = [_Delivery(msg, "webhook", url, redact(url)) for url in self.cfg.webhooks]
        return out + [_Delivery(msg, "mail", addr, addr) for addr in self.cfg.mails]

    def _start(self, d: "_Delivery") -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="chainrun-notify")
        d.attempts += 1
        if d.how == "webhook":
            fut = self._pool.submit(self._webhook, d.target, d.msg)
        else:
            fut = self._pool.submit(self._mail, d.target, d.msg, self.cfg.mail_command)
        self._inflight[fut] = d

    def _finished(self, timeout: float) -> list[tuple[Message, str, bool]]:
        """Wait up to ``timeout`` for the sends in flight; what finished, in the order they were started."""
        if not self._inflight:
            return []
        done, _ = wait(list(self._inflight), timeout=timeout)
        out = []
        for fut in [f for f in self._inflight if f in done]:
            d = self._inflight.pop(fut)
            ok = self._outcome(fut, d)
            out.append((d.msg, d.shown, ok))
        self.sent += out
        return out

    def _outcome(self, fut: Future, d: "_Delivery") -> bool:
        e = fut.exception()
        if e is None:
            log.info("notify: sent %s %s to %s", d.msg.chain_id, d.msg.kind, d.shown)
            return True
        what = e if isinstance(e, (OSError, urllib.error.URLError, subprocess.SubprocessError, ValueError)) \
            else f"{type(e).__name__}: {e}"
        if d.attempts < MAX_ATTEMPTS:
            log.warning("notify: could not send %s %s to %s: %s; trying again next tick (attempt %d of %d)",
                        d.msg.chain_id, d.msg.kind, d.shown, what, d.attempts, MAX_ATTEMPTS)
            self._retry.append(d)
        else:
            log.warning("notify: could not send %s %s to %s: %s; dropped after %d attempts",
                        d.msg.chain_id, d.msg.kind, d.shown, what, d.attempts)
        return False


@dataclass
class _Delivery:
    """One message to one target, as it is tried."""

    msg: Message
    how: str  # "webhook" or "mail"
    target: str  # the URL (secret) or the address
    shown: str  # what logs and views may show
    attempts: int = 0


def watch_notifier(store, targets: Iterable[str] | None = None) -> Notifier:
    """The notifier a watcher runs: config.toml's [notify] plus ``--notify`` targets.

    Without any target it still advances the mark, so turning notifications on later does
    not replay old events.
    """
    return Notifier(store, load_config(extra_targets=targets or ()))
