"""The spine's commands: ``ror ingest``, ``ror segment``, ``ror label``, ``ror run``, ``ror status``."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..errors import InputError, JudgeOutcomeError
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, err_console, open_store, parse_fractions
from .judge_options import (
    JudgeBaseUrlOption,
    JudgeBatchIdOption,
    JudgeBatchOption,
    JudgeBatchPollOption,
    JudgeBatchRequeueOption,
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
        "(e.g. open-r1/OpenR1-Math-220k). With --preset, may be omitted.",
        show_default=False,
    ),
]
PresetOption = Annotated[
    str | None,
    typer.Option("--preset", help="Column mapping of a public trace dataset: openr1-math, s1k-1.1, s1k, openthoughts.", rich_help_panel=_INPUT_PANEL),
]
SplitOption = Annotated[str | None, typer.Option("--split", help="Split of a Hugging Face dataset.", rich_help_panel=_INPUT_PANEL)]
TextFieldOption = Annotated[str | None, typer.Option("--text-field", help="Column holding the reasoning text (a string, or a list of generations).", rich_help_panel=_INPUT_PANEL)]
IdFieldOption = Annotated[str | None, typer.Option("--id-field", help="Column holding a stable trace id (default: trace_id/id/uuid, else a content hash).", rich_help_panel=_INPUT_PANEL)]
ProblemFieldOption = Annotated[str | None, typer.Option("--problem-field", help="Column holding the problem statement.", rich_help_panel=_INPUT_PANEL)]
AnswerFieldOption = Annotated[str | None, typer.Option("--answer-field", help="Column holding the model's final answer.", rich_help_panel=_INPUT_PANEL)]
GoldFieldOption = Annotated[str | None, typer.Option("--gold-field", help="Column holding the reference answer.", rich_help_panel=_INPUT_PANEL)]
ModelFieldOption = Annotated[str | None, typer.Option("--model-field", help="Column naming the model that wrote the trace.", rich_help_panel=_INPUT_PANEL)]
DatasetFieldOption = Annotated[str | None, typer.Option("--dataset-field", help="Column naming the source dataset/benchmark.", rich_help_panel=_INPUT_PANEL)]
SkipInvalidOption = Annotated[bool, typer.Option("--skip-invalid", help="Skip bad records (counted and reported) instead of stopping at the first.", rich_help_panel=_INPUT_PANEL)]
LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="Read at most this many traces.", rich_help_panel=_INPUT_PANEL)]
TokenizerOption = Annotated[
    str | None,
    typer.Option("--tokenizer", help="Subject-model fast tokenizer (name or local path) for token counts and token alignment; default: a documented approximation."),
]
MaxTokensSegOption = Annotated[int, typer.Option("--max-segment-tokens", min=8, help="Hard cap on segment length in tokens.")]
JudgeSpecOption = Annotated[str, typer.Option("--judge", help="baseline (offline cue-phrase rules) or openai:MODEL.")]
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


@contextmanager
def _tracked_run(store, command: str, parameters: dict[str, Any]) -> Iterator[Any]:
    """Record a run in the store: ``ok`` on success, ``failed``/``interrupted`` otherwise."""
    run = store.start_run(command, parameters)
    counts: dict[str, Any] = {}
    try:
        yield run, counts
    except KeyboardInterrupt:
        store.finish_run(run.run_id, status="interrupted", counts=counts)
        raise
    except BaseException:
        store.finish_run(run.run_id, status="failed", counts=counts)
        raise
    store.finish_run(run.run_id, status="ok", counts=counts)


# --------------------------------------------------------------------------- stages as functions
def _mapping(preset: str | None, columns: dict[str, str]):
    from ..traces import PRESETS, ColumnMap

    if not columns:
        return None
    base = PRESETS[preset].columns.model_dump() if preset in PRESETS else {}
    base.update(columns)
    return ColumnMap(**base)


def do_ingest(
    store, source: str, *, preset: str | None, split: str | None, columns: dict[str, str], skip_invalid: bool, limit: int | None, run_id: str
) -> tuple[dict[str, int], list[str]]:
    """Read, validate and store traces; nothing is stored unless the whole input validates.

    Returns the counts and the trace ids of this input, in input order.
    """
    from ..traces import load_traces

    mapping = _mapping(preset, columns)
    with err_console.status(f"reading {source or preset} ..."):
        result = load_traces(source, columns=mapping, preset=preset, split=split, skip_invalid=skip_invalid, limit=limit)
    for skipped in result.skipped[:20]:
        err_console.print(f"[yellow]skipped[/] {skipped.reason}", highlight=False)
    if len(result.skipped) > 20:
        err_console.print(f"[yellow]... and {len(result.skipped) - 20} more skipped records[/]")
    counts = store.upsert_traces(result.traces, run_id=run_id)
    counts["skipped"] = len(result.skipped)
    counts["read"] = len(result.traces)
    return counts, [t.trace_id for t in result.traces]


def do_segment(store, trace_ids: Sequence[str], *, tokenizer: str | None, max_tokens: int, force: bool, run_id: str, progress: Progress | None) -> dict[str, int]:
    """Segment traces and store their segments (idempotent; one transaction per trace).

    A trace already segmented by the same versioned rule set, cap and token counter is skipped
    without re-running the segmenter (re-runs of the main job cost no segmentation); ``force``
    re-segments everything.
    """
    from ..segment import Segmenter, make_token_counter

    segmenter = Segmenter(max_tokens=max_tokens, token_counter=make_token_counter(tokenizer))
    segmenter_id = f"{segmenter.name}:max{max_tokens}"
    counter_name = segmenter.token_counter.name
    done = store.segmentations()
    outcome: Counter[str] = Counter()
    task = progress.add_task("segment", total=len(trace_ids), info="") if progress else None
    for trace in store.iter_traces(trace_ids):
        prior = done.get(trace.trace_id)
        if not force and prior is not None and prior[:2] == (segmenter_id, counter_name):
            outcome["unchanged"] += 1
            outcome["segments"] += prior[2]
        else:
            segments = segmenter.segment(trace.text, trace.trace_id)
            status = store.replace_segments(
                trace.trace_id, segments, segmenter=segmenter_id, token_counter=counter_name, run_id=run_id, force=force
            )
            outcome[status] += 1
            outcome["segments"] += len(segments)
        if progress is not None and task is not None:
            progress.update(task, advance=1, info=f"{outcome['segments']} segments")
    return dict(outcome)


def make_judge_checked(judge_spec: str, options: dict[str, Any]):
    """Build the judge before any work, so a bad spec or a missing API key fails first (ConfigError)."""
    from ..judge import make_judge

    return make_judge(judge_spec, **options)


def do_label(store, trace_ids: Sequence[str], *, judge, run, progress: Progress | None) -> dict[str, Any]:
    """Label every stored segment of ``trace_ids`` with ``judge`` (from :func:`make_judge_checked`)."""
    report = judge.label(store, list(trace_ids), run=run, progress=progress)
    return report.as_counts()


def _length_table(store, trace_ids: Sequence[str] | None = None) -> Table:
    from ..segment import segment_stats

    segments = store.segments()
    if trace_ids is not None:
        wanted = set(trace_ids)
        segments = [s for s in segments if s.trace_id in wanted]
    stats = segment_stats(segments)
    table = Table(title="segment length (tokens)", show_header=True)
    table.add_column("statistic")
    table.add_column("ours", justify="right")
    table.add_column("method's corpus", justify="right")
    reference = {"segments_per_trace": "239", "median": "16", "p5": "3", "p95": "47", "max": "125 (cap)"}
    for key in ("n_segments", "n_traces", "segments_per_trace", "median", "p5", "p95", "max", "mean"):
        if key in stats:
            value = stats[key]
            table.add_row(key, f"{value:.1f}" if isinstance(value, float) else str(value), reference.get(key, ""))
    return table


def _label_table(store, trace_ids: Sequence[str] | None = None) -> Table:
    from ..records import BEHAVIORS

    # Counted in SQL: loading every label as a record made `ror status` take seconds per 100k labels.
    sql = "SELECT source, annotator, label, count(*) FROM labels"
    params: list[Any] = []
    if trace_ids is not None:
        sql += " WHERE list_contains(?, trace_id)"
        params.append(list(trace_ids))
    per: dict[tuple[str, str], Counter[str]] = {}
    for source, annotator, name, n in store.execute(sql + " GROUP BY ALL", params).fetchall():
        per.setdefault((source, annotator), Counter())[name] = int(n)
    # One column per annotator, behaviors as rows: with eight columns of names an 80-column terminal
    # cut every annotator to "openai:…"; now names fold onto a second line instead.
    table = Table(title="labels", show_header=True)
    table.add_column("behavior")
    keys = sorted(per)
    for source, annotator in keys:
        table.add_column(f"{annotator} ({source})", justify="right", overflow="fold")
    for name in BEHAVIORS:
        table.add_row(name, *(str(per[k][name]) for k in keys))
    table.add_row("total", *(str(sum(per[k].values())) for k in keys), style="bold")
    return table


# --------------------------------------------------------------------------- commands
@app.command()
def ingest(
    source: InputArg = "",
    preset: PresetOption = None,
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
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Read traces into the store (validated first: a bad record stores nothing)."""
    columns = _columns(text_field, id_field, problem_field, answer_field, gold_field, model_field, dataset_field)
    _require_source(source, preset)
    with open_store(db, lock_timeout) as store, _tracked_run(store, "ingest", {"source": source, "preset": preset, "split": split, **columns}) as (run, counts):
        counts.update(do_ingest(store, source, preset=preset, split=split, columns=columns, skip_invalid=skip_invalid, limit=limit, run_id=run.run_id)[0])
        console.print(f"traces: {counts['inserted']} new, {counts['unchanged']} already stored, {counts['skipped']} skipped -> {store.path}")


@app.command()
def segment(
    tokenizer: TokenizerOption = None,
    max_segment_tokens: MaxTokensSegOption = 125,
    force: ForceOption = False,
    stats: Annotated[bool, typer.Option("--stats", help="Print the segment length profile (tokens) next to the method's reference figures.")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Split every stored trace into clause-level segments with exact character offsets."""
    with open_store(db, lock_timeout, must_exist=True) as store:
        ids = store.trace_ids()
        if not ids:
            raise InputError(f"no traces in {store.path}; run `ror ingest FILE` first")
        with _tracked_run(store, "segment", {"tokenizer": tokenizer, "max_segment_tokens": max_segment_tokens}) as (run, counts), _progress() as progress:
            counts.update(do_segment(store, ids, tokenizer=tokenizer, max_tokens=max_segment_tokens, force=force, run_id=run.run_id, progress=progress))
        console.print(
            f"segments: {counts.get('segments', 0)} in {len(ids)} traces "
            f"({counts.get('inserted', 0)} new, {counts.get('unchanged', 0)} unchanged, {counts.get('replaced', 0)} re-segmented)"
        )
        if stats:
            console.print(_length_table(store))


@app.command()
def label(
    judge: JudgeSpecOption = "baseline",
    trace: Annotated[list[str] | None, typer.Option("--trace", help="Label only these trace ids (repeatable).")] = None,
    base_url: JudgeBaseUrlOption = None,
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
    max_failed: MaxFailedOption = "10%",
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Label every stored segment with a judge (the offline baseline by default)."""
    options = _judge_options_of(locals())
    the_judge = make_judge_checked(judge, options)
    _max_failed(max_failed)
    with open_store(db, lock_timeout, must_exist=True) as store:
        ids = trace or [t for t in store.trace_ids() if store.segmentation_of(t) is not None]
        if trace:
            unknown = sorted(set(trace) - set(store.trace_ids()))
            if unknown:
                raise InputError(f"--trace: no trace {', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''} in {store.path}; see `ror status`")
        if not ids:
            raise InputError(f"no segmented traces in {store.path}; run `ror ingest FILE` and `ror segment` first")
        with _tracked_run(store, "label", {"judge": judge, **options, "max_failed": max_failed}) as (run, counts):
            with _progress() as progress:
                counts.update(do_label(store, ids, judge=the_judge, run=run, progress=progress))
            _check_label_outcome(counts, max_failed)
        console.print(_label_table(store, ids))
        _print_judge_counts(counts)


@app.command()
def run(
    source: InputArg = "",
    preset: PresetOption = None,
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
    tokenizer: TokenizerOption = None,
    max_segment_tokens: MaxTokensSegOption = 125,
    judge: JudgeSpecOption = "baseline",
    base_url: JudgeBaseUrlOption = None,
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
    """The main job: ingest -> segment -> label -> export, with a summary at the end."""
    from ..export import export_dataset

    _require_source(source, preset)
    fractions = parse_fractions(split_fractions, "--split-fractions")
    columns = _columns(text_field, id_field, problem_field, answer_field, gold_field, model_field, dataset_field)
    options = _judge_options_of(locals())
    the_judge = make_judge_checked(judge, options)
    _max_failed(max_failed)
    out = out or Path("exports") / _dataset_name(source, preset)
    params = {"source": source, "preset": preset, "split": split, **columns, "tokenizer": tokenizer, "judge": judge, **options,
              "max_failed": max_failed, "out": str(out), "labels": labels}
    with open_store(db, lock_timeout) as store:
        with _tracked_run(store, "run", params) as (run_rec, counts):
            ingested, ids = do_ingest(store, source, preset=preset, split=split, columns=columns, skip_invalid=skip_invalid, limit=limit, run_id=run_rec.run_id)
            counts["ingest"] = ingested
            with _progress() as progress:
                counts["segment"] = do_segment(store, ids, tokenizer=tokenizer, max_tokens=max_segment_tokens, force=False, run_id=run_rec.run_id, progress=progress)
                counts["label"] = do_label(store, ids, judge=the_judge, run=run_rec, progress=progress)
            _check_label_outcome(counts["label"], max_failed)  # before export: never an all-unlabelled dataset
            with err_console.status(f"exporting to {out} ..."):
                summary = export_dataset(
                    store, out, label_source=labels, tokenizer=tokenizer, chat_template=chat_template, seed=split_seed,
                    split_fractions=fractions, stratify_by=stratify_by, trace_ids=ids,
                )
            counts["export"] = {"out_dir": str(out)}
        _print_summary(store, ids, ingested, summary)
        _print_judge_counts(counts["label"])


# --------------------------------------------------------------------------- helpers
def _judge_options_of(values: dict[str, Any]) -> dict[str, Any]:
    """The judge options among a command's parameters (same names as in judge_options.py)."""
    return judge_options(**{name: values[name] for name in JUDGE_OPTION_NAMES})


def _columns(text, id_, problem, answer, gold, model, dataset) -> dict[str, str]:
    given = {"text": text, "trace_id": id_, "problem": problem, "answer": answer, "gold_answer": gold, "model": model, "dataset": dataset}
    return {k: v for k, v in given.items() if v is not None}


def _require_source(source: str, preset: str | None) -> None:
    if not source and not preset:
        raise InputError("no input: give a traces file or dataset name (ror run FILE), or --preset NAME")


def _dataset_name(source: str, preset: str | None) -> str:
    if preset and not source:
        return preset
    name = Path(source).name if source else "dataset"
    for suffix in (".jsonl", ".ndjson", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name.replace("/", "__") or "dataset"


def _print_summary(store, ids: Sequence[str], ingested: dict[str, int], summary) -> None:
    wanted = set(ids)
    lengths = [s.n_tokens for s in store.segments() if s.trace_id in wanted]
    table = Table(title="ror run: summary", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("input traces", f"{len(ids)} ({ingested.get('inserted', 0)} new, {ingested.get('skipped', 0)} skipped as invalid)")
    if lengths:
        q = statistics.quantiles(lengths, n=20, method="inclusive") if len(lengths) > 1 else [lengths[0]] * 19
        table.add_row("segment tokens median / p5 / p95 / max", f"{statistics.median(lengths):g} / {q[0]:g} / {q[18]:g} / {max(lengths)}")
    for field, value in summary.table_rows():
        table.add_row(field, value)
    console.print(table)


def _max_failed(value: str):
    """``--max-failed`` parsed before any work (a ConfigError for a bad value)."""
    from ..judge import MaxFailed

    return MaxFailed.parse(value)


def _check_label_outcome(counts: dict[str, Any], max_failed: str) -> None:
    """Exit status 3 (E506) when the judge labelled nothing or too little; the counts are shown first."""
    from ..judge import check_label_outcome

    try:
        check_label_outcome(counts, max_failed=max_failed)
    except JudgeOutcomeError:
        _print_judge_counts(counts)
        raise


def _print_judge_counts(counts: dict[str, Any]) -> None:
    shown = {k: ({c: n for c, n in v.items() if n} if isinstance(v, dict) else v) for k, v in counts.items() if k != "failure_example"}
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
    if counts.get("failed_kept"):
        err_console.print(
            f"[yellow]warning[/]: {counts['failed_kept']} segments stay judge-failed from earlier runs (--no-retry-failed)",
            highlight=False,
        )


@app.command()
def status(db: DbOption = DEFAULT_DB_PATH, lock_timeout: LockTimeoutOption = 10.0) -> None:
    """What the store holds: traces, segments, labels per annotator, recent runs."""
    with open_store(db, lock_timeout, must_exist=True) as store:
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


def _run_status(status: str) -> str:
    # This command holds the store's write lock, so no other process can be running: a run still
    # marked "running" lost its process (kill -9, power loss, out of memory).
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
