"""Traces in: JSONL, JSON arrays, parquet and Hugging Face datasets, to :class:`~ror_annotate.records.Trace`.

Every input goes through the same steps: read rows (with file and line numbers), map columns
(a :class:`ColumnMap`, from the user, a preset, or the default candidate names), extract the
reasoning part of the text (``<think>...</think>`` and its common variants), give each trace a
stable id, and validate. Bad rows raise :class:`~ror_annotate.errors.InputError` naming the file
and line, or are counted and reported with ``skip_invalid=True``. Nothing is written anywhere here;
ingestion into the store happens only after the whole input has been read and validated.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError, InputError
from .hub import OFFLINE_HINT, check_hub
from .records import Trace, sha256_text

# Default candidate column names, tried in order when no mapping is given.
_CANDIDATES: dict[str, tuple[str, ...]] = {
    "text": ("trace", "reasoning", "reasoning_content", "thinking", "thinking_trajectory", "cot", "response", "generation", "completion", "output", "text"),
    "trace_id": ("trace_id", "id", "uuid", "idx"),
    "problem": ("problem", "question", "prompt", "input"),
    "answer": ("answer", "final_answer", "attempt", "solution_text"),
    "gold_answer": ("gold_answer", "reference_answer", "ground_truth", "gt_answer"),
    "correct": ("correct", "is_correct", "correctness"),
    "model": ("model", "model_name", "generator"),
    "source": ("source_repo", "source"),
    "dataset": ("dataset", "benchmark", "subset", "domain"),
}


class ColumnMap(BaseModel):
    """Which input column holds which trace field. ``None`` means "try the default candidates".

    ``text`` may name a list-valued column (several generations per problem); each element
    then becomes its own trace, with ``correct`` taken from the same position of a list-valued
    ``correct`` column.
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    trace_id: str | None = None
    problem: str | None = None
    answer: str | None = None
    gold_answer: str | None = None
    correct: str | None = None
    model: str | None = None
    source: str | None = None
    dataset: str | None = None
    #: Fixed values for fields with no column (e.g. the model that wrote a preset's traces).
    constants: dict[str, Any] = {}
    #: Tag pair that wraps the reasoning when it is not ``<think>``/``</think>``.
    think_tags: tuple[str, str] | None = None


@dataclass(frozen=True)
class Preset:
    """Column mapping of a popular public trace dataset, taken from its dataset card."""

    name: str
    hub_id: str
    description: str
    columns: ColumnMap
    config: str | None = None
    default_split: str = "train"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="openr1-math",
            hub_id="open-r1/OpenR1-Math-220k",
            description="DeepSeek-R1 solutions to NuminaMath 1.5 problems; several generations per problem, each with <think> tags.",
            columns=ColumnMap(
                text="generations", trace_id="uuid", problem="problem", gold_answer="answer",
                correct="correctness_math_verify", dataset="source", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
            config="default",
        ),
        Preset(
            name="s1k-1.1",
            hub_id="simplescaling/s1K-1.1",
            description="s1K-1.1: 1,000 hard problems with DeepSeek-R1 thinking trajectories and attempts.",
            columns=ColumnMap(
                text="deepseek_thinking_trajectory", problem="question", answer="deepseek_attempt",
                gold_answer="solution", dataset="source_type", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
        ),
        Preset(
            name="s1k",
            hub_id="simplescaling/s1K",
            description="s1K: 1,000 problems with Gemini Flash Thinking trajectories (list column) and attempts.",
            columns=ColumnMap(
                text="thinking_trajectories", problem="question", answer="attempt", gold_answer="solution",
                dataset="source_type", constants={"model": "gemini-2.0-flash-thinking-exp"},
            ),
        ),
        Preset(
            name="openthoughts",
            hub_id="open-thoughts/OpenThoughts-114k",
            description="OpenThoughts-114k 'metadata' config: DeepSeek-R1 reasoning and solutions for math, code, science and puzzles.",
            columns=ColumnMap(
                text="deepseek_reasoning", problem="problem", answer="deepseek_solution",
                gold_answer="ground_truth_solution", dataset="domain", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
            config="metadata",
        ),
    )
}


@dataclass
class SkippedRecord:
    """A record left out with ``skip_invalid=True``: where it was and why."""

    where: str
    reason: str


@dataclass
class LoadResult:
    """The traces read from one input, plus what was skipped (only with ``skip_invalid``)."""

    traces: list[Trace]
    skipped: list[SkippedRecord] = field(default_factory=list)
    source: str = ""


# --------------------------------------------------------------------------- think extraction
_BOXED = re.compile(r"\\boxed\{")
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
)
_SOLUTION_TAGS = ("<|begin_of_solution|>", "<|end_of_solution|>")


def split_reasoning(text: str, tags: tuple[str, str] | None = None) -> tuple[str, str | None, bool]:
    """Split a model output into (reasoning, final answer, had_tags).

    Handles ``<think>R</think>A``, a missing opening tag (``R</think>A``: chat templates of
    DeepSeek-R1 and Qwen3 put ``<think>`` in the prompt), a missing closing tag (truncated
    generation: everything after ``<think>`` is reasoning, no answer), and the
    ``<|begin_of_thought|>`` tags of OpenThoughts/Bespoke. Text without tags is all reasoning.
    Returned strings are stripped of surrounding whitespace; the answer is None when empty.
    """
    pairs = (tags,) if tags else THINK_TAGS
    for open_tag, close_tag in pairs:
        has_open, has_close = open_tag in text, close_tag in text
        if not (has_open or has_close):
            continue
        if has_close:
            head, _, tail = text.partition(close_tag)
            reasoning = head.split(open_tag, 1)[1] if open_tag in head else head
        else:
            reasoning, tail = text.split(open_tag, 1)[1], ""
        answer = tail
        for tag in _SOLUTION_TAGS:
            answer = answer.replace(tag, "")
        answer = answer.strip()
        return reasoning.strip(), (answer or None), True
    return text.strip(), None, False


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` in ``text`` (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


# --------------------------------------------------------------------------- readers
def _iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: Windows tools (Notepad, PowerShell) start files with a BOM.
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                yield where, InputError(f"{where}: byte {exc.start} is not valid UTF-8 ({raw[exc.start:exc.start + 1]!r}); re-encode the file as UTF-8")
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, InputError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}")
                continue
            if not isinstance(obj, dict):
                yield where, InputError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
                continue
            yield where, obj


def _iter_json_array(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: byte {exc.start} is not valid UTF-8; re-encode the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON at column {exc.colno}: {exc.msg}") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise InputError(f"{path}: expected a JSON array of trace objects (or an object holding exactly one such array)")
        data = lists[0]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of trace objects, got {type(data).__name__}")
    for i, obj in enumerate(data):
        where = f"{path}[{i}]"
        yield where, obj if isinstance(obj, dict) else InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise InputError(f"{path}: not a readable parquet file ({exc})") from None
    row = 0
    for batch in pf.iter_batches(batch_size=2048):
        for obj in batch.to_pylist():
            yield f"{path} row {row}", obj
            row += 1


def _iter_hf(name: str, split: str | None, config: str | None, streaming: bool = False) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    import datasets

    if not Path(name).exists():
        check_hub(name)  # fail in seconds with a hint, not after the libraries' retries
    try:
        local = Path(name)
        if local.is_dir() and ((local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(name)
        else:
            # Streaming when only the first rows are wanted: OpenR1-Math is gigabytes.
            ds = datasets.load_dataset(name, config, split=split or "train", streaming=streaming)
    except FileNotFoundError as exc:
        raise InputError(f"{name}: no such file, directory or Hugging Face dataset ({exc})") from None
    except Exception as exc:  # network errors, missing configs, gated datasets...
        hint = ("A local directory must be written by save_to_disk or hold .jsonl/.json/.parquet files"
                if Path(name).is_dir() else OFFLINE_HINT[0].upper() + OFFLINE_HINT[1:])
        raise InputError(
            f"{name}: could not load it with datasets.load_dataset (split={split!r}, config={config!r}): {exc}. {hint}."
        ) from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is None:
            raise InputError(f"{name}: has splits {list(ds)}; choose one with --split")
        ds = ds[split]
    for i, obj in enumerate(ds):
        yield f"{name}[{split or 'train'}] row {i}", obj


_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".gz", ".csv", ".tsv", ".txt")


def iter_records(
    source: str | Path, *, split: str | None = None, config: str | None = None, streaming: bool = False
) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    """Yield ``(where, record_or_error)`` from a file or a Hugging Face dataset name.

    ``where`` names the file and line (or row) for error messages. Format by extension:
    ``.jsonl``/``.ndjson``, ``.json`` (array), ``.parquet``; a directory written by
    ``save_to_disk``; anything else that is not a file is a Hugging Face dataset name.
    """
    path = Path(source)
    if path.is_file():
        suffix = "".join(path.suffixes[-2:]).lower() if path.suffix.lower() == ".gz" else path.suffix.lower()
        if suffix in (".jsonl", ".ndjson"):
            return _iter_jsonl(path)
        if suffix == ".json":
            with path.open("rb") as fh:  # sniff the first megabyte only: .json files can be gigabytes
                head = fh.read(1_000_000)
            start = head.removeprefix(b"\xef\xbb\xbf").lstrip()
            return _iter_jsonl(path) if start.startswith(b"{") and b"\n{" in head else _iter_json_array(path)
        if suffix == ".parquet":
            return _iter_parquet(path)
        raise InputError(f"{path}: unknown trace file type {path.suffix!r}; use .jsonl, .json or .parquet")
    if path.exists() and path.is_dir() and not any(path.iterdir()):
        raise InputError(f"{path}: empty directory")
    # a missing local file would otherwise be tried as a hub dataset name (a network wait, then a hub error)
    looks_local = str(source).startswith((".", "/", "~")) or path.suffix.lower() in _FILE_SUFFIXES
    if looks_local and not path.exists():
        raise InputError(f"{source}: no such file (relative to {Path.cwd()}); check the path")
    return _iter_hf(str(source), split, config, streaming)


# --------------------------------------------------------------------------- mapping
def _mapped_columns(mapping: ColumnMap) -> set[str]:
    return {c for f in _CANDIDATES if (c := getattr(mapping, f)) is not None}


def _pick(record: dict[str, Any], field_name: str, mapping: ColumnMap) -> Any:
    column = getattr(mapping, field_name)
    if column is not None:
        return record.get(column)
    if field_name in mapping.constants:
        return mapping.constants[field_name]
    # A column explicitly mapped to another field is never reused by candidate lookup
    # (OpenR1's "answer" column is the gold answer, not the model's).
    taken = _mapped_columns(mapping)
    for cand in _CANDIDATES[field_name]:
        if cand not in taken and record.get(cand) is not None:
            return record[cand]
    return None


def _as_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _as_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return None


def content_trace_id(problem: str | None, text: str) -> str:
    """Stable id from content: ``"sha256:" + first 16 hex chars of sha256(problem NUL text)``."""
    return "sha256:" + sha256_text(f"{problem or ''}\x00{text}")[:16]


def records_to_traces(
    record: dict[str, Any], where: str, mapping: ColumnMap, source_name: str
) -> list[Trace]:
    """Turn one input record into one or more traces (several for list-valued text columns).

    Raises :class:`InputError` naming ``where`` for a missing or empty text field.
    """
    raw_text = _pick(record, "text", mapping)
    if raw_text is None:
        looked = mapping.text or ", ".join(_CANDIDATES["text"])
        raise InputError(f"{where}: record has no reasoning text (looked for: {looked}); name the column with --text-field")
    texts = raw_text if isinstance(raw_text, list) else [raw_text]
    corrects = _pick(record, "correct", mapping)
    corrects = corrects if isinstance(corrects, list) else [corrects] * len(texts)
    given_id = _as_str(_pick(record, "trace_id", mapping))
    problem = _as_str(_pick(record, "problem", mapping))
    answer_col = _as_str(_pick(record, "answer", mapping))
    used = _mapped_columns(mapping) | {c for f in _CANDIDATES for c in _CANDIDATES[f]}
    # NaN/inf (pandas' missing values) are left out: they are not JSON and would break readers of meta.
    meta = {
        k: v for k, v in record.items()
        if k not in used and isinstance(v, (str, int, float, bool)) and not (isinstance(v, float) and not math.isfinite(v))
    }
    traces = []
    for i, item in enumerate(texts):
        if not isinstance(item, str):
            raise InputError(f"{where}: reasoning text must be a string, got {type(item).__name__}")
        reasoning, tail_answer, _ = split_reasoning(item, mapping.think_tags)
        if not reasoning:
            raise InputError(f"{where}: empty reasoning trace (nothing but whitespace or tags)")
        answer = answer_col or tail_answer or last_boxed(item)
        suffix = f"/g{i}" if len(texts) > 1 else ""
        trace_id = (given_id + suffix) if given_id else content_trace_id(problem, reasoning)
        try:
            traces.append(
                Trace(
                    trace_id=trace_id, text=reasoning, problem=problem, answer=answer,
                    gold_answer=_as_str(_pick(record, "gold_answer", mapping)),
                    correct=_as_bool(corrects[i] if i < len(corrects) else None),
                    model=_as_str(_pick(record, "model", mapping)),
                    source=_as_str(_pick(record, "source", mapping)) or source_name,
                    dataset=_as_str(_pick(record, "dataset", mapping)),
                    meta=meta,
                )
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InputError(f"{where}: invalid trace field {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return traces


def load_traces(
    source: str | Path,
    *,
    columns: ColumnMap | None = None,
    preset: str | None = None,
    split: str | None = None,
    skip_invalid: bool = False,
    limit: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> LoadResult:
    """Read and validate every trace of ``source`` (file path or Hugging Face dataset name).

    Parameters
    ----------
    source : str or Path
        A ``.jsonl``/``.json``/``.parquet`` file, a ``save_to_disk`` folder, or a hub dataset name.
    columns : ColumnMap, optional
        Column mapping; overrides the preset's.
    preset : str, optional
        One of :data:`PRESETS` (``openr1-math``, ``s1k-1.1``, ``s1k``, ``openthoughts``): its column
        mapping and, when ``source`` is empty or the preset name, its hub id.
    split : str, optional
        Split of a Hugging Face dataset.
    skip_invalid : bool
        Skip bad records (counted in :attr:`LoadResult.skipped`) instead of raising.
    limit : int, optional
        Stop after this many traces.
    progress : callable, optional
        Called as ``progress(records_read, limit)`` after each record (a progress bar).

    Raises
    ------
    InputError
        A bad record (file and line named), unreadable input, duplicate trace ids, or no traces.
    ConfigError
        Unknown preset.
    """
    config = None
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}. Available presets: {', '.join(sorted(PRESETS))}")
        p = PRESETS[preset]
        columns = columns or p.columns
        config = p.config
        if not str(source) or str(source) == preset:
            source, split = p.hub_id, split or p.default_split
    mapping = columns or ColumnMap()
    result = LoadResult(traces=[], source=str(source))
    # A file's name, not its path: local directories must not leak into exports and cards.
    source_name = Path(source).name if Path(source).is_file() else str(source)
    seen: dict[str, str] = {}
    for n_read, (where, rec) in enumerate(iter_records(source, split=split, config=config, streaming=limit is not None), 1):
        if progress is not None:
            progress(n_read, limit)
        try:
            if isinstance(rec, Exception):
                raise rec
            traces = records_to_traces(rec, where, mapping, source_name=source_name)
            for t in traces:
                if t.trace_id in seen:
                    raise InputError(f"{where}: duplicate trace id {t.trace_id!r} (first seen at {seen[t.trace_id]})")
        except InputError as exc:
            if not skip_invalid:
                raise
            result.skipped.append(SkippedRecord(where=where, reason=exc.message))
            continue
        for t in traces:
            seen[t.trace_id] = where
            result.traces.append(t)
        if limit is not None and len(result.traces) >= limit:
            result.traces = result.traces[:limit]
            break
    if not result.traces:
        detail = f" ({len(result.skipped)} records skipped as invalid)" if result.skipped else ""
        raise InputError(f"{source}: no traces found{detail}")
    return result
