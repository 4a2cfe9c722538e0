"""The ``chainrun`` command: builds the typer app and turns errors into one-line messages.

Heavy libraries (pandas, lightgbm, paramiko) must not be imported on this path: command
modules import them inside their functions, so ``chainrun --help`` stays fast.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from typing import Annotated, Optional

import typer

from chainrun import __version__
from chainrun.errors import ChainrunError, StateError, UsageError

app = typer.Typer(
    name="chainrun",
    help="Run long training jobs on Slurm as chains of checkpointed segments, each submitted "
    "early enough that the queue wait disappears.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,  # we print one line; locals could hold secrets
    rich_markup_mode=None,
)

EXIT_INTERNAL = 70


def _version(value: bool) -> None:
    if value:
        typer.echo(f"chainrun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit."),
    ] = None,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail; -v shows tracebacks.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors.")] = False,
) -> None:
    """chainrun: long Slurm runs without the queue wait between segments."""
    from chainrun.cli import logsetup

    logsetup.configure(verbose=verbose, quiet=quiet)


def _register() -> None:
    # each module adds its commands to `app`; none imports heavy libraries at import time
    from chainrun.cli import chain_cmd  # submit, status, watch, cancel

    chain_cmd.register(app)
    # --- further command modules register here (one line each) ---
    from chainrun.cli import model_cmd  # model refresh/status/eval, predict

    model_cmd.register(app)
    from chainrun.cli import sim_cmd  # trace replay of submission policies

    sim_cmd.register(app)
    from chainrun.cli import cluster_cmd  # cluster add/list/test/remove/default (SSH)

    cluster_cmd.register(app)
    from chainrun.cli import report_cmd  # report: timeline PNG/HTML and summary

    report_cmd.register(app)
    from chainrun.cli import init_cmd  # init --template: copy a trainer that follows the contract

    init_cmd.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run one command; every failure becomes one line on stderr and a documented exit code."""
    from chainrun.cli import logsetup

    click = _click()

    try:
        rv = app(args=argv, prog_name="chainrun", standalone_mode=False)
        return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
    except SystemExit as e:  # sys.exit inside a command
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return code
    except click.exceptions.NoArgsIsHelpError as e:  # `chainrun model`: the group's help, as before
        e.show()
        return e.exit_code
    except click.exceptions.UsageError as e:  # unknown option, missing argument, value out of range
        where = f"chainrun {e.ctx.command_path.split(' ', 1)[1]}" if e.ctx and " " in e.ctx.command_path else "chainrun"
        msg = " ".join(e.format_message().split())
        typer.echo(f"chainrun: error: {msg} (see `{where} --help`)", err=True)
        return UsageError.exit_code
    except click.exceptions.ClickException as e:
        typer.echo(f"chainrun: error: {' '.join(e.format_message().split())}", err=True)
        return e.exit_code or 1
    except typer.Abort:
        typer.echo("chainrun: aborted", err=True)
        return 1
    except ChainrunError as e:
        logging.getLogger("chainrun").debug("error", exc_info=True)
        typer.echo(f"chainrun: error: {' '.join(str(e).split())}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        typer.echo("chainrun: interrupted", err=True)
        return 130
    except sqlite3.DatabaseError as e:  # locked, disk full or I/O error under the state store
        path = logsetup.log_exception(e)
        _verbose_traceback(logsetup)
        typer.echo(f"chainrun: error: state store: {e} (nothing was changed; details in {path})", err=True)
        return StateError.exit_code
    except OSError as e:  # a file or folder we could not read or write: the system's words, one line
        from chainrun import paths

        if paths.is_in_home(e.filename):  # the home is the problem: name it and say what to do (exit 6)
            logging.getLogger("chainrun").debug("home error", exc_info=True)
            err = paths.home_error(e)
            typer.echo(f"chainrun: error: {' '.join(str(err).split())}", err=True)
            return err.exit_code
        path = logsetup.log_exception(e)
        _verbose_traceback(logsetup)
        what = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
        typer.echo(f"chainrun: error: {what} (details in {path})", err=True)
        return 1
    except Exception as e:  # a bug: one line for the user, the traceback in the log
        path = logsetup.log_exception(e)
        _verbose_traceback(logsetup)
        typer.echo(
            f"chainrun: internal error: {type(e).__name__}: {' '.join(str(e).split())} "
            f"(traceback in {path}; please report it)", err=True
        )
        return EXIT_INTERNAL


def _click():
    try:  # typer >= 0.20 carries its own copy of click: its exceptions are not click's
        from typer import _click as click
    except ImportError:  # pragma: no cover - older typer
        import click
    return click


def _verbose_traceback(logsetup) -> None:
    if logsetup.VERBOSE:
        import traceback

        traceback.print_exc()


def run() -> None:  # console-script entry
    sys.exit(main())


if __name__ == "__main__":
    run()
