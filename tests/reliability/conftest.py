"""Long fault runs (``@pytest.mark.slow``) are deselected unless asked for.

They are deselected, not skipped (in CI a skipped Slurm test fails the run): run them with
``pytest -m slow tests/reliability`` or ``CHAINRUN_SLOW=1``.
"""

import os


def pytest_collection_modifyitems(config, items):
    wanted = "slow" in (config.getoption("-m") or "") or os.environ.get("CHAINRUN_SLOW") == "1"
    if wanted:
        return
    here = os.path.dirname(__file__)
    keep, drop = [], []
    for it in items:
        (drop if it.get_closest_marker("slow") and str(it.fspath).startswith(here) else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
