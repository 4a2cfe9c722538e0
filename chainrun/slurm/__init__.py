"""Argv builders and pure parsers for the text Slurm prints."""
