"""chainrun: long Slurm training runs as chains of checkpointed segments."""

__version__ = "0.1.0"
