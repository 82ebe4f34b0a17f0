"""``ror codebook``: list, show and hash the frozen codebooks."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import app

codebook_app = typer.Typer(help="The frozen six-behavior codebooks: list, show (what the judge and reviewers see), hash.",
                           no_args_is_help=True)
app.add_typer(codebook_app, name="codebook")

NameArg = Annotated[str, typer.Argument(help="Codebook name such as six-behaviors@v1, or a path to a .yaml file.")]


@codebook_app.command("list")
def list_codebooks() -> None:
    """List the available codebooks with their sha256 (the codebook_version on labels)."""
    from ..codebook import available_codebooks, load_codebook

    for name in available_codebooks():
        typer.echo(f"{name}\t{load_codebook(name).sha256}")


@codebook_app.command("show")
def show(
    name: NameArg = "six-behaviors@v1",
    fmt: Annotated[str, typer.Option("--format", help="markdown (the judge's and reviewers' text), summary, or json (canonical form).")] = "markdown",
) -> None:
    """Print a codebook exactly as the judge's prompt and the review interface show it."""
    from ..codebook import load_codebook, render_markdown, summary
    from ..errors import InputError

    book = load_codebook(name)
    if fmt == "markdown":
        text = render_markdown(book)
    elif fmt == "summary":
        text = summary(book)
    elif fmt == "json":
        text = book.canonical_json()
    else:
        raise InputError(f"--format must be markdown, summary or json, got {fmt!r}")
    # Plain output (no rich markup) so it can be piped and diffed byte for byte.
    typer.echo(text)


@codebook_app.command("hash")
def hash_(name: NameArg = "six-behaviors@v1") -> None:
    """Print the codebook's sha256 over its canonical JSON form."""
    from ..codebook import load_codebook

    typer.echo(load_codebook(name).sha256)
