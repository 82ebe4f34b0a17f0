"""``ror aggregate``: several raters' labels -> one label per segment with a posterior (stored as ``aggregate:<method>``)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store


@app.command()
def aggregate(
    method: Annotated[
        str,
        typer.Option("--method", help="majority-vote, dawid-skene (default), one-coin-dawid-skene, glad or mace."),
    ] = "dawid-skene",
    raters: Annotated[
        str | None,
        typer.Option("--raters", help="Comma-separated annotator ids to combine (default: every machine rater with labels, "
                     "except earlier aggregates and verifiers)."),
    ] = None,
    human: Annotated[
        str,
        typer.Option("--human", help="held-out (default): human labels are not used, so calibration against them stays honest; "
                     "anchor: every human rater joins the estimate."),
    ] = "held-out",
    n_iter: Annotated[int | None, typer.Option("--n-iter", help="Maximum EM iterations (default 100).")] = None,
    tol: Annotated[float | None, typer.Option("--tol", help="EM stopping tolerance on the bound per response (default 1e-5).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Random state of randomised methods (mace).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Combine raters into one label per segment with a probability per class (Dawid-Skene by default)."""
    from .. import pipeline
    from ..aggregate import AggregateOptions

    names = None if raters is None else tuple(r.strip() for r in raters.split(",") if r.strip())
    options = AggregateOptions.from_options({"method": method, "raters": names, "human": human, "n_iter": n_iter, "tol": tol, "seed": seed})
    with open_store(db, lock_timeout, must_exist=True) as store:
        summary = pipeline.aggregate(store, options)
    if as_json:
        console.print_json(json.dumps(summary.model_dump(mode="json")))
        return
    _print(summary)


def _print(summary) -> None:
    console.print(
        f"{summary.annotator}: {summary.segments} segments from {len(summary.raters)} raters ({summary.responses} labels), "
        f"human {summary.human}; mean confidence {summary.mean_confidence:.3f}, "
        f"{100 * summary.share_below_half:.1f}% of segments below 0.5"
        + (f"; {summary.iterations} EM iterations" if summary.iterations is not None else "")
    )
    if summary.held_out_humans:
        console.print(f"held out (human): {', '.join(summary.held_out_humans)}")
    table = Table(title="Raters combined")
    for col in ("rater", "segments", "estimated accuracy"):
        table.add_column(col, overflow="fold")
    for rater in summary.raters:
        table.add_row(rater, str(summary.rater_segments[rater]), f"{summary.rater_accuracy[rater]:.3f}")
    console.print(table)
    console.print("labels: " + ", ".join(f"{k} {v}" for k, v in summary.class_counts.items()))
