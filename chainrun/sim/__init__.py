"""Trace replay: how much interruption and overlap each submission policy gives on a real trace.

Public API::

    from chainrun.sim import SimConfig, run_sim
    result = run_sim(read_trace(path), SimConfig(chains_every_s=4 * 3600))
    result.fidelity            # replay of the trace alone vs the recorded waits
    result.policies            # {policy: {transitions, mean_interruption_h, ..., by_load}}
    result.as_json()

Modules: scheduler (the event-driven partition model), workload (trace -> jobs), fidelity,
knowledge (the masked past and the predictor), policies (submission rules), experiment (one
injected chain, all rules), metrics, replay (the whole run).
"""

from chainrun.sim.replay import SimConfig, SimResult, run_sim

__all__ = ["SimConfig", "SimResult", "run_sim"]
