"""Trace replay: what each submission policy costs a training run, whole chains on a real trace.

Public API::

    from chainrun.sim import ChainsConfig, run_chains
    result = run_chains(read_trace(path), ChainsConfig(chains_every_s=12 * 3600))
    result.fidelity            # replay of the trace alone vs the recorded waits
    result.as_json()           # {"chains": {"policies": {policy: {mean_overhead_h, by_load, ...}}}, "meta": ...}

Modules: scheduler (the event-driven partition model), workload (trace -> jobs), fidelity,
knowledge (the masked past and the predictor), adapter (the shipped policy classes asked as the
watcher asks them), chains (one chain, every segment), chain_replay (the whole run), tune,
elastic. The per-transition replay (Mirage's metric with its own copies of the rules) was
retired: every boundary's gap is reported by the whole-chain replay, under ``transitions``.
"""

from chainrun.sim.chain_replay import ChainsConfig, ChainsResult, run_chains

__all__ = ["ChainsConfig", "ChainsResult", "run_chains"]
