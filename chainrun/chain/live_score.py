"""How the predictions the watcher acted on compare with the waits that followed (`model status`).

Scored in the chain layer: it reads the chains and segments the watcher recorded and the target
quantile the `predicted` policy acts on (chain/policies.py), beside the saved model's status
(predict/service.py)."""

from __future__ import annotations

import math


def model_status(cluster: str = "default", user: str | None = None) -> dict:
    """The saved model's status (predict/service.py ``status``) and, once there is a model, how the
    predictions the watcher acted on turned out (``live_error``)."""
    from chainrun.chain import tuned
    from chainrun.predict import service

    out = service.status(cluster, user)
    if out["model"] is None and cluster not in ("local", "default"):
        from chainrun import clusters

        clusters.get(cluster)  # a typo says "no cluster", not "run a refresh" of a cluster that is not there
    if out["model"] is not None:
        out["live_error"] = live_error(cluster)
    out["tuning"] = tuned.status(cluster)  # predicted's values in force per partition
    return out


def live_error(cluster: str) -> dict:
    """How the predictions the watcher acted on compare with the waits that followed.

    Read from the state store: every segment submitted under the `predicted` policy keeps the
    wait it acted on (the target quantile, see chain.policies.predict_quantile) beside its
    measured wait (start - eligible). Scored as it was used: the share of waits at or below
    the acted-on quantile (nominal = the target) and its ``verdict`` (:func:`coverage_verdict`),
    and the deadline hit rate (the segment started before its predecessor ended), beside the
    chance of it that the policy acted on when it submitted (``prob_in_time``: the slack rule
    decides on the whole distribution, not on one quantile); MAE and within 2x of the acted-on
    quantile for comparison. Every comparison is at one resolution (RESOLUTION_S): waits under
    a watcher tick count as one tick, so the verdicts cannot disagree about a 2 s wait.
    """
    from chainrun.chain.policies import predict_quantile
    from chainrun.paths import state_db
    from chainrun.state.store import Store

    pairs: list[tuple[float, float]] = []
    targets: list[float] = []
    deadline: list[bool] = []
    acted: list[tuple[float, bool]] = []  # (P(start in time) when submitted, started in time)
    if state_db().exists():
        store = Store(state_db())
        try:
            for c in store.chains():
                if c.cluster != cluster:
                    continue
                segs = store.segments(c.id)
                for i, seg in enumerate(segs):
                    if seg.predicted_wait_s is None:
                        continue
                    prev = next((p for p in reversed(segs[:i]) if p.start is not None), None)
                    if seg.wait_s is not None:
                        pairs.append((seg.predicted_wait_s, seg.wait_s))
                        # the quantile it was read at (a tuned boundary cost moves it); older rows: the default
                        targets.append(float(seg.extra.get("wait_quantile") or predict_quantile(c.segment_s)))
                    if prev is not None and prev.end is not None and not prev.is_live:
                        # decided once the predecessor ended: started by then, or missed
                        deadline.append(seg.start is not None and seg.start <= prev.end)
                        if seg.extra.get("prob_in_time") is not None:
                            acted.append((float(seg.extra["prob_in_time"]), deadline[-1]))
        finally:
            store.close()
    out: dict = {"n": len(pairs), "resolution_s": RESOLUTION_S}
    if deadline:
        out.update(deadline_n=len(deadline), deadline_hit_rate=sum(deadline) / len(deadline))
    if acted:
        out.update(acted_prob_n=len(acted), acted_prob_mean=sum(p for p, _ in acted) / len(acted),
                   acted_prob_hit_rate=sum(hit for _, hit in acted) / len(acted))
    if not pairs:
        return out
    # every verdict compares waits at one resolution: the watcher's tick (RESOLUTION_S), so a
    # 2 s wait against a predicted 1 s is neither "late" nor "outside 2x"
    r = [(max(p, RESOLUTION_S), max(a, RESOLUTION_S)) for p, a in pairs]
    errs = [abs(math.log10(p) - math.log10(a)) for p, a in r]
    hits = [p / a <= 2 and a / p <= 2 for p, a in r]
    covered = [a <= p for p, a in r]
    nominal = sum(targets) / len(targets)
    cov = sum(covered) / len(covered)
    out.update(mae_log10=sum(errs) / len(errs), within_2x=sum(hits) / len(hits),
               waited_longer_than_predicted=1.0 - cov, acted_quantile=nominal, acted_quantile_coverage=cov,
               verdict=coverage_verdict(cov, nominal, len(covered)))
    return out


RESOLUTION_S = 60.0


def coverage_verdict(coverage: float, nominal: float, n: int) -> str:
    """'too optimistic', 'too cautious' or 'as promised': the coverage of the acted-on quantile
    against its nominal level, beyond the binomial spread of n segments (one-sided 95 %)."""
    from chainrun.predict.doubt import Z

    spread = Z * math.sqrt(nominal * (1.0 - nominal) / n) + 1.0 / n
    if coverage < nominal - spread:
        return "too optimistic"
    if coverage > nominal + spread:
        return "too cautious"
    return "as promised"
