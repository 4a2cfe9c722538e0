"""The ``chainrun`` command: builds the typer app and turns errors into one-line messages.

Heavy libraries (pandas, lightgbm, paramiko) must not be imported on this path: command
modules import them inside their functions, so ``chainrun --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Optional

import typer

from chainrun import __version__
from chainrun.errors import ChainrunError

app = typer.Typer(
    name="chainrun",
    help="Run long training jobs on Slurm as chains of checkpointed segments, each submitted "
    "early enough that the queue wait disappears.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,  # we print one line; locals could hold secrets
    rich_markup_mode="rich",
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
    from chainrun.cli import chains  # submit, status, watch, cancel

    chains.register(app)
    # --- further command modules register here (one line each) ---
    from chainrun.cli import model_cmd  # model refresh/status/eval, predict

    model_cmd.register(app)
    from chainrun.cli import sim_cmd  # trace replay of submission policies

    sim_cmd.register(app)
    from chainrun.cli import cluster_cmd  # cluster add/list/test/remove/default (SSH)

    cluster_cmd.register(app)
    from chainrun.cli import report_cmd  # report: timeline PNG/HTML and summary

    report_cmd.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    from chainrun.cli import logsetup

    try:
        app(args=argv, prog_name="chainrun", standalone_mode=True)
    except SystemExit as e:  # typer/click exit paths
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return code
    except ChainrunError as e:
        logging.getLogger("chainrun").debug("error", exc_info=True)
        typer.echo(f"chainrun: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        typer.echo("chainrun: interrupted", err=True)
        return 130
    except Exception as e:  # a bug: one line for the user, the traceback in the log
        path = logsetup.log_exception(e)
        if logsetup.VERBOSE:
            import traceback

            traceback.print_exc()
        typer.echo(
            f"chainrun: internal error: {type(e).__name__}: {e} (traceback in {path}; please report it)", err=True
        )
        return EXIT_INTERNAL
    return 0


def run() -> None:  # console-script entry
    sys.exit(main())


if __name__ == "__main__":
    run()
