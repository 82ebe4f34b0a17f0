"""``ror review start`` / ``ror review finish``: the review path in two commands (issue 27).

``start`` = start Label Studio if needed + ``review create`` + accounts + ``review push`` + links;
``finish`` = ``review pull`` + ``ror agree --study NAME --with-judge [--weighted] --report DIR``.
The library does the work (:mod:`ror_annotate.review.flow`); this module parses and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..options import RESAMPLES_MAX, SEED_MAX
from ..provenance import scrub_url
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, console, err_console, open_store
from .review import (
    AdjudicatorOption,
    BlindOption,
    CodebookOption,
    CompareOption,
    ContextCharsOption,
    ControlFractionOption,
    JudgeAnnotatorOption,
    ModeOption,
    NOption,
    OverlapOption,
    PublicUrlOption,
    RaterOption,
    RestoreConfigOption,
    SeedOption,
    StrategyOption,
    StrictOption,
    StudyArg,
    TraceIdOption,
    TracesOption,
    UrlOption,
    _print_pull,
    print_adjudicator,
    review_app,
)


def _say(text: str) -> None:
    err_console.print(text, highlight=False, soft_wrap=True)


@review_app.command("start")
def start(
    name: StudyArg,
    annotator: Annotated[list[str] | None, typer.Option("--annotator", "-a", help="An annotator's e-mail (repeat); a Label Studio account is created for each one without. Needed for a new study; on a re-run leave it out.")] = None,
    strategy: StrategyOption = "random",
    n: NOption = None,
    traces: TracesOption = None,
    control_fraction: ControlFractionOption = 0.25,
    rater: RaterOption = None,
    seed: SeedOption = 0,
    overlap: OverlapOption = 2,
    blind: BlindOption = True,
    mode: ModeOption = "segment",
    codebook: CodebookOption = "six-behaviors@v1",
    judge_annotator: JudgeAnnotatorOption = None,
    compare: CompareOption = None,
    adjudicator: AdjudicatorOption = None,
    context_chars: ContextCharsOption = 1200,
    trace_id: TraceIdOption = None,
    install: Annotated[bool, typer.Option("--install", help="Install Label Studio (scripts/labelstudio.sh install, about 3-4 min) if no server answers and it is not installed.")] = False,
    url: UrlOption = None,
    public_url: PublicUrlOption = None,
    restore_config: RestoreConfigOption = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Start Label Studio if needed, create the study, create missing accounts, push, and print each annotator's links.

    Idempotent: on an existing study it pushes only what is missing and prints the links again. With
    --adjudicator EMAIL the adjudicator's account is created too (password shown once) and their links printed."""
    from ..review.flow import ReviewStartOptions, review_start

    options = ReviewStartOptions.from_options(dict(
        annotators=tuple(annotator or ()), strategy=strategy, n=n, n_traces=traces, control_fraction=control_fraction, rater=rater,
        seed=seed, overlap=overlap, blind=blind, mode=mode, codebook=codebook, judge_annotator=judge_annotator,
        compare_annotators=tuple(compare) if compare else None, adjudicator=adjudicator, context_chars=context_chars,
        trace_ids=tuple(trace_id) if trace_id else None, install=install, url=url, public_url=public_url, restore_config=restore_config,
    ))
    with open_store(db, lock_timeout) as store:
        s = review_start(store, name, options, say=_say)
    p = s.push
    server = "started" if s.server.started else "running"
    console.print(f"Label Studio {server} at {scrub_url(s.server.url)}" + (" (installed now)" if s.server.installed else ""), highlight=False, soft_wrap=True)
    if s.server.started:
        console.print("It keeps running after this command (`bash scripts/labelstudio.sh stop` stops it); for the separate "
                      "`ror review` commands: eval \"$(bash scripts/labelstudio.sh env)\"", highlight=False, soft_wrap=True, markup=False)
    console.print(f"study {name}: {'created' if s.created else 'exists'} ({s.strategy}); {len(s.annotators)} projects, "
                  f"{p.projects_created} new; {p.tasks_created} new tasks, {p.tasks_total} in all", highlight=False, soft_wrap=True)
    d = s.design
    if d and s.strategy == "uncertainty":
        console.print(f"design: {d['m']} least confident ({d['basis']}) with inclusion probability 1, {d['n_control']} control "
                      f"of the other {d['population'] - d['m']} segments (probability {d['n_control'] / max(1, d['population'] - d['m']):.4g})",
                      highlight=False, soft_wrap=True)
    lines = ["Give each annotator only their own lines:"]
    for a in s.annotators:
        lines.append(f"  {a.email} ({a.pseudonym}): project {a.project_url}")
        if a.password is not None:
            lines.append(f"      new account: log in at {a.login_url} with password {a.password}  (shown only now; change it under Account & Settings)")
        else:
            lines.append(f"      existing account: log in at {a.login_url}")
    # links on their own lines, never cut or wrapped, so they can be copied whole
    console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)
    if s.adjudicator is not None:
        print_adjudicator(s.adjudicator)
    console.print(f"When they are done: ror review finish {name}", highlight=False)


@review_app.command("finish")
def finish(
    name: StudyArg,
    url: UrlOption = None,
    public_url: PublicUrlOption = None,
    strict_offsets: StrictOption = False,
    with_judge: Annotated[bool, typer.Option("--with-judge/--humans-only", help="Also compare the machine raters on the study's segments (judge-vs-human figures).")] = True,
    weighted: Annotated[bool | None, typer.Option("--weighted/--unweighted", help="Inverse-probability weights (default: exactly when every item has an inclusion probability and there is a control stratum).", show_default=False)] = None,
    reference: Annotated[str | None, typer.Option("--reference", help="As `ror agree`: human, adjudicated, majority, none, or an annotator name.")] = "majority",
    resamples: Annotated[int, typer.Option("--resamples", min=0, max=RESAMPLES_MAX, help="Trace-level bootstrap resamples (0: no intervals).")] = 1000,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Bootstrap seed.")] = 0,
    report: Annotated[Path | None, typer.Option("--report", help="Folder of agreement.md, agreement.json and figures (default reports/NAME).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the agreement figures as JSON (as `ror agree --json`).")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Pull the study's annotations, print its agreement (as `ror agree --study NAME --with-judge`, weighted
    when the study has inclusion probabilities) and write the report."""
    from ..review.flow import ReviewFinishOptions, review_finish
    from .agree import _print_tables, _print_trust

    ref = None if reference in (None, "", "none") else reference
    options = ReviewFinishOptions.from_options(dict(
        url=url, public_url=public_url, strict_offsets=strict_offsets, with_judge=with_judge, weighted=weighted,
        n_resamples=resamples, seed=seed, report=report or Path("reports") / name,
    ))
    options = options.model_copy(update={"reference": ref})
    with open_store(db, lock_timeout, must_exist=True) as store:
        s = review_finish(store, name, options, say=_say)
    if as_json:
        _print_pull_quietly(s)
        typer.echo(json.dumps(s.agreement, indent=2, allow_nan=False, ensure_ascii=False))
        return
    _print_pull(s.pull)
    _print_tables(s.agreement)
    _print_trust(s.agreement)
    if s.weighted_note:
        console.print(s.weighted_note, highlight=False)
    console.print(f"report: {s.report}" + (f", reliability diagram: {s.reliability_png}" if s.reliability_png else ""), highlight=False, soft_wrap=True)
    console.print("same as: " + " && ".join(s.commands), highlight=False, soft_wrap=True)


def _print_pull_quietly(s) -> None:
    """With --json the pull's counts go to stderr, so stdout stays one JSON document."""
    p = s.pull
    err_console.print(f"pulled: labels written {p.labels_written}, unchanged {p.labels_unchanged}, removed {p.labels_removed}, "
                      f"rejected {len(p.rejected)}; report: {s.report}", highlight=False, soft_wrap=True)
