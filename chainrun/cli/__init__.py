"""Thin typer commands: parse, call one core function, render."""
