"""``ror review``: the human review queue in Label Studio (create, push, pull, status, adjudicate, serve).

The Label Studio API key is read from ``$LABEL_STUDIO_API_KEY`` only (never an option, never stored);
the server from ``--url`` / ``$LABEL_STUDIO_URL`` (default ``http://127.0.0.1:8089``); every link
printed for people from ``--public-url`` / ``$LABEL_STUDIO_PUBLIC_URL`` (default: the server URL).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import ReviewError
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, err_console, open_store

if TYPE_CHECKING:  # pragma: no cover
    from ..review.flow import AdjudicatorLink

review_app = typer.Typer(
    help="Human review in Label Studio: sample a study, push it, pull labels, adjudicate disagreements.",
    no_args_is_help=True,
)
app.add_typer(review_app, name="review")

StudyArg = Annotated[str, typer.Argument(help="Study name.", show_default=False)]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="LABEL_STUDIO_URL", help="Label Studio server ror calls (env LABEL_STUDIO_URL; default http://127.0.0.1:8089). The API key is read from LABEL_STUDIO_API_KEY."),
]
PublicUrlOption = Annotated[
    str | None,
    typer.Option("--public-url", envvar="LABEL_STUDIO_PUBLIC_URL", help="Address annotators open in their browser (reverse proxy, tunnel); every printed link uses it (env LABEL_STUDIO_PUBLIC_URL; default: the server URL)."),
]
StrictOption = Annotated[
    bool,
    typer.Option("--strict-offsets", help="Span mode: reject regions whose offsets match neither code points nor UTF-16 units instead of re-anchoring them by their text."),
]
RestoreConfigOption = Annotated[bool, typer.Option("--restore-config", help="Put back the study's labeling config if it was edited in the UI.")]
#: The sampling options `ror review create` and `ror review start` share (one declaration each).
StrategyOption = Annotated[str, typer.Option("--strategy", help="random | stratified (by judge label) | disagreement (judges disagree / low confidence first) | trace (whole traces) | uncertainty (least confident first + a random control stratum, with inclusion probabilities).")]
ControlFractionOption = Annotated[float, typer.Option("--control-fraction", min=0.0, max=0.99, help="uncertainty strategy: share of the sample drawn at random from the rest (the control stratum).")]
RaterOption = Annotated[str | None, typer.Option("--rater", help="uncertainty strategy: whose confidence ranks the segments, e.g. aggregate:dawid-skene (default: the latest aggregate, else machine-rater disagreement).")]
NOption = Annotated[int | None, typer.Option("--n", min=1, help="Segments to sample (all strategies but trace).")]
TracesOption = Annotated[int | None, typer.Option("--traces", min=1, help="Whole traces to sample (trace strategy).")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of sampling and assignment.")]
OverlapOption = Annotated[int, typer.Option("--overlap", min=1, help="Annotators per segment (per trace in span mode).")]
BlindOption = Annotated[bool, typer.Option("--blind/--show-judge", help="Blind: annotators never see the judge label. --show-judge pre-selects it as a prediction.")]
ModeOption = Annotated[str, typer.Option("--mode", help="segment (one task per segment) or span (one task per trace, segments as regions).")]
CodebookOption = Annotated[str, typer.Option("--codebook", help="Versioned codebook name.")]
JudgeAnnotatorOption = Annotated[str | None, typer.Option("--judge-annotator", help="Which judge's labels are 'the judge' (shown, stratified by), e.g. baseline:cue-v1 or openai:gpt-4.1-mini.")]
CompareOption = Annotated[list[str] | None, typer.Option("--compare", help="Judge annotators compared by the disagreement strategy (repeat; default all).")]
AdjudicatorOption = Annotated[str | None, typer.Option("--adjudicator", help="The adjudicator's Label Studio account e-mail (`review start` creates the account if missing and prints its password once).")]
ContextCharsOption = Annotated[int, typer.Option("--context-chars", min=0, help="Trace context shown on each side of a segment, in characters.")]
TraceIdOption = Annotated[list[str] | None, typer.Option("--trace-id", help="Restrict sampling to these traces (repeat).")]


def _client(url: str | None, public: str | None = None):
    from ..review.labelstudio import LabelStudioClient

    return LabelStudioClient(url, public=public)


def _pull_counts(report) -> dict[str, int]:
    return {"labels_written": report.labels_written, "labels_unchanged": report.labels_unchanged,
            "labels_removed": report.labels_removed, "labels_replaced": len(report.replaced), "skips": report.skips,
            "superseded": len(report.superseded), "re_anchored": len(report.reanchored), "rejected": len(report.rejected)}


def _print_pull(report) -> None:
    """Counts on one line, then every removed / replaced label, re-anchored region and rejection by name."""
    counts = _pull_counts(report)
    console.print(", ".join(f"{k.replace('re_', 're-').replace('_', ' ')} {v}" for k, v in counts.items()))
    # never truncated: a lab must be able to see every label a pull took away or changed
    for kind, lines in (("removed", report.removed), ("replaced", report.replaced), ("re-anchored", report.reanchored),
                        ("superseded", report.superseded), ("rejected", report.rejected)):
        for line in lines:
            err_console.print(f"[yellow]{kind}[/]: {escape(str(line))}", highlight=False, soft_wrap=True)  # line holds label and segment text


@review_app.command("create")
def create(
    name: StudyArg,
    annotator: Annotated[list[str], typer.Option("--annotator", "-a", help="An annotator's Label Studio account e-mail (repeat). Only a salted pseudonym reaches the labels.")],
    strategy: StrategyOption = "random",
    control_fraction: ControlFractionOption = 0.25,
    rater: RaterOption = None,
    n: NOption = None,
    traces: TracesOption = None,
    ci_width: Annotated[float | None, typer.Option("--ci-width", help="Instead of --n: sample enough segments for a 95% CI of this total width on an agreement rate (Wald, p = 0.5).")] = None,
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
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Sample a study's segments and assign them to annotators (overlap and blinding by construction)."""
    from ..review.studies import assignments, create_study, sample_size_for_ci_width

    if ci_width is not None:
        if n is not None:
            raise ReviewError("give either --n or --ci-width, not both")
        n = sample_size_for_ci_width(ci_width)
        console.print(f"--ci-width {ci_width}: sampling {n} segments (Wald, p = 0.5, 95%)")
    with open_store(db, lock_timeout) as store:
        study = create_study(
            store, name, annotators=annotator, strategy=strategy, n=n, n_traces=traces, seed=seed, overlap=overlap,
            blind=blind, mode=mode, codebook=codebook, judge_annotator=judge_annotator, compare_annotators=compare,  # type: ignore[arg-type]
            adjudicator=adjudicator, context_chars=context_chars, trace_ids=trace_id, control_fraction=control_fraction, rater=rater,
        )
        from ..review.studies import study_items, study_people

        items = study_items(store, name)
        table = Table(title=f"study {name}: {len(items)} segments, {study.mode} mode, {'blind' if study.blind else 'judge shown'}, overlap {study.overlap}")
        table.add_column("annotator")
        table.add_column("segments", justify="right")
        for person in study_people(store, name):
            table.add_row(person, str(len(assignments(store, name, person))))
        console.print(table)
        console.print(f"codebook {study.codebook_name} ({study.codebook_version[:12]}), strategy {study.strategy}, seed {study.seed}"
                      + (f", judge {study.judge_annotator}" if study.judge_annotator else ""))
        design = study.parameters.get("design")
        if design and study.strategy == "uncertainty":
            console.print(f"design: {design['m']} least confident ({design['basis']}) with inclusion probability 1, "
                          f"{design['n_control']} control of the other {design['population'] - design['m']} segments "
                          f"(probability {design['n_control'] / max(1, design['population'] - design['m']):.4g})", highlight=False)


@review_app.command("push")
def push(
    name: StudyArg,
    url: UrlOption = None,
    public_url: PublicUrlOption = None,
    restore_config: RestoreConfigOption = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Create or reuse each annotator's Label Studio project and import missing tasks (never duplicates)."""
    from ..review.studies import person_email
    from ..review.sync import push_study, require_accounts

    client = _client(url, public_url)
    with open_store(db, lock_timeout) as store:
        require_accounts(store, name, client)  # before the run: its message names people by e-mail
        with store.run("review push", {"study": name, "url": client.url, "public_url": client.public_url}) as run:
            report = push_study(store, name, client, restore_config=restore_config)
            run.counts.update(tasks_created=report.tasks_created, tasks_total=report.tasks_total)
        table = Table(title=f"study {name} on {client.public_url}")
        for col in ("annotator", "e-mail (private)", "project", "new tasks", "tasks"):
            table.add_column(col, no_wrap=col == "annotator")
        links = []
        for person, pid, purl, created, total in report.projects:
            email = person_email(store, person)
            table.add_row(person, email, str(pid), str(created), str(total))
            links.append(f"  {email}: {purl}")
        console.print(table)
        # links on their own lines, never cut or wrapped by the table, so they can be copied whole
        console.print("Give each annotator only their own project link:\n" + "\n".join(links), soft_wrap=True, highlight=False)


@review_app.command("pull")
def pull(
    name: StudyArg,
    url: UrlOption = None,
    public_url: PublicUrlOption = None,
    strict_offsets: StrictOption = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Import annotations (idempotent): human labels, skips, adjudications; names every label removed or replaced."""
    from ..review.sync import pull_study, require_accounts

    client = _client(url, public_url)
    with open_store(db, lock_timeout) as store:
        require_accounts(store, name, client)  # before the run: its message names people by e-mail
        with store.run("review pull", {"study": name, "url": client.url, "strict_offsets": strict_offsets}) as run:
            report = pull_study(store, name, client, run_id=run.run_id, strict_offsets=strict_offsets)
            run.counts.update(_pull_counts(report))
    _print_pull(report)


@review_app.command("status")
def status(
    name: StudyArg,
    show_people: Annotated[bool, typer.Option("--show-people", help="Also show which person (e-mail) each pseudonym is. Local output only; never stored in runs or exports.")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Progress per annotator, disagreements (adjudicated / open) and adjudication progress, as of the last pull (offline)."""
    from ..review.adjudicate import disagreement_status
    from ..review.studies import load_study, person_email
    from ..review.sync import ADJUDICATION_ROLE, study_status

    with open_store(db, lock_timeout) as store:
        study = load_study(store, name)
        rows = study_status(store, name)
        dis = disagreement_status(store, name)
        people = {r.pseudonym: person_email(store, r.pseudonym) for r in rows} if show_people else {}
    table = Table(title=f"study {name} ({study.state}, {study.mode} mode, {'blind' if study.blind else 'judge shown'}, overlap {study.overlap})")
    cols = [("annotator", "left")] + ([("person (local only)", "left")] if show_people else []) + [
        ("role", "left"), ("assigned", "right"), ("labeled", "right"), ("skipped", "right"), ("remaining", "right"),
        ("rejected", "right"), ("project", "right"), ("last pull (UTC)", "left")]
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=col in ("annotator", "person (local only)"))  # type: ignore[arg-type]
    for r in rows:
        who = [r.pseudonym] + ([people[r.pseudonym]] if show_people else [])
        table.add_row(*who, r.role, str(r.assigned), str(r.labeled), str(r.skipped), str(r.remaining), str(r.rejected),
                      str(r.project_id or "-"), r.last_pull_at.strftime("%Y-%m-%d %H:%M") if r.last_pull_at else "never")
    console.print(table)
    console.print(f"disagreements: {dis.total} (adjudicated {len(dis.adjudicated)}, open {len(dis.open)})", highlight=False)
    adj = [r for r in rows if r.role == ADJUDICATION_ROLE]
    if adj:
        a = adj[0]
        console.print(f"adjudication project {a.project_id}: {a.labeled} of {a.assigned} tasks adjudicated, {a.skipped} skipped, "
                      f"{a.remaining} remaining; {dis.unsent} open disagreements not sent yet (run `ror review adjudicate {name}`)",
                      highlight=False)
    elif dis.open:
        console.print(f"adjudication not started: run `ror review adjudicate {name} --adjudicator EMAIL`", highlight=False)


@review_app.command("adjudicate")
def adjudicate(
    name: StudyArg,
    adjudicator: Annotated[str | None, typer.Option("--adjudicator", help="The adjudicator's Label Studio account e-mail (first time, unless set at create); the account is created if missing and its password printed once.")] = None,
    show_judge: Annotated[bool | None, typer.Option("--show-judge/--hide-judge", help="Show the judge's label (marked as the judge) to the adjudicator. Default: hidden when the study measures a judge (it names --judge-annotator).", show_default=False)] = None,
    url: UrlOption = None,
    public_url: PublicUrlOption = None,
    strict_offsets: StrictOption = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Send disagreements to the adjudication project and pull the adjudicator's choices."""
    from ..review.adjudicate import adjudicate_study
    from ..review.flow import adjudicator_account
    from ..review.sync import require_accounts

    client = _client(url, public_url)
    with open_store(db, lock_timeout) as store:
        # the adjudicator's account is created if missing (password shown once below, stored nowhere)
        account = adjudicator_account(store, name, client, adjudicator)
        require_accounts(store, name, client, adjudicator=adjudicator, adjudicating=True)  # before the run: its message names people by e-mail
        with store.run("review adjudicate", {"study": name, "url": client.url, "show_judge": show_judge}) as run:
            report = adjudicate_study(store, name, client, adjudicator=adjudicator, show_judge=show_judge, run_id=run.run_id,
                                      strict_offsets=strict_offsets)
            run.counts.update(disagreements=report.disagreements, tasks_created=report.tasks_created,
                              show_judge=report.show_judge, **_pull_counts(report.pull))
    for w in report.warnings:
        err_console.print(f"[yellow]warning[/]: {escape(str(w))}", highlight=False, soft_wrap=True)
    console.print(f"{report.disagreements} disagreements, {report.tasks_created} new adjudication tasks "
                  f"(judge {'shown' if report.show_judge else 'hidden'}):", highlight=False)
    console.print(f"  {report.project_url}", soft_wrap=True, highlight=False)
    if account is not None:
        print_adjudicator(account, report.project_url)
    _print_pull(report.pull)


def print_adjudicator(account: "AdjudicatorLink", project_url: str | None = None) -> None:
    """The adjudicator's lines: project (or when it comes), login link, and a new account's password (shown once)."""
    project_url = project_url or account.project_url
    where = (f"project {project_url}" if project_url
             else "adjudication project: made by `ror review adjudicate` once annotation has closed")
    lines = [f"Adjudicator: {account.email} ({account.pseudonym}): {where}"]
    if account.password is not None:
        lines.append(f"      new account: log in at {account.login_url} with password {account.password}  (shown only now; change it under Account & Settings)")
    else:
        lines.append(f"      existing account: log in at {account.login_url}")
    console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)


@review_app.command("serve")
def serve(
    script: Annotated[Path | None, typer.Option("--script", help="Path to scripts/labelstudio.sh (default: found from the current directory up).")] = None,
    action: Annotated[str, typer.Argument(help="install | start | stop | status | env")] = "start",
) -> None:
    """Install, start or stop the local Label Studio server (runs scripts/labelstudio.sh)."""
    if action not in ("install", "start", "stop", "status", "env"):
        raise ReviewError(f"unknown action {action!r}: use install, start, stop, status or env")
    path = script or _find_script()
    bash = shutil.which("bash")
    if bash is None:
        raise ReviewError("bash is needed to run scripts/labelstudio.sh")
    raise typer.Exit(subprocess.call([bash, str(path), action], env=os.environ.copy()))


def _find_script() -> Path:
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]:
        candidate = base / "scripts" / "labelstudio.sh"
        if candidate.is_file():
            return candidate
    raise ReviewError("scripts/labelstudio.sh not found from the current directory: run from the ror_annotate checkout or pass --script")
