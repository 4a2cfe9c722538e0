"""The values `predicted` and `lead` ship with, and why: the defaults every chain gets until
`model refresh` chooses others for its cluster and partition (chainrun/chain/tuned.py). Their own
module so that the policies and the tuned values both read them without importing each other."""

# How long before the hand-over point a segment is submitted by default (`--lead`); for the
# `predicted` policy it is the floor the model can only move earlier. An hour early costs an
# hour of work moved into a later segment, not an hour of GPUs: the running segment hands off.
DEFAULT_LEAD_S = 3600

# The floor `predicted` keeps when the chain gives no `--lead`: the pick of the decide-on-past,
# score-on-future procedure (chainrun/sim/tune.py, `bench/sim_chains.py --tune-score-from`; its
# output docs/results/sim-tune-ls6.json shows the choice: 1 h with fair share in the replay, 3 h
# before). Separate from DEFAULT_LEAD_S, the `lead` policy's lead, so that tuning one does not
# move the other (they happen to be equal now).
PREDICTED_FLOOR_S = 3600

# What one extra segment boundary costs, in the same unit as an hour of interruption: its own
# restart, the hand-off minutes and the small queue gap it may bring. Starting an hour early moves
# an hour of work into one more boundary every `segment` hours, so the newsvendor quantile of the
# predicted wait is
#   q* = cost late / (cost late + cost early) = 1 / (1 + TRANSITION_COST_S / segment_s).
# The `slack` rule (PREDICTED_RULE below) reads the same cost directly: a successor that starts more
# than the chain's slack allows before its predecessor's hand-over point costs one such boundary.
# The value is the decide-on-past, score-on-future procedure's pick (chainrun/sim/tune.py, its grid
# COSTS_S; docs/results/sim-tune-ls6.json; docs/evaluation.md), with the rule and the guard's share.
TRANSITION_COST_S = 3600

# The highest target probability `predicted` acts on: 0.98, the highest level the queue-delay
# model learns (chainrun.predict.model.QUANTILES); beyond it the answer is an extrapolated tail.
# It was a tuned 0.95 before the guard (MAX_LEAD_SHARE) bounded what a long predicted wait can do;
# the tunable is now TRANSITION_COST_S.
MAX_TARGET = 0.98


# The guard against the hand-off spiral: a successor is never queued before its predecessor has
# trained (1 - MAX_LEAD_SHARE) of a full segment, or all of itself if it is shorter. Without it,
# when the model's wait at the target is longer than the segment (q0.95 of a 48 h request often
# is), `predicted` submitted at the segment's start, the successor started minutes later and cut
# it, and its successor again. A short segment (a chain's last pieces) gets no early successor at
# all: otherwise each cut leaves a shorter one to cut again. With it every segment trains at least
# min(itself, (1 - share) x a full segment), so a chain needs a bounded number of them. 1.0 = no
# cap (the rule before the guard). The value is the decide-on-past procedure's pick among the
# bounded shares (chainrun/sim/tune.py, docs/results/sim-tune-ls6.json): on the choice window
# (Nov-Jan), with the slack rule and a boundary cost of 1 h, 0.6 left the smallest gap per load
# level of 0.25/0.4/0.5/0.6/0.75 and all the quantile candidates (0.5 with the quantile rule before
# the grid covered both rules, 0.75 before it covered the share and the target together); no cap
# is not a candidate for a safety bound (the spiral was seen on that window: 32 of 148 chains stuck
# at q0.98 without it). See docs/evaluation.md.
MAX_LEAD_SHARE = 0.6


# How `predicted` turns the model's distribution into a moment: "quantile", the newsvendor rule
# (submit once P(start within the time left) has fallen to predict_quantile's target: an hour early
# costs 1/segment of a boundary), or "slack", the chain's own arithmetic (an early start costs
# nothing while the cut fits in the chain's slack, its share of it per boundary, and one whole
# boundary beyond; ``slack_lead``). "slack" is the decide-on-past procedure's pick over both rules
# (chainrun/sim/tune.py; docs/results/sim-tune-ls6.json, commit 5d021ee: on November-January it
# left the least of reactive - oracle open at its worst load level, 0.56, against 0.58 for the
# best quantile candidate, with 4.21 segments a chain against 4.35-4.65).
RULES = ("quantile", "slack")
PREDICTED_RULE = "slack"
