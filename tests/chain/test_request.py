"""What each segment asks sbatch for: user and site options, chainrun's adaptations, chainrun's own."""

from chainrun.chain.request import describe, merge_site_options, segment_args
from chainrun.state.records import Chain, Segment


def chain(args, adapt=None):
    c = Chain(id="c1", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/k",
              total_s=7200, segment_s=3600, policy="lead", lead_s=600, signal="USR2", signal_lead_s=300, retries=1,
              sbatch_args=args, partition="p")
    if adapt:
        c.extra["adapt"] = adapt
    return c


def test_user_options_are_never_dropped_and_ours_come_last():
    args = segment_args(chain(["--account=a", "--qos", "q", "--gres=gpu:4"]), Segment(chain_id="c1", idx=3,
                                                                                     time_limit_s=3600))
    assert args[:4] == ["--account=a", "--qos", "q", "--gres=gpu:4"]
    assert "--job-name=cr.c1.3" in args and "--time=0-01:00:00" in args and "--signal=B:USR2@300" in args


def test_excludes_are_a_union():
    c = chain(["--exclude=n1,n2", "-x", "n5"], adapt={"exclude": ["n2", "n3"]})
    args = segment_args(c, Segment(chain_id="c1", idx=0, time_limit_s=60))
    assert [a for a in args if "exclude" in a or a == "-x"] == ["--exclude=n1,n2,n5,n3"]


def test_an_option_the_user_pinned_is_not_changed():
    pinned = chain(["--nodes=8", "--oversubscribe"], adapt={"nodes": 4, "exclusive": True})
    args = segment_args(pinned, Segment(chain_id="c1", idx=0, time_limit_s=60))
    assert "--nodes=4" not in args and "--exclusive" not in args and "--nodes=8" in args
    free = segment_args(chain([], adapt={"nodes": 4, "exclusive": True}), Segment(chain_id="c1", idx=0, time_limit_s=60))
    assert "--nodes=4" in free and "--exclusive" in free


def test_site_options_yield_to_the_users_but_excludes_join():
    merged = merge_site_options(["--account=site", "--qos", "normal", "--exclude=bad1", "--constraint=a100"],
                                ["--account=mine", "--exclude=bad2"])
    assert merged[:3] == ["--qos", "normal", "--constraint=a100"]
    assert "--account=mine" in merged and "--account=site" not in merged
    assert merged[-1] == "--exclude=bad1,bad2"


def test_time_min_and_dependency_and_description():
    seg = Segment(chain_id="c1", idx=1, time_limit_s=7200, dependency="afterany:5", extra={"time_min_s": 600})
    args = segment_args(chain(["--account=a"]), seg)
    assert "--time-min=0-00:10:00" in args and args[-1] == "--dependency=afterany:5"
    text = describe(args)
    assert "--account=a" in text and "--job-name" not in text and "--chdir" not in text


def test_a_pinned_node_is_never_excluded_by_chainrun():
    c = chain(["--nodelist=n[1-2]"], adapt={"exclude": ["n1", "n3"]})
    args = segment_args(c, Segment(chain_id="c1", idx=0, time_limit_s=60))
    assert "--exclude=n3" in args and not any("n1" in a for a in args if a.startswith("--exclude"))
