"""One error base for everything chainrun reports to a user.

The CLI catches :class:`ChainrunError`, prints its message on one line to stderr and
exits with its ``exit_code``; anything else is a bug and keeps its traceback in the
log file (and on screen with ``-v``). Exit codes are documented in docs/exit-codes.md.
"""

from __future__ import annotations


class ChainrunError(Exception):
    """Base of all errors a user can cause or fix."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(ChainrunError):
    """Bad input on the command line or in a file the user wrote."""

    exit_code = 2


class SiteRefused(UsageError):
    """A cluster of a chain spanning clusters failed a check at submit; the message names the cluster."""


class NotFoundError(ChainrunError):
    """A chain, cluster, file or model that does not exist."""

    exit_code = 3


class SlurmError(ChainrunError):
    """Slurm refused a request or printed something we cannot use."""

    exit_code = 4


class TransientSlurmError(SlurmError):
    """Slurm did not answer (timeout, controller down); worth retrying later."""

    exit_code = 5


class StateError(ChainrunError):
    """The state store is corrupt, from a newer chainrun, or locked by another watcher."""

    exit_code = 6


class ModelError(ChainrunError):
    """No usable queue-delay model, or a model that does not match this chainrun."""

    exit_code = 7


class RemoteError(ChainrunError):
    """An SSH connection failed or a host key could not be verified."""

    exit_code = 8


class HomeError(StateError):
    """The chainrun home (``CHAINRUN_HOME`` or the default data folder) cannot be created or written."""


class CopyError(ChainrunError):
    """A checkpoint copy between sites failed (chainrun/chain/ckpt_copy.py); the destination's latest
    checkpoint is unchanged and a later copy resumes what arrived."""


class RsyncMissing(CopyError):
    """``rsync`` is not installed (or not on the PATH) on one side of a copy."""


class CopyPermissionDenied(CopyError):
    """A side refused: no login without a prompt (the direct route's key), or a folder not writable."""


class DiskFull(CopyError):
    """The destination (or the driver's staging folder) ran out of space or quota."""


class VerifyMismatch(CopyError):
    """What arrived differs from the source's manifest (sizes or sha256): it is not made latest."""
