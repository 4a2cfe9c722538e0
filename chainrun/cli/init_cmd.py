"""`chainrun init --template NAME [DIR]`: copy a working trainer that follows the checkpoint contract."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from chainrun.cli.render import envelope
from chainrun.errors import NotFoundError, UsageError

# template name -> (folder under templates/, files to copy)
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "pytorch": ("pytorch", ("train.py", "train.sh")),
    "lightning": ("lightning", ("train.py", "train.sh")),
    "hf": ("hf", ("train.py", "train.sh")),
    "toy": ("", ("toy_trainer.py", "toy_train.sh")),
}
NEEDS = {"pytorch": "torch", "lightning": "lightning (and torch)", "hf": "transformers, accelerate (and torch)",
         "toy": "nothing but python3"}


def register(app: typer.Typer) -> None:
    app.command("init", help="Copy a trainer that follows the checkpoint contract (pytorch, lightning, hf or toy) "
                             "into DIR; never overwrites a file.")(init)


def templates_root() -> Path:
    """The templates shipped inside the package (the repository's templates/ links here)."""
    import chainrun

    return Path(chainrun.__file__).resolve().parent / "templates"


def init(
    template: Annotated[str, typer.Option("--template", "-t", metavar="NAME", help="pytorch, lightning, hf or toy.")],
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Where to put the files (created if missing).")] = Path("."),
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (a versioned envelope) instead of text.")] = False,
) -> None:
    if template not in TEMPLATES:
        raise UsageError(f"unknown template {template!r}", hint=f"choose one of: {', '.join(TEMPLATES)}")
    sub, names = TEMPLATES[template]
    src_dir = templates_root() / sub if sub else templates_root()
    sources = [src_dir / n for n in names]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise NotFoundError(f"template files not found: {', '.join(missing)}",
                            hint="install chainrun from a checkout of its repository (pip install -e .)")
    dest = directory.expanduser()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{directory} exists and is not a folder")
    targets = [dest / n for n in names]
    clash = [str(t) for t in targets if t.exists() or t.is_symlink()]
    if clash:
        raise UsageError(f"refusing to overwrite {', '.join(clash)}", hint="choose another folder or move them aside")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for s, t in zip(sources, targets):
            shutil.copyfile(s, t)
            shutil.copymode(s, t)
    except OSError as e:
        raise UsageError(f"cannot write into {directory}: {e.strerror or e}") from None
    script = next(t for t in targets if t.suffix == ".sh")
    if json_out:
        typer.echo(envelope("init", {"template": template, "directory": str(dest.resolve()),
                                     "files": [str(t.resolve()) for t in targets], "script": str(script.resolve())}))
        return
    typer.echo(f"{template} template copied to {dest}: {', '.join(names)}")
    typer.echo(f"it needs {NEEDS[template]} where the job runs; set the environment up at the top of {script.name}")
    typer.echo(f"then: chainrun submit {script} --total 72h   (see docs/templates.md)")
