"""The one seam between chainrun and a machine: run an argv, get a result.

Everything above this package is identical for the local machine and a remote cluster.
"""

from chainrun.runner.base import RunResult, Runner

__all__ = ["RunResult", "Runner"]
