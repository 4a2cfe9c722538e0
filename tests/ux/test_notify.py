"""Notifications: events after the high-water mark go to a real local webhook and a fake sendmail."""

from __future__ import annotations

import os
import time

import pytest

from chainrun.chain.engine import TickReport
from chainrun.errors import UsageError
from chainrun.notify import NotifyConfig, Notifier, load_config, redact, watch_notifier
from tests.conftest import run_cli
from tests.ux.fixtures import T0, make_chain
from tests.ux.notifyhelpers import fake_sendmail, mails, webhook_server


@pytest.fixture
def store(chainrun_home):
    s = make_chain(chainrun_home, status="ACTIVE", running_last=True)
    yield s
    s.close()


@pytest.fixture
def sendmail(tmp_path, monkeypatch):
    log = fake_sendmail(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return log


def named(home, **targets) -> list[str]:
    """Targets kept in config.toml's [notifiers] (how --notify names them); returns the names."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[notifiers]\n" + "".join(f'{k} = "{v}"\n' for k, v in targets.items()))
    return list(targets)


def finish(store, chain_id="train-abcd", status="COMPLETED", reason="training finished in segment 3"):
    ch = store.chain(chain_id)
    ch.status, ch.reason = status, reason
    store.save(ch, [], [(None, status.lower(), f"chain {ch.id} {status.lower()}: {reason}")])


def test_completion_reaches_webhook_and_mail(store, sendmail, chainrun_home):
    with webhook_server() as (url, got):
        n = Notifier(store, load_config(extra_targets=named(chainrun_home, hook=url) + ["mailto:me@example.org"]))
        assert n.after_tick() == []  # history before the first run is not replayed
        finish(store)
        sent = n.after_tick()
        assert [(m.kind, ok) for m, _, ok in sent] == [("completed", True), ("completed", True)]
        assert n.after_tick() == []  # each event once
    assert len(got) == 1 and got[0]["type"] == "application/json" and got[0]["path"] == "/hooks/secret-token"
    assert "train-abcd completed" in got[0]["text"] and "4 segment(s)" in got[0]["text"]
    (mail,) = mails(sendmail)
    assert "ARGS -t -oi" in mail and "To: me@example.org" in mail and "Subject: chainrun: train-abcd completed" in mail
    assert "training finished in segment 3" in mail


def test_mark_survives_restarts_like_cron(store, chainrun_home):
    with webhook_server() as (url, got):
        hook = named(chainrun_home, hook=url)
        Notifier(store, load_config(extra_targets=hook)).after_tick()
        finish(store, status="FAILED", reason="segment 1 failed; no retries left")
        Notifier(store, load_config(extra_targets=hook)).after_tick()  # a later `watch --once`
        Notifier(store, load_config(extra_targets=hook)).after_tick()
    assert [g["text"].split(":")[1].strip() for g in got] == ["chain train-abcd failed"]


def test_uninteresting_events_are_skipped_and_on_is_configurable(store, chainrun_home):
    with webhook_server() as (url, got):
        (chainrun_home / "config.toml").write_text('[clusters.x]\nhost = "h"\n\n[notify]\non = ["crash", "retry"]\n'
                                                   f'\n[notifiers]\nhook = "{url}"\n')
        n = watch_notifier(store, ["hook"])
        store.add_event("train-abcd", 4, "submitted", "segment 4 submitted")
        store.add_event("train-abcd", 4, "crash", "segment 4 crashed: payload exit code 1")
        finish(store)
        n.after_tick()
    assert [g["text"] for g in got] == ["chainrun: chain train-abcd crash: segment 4 crashed: payload exit code 1 "
                                        f"({got[0]['text'].split('(', 1)[1]}"]


def test_long_interruption_is_sent_once_while_it_lasts(store):
    last = store.segments("train-abcd")[-1]
    last.phase, last.outcome = "ENDED", "continue"
    store.save_segment(last)
    last_end = last.end
    now = [last_end + 100]
    with webhook_server() as (url, got):
        n = Notifier(store, NotifyConfig(webhooks=[url], gap_s=1800), clock=lambda: now[0])
        n.after_tick()
        assert got == []  # 100 s: not long yet
        now[0] = last_end + 2000
        n.after_tick()
        n.after_tick()
        assert len(got) == 1 and "has not trained for 33m20s" in got[0]["text"]
        assert "segment 3 ended (continue) and no successor is queued" in got[0]["text"]
        # the successor starts after 40 minutes: already told, not again
        store.add_event("train-abcd", 4, "started", "segment 4 (job 104) started")
        n.after_tick()
    assert len(got) == 1


def test_long_gap_noticed_at_start_when_the_watcher_was_not_running(store):
    from chainrun.state.records import Segment

    with webhook_server() as (url, got):
        n = Notifier(store, NotifyConfig(webhooks=[url], gap_s=600), clock=lambda: T0 + 20_000)
        store.save_segment(Segment("train-abcd", 4, phase="RUNNING", job_id="104", start=T0 + 9000 + 3600,
                                   end=T0 + 9000 + 7200, extra={"gap_s": 3600.0}))
        store.add_event("train-abcd", 4, "started", "segment 4 (job 104) started")
        n.after_tick()
    assert len(got) == 1 and "segment 4 started after an interruption of 1h00m" in got[0]["text"]


def test_failures_are_retried_then_logged_never_fatal(store, caplog, tmp_path, monkeypatch, chainrun_home):
    # a sendmail that fails (a machine may have a real one in /usr/sbin, which a bare PATH would not hide)
    failing = tmp_path / "sendmail"
    failing.write_text("#!/bin/sh\necho 'sendmail: cannot connect' >&2\nexit 75\n")
    failing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with webhook_server(status=500) as (url, got):
        hooks = named(chainrun_home, hook=url, nobody="http://127.0.0.1:9/nobody")
        n = Notifier(store, load_config(extra_targets=hooks + ["me@example.org"]))
        finish(store)
        tries = [n.after_tick() for _ in range(4)]
    assert [[ok for _, _, ok in sent] for sent in tries] == [[False] * 3] * 3 + [[]]  # 3 attempts each, then dropped
    assert len(got) == 3  # the webhook was tried each time
    text = caplog.text
    assert "trying again next tick" in text and "dropped after 3 attempts" in text
    assert "secret-token" not in text  # the webhook's secret is not logged


def test_a_tick_waits_a_few_seconds_at_most_and_nothing_is_lost(store, chainrun_home):
    """Slow webhooks (8 s an answer) for 6 messages: sent one after another they held the tick for 48 s+."""
    with webhook_server(delay=8) as (url, got):
        n = Notifier(store, load_config(extra_targets=named(chainrun_home, hook=url)), budget_s=2.0)
        n.cfg.on = {"crash"}
        for i in range(6):
            store.add_event("train-abcd", 3, "crash", f"crash {i}")
        t0 = time.monotonic()
        assert n.after_tick() == []  # none answered within the budget: reported later, not lost
        assert time.monotonic() - t0 < 6  # 2 s budget (a loaded CI machine gets slack); one by one: 48 s
        late = n.after_tick() + n.close(timeout=60)  # the next tick, then the watcher's end, collect them
    assert sorted(m.text.split(": ")[2].split(" (")[0] for m, _, ok in late if ok) == [f"crash {i}" for i in range(6)]
    assert len(got) == 6


def test_what_the_watcher_could_not_send_before_it_stopped_is_logged(store, chainrun_home, caplog):
    with webhook_server(delay=5) as (url, got):
        n = Notifier(store, load_config(extra_targets=named(chainrun_home, hook=url)), budget_s=0.1)
        finish(store)
        assert n.after_tick() == []
        assert n.close(timeout=0.1) == []
    assert "not sent train-abcd completed to http://127.0.0.1" in caplog.text and "secret-token" not in caplog.text


def test_plain_watch_hook_notifies(store, chainrun_home, sendmail, capsys):
    from chainrun.cli.chain_cmd import _plain_watch

    class OneTick:  # the engine's interface as run_watch uses it; the chain completes during the tick
        def __init__(self, s):
            self.store = s

        def tick(self):
            finish(self.store)
            return TickReport()

    with webhook_server() as (url, got):
        _plain_watch(store, OneTick(store), interval=1, once=True, until_done=False, json_out=False,
                     notify=named(chainrun_home, hook=url) + ["ops@example.org"])
    assert len(got) == 1 and "completed" in got[0]["text"]
    assert "To: ops@example.org" in mails(sendmail)[0]
    out = capsys.readouterr().out
    assert "train-abcd notified ops@example.org: completed" in out and "train-abcd completed:" in out
    assert "secret-token" not in out


@pytest.mark.parametrize("toml,fragment", [
    ('[notify]\nwebhook = "ftp://x"\n', "not a webhook URL"),
    ('[notify]\nmail = "nobody"\n', "not a webhook URL or a mail address"),
    ('[notify]\non = ["completd"]\n', "unknown kind"),
    ('[notify]\ngap = "soon"\n', "gap"),
    ('[notify]\nwebhok = "https://x/y"\n', "unknown key"),
    ('[notify\n', "cannot read"),
])
def test_bad_config_is_a_usage_error(chainrun_home, toml, fragment):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    (chainrun_home / "config.toml").write_text(toml)
    with pytest.raises(UsageError, match=fragment):
        load_config()


def test_config_defaults_and_other_tables_untouched(chainrun_home):
    chainrun_home.mkdir(parents=True, exist_ok=True)
    text = ('default = "hpc"\n[clusters.hpc]\nhost = "login.hpc"\n\n[notify]\n'
            'webhook = ["https://hooks.example/a/b"]\nmail = "me@example.org"\ngap = "45m"\nmail_command = "mail"\n')
    (chainrun_home / "config.toml").write_text(text)
    cfg = load_config(extra_targets=["you@example.org"])
    assert cfg.webhooks == ["https://hooks.example/a/b"] and cfg.mails == ["me@example.org", "you@example.org"]
    assert cfg.gap_s == 2700 and cfg.mail_command == "mail" and cfg.on == {"completed", "failed", "gap", "login"}
    assert (chainrun_home / "config.toml").read_text() == text
    assert redact("https://hooks.slack.com/services/T/B/X") == "https://hooks.slack.com/..."


def test_mail_command(store, tmp_path, monkeypatch):
    log = tmp_path / "mail.log"
    (tmp_path / "mail").write_text(f"#!/bin/sh\n{{ echo \"ARGS $*\"; /bin/cat; }} >> '{log}'\n")
    (tmp_path / "mail").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    n = Notifier(store, NotifyConfig(mails=["me@example.org"], mail_command="mail"))
    finish(store)
    assert [ok for _, _, ok in n.after_tick()] == [True]
    assert log.read_text().startswith("ARGS -s chainrun: train-abcd completed -- me@example.org\nchainrun: chain")


def test_watch_rejects_an_unknown_notifier_name_in_one_line(chainrun_home):
    named(chainrun_home, team="https://hooks.example/T/B/secret")
    p = run_cli("watch", "--once", "--notify", "teem", home=chainrun_home)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]  # one line
    assert "no notifier named 'teem'" in p.stderr and "known: team" in p.stderr and "secret" not in p.stderr


def test_a_url_on_the_command_line_is_refused_with_a_hint(chainrun_home):
    """`ps` on a shared login node shows every user the command line, and a webhook URL is its own secret."""
    p = run_cli("watch", "--once", "--notify", "https://hooks.slack.com/services/T0/B0/SECRET", home=chainrun_home)
    assert p.returncode == 2 and "visible to every user" in p.stderr and "[notifiers] NAME" in p.stderr
    assert "SECRET" not in p.stderr


def test_a_named_notifier_reaches_its_url(store, chainrun_home):
    with webhook_server() as (url, got):
        n = watch_notifier(store, named(chainrun_home, team=url))
        finish(store)
        assert [ok for _, _, ok in n.after_tick()] == [True]
    assert len(got) == 1 and got[0]["path"] == "/hooks/secret-token"


def test_a_bad_notifiers_table_is_a_usage_error(chainrun_home):
    named(chainrun_home, team="ftp://nope")
    with pytest.raises(UsageError, match="not a webhook URL"):
        load_config(extra_targets=["team"])
