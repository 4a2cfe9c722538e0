"""Notifications: a chain completed, failed, or has been interrupted for too long.

The watcher already writes every event to the store; a :class:`Notifier` reads the events
that are new since its high-water mark (kept in the store's ``meta`` table, so a cron
``watch --once`` carries on where the previous run stopped) after each tick, and sends a
short text to every target: a Slack/Mattermost-compatible webhook (``{"text": ...}``) or a
mail address (through the local ``sendmail``, else ``mail``). A long interruption is
noticed while it lasts: the chain's last segment ended more than ``gap`` ago and no
successor runs yet. Sending never stops the watcher: a failure is logged and dropped.

Defaults come from the ``[notify]`` table of ``config.toml`` in the chainrun home::

    [notify]
    webhook = "https://hooks.slack.com/services/..."   # one URL or a list
    mail = "me@example.org"                            # one address or a list
    on = ["completed", "failed", "gap"]                # event kinds, "gap" = long interruption
    gap = "30m"                                         # what counts as long
    mail_command = "sendmail"                           # or "mail"; default: whichever exists

``chainrun watch --notify TARGET`` adds targets for that watcher (a URL or an address).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import urlsplit

from chainrun.errors import UsageError

log = logging.getLogger(__name__)

EVENT_KINDS = {"created", "submitted", "started", "continue", "handoff", "done", "crash", "retry", "completed",
               "failed", "cancelled", "warning", "adopted", "lost", "shape",  # shape: an elastic segment's node count changed
               "total"}  # total: --total reached, the training segment was signalled to stop
DEFAULT_ON = ("completed", "failed", "gap")
DEFAULT_GAP_S = 1800
MARK_KEY = "notify.last_event"
GAP_KEY = "notify.gaps_sent"
TIMEOUT_S = 10.0


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
            table = tomllib.loads(path.read_text(encoding="utf-8")).get("notify", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read {path}: {e}") from None
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [notify] must be a table")
    cfg = NotifyConfig()
    unknown = set(table) - {"webhook", "mail", "on", "gap", "mail_command"}
    if unknown:
        raise UsageError(f"{path}: unknown key(s) in [notify]: {', '.join(sorted(unknown))}",
                         hint="known: webhook, mail, on, gap, mail_command")
    for target in _as_list(table.get("webhook"), path, "webhook"):
        cfg.webhooks.append(_check_url(target))
    cfg.mails += [_check_mail(m) for m in _as_list(table.get("mail"), path, "mail")]
    if "on" in table:
        on = set(_as_list(table["on"], path, "on"))
        bad = on - EVENT_KINDS - {"gap"}
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
        if target.startswith(("http://", "https://")):
            cfg.webhooks.append(_check_url(target))
        else:
            cfg.mails.append(_check_mail(target))
    return cfg


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
                         hint="--notify https://hooks.example/... or --notify me@example.org")
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
                 webhook: Callable = send_webhook, mail: Callable = send_mail) -> None:
        self.store, self.cfg, self.clock = store, cfg, clock
        self._webhook, self._mail = webhook, mail
        self.sent: list[tuple[Message, str, bool]] = []  # (message, target, ok), for the views and tests
        try:
            if self._meta(MARK_KEY) is None:  # first run: start from now, not from the whole history
                recent = store.events(limit=1)
                self._set_meta(MARK_KEY, str(recent[-1][0] if recent else 0))
        except Exception:  # noqa: BLE001 - a notifier must never stop the watcher
            log.warning("notify: cannot read or write the high-water mark", exc_info=True)

    # the mark lives in the store's meta table (key/value), beside the schema version
    def _meta(self, key: str) -> str | None:
        row = self.store.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        with self.store.tx() as db:
            db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                       (key, value))

    def after_tick(self) -> list[tuple[Message, str, bool]]:
        """Read new events, send what is wanted, advance the mark. Returns what was sent."""
        out: list[tuple[Message, str, bool]] = []
        try:
            messages = self._collect()
        except Exception:  # noqa: BLE001
            log.warning("notify: cannot read new events", exc_info=True)
            return out
        for msg in messages:
            out += self._deliver(msg)
        self.sent += out
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

    def _deliver(self, msg: Message) -> list[tuple[Message, str, bool]]:
        out = []
        for url in self.cfg.webhooks:
            out.append((msg, redact(url), self._try(self._webhook, url, msg, redact(url))))
        for addr in self.cfg.mails:
            out.append((msg, addr, self._try(lambda a, m: self._mail(a, m, self.cfg.mail_command), addr, msg, addr)))
        return out

    @staticmethod
    def _try(fn, target: str, msg: Message, shown: str) -> bool:
        try:
            fn(target, msg)
            log.info("notify: sent %s %s to %s", msg.chain_id, msg.kind, shown)
            return True
        except (OSError, urllib.error.URLError, subprocess.SubprocessError, ValueError) as e:
            log.warning("notify: could not send %s %s to %s: %s", msg.chain_id, msg.kind, shown, e)
        except Exception as e:  # noqa: BLE001 - never fatal
            log.warning("notify: could not send %s %s to %s: %s: %s", msg.chain_id, msg.kind, shown,
                        type(e).__name__, e)
        return False


def watch_notifier(store, targets: Iterable[str] | None = None) -> Notifier:
    """The notifier a watcher runs: config.toml's [notify] plus ``--notify`` targets.

    Without any target it still advances the mark, so turning notifications on later does
    not replay old events.
    """
    return Notifier(store, load_config(extra_targets=targets or ()))
