"""The small generation evaluation behind ``ror steer``: steered vs unmodified vs controls.

Problems go in (JSONL: ``{"id", "problem", "answer"}``), greedy generations come out with their
generated token counts and extracted answers. Conditions:

- ``unmodified``: the model as loaded;
- ``steered``: the :class:`~ror_annotate.steer.steering.RoutingEdit` under the chosen schedule;
- ``random``: random expert sets of the same size per layer (seeded), same schedule;
- ``concise_prompt``: no edit, a system prompt asking for a concise answer.

Token savings are reported as the median over problems of the paired relative change in
generated tokens against ``unmodified`` (the method's "median -30.4% generated tokens").
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import InputError, SteerError
from ..answers import answers_match, extract_answer
from . import require_torch
from .families import find_router_sites
from .steering import AfterFirstAnswer, AlwaysOn, RoutingEdit, random_expert_sets, steer_routing

CONDITIONS: tuple[str, ...] = ("unmodified", "steered", "random", "concise_prompt")
CONCISE_SYSTEM_PROMPT = ("Answer concisely. Reason briefly, do not re-check a result once you have it, "
                         "and put the final answer in \\boxed{}.")


@dataclass(frozen=True)
class Problem:
    """One evaluation problem: id, prompt text and the reference answer (may be empty)."""

    problem_id: str
    problem: str
    answer: str = ""


def load_problems(path: str | Path) -> list[Problem]:
    """Read problems from JSONL (``id`` optional, ``problem`` or ``question``, ``answer`` optional).

    A traces file works too: ``trace_id`` stands in for ``id`` and ``gold_answer`` takes precedence
    over ``answer`` (in a trace, ``answer`` is what the model answered, not the reference). A null
    answer means "no reference" (the problem is never counted correct), never the string "None".

    Raises
    ------
    InputError
        Missing file, bad JSON, a line that is not an object, no problem text or a repeated id,
        naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such problems file (JSONL with 'problem' and 'answer' fields)")
    problems = []
    seen: dict[str, int] = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{line_no}: expected a JSON object with a 'problem' field, got {type(rec).__name__}")
        text = rec.get("problem") or rec.get("question")
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{path}:{line_no}: no 'problem' (or 'question') text")
        problem_id = next((rec[k] for k in ("id", "problem_id", "trace_id") if rec.get(k) is not None), line_no)
        reference = next((rec[k] for k in ("gold_answer", "answer") if rec.get(k) is not None), "")
        if str(problem_id) in seen:
            raise InputError(f"{path}:{line_no}: problem id {problem_id!r} already used on line {seen[str(problem_id)]}; "
                             "ids must be unique (token changes are paired by id)")
        seen[str(problem_id)] = line_no
        problems.append(Problem(str(problem_id), text, str(reference)))
    if not problems:
        raise InputError(f"{path}: no problems")
    return problems


def build_prompt(tokenizer: Any, problem: str, system: str | None = None) -> list[int]:
    """Token ids of the prompt: the chat template when the tokenizer has one, else plain text."""
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": problem}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    text = (f"{system}\n\n" if system else "") + f"Problem: {problem}\nSolution:"
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def _generate(model: Any, tokenizer: Any, prompt: list[int], max_new_tokens: int) -> tuple[list[int], str]:
    torch = require_torch()
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, use_cache=True)
    new = out[0, ids.shape[1]:].tolist()
    eos = tokenizer.eos_token_id
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return new, tokenizer.decode(new, skip_special_tokens=True)


def run_evaluation(model: Any, tokenizer: Any, problems: Sequence[Problem], edit: RoutingEdit, *,
                   conditions: Sequence[str] = CONDITIONS, schedule: str = "always", max_new_tokens: int = 1024,
                   seed: int = 0, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Generate every problem under every condition.

    Parameters
    ----------
    model, tokenizer
        A loaded MoE causal LM of a registered family and its tokenizer.
    problems : sequence of Problem
    edit : RoutingEdit
        The steering edit (``steered``); ``random`` matches its per-layer set sizes.
    conditions : sequence of str
        Subset of :data:`CONDITIONS`.
    schedule : {"always", "after_first_answer"}
    max_new_tokens : int
    seed : int
        Seed of the random control's expert sets.
    progress : callable, optional

    Returns
    -------
    list of dict
        One per (condition, problem): ``condition, problem_id, generated_tokens, steered_tokens``
        (tokens generated with the edit on; None for a condition without an edit; 0 when the schedule
        never switched on), ``answer, correct, text``.

    Raises
    ------
    SteerError
        Unknown condition or schedule, or an invalid edit.
    """
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad:
        raise SteerError(f"unknown conditions {bad}; choose from {', '.join(CONDITIONS)}")
    if schedule not in ("always", "after_first_answer"):
        raise SteerError(f"unknown schedule {schedule!r}; choose 'always' or 'after_first_answer'")
    sites = find_router_sites(model)
    edit.validate(sites)
    if edit.empty and ("steered" in conditions or "random" in conditions):
        raise SteerError("the steering spec edits no expert; give --spec with activate/suppress sets")
    edits = {"unmodified": None, "steered": edit, "random": random_expert_sets(edit, sites, seed=seed),
             "concise_prompt": None}
    rows = []
    for condition in conditions:
        for problem in problems:
            if progress is not None:
                progress(f"{condition} {problem.problem_id}")
            system = CONCISE_SYSTEM_PROMPT if condition == "concise_prompt" else None
            prompt = build_prompt(tokenizer, problem.problem, system)
            cond_edit = edits[condition]
            steered: int | None = None
            if cond_edit is None:
                new, text = _generate(model, tokenizer, prompt, max_new_tokens)
            else:
                sched = AlwaysOn() if schedule == "always" else AfterFirstAnswer(tokenizer)
                with steer_routing(model, cond_edit, schedule=sched):
                    new, text = _generate(model, tokenizer, prompt, max_new_tokens)
                steered = len(new)
                if isinstance(sched, AfterFirstAnswer):
                    # the forwards after the switch produce the steered tokens
                    at = sched.activated_at[0] if sched.activated_at else None
                    steered = 0 if at is None else max(0, len(new) - at)
            answer = extract_answer(text)
            rows.append({"condition": condition, "problem_id": problem.problem_id, "generated_tokens": len(new),
                         "steered_tokens": steered,
                         "answer": answer, "correct": bool(answers_match(answer, problem.answer)), "text": text})
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per condition: n, median and mean generated tokens, accuracy, median paired change vs unmodified,
    and how much was actually steered.

    Returns
    -------
    list of dict
        ``condition, n, median_tokens, mean_tokens, accuracy, median_token_change`` (a fraction,
        ``-0.30`` = 30% fewer tokens; NaN without an ``unmodified`` run), ``steered_rows`` (rows with at
        least one steered token) and ``steered_tokens`` (their sum); both None for a condition without
        an edit.
    """
    base = {r["problem_id"]: r["generated_tokens"] for r in rows if r["condition"] == "unmodified"}
    out = []
    for condition in dict.fromkeys(r["condition"] for r in rows):
        sub = [r for r in rows if r["condition"] == condition]
        tokens = [r["generated_tokens"] for r in sub]
        changes = [(r["generated_tokens"] - base[r["problem_id"]]) / base[r["problem_id"]]
                   for r in sub if base.get(r["problem_id"])]
        out.append({"condition": condition, "n": len(sub), "median_tokens": statistics.median(tokens),
                    "mean_tokens": statistics.fmean(tokens), "accuracy": statistics.fmean(r["correct"] for r in sub),
                    "median_token_change": statistics.median(changes) if changes else float("nan"),
                    **_steered(sub)})
    return out


def _steered(rows: Sequence[dict[str, Any]]) -> dict[str, int | None]:
    counts = [r.get("steered_tokens") for r in rows]
    if all(c is None for c in counts):
        return {"steered_rows": None, "steered_tokens": None}
    return {"steered_rows": sum(1 for c in counts if c), "steered_tokens": sum(c or 0 for c in counts)}


__all__ = [
    "CONCISE_SYSTEM_PROMPT",
    "CONDITIONS",
    "Problem",
    "build_prompt",
    "load_problems",
    "run_evaluation",
    "summarize",
]
