"""Small hand-made stores for the review tests: non-ASCII traces, segments and baseline labels.

Segment offsets are found with ``str.index`` on hand-picked segment texts, so every segment
satisfies ``trace[start:end] == text`` by construction; the labels are chosen by hand.
"""

from __future__ import annotations

from pathlib import Path

from ror_annotate.records import Label, Segment, Trace
from ror_annotate.store import Store

BASELINE = "baseline:cue-v1"

# (trace_id, problem, [(segment text, baseline label, baseline confidence)], separator)
TRACES = [
    (
        "t-latex",
        "Solve $x^2 = 4$ for x > 0.",
        [
            ("Let me solve $x^2 = 4$ first.", "planning", 0.9),
            ("Taking roots: $x = \\pm 2$ — so x = ±2.", "execution", 0.8),
            ("🤔 Wait, is the negative root allowed?", "reflection", 0.4),
            ("The problem says x > 0.", "restatement", 0.7),
            ("So the answer is 2.", "conclusion", 0.95),
        ],
        " ",
    ),
    (
        "t-cjk",
        "计算 3 + 4。",
        [
            ("首先，我们计算 3 + 4。", "planning", 0.6),
            ("3 + 4 = 7。", "execution", 0.9),
            ("加法满足交换律。", "fact", 0.5),
            ("所以答案是 7。", "conclusion", 0.9),
        ],
        "",
    ),
    (
        "t-zwj",
        "A firefighter 👨🏻‍🚒 carries 5 hoses, 3 times. How many?",
        [
            ("👨🏻‍🚒 carries 5 hoses 3 times.", "restatement", 0.7),
            ("Next I compute 5 × 3.", "planning", 0.8),
            ("5 × 3 = 15 <b>hoses</b> & more.", "execution", 0.9),
            ("Therefore 15.", "conclusion", 0.9),
        ],
        "\n",
    ),
]


def build_trace(trace_id: str, problem: str, parts: list[tuple[str, str, float]], sep: str) -> tuple[Trace, list[Segment], list[Label]]:
    text = sep.join(p[0] for p in parts)
    trace = Trace(trace_id=trace_id, text=text, problem=problem, model="hand-made", dataset="unit")
    segments, labels, cursor = [], [], 0
    for i, (seg_text, label, conf) in enumerate(parts):
        start = text.index(seg_text, cursor)
        cursor = start + len(seg_text)
        segments.append(Segment(trace_id=trace_id, segment_index=i, char_start=start, char_end=cursor, text=seg_text, n_tokens=len(seg_text.split())))
        labels.append(Label(trace_id=trace_id, segment_index=i, label=label, source="baseline", annotator=BASELINE,
                            codebook_version="baseline-cue-v1", confidence=conf))
    return trace, segments, labels


def make_store(path: Path, *, with_labels: bool = True) -> Store:
    """A store at ``path`` holding :data:`TRACES`, their segments and (optionally) baseline labels."""
    store = Store(path)
    for trace_id, problem, parts, sep in TRACES:
        trace, segments, labels = build_trace(trace_id, problem, parts, sep)
        store.upsert_traces([trace])
        store.replace_segments(trace_id, segments, segmenter="hand", token_counter="words")
        if with_labels:
            store.upsert_labels(labels)
    return store


def baseline_label(trace_id: str, index: int) -> str:
    """The hand-chosen baseline label of a segment."""
    for tid, _, parts, _ in TRACES:
        if tid == trace_id:
            return parts[index][1]
    raise KeyError(trace_id)


ALL_KEYS = [(tid, i) for tid, _, parts, _ in TRACES for i in range(len(parts))]


class FakeLabelStudio:
    """An in-memory Label Studio with the calls :class:`~ror_annotate.review.labelstudio.LabelStudioClient` offers.

    For property tests that need thousands of pulls (the real server takes about 0.25 s per annotation;
    the integration suite covers the real one). Annotations are plain dicts shaped like the sync JSON
    export of Label Studio 1.23 (``completed_by`` / ``updated_by`` are user ids), with ids given by the
    test so that two fakes fed different histories can be compared annotation by annotation.
    """

    url = public_url = "http://fake-ls.invalid"

    def __init__(self, users: dict[str, int]) -> None:
        self.users = dict(users)
        self.projects: dict[int, dict] = {}
        self.tasks: dict[int, dict] = {}
        self._next = 1000

    def _id(self) -> int:
        self._next += 1
        return self._next

    def whoami(self):
        return {"id": 1}

    def users_by_email(self) -> dict[str, int]:
        return dict(self.users)

    def invite_url(self) -> str:
        return f"{self.public_url}/user/signup/?token=fake"

    def project_url(self, project_id: int) -> str:
        return f"{self.public_url}/projects/{project_id}/data"

    def project(self, project_id: int):
        from types import SimpleNamespace

        p = self.projects.get(project_id)
        return None if p is None else SimpleNamespace(id=project_id, label_config=p["label_config"])

    def create_project(self, *, title: str, description: str, label_config: str, model_version=None, show_predictions=False) -> int:
        pid = self._id()
        self.projects[pid] = {"label_config": label_config, "tasks": []}
        return pid

    def set_config(self, project_id: int, label_config: str) -> None:
        self.projects[project_id]["label_config"] = label_config

    def import_tasks(self, project_id: int, tasks) -> int:
        for t in tasks:
            tid = self._id()
            self.tasks[tid] = {"id": tid, "data": dict(t["data"]), "annotations": []}
            self.projects[project_id]["tasks"].append(tid)
        return len(tasks)

    def export_tasks(self, project_id: int) -> list[dict]:
        import copy

        return [copy.deepcopy(self.tasks[t]) for t in self.projects[project_id]["tasks"]]

    # -- what annotators do
    def annotate(self, task_id: int, ann_id: int, user: int, result: list[dict], *, when: str, cancelled: bool = False) -> None:
        self.tasks[task_id]["annotations"].append({
            "id": ann_id, "completed_by": user, "updated_by": user, "result": result, "was_cancelled": cancelled,
            "created_at": when, "updated_at": when, "lead_time": 1.0,
        })

    def update(self, ann_id: int, user: int, result: list[dict], *, when: str) -> bool:
        for t in self.tasks.values():
            for a in t["annotations"]:
                if a["id"] == ann_id:
                    a.update(result=result, updated_by=user, updated_at=when, was_cancelled=False)
                    return True
        return False

    def delete(self, ann_id: int) -> bool:
        for t in self.tasks.values():
            n = len(t["annotations"])
            t["annotations"] = [a for a in t["annotations"] if a["id"] != ann_id]
            if len(t["annotations"]) != n:
                return True
        return False


def two_segment_store(path: Path) -> Store:
    """A store at ``path`` holding one trace ``t-1`` ("So x = 4. Wait, that is wrong.") cut by hand into
    its two sentences (offsets 0-9 and 9-30), unlabelled: enough for a study of two segments."""
    text = "So x = 4. Wait, that is wrong."
    store = Store(path)
    store.upsert_traces([Trace(trace_id="t-1", text=text)])
    store.replace_segments("t-1", [Segment(trace_id="t-1", segment_index=0, char_start=0, char_end=9, text=text[:9], n_tokens=2),
                                   Segment(trace_id="t-1", segment_index=1, char_start=9, char_end=len(text), text=text[9:], n_tokens=2)],
                           segmenter="hand", token_counter="chars/4")
    return store
