"""The spine's commands: ``ror ingest``, ``ror segment``, ``ror label``, ``ror run``, ``ror status``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rich.markup import escape

from ..errors import JudgeOutcomeError
from ..segment import MAX_SEGMENT_TOKENS
from ..sample import card_license, resolve_source, source_licenses
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, err_console, open_store, parse_fractions
from .judge_options import (
    JudgeBatchIdOption,
    JudgeBatchOption,
    JudgeBatchPollOption,
    JudgeBatchRequeueOption,
    JudgeTimeoutOption,
    JudgeChunkSizeOption,
    JudgeCodebookOption,
    JudgeConcurrencyOption,
    JudgeContextTokensOption,
    JudgeMaxAttemptsOption,
    JudgeMaxTokensOption,
    JudgeModeOption,
    JudgePricesOption,
    JudgeRetryFailedOption,
    JudgeSamplesOption,
    JudgeSeedOption,
    JudgeTemperatureOption,
    JUDGE_OPTION_NAMES,
    MaxFailedOption,
    judge_options,
)

_INPUT_PANEL = "Input"

InputArg = Annotated[
    str,
    typer.Argument(
        help="Traces: a .jsonl/.json/.parquet file, a save_to_disk folder, or a Hugging Face dataset name "
        "(e.g. open-r1/OpenR1-Math-220k). With --preset or --sample, omitted; `ror run` with no input reads the embedded sample.",
        show_default=False,
    ),
]
PresetOption = Annotated[
    str | None,
    typer.Option("--preset", help="Column mapping of a public trace dataset: openr1-math, s1k-1.1, s1k, openthoughts.", rich_help_panel=_INPUT_PANEL),
]
SplitOption = Annotated[str | None, typer.Option("--split", help="Split of a Hugging Face dataset.", rich_help_panel=_INPUT_PANEL)]
SampleOption = Annotated[
    bool,
    typer.Option("--sample", help="Read the embedded sample: 40 MIT-licensed traces shipped with ror_annotate (offline).", rich_help_panel=_INPUT_PANEL),
]
TextFieldOption = Annotated[str | None, typer.Option("--text-field", help="Column holding the reasoning text (a string, or a list of generations).", rich_help_panel=_INPUT_PANEL)]
IdFieldOption = Annotated[str | None, typer.Option("--id-field", help="Column holding a stable trace id (default: trace_id/id/uuid, else a content hash).", rich_help_panel=_INPUT_PANEL)]
ProblemFieldOption = Annotated[str | None, typer.Option("--problem-field", help="Column holding the problem statement.", rich_help_panel=_INPUT_PANEL)]
AnswerFieldOption = Annotated[str | None, typer.Option("--answer-field", help="Column holding the model's final answer.", rich_help_panel=_INPUT_PANEL)]
GoldFieldOption = Annotated[str | None, typer.Option("--gold-field", help="Column holding the reference answer.", rich_help_panel=_INPUT_PANEL)]
ModelFieldOption = Annotated[str | None, typer.Option("--model-field", help="Column naming the model that wrote the trace.", rich_help_panel=_INPUT_PANEL)]
DatasetFieldOption = Annotated[str | None, typer.Option("--dataset-field", help="Column naming the source dataset/benchmark.", rich_help_panel=_INPUT_PANEL)]
SkipInvalidOption = Annotated[bool, typer.Option("--skip-invalid", help="Skip bad records (counted and reported) instead of stopping at the first.", rich_help_panel=_INPUT_PANEL)]
LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="Read at most this many traces.", rich_help_panel=_INPUT_PANEL)]
FormatOption = Annotated[
    str,
    typer.Option("--format", help="Reasoning format: auto (detect per record) or one of think, thinking, thought, harmony, mistral, seed, kimi, "
                 "openai-response, ollama-chat, chat, plain (see README 'Inputs').", rich_help_panel=_INPUT_PANEL),
]
AllowMarkersOption = Annotated[
    bool,
    typer.Option("--allow-markers", help="Store traces that still hold a known control token or thinking marker (counted) instead of refusing them.", rich_help_panel=_INPUT_PANEL),
]
TokenizerOption = Annotated[
    str | None,
    typer.Option("--tokenizer", help="Subject-model fast tokenizer (name or local path) for token counts and token alignment; default: a documented approximation."),
]
MaxTokensSegOption = Annotated[int, typer.Option("--max-segment-tokens", min=8, help="Hard cap on segment length in tokens.")]
WorkersOption = Annotated[int | None, typer.Option("--workers", min=1, help="Processes segmenting (in ror run also running the baseline's rules) in parallel (default: all cores; the segments and labels are the same for any number).")]
LabelWorkersOption = Annotated[int | None, typer.Option("--workers", min=1, help="Processes running the baseline judge's rules in parallel (default: all cores; the labels are the same for any number).")]
JudgeSpecOption = Annotated[str, typer.Option("--judge", help="baseline (offline cue-phrase rules) or openai:MODEL.")]
JudgeSpecsOption = Annotated[
    list[str] | None,
    typer.Option("--judge", help="baseline (offline cue-phrase rules) or openai:MODEL; repeat for several judges, each stored "
                 "as its own rater (default baseline)."),
]
JudgeBaseUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--base-url", envvar="OPENAI_BASE_URL",
        help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM or Ollama (env OPENAI_BASE_URL): once for every "
        "--judge, or once per --judge, paired by position. The key is read from OPENAI_API_KEY only; a local URL without a key "
        "gets a placeholder key.",
        rich_help_panel="LLM judge (--judge openai:MODEL)",
    ),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Re-segment traces whose stored segmentation differs, deleting their labels.")]


class _InfoColumn(ProgressColumn):
    """Free text a stage attaches to its task (``info=...``); tasks without it show nothing."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("info", "")), style="dim")


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), _InfoColumn(), console=err_console, transient=False,
    )


def _length_table(store, trace_ids: Sequence[str] | None = None) -> Table:
    from ..segment import METHOD_LENGTH_PROFILE, segment_stats

    stats = segment_stats(store.segment_lengths(trace_ids))
    table = Table(title="segment length (tokens)", show_header=True)
    table.add_column("statistic")
    table.add_column("ours", justify="right")
    table.add_column("method's corpus", justify="right")
    for key in ("n_segments", "n_traces", "segments_per_trace", "median", "p5", "p95", "max", "mean"):
        if key in stats:
            value = stats[key]
            reference = METHOD_LENGTH_PROFILE.get(key)
            ref_text = "" if reference is None else f"{reference:g}" + (" (cap)" if key == "max" else "")
            table.add_row(key, f"{value:.1f}" if isinstance(value, float) else str(value), ref_text)
    return table


def _label_table(store, trace_ids: Sequence[str] | None = None) -> Table:
    from ..records import BEHAVIORS

    per = store.label_counts(trace_ids)
    # One column per annotator, behaviors as rows: with eight columns of names an 80-column terminal
    # cut every annotator to "openai:…"; now names fold onto a second line instead.
    table = Table(title="labels", show_header=True)
    table.add_column("behavior")
    keys = sorted(per)
    for source, annotator in keys:
        table.add_column(f"{annotator} ({source})", justify="right", overflow="fold")
    for name in BEHAVIORS:
        table.add_row(name, *(str(per[k].get(name, 0)) for k in keys))
    table.add_row("total", *(str(sum(per[k].values())) for k in keys), style="bold")
    return table


def _print_skipped(reasons: Sequence[str], n_skipped: int) -> None:
    for reason in reasons:
        err_console.print(f"[yellow]skipped[/] {escape(reason)}", highlight=False)
    if n_skipped > len(reasons):
        err_console.print(f"[yellow]... and {n_skipped - len(reasons)} more skipped records[/]")


def _print_formats(formats: dict[str, int], notes: dict[str, int]) -> None:
    for note, n in notes.items():
        err_console.print(f"[yellow]note[/] {n} traces: {escape(note)}", highlight=False)
    if formats:
        err_console.print("formats: " + ", ".join(f"{name} {n}" for name, n in formats.items()), highlight=False)


# --------------------------------------------------------------------------- commands
@app.command()
def ingest(
    source: InputArg = "",
    preset: PresetOption = None,
    sample: SampleOption = False,
    split: SplitOption = None,
    text_field: TextFieldOption = None,
    id_field: IdFieldOption = None,
    problem_field: ProblemFieldOption = None,
    answer_field: AnswerFieldOption = None,
    gold_field: GoldFieldOption = None,
    model_field: ModelFieldOption = None,
    dataset_field: DatasetFieldOption = None,
    skip_invalid: SkipInvalidOption = False,
    limit: LimitOption = None,
    format: FormatOption = "auto",
    allow_markers: AllowMarkersOption = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Read traces into the store (validated first: a bad record stores nothing)."""
    from .. import pipeline

    columns = _columns(text_field, id_field, problem_field, answer_field, gold_field, model_field, dataset_field)
    source = resolve_source(source, preset, sample=sample, default_to_sample=False)
    pipeline.check_source(source, preset)  # a mistyped path must not create a store
    with open_store(db, lock_timeout) as store, _progress() as progress:
        summary = pipeline.ingest(
            store, source, preset=preset, split=split, columns=columns, skip_invalid=skip_invalid, limit=limit, format=format,
            allow_markers=allow_markers, progress=progress,
        )
    _print_skipped(summary.skipped_reasons, summary.skipped)
    _print_formats(summary.formats, summary.notes)
    console.print(f"traces: {summary.inserted} new, {summary.unchanged} already stored, {summary.skipped} skipped -> {store.path}")


@app.command()
def segment(
    tokenizer: TokenizerOption = None,
    max_segment_tokens: MaxTokensSegOption = MAX_SEGMENT_TOKENS,
    workers: WorkersOption = None,
    force: ForceOption = False,
    stats: Annotated[bool, typer.Option("--stats", help="Print the segment length profile (tokens) next to the method's reference figures.")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Split every stored trace into clause-level segments with exact character offsets."""
    from .. import pipeline

    with open_store(db, lock_timeout, must_exist=True) as store:
        with _progress() as progress:
            summary = pipeline.segment(store, tokenizer=tokenizer, max_tokens=max_segment_tokens, force=force, workers=workers, progress=progress)
        console.print(
            f"segments: {summary.segments} in {summary.traces} traces "
            f"({summary.inserted} new, {summary.unchanged} unchanged, {summary.replaced} re-segmented)"
        )
        if stats:
            console.print(_length_table(store))


@app.command()
def label(
    judge: JudgeSpecsOption = None,
    trace: Annotated[list[str] | None, typer.Option("--trace", help="Label only these trace ids (repeatable).")] = None,
    base_url: JudgeBaseUrlsOption = None,
    chunk_size: JudgeChunkSizeOption = None,
    mode: JudgeModeOption = None,
    concurrency: JudgeConcurrencyOption = None,
    temperature: JudgeTemperatureOption = None,
    seed: JudgeSeedOption = None,
    max_tokens: JudgeMaxTokensOption = None,
    samples: JudgeSamplesOption = None,
    batch: JudgeBatchOption = False,
    batch_id: JudgeBatchIdOption = None,
    prices: JudgePricesOption = None,
    max_attempts: JudgeMaxAttemptsOption = None,
    codebook: JudgeCodebookOption = None,
    context_tokens: JudgeContextTokensOption = None,
    retry_failed: JudgeRetryFailedOption = None,
    batch_poll: JudgeBatchPollOption = None,
    batch_requeue: JudgeBatchRequeueOption = None,
    timeout: JudgeTimeoutOption = None,
    max_failed: MaxFailedOption = "10%",
    workers: LabelWorkersOption = None,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Label every stored segment with one or several judges (the offline baseline by default), each its own rater."""
    from .. import pipeline

    specs, options = _judges_and_options(judge, base_url, locals())
    judges = pipeline.make_judges(specs, options)  # a bad spec or a missing key fails before the store opens
    failed_limit = _max_failed(max_failed)
    with open_store(db, lock_timeout, must_exist=True) as store:
        with _progress() as progress, _judge_counts_on_outcome_error():
            summary = pipeline.label(store, trace or None, judge=judges, judge_options=options, max_failed=failed_limit,
                                     workers=workers, progress=progress)
        console.print(_label_table(store, None if trace is None else list(trace)))
    _print_judge_counts(summary.counts())


@app.command()
def run(
    source: InputArg = "",
    preset: PresetOption = None,
    sample: SampleOption = False,
    split: SplitOption = None,
    text_field: TextFieldOption = None,
    id_field: IdFieldOption = None,
    problem_field: ProblemFieldOption = None,
    answer_field: AnswerFieldOption = None,
    gold_field: GoldFieldOption = None,
    model_field: ModelFieldOption = None,
    dataset_field: DatasetFieldOption = None,
    skip_invalid: SkipInvalidOption = False,
    limit: LimitOption = None,
    format: FormatOption = "auto",
    allow_markers: AllowMarkersOption = False,
    tokenizer: TokenizerOption = None,
    max_segment_tokens: MaxTokensSegOption = MAX_SEGMENT_TOKENS,
    workers: WorkersOption = None,
    judge: JudgeSpecsOption = None,
    base_url: JudgeBaseUrlsOption = None,
    chunk_size: JudgeChunkSizeOption = None,
    mode: JudgeModeOption = None,
    concurrency: JudgeConcurrencyOption = None,
    temperature: JudgeTemperatureOption = None,
    seed: JudgeSeedOption = None,
    max_tokens: JudgeMaxTokensOption = None,
    samples: JudgeSamplesOption = None,
    batch: JudgeBatchOption = False,
    batch_id: JudgeBatchIdOption = None,
    prices: JudgePricesOption = None,
    max_attempts: JudgeMaxAttemptsOption = None,
    codebook: JudgeCodebookOption = None,
    context_tokens: JudgeContextTokensOption = None,
    retry_failed: JudgeRetryFailedOption = None,
    batch_poll: JudgeBatchPollOption = None,
    batch_requeue: JudgeBatchRequeueOption = None,
    timeout: JudgeTimeoutOption = None,
    max_failed: MaxFailedOption = "10%",
    out: Annotated[Path | None, typer.Option("--out", help="Dataset folder (save_to_disk layout + parquet + card); default exports/<input name>.")] = None,
    labels: Annotated[str, typer.Option("--labels", help="Which labels to export: auto, judge, baseline, human, adjudicated, majority.")] = "auto",
    split_seed: Annotated[int, typer.Option("--split-seed", help="Seed of the by-trace train/validation/test split.")] = 0,
    split_fractions: Annotated[str, typer.Option("--split-fractions", help="train,validation,test fractions of traces (by trace, never splitting one).")] = "0.8,0.1,0.1",
    stratify_by: Annotated[str | None, typer.Option("--stratify-by", help="Stratify the split by dataset, model or source.")] = None,
    chat_template: Annotated[bool, typer.Option("--chat-template", help="With --tokenizer: align on the model's chat template rendering (problem as user turn, reasoning as thinking).")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """The main job: ingest -> segment -> label -> export, with a summary at the end (no input: the embedded sample)."""
    from .. import pipeline

    source = resolve_source(source, preset, sample=sample, default_to_sample=True)
    pipeline.check_source(source, preset)  # a mistyped path must not create a store
    fractions = parse_fractions(split_fractions, "--split-fractions")
    columns = _columns(text_field, id_field, problem_field, answer_field, gold_field, model_field, dataset_field)
    specs, options = _judges_and_options(judge, base_url, locals())
    judges = pipeline.make_judges(specs, options)
    failed_limit = _max_failed(max_failed)
    with open_store(db, lock_timeout) as store:
        with _progress() as progress, _judge_counts_on_outcome_error():
            summary = pipeline.run(
                store, source, preset=preset, split=split, columns=columns, skip_invalid=skip_invalid, limit=limit,
                format=format, allow_markers=allow_markers, tokenizer=tokenizer, max_segment_tokens=max_segment_tokens, workers=workers,
                judge=judges, judge_options=options,
                out=out, labels=labels, split_seed=split_seed, split_fractions=fractions, stratify_by=stratify_by,
                chat_template=chat_template, license=card_license(source), source_licenses=source_licenses(source),
                max_failed=failed_limit, progress=progress,
            )
        _print_skipped(summary.ingest.skipped_reasons, summary.ingest.skipped)
        _print_formats(summary.ingest.formats, summary.ingest.notes)
        _print_summary(store, summary)
    _print_judge_counts(summary.label.counts())


# --------------------------------------------------------------------------- helpers
def _judge_options_of(values: dict[str, Any]) -> dict[str, Any]:
    """The judge options among a command's parameters (same names as in judge_options.py)."""
    return judge_options(**{name: values[name] for name in JUDGE_OPTION_NAMES})


def _judges_and_options(
    judge: list[str] | None, base_url: list[str] | None, values: dict[str, Any]
) -> tuple[list[str], dict[str, Any] | list[dict[str, Any]]]:
    """The ``--judge`` specs and their options: one dict for all, or one per judge when ``--base-url`` is paired.

    Raises
    ------
    UsageError
        E133: ``--base-url`` given neither once nor once per ``--judge`` (before any store opens).
    """
    from ..errors import UsageError

    specs = list(judge or ["baseline"])
    urls = list(base_url or [])
    shared = _judge_options_of({**values, "base_url": None})
    if len(urls) <= 1:
        return specs, {**shared, **({"base_url": urls[0]} if urls else {})}
    if len(urls) != len(specs):
        raise UsageError(
            f"{len(urls)} --base-url for {len(specs)} --judge: give --base-url once (for every judge) or once per --judge, "
            "paired by position", code="E133",
        )
    return specs, [{**({} if s.partition(":")[0] == "baseline" else shared), "base_url": u} for s, u in zip(specs, urls)]


def _columns(text, id_, problem, answer, gold, model, dataset) -> dict[str, str]:
    given = {"text": text, "trace_id": id_, "problem": problem, "answer": answer, "gold_answer": gold, "model": model, "dataset": dataset}
    return {k: v for k, v in given.items() if v is not None}


def _print_summary(store, summary) -> None:
    ids = summary.ingest.trace_ids
    # the export's profile covers the same segments, computed while streaming (no second pass over the store)
    stats = summary.export.segment_length
    table = Table(title="ror run: summary", show_header=False)
    table.add_column("what")
    table.add_column("value", overflow="fold")  # a long path folds onto the next line, never cut to "…"
    table.add_row("input traces", f"{len(ids)} ({summary.ingest.inserted} new, {summary.ingest.skipped} skipped as invalid)")
    if stats:
        table.add_row("segment tokens median / p5 / p95 / max", f"{stats['median']:g} / {stats['p5']:g} / {stats['p95']:g} / {stats['max']:g}")
    for field, value in summary.export.table_rows():
        table.add_row(field, value)
    console.print(table)


def _max_failed(value: str):
    """``--max-failed`` parsed before any work (a ConfigError for a bad value)."""
    from ..judge import MaxFailed

    return MaxFailed.parse(value)


@contextmanager
def _judge_counts_on_outcome_error() -> Iterator[None]:
    """Show the judge's counts before the one-line E506 error (exit status 3) when it labelled too little."""
    try:
        yield
    except JudgeOutcomeError as exc:
        if exc.counts:
            _print_judge_counts(exc.counts)
        raise


def _print_judge_counts(counts: dict[str, Any]) -> None:
    per_judge = counts.get("judges")
    if isinstance(per_judge, dict) and per_judge:  # several judges: one line each
        for name, one in per_judge.items():
            console.print(f"{name}:", highlight=False, end=" ")
            _print_judge_counts(one)
        return
    shown = {k: ({c: n for c, n in v.items() if n} if isinstance(v, dict) else v) for k, v in counts.items()
             if k not in ("failure_example", "usage_unknown_example", "ledger")}
    shown = {k: v for k, v in shown.items() if v not in (0, 0.0, None, {}, [])}
    if shown:
        console.print("judge: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), highlight=False)
    if counts.get("failed"):
        err_console.print(
            f"[yellow]warning[/]: {counts['failed']} segments are stored as judge-failed (no label; the reason of each is in the "
            "judge_failures table). Running the same command again asks the judge for them again, with up to --max-attempts "
            "new tries each (never replaying the failed answers); --no-retry-failed leaves them failed",
            highlight=False,
        )
    if counts.get("usage_unknown_requests"):
        err_console.print(
            f"[yellow]warning[/]: {counts['usage_unknown_requests']} responses carried no usable token usage "
            f"({escape(str(counts.get('usage_unknown_example', 'missing')))}); they are stored as unknown (NULL in judge_cache), "
            "so the tokens and cost shown are a lower bound",
            highlight=False,
        )
    if counts.get("failed_kept"):
        err_console.print(
            f"[yellow]warning[/]: {counts['failed_kept']} segments stay judge-failed from earlier runs (--no-retry-failed)",
            highlight=False,
        )


@app.command()
def status(db: DbOption = DEFAULT_DB_PATH, lock_timeout: LockTimeoutOption = 10.0) -> None:
    """What the store holds: traces, segments, labels per annotator, recent runs, and a running job's progress.

    Opens the store read-only (works on read-only media). While another `ror` process writes the
    store (DuckDB then refuses even a read-only open), shows that job's progress instead.
    """
    from ..errors import StoreLockedError
    from ..store import ProgressFile

    try:
        store = open_store(db, min(lock_timeout, 1.0), must_exist=True, read_only=True)
    except StoreLockedError as locked:
        state = ProgressFile.read(db)
        if state is None:
            raise
        where = Path(db).expanduser().resolve()
        _check_progress_shape(state, where)
        if not _is_live(state):
            # the progress file is a finished (or killed) run's: the job holding the lock now has not
            # written its own yet
            console.print(
                f"{where}: locked by a running job that has not reported its progress yet ({locked.message.split(': ', 1)[0]}); "
                f"the last progress written was {state.get('command', '?')} {state.get('run_id', '')} "
                f"({'ended ' + str(state.get('status')) if state.get('status') != 'running' else 'its process is gone'})",
                markup=False, highlight=False,
            )
            return
        console.print(f"{where}: locked by a running job; its progress:", markup=False, highlight=False)
        console.print(_progress_table(state))
        return
    with store:
        counts = store.counts()
        console.print(f"{store.path}: {counts['traces']} traces, {counts['segments']} segments, {counts['labels']} labels, {counts['runs']} runs")
        if counts["labels"]:
            console.print(_label_table(store))
        runs = store.runs()[-10:]
        if runs:
            table = Table(title="recent runs (a run id holds its UTC start time)")
            table.add_column("run", no_wrap=True)
            table.add_column("command")
            table.add_column("status")
            table.add_column("counts", overflow="fold", ratio=1)
            for r in runs:
                table.add_row(r.run_id, r.command, _run_status(r.status), _compact_counts(r.counts))
            console.print(table)


#: Code of a progress file (``<db>.progress.json``) that is not the shape ror writes.
BAD_PROGRESS_FILE = "E204"


def _check_progress_shape(state: Any, where: Path) -> None:
    """Raise ``StoreError`` (``E204``) unless ``state`` is a progress file as :class:`ProgressFile` writes it."""
    from ..errors import StoreError

    stages = state.get("stages") if isinstance(state, dict) else None
    ok = isinstance(state, dict) and isinstance(stages, dict) and all(
        isinstance(v, dict) and all(isinstance(v.get(k, 0), (int, float)) or v.get(k) is None for k in ("done", "total"))
        for v in stages.values()
    )
    if not ok:
        raise StoreError(
            f"{where}.progress.json is not a ror progress file (expected an object with a 'stages' object of "
            f"{{'done', 'total', 'info'}} entries, got {type(state).__name__}); delete it, the next command rewrites it",
            code=BAD_PROGRESS_FILE,
        )


def _is_live(state: dict[str, Any]) -> bool:
    """Whether the progress file describes a job that is still running (status and a live process)."""
    import os

    if state.get("status") != "running":
        return False
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True  # cannot tell: show it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _progress_table(state: dict[str, Any]) -> Table:
    from rich.text import Text

    # Everything comes from a file: printed as text, never as Rich markup.
    table = Table(title=Text(f"{state.get('command', '?')} {state.get('run_id', '')} (pid {state.get('pid', '?')}, updated {state.get('updated_at', '?')})"))
    table.add_column("stage", overflow="fold")
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("info", overflow="fold")
    for stage, info in (state.get("stages") or {}).items():
        table.add_row(
            Text(str(stage)), str(info.get("done", "")), "" if info.get("total") is None else str(info["total"]), Text(str(info.get("info", ""))),
        )
    table.caption = Text(f"status: {state.get('status', '?')}")
    return table


def _run_status(status: str) -> str:
    # The store opened, so no other process holds it: a run still marked "running" lost its process
    # (kill -9, power loss, out of memory).
    return "abandoned" if status == "running" else status


def _compact_counts(counts: dict[str, Any], limit: int = 160) -> str:
    """``a=1 b.c=2 ...``: nested counts flattened, zeros and empties left out, cut at ``limit`` characters."""
    parts: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        elif value not in (0, 0.0, None, "", [], False):
            parts.append(f"{prefix[:-1]}={value:.4g}" if isinstance(value, float) else f"{prefix[:-1]}={value}")

    walk("", counts)
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"
