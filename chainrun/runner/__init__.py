"""The one seam between chainrun and a machine: run an argv, get a result.

Everything above this package is identical for the local machine and a remote cluster.
"""

from chainrun.runner.base import RunResult, Runner

__all__ = ["RunResult", "Runner", "for_cluster"]


def for_cluster(spec, *, known_hosts, accept_new_host_key: bool = False) -> Runner:
    """The runner of a configured cluster: the system ssh (``cluster add --ssh``) or paramiko."""
    if spec.openssh:
        from chainrun.runner.openssh import OpenSSHRunner  # no paramiko on this path

        return OpenSSHRunner(spec, accept_new_host_key=accept_new_host_key)
    from chainrun.runner.ssh import SSHRunner  # paramiko: only once a remote cluster is used

    return SSHRunner(spec, known_hosts=known_hosts, accept_new_host_key=accept_new_host_key)
