"""The general rule of pulling (issue 14): no annotation by user B, in any project, changes what is stored for user A.

Property test over random histories on an in-memory Label Studio (tests/review_fixtures.FakeLabelStudio):
two worlds receive the same history, except that world "owners" never sees the annotations people make
in somebody else's project (or that an outsider makes anywhere). After every pull, each annotator's
stored labels must be identical in both worlds. The real-server reproduction of the issue's scenario is
in tests/test_review_labelstudio.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ror_annotate.records import BEHAVIORS
from ror_annotate.review import create_study, pull_study, push_study
from ror_annotate.review.studies import pseudonym_for

from . import review_fixtures as F

EMAILS = {"a1": "a1@example.org", "a2": "a2@example.org", "out": "outsider@example.org"}
UIDS = {"a1": 11, "a2": 12, "out": 99}
N_TASKS = 4

annotate = st.tuples(st.just("ann"), st.sampled_from(["a1", "a2", "out"]), st.sampled_from(["a1", "a2"]),
                     st.integers(0, N_TASKS - 1), st.sampled_from(BEHAVIORS), st.booleans())
update = st.tuples(st.just("upd"), st.integers(0, 30), st.sampled_from(BEHAVIORS))
delete = st.tuples(st.just("del"), st.integers(0, 30))
pull = st.tuples(st.just("pull"))
histories = st.lists(st.one_of(annotate, annotate, update, delete, pull), min_size=1, max_size=25)


def _choice(label: str) -> list[dict]:
    return [{"from_name": "behavior", "to_name": "segment", "type": "choices", "value": {"choices": [label]}}]


class World:
    def __init__(self, path: Path, name: str) -> None:
        self.store = F.make_store(path)
        create_study(self.store, name, annotators=[EMAILS["a1"], EMAILS["a2"]], n=N_TASKS, seed=9, overlap=2)
        self.ls = F.FakeLabelStudio({EMAILS[k]: v for k, v in UIDS.items()})
        push_study(self.store, name, self.ls)
        self.name = name
        self.pseud = {k: pseudonym_for(self.store, EMAILS[k]) for k in ("a1", "a2")}
        # both people got the same N_TASKS segments (overlap 2 of 2): task order by external id
        self.task_ids = {}
        for k in ("a1", "a2"):
            pid = self.store.execute("SELECT ls_project_id FROM review_projects WHERE study = ? AND pseudonym = ?",
                                     [name, self.pseud[k]]).fetchone()[0]
            self.task_ids[k] = [t["id"] for t in sorted(self.ls.export_tasks(pid), key=lambda t: t["data"]["ror_external_id"])]

    def stored(self) -> dict[str, dict]:
        return {k: {(lab.trace_id, lab.segment_index): (lab.label, lab.extra["ls_annotation_id"])
                    for lab in self.store.labels(source="human", study=self.name, annotator=p)} for k, p in self.pseud.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
# the owner annotates twice: the newer annotation replaces the label, named with the owner's pseudonym
@example([("ann", "a1", "a1", 0, "planning", False), ("pull",), ("ann", "a1", "a1", 0, "fact", False)])
# an outsider and the other annotator annotate the owner's task after the owner's label was pulled (the issue)
@example([("ann", "a1", "a1", 0, "planning", False), ("pull",), ("ann", "out", "a1", 0, "fact", False),
          ("ann", "a2", "a1", 0, "execution", False)])
def test_no_annotation_by_another_user_changes_what_is_stored_for_the_owner(history):
    with tempfile.TemporaryDirectory() as tmp:
        everyone, owners = World(Path(tmp) / "x.duckdb", "iso"), World(Path(tmp) / "y.duckdb", "iso")
        made: list[tuple[int, str, bool]] = []  # (annotation id, actor, foreign)
        for step, op in enumerate(history + [("pull",)]):
            when = f"2026-01-01T00:{step // 60:02d}:{step % 60:02d}.000000Z"
            if op[0] == "ann":
                _, actor, owner, pos, label, cancelled = op
                foreign = actor != owner
                ann_id = 5000 + step
                made.append((ann_id, actor, foreign))
                for w in (everyone,) if foreign else (everyone, owners):
                    w.ls.annotate(w.task_ids[owner][pos], ann_id, UIDS[actor], [] if cancelled else _choice(label),
                                  when=when, cancelled=cancelled)
            elif op[0] in ("upd", "del") and made:
                ann_id, actor, foreign = made[op[1] % len(made)]
                for w in (everyone,) if foreign else (everyone, owners):
                    if op[0] == "upd":
                        w.ls.update(ann_id, UIDS[actor], _choice(op[2]), when=when)  # a person edits their own
                    else:
                        w.ls.delete(ann_id)
            elif op[0] == "pull":
                reports = [(w, pull_study(w.store, w.name, w.ls, run_id=None)) for w in (everyone, owners)]
                assert everyone.stored() == owners.stored()
                for w, rep in reports:  # every removed or replaced label is named, by the store's pseudonym
                    assert len(rep.removed) == rep.labels_removed
                    assert all(line.split(" ")[0] in w.pseud.values() for line in rep.removed + rep.replaced)
        everyone.store.close()
        owners.store.close()


def test_an_edit_by_another_account_keeps_what_is_stored_for_the_task(tmp_path):
    w = World(tmp_path / "e.duckdb", "edit")
    task = w.task_ids["a1"][0]
    w.ls.annotate(task, 7001, UIDS["a1"], _choice("planning"), when="2026-01-01T00:00:01Z")
    assert pull_study(w.store, w.name, w.ls).labels_written == 1
    # a1 makes a newer annotation, which an outsider edits before the next pull: its content is not a1's
    w.ls.annotate(task, 7002, UIDS["a1"], _choice("fact"), when="2026-01-01T00:00:02Z")
    w.ls.update(7002, UIDS["out"], _choice("execution"), when="2026-01-01T00:00:03Z")
    rep = pull_study(w.store, w.name, w.ls)
    assert (rep.labels_written, rep.labels_removed, rep.removed, rep.replaced) == (0, 0, [], [])
    assert any("annotation 7002 " in r and f"Label Studio user {UIDS['out']}" in r for r in rep.rejected)
    assert [v for v in w.stored()["a1"].values()] == [("planning", 7001)]
    # a1 saves it again: now it is theirs, and the replacement is named
    w.ls.update(7002, UIDS["a1"], _choice("reflection"), when="2026-01-01T00:00:04Z")
    rep = pull_study(w.store, w.name, w.ls)
    assert rep.labels_written == 1 and len(rep.replaced) == 1 and "planning (annotation 7001) -> reflection (annotation 7002" in rep.replaced[0]
    assert [v for v in w.stored()["a1"].values()] == [("reflection", 7002)]
    w.store.close()
