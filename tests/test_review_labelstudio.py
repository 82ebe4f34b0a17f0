"""Integration tests of the review queue against a REAL Label Studio server.

The server comes from ``LABEL_STUDIO_URL`` / ``LABEL_STUDIO_API_KEY`` (CI: ``.ci/run`` runs
``bash scripts/labelstudio.sh install && bash scripts/labelstudio.sh start`` and exports them);
when unset, the defaults of scripts/labelstudio.sh are tried. The tests skip, saying why, only if no
server answers. Annotators are real Label Studio users created through the organization's invite
link, and annotate with their own API tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid

import httpx
import pytest

from ror_annotate.errors import ReviewError
from ror_annotate.review import (
    adjudicate_study, create_study, disagreement_status, disagreements, pull_study, push_study, reference_labels, signup_annotator,
    study_status,
)
from ror_annotate.review.labelstudio import LabelStudioClient
from ror_annotate.review.studies import assignments, study_people
from ror_annotate.store import Store

from . import review_fixtures as F

pytestmark = pytest.mark.integration

URL = os.environ.get("LABEL_STUDIO_URL", "http://127.0.0.1:8089").rstrip("/")
KEY = os.environ.get("LABEL_STUDIO_API_KEY", "0123456789abcdef0123456789abcdef01234567")


@pytest.fixture(scope="module")
def admin() -> LabelStudioClient:
    try:
        ok = httpx.get(f"{URL}/health/", timeout=5).json().get("status") == "UP"
    except (httpx.HTTPError, ValueError):
        ok = False
    if not ok:
        reason = f"no Label Studio server answers at {URL}/health/ (start one: bash scripts/labelstudio.sh start)"
        if os.environ.get("ROR_REQUIRE_LABEL_STUDIO"):  # set by scripts/test.sh and CI: never skip there
            pytest.fail(reason)
        pytest.skip(reason)
    return LabelStudioClient(URL, KEY)


def _new_user(admin: LabelStudioClient, tag: str) -> tuple[str, str]:
    email = f"{tag}-{uuid.uuid4().hex[:8]}@example.org"
    return email, signup_annotator(URL, admin.invite_url(), email, "pw-" + uuid.uuid4().hex)


@pytest.fixture(scope="module")
def people(admin):
    """Two annotators, an adjudicator and an outsider, each a real user with their own token."""
    return {tag: _new_user(admin, tag) for tag in ("ann1", "ann2", "adj", "outsider")}


def _sdk(token: str):
    from label_studio_sdk import LabelStudio

    return LabelStudio(base_url=URL, api_key=token, timeout=60)


def _project_of(store, study: str, pseudonym: str, role: str = "annotator") -> int:
    return store.execute("SELECT ls_project_id FROM review_projects WHERE study = ? AND pseudonym = ? AND role = ?",
                         [study, pseudonym, role]).fetchone()[0]


def _tasks(admin: LabelStudioClient, pid: int) -> list[dict]:
    return admin.export_tasks(pid)


def _choice(label: str) -> list[dict]:
    return [{"from_name": "behavior", "to_name": "segment", "type": "choices", "value": {"choices": [label]}}]


def _labels_snapshot(store) -> list[tuple]:
    return store.execute("SELECT * FROM labels ORDER BY label_id").fetchall()


def _pseudonym(store, email: str) -> str:
    # Independent of the code under test: the documented formula over the stored salt.
    salt = store.execute("SELECT value FROM review_meta WHERE key = 'pseudonym_salt'").fetchone()[0]
    return "h-" + hashlib.sha256(f"{salt}:{email.lower()}".encode()).hexdigest()[:10]


# Hand-chosen answers. ann1 agrees with the baseline everywhere except t-cjk#2; ann2 agrees with ann1
# except on t-latex#2 and t-zwj#1; ann2 skips t-cjk#0.
ANN1 = {k: F.baseline_label(*k) for k in F.ALL_KEYS} | {("t-cjk", 2): "execution"}
ANN2 = dict(ANN1) | {("t-latex", 2): "planning", ("t-zwj", 1): "execution"}
ANN2_SKIP = ("t-cjk", 0)
LEAD = {("t-latex", 0): 12.5}


def test_full_study_round_trip(admin, people, tmp_path):
    store = F.make_store(tmp_path / "s.duckdb")
    (e1, tok1), (e2, tok2), (ea, toka) = people["ann1"], people["ann2"], people["adj"]
    name = "full-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1, e2], strategy="random", n=100, seed=3, overlap=2, blind=False,
                 judge_annotator=F.BASELINE)
    p1, p2 = _pseudonym(store, e1), _pseudonym(store, e2)
    assert study_people(store, name) == sorted([p1, p2])

    report = push_study(store, name, admin)
    assert report.projects_created == 2 and report.tasks_created == 2 * len(F.ALL_KEYS)
    pid1 = _project_of(store, name, p1)

    # Non-blind: every task carries exactly the baseline label as a prediction, model_version = judge@codebook.
    from ror_annotate.codebook import load_codebook

    mv = f"{F.BASELINE}@{load_codebook('six-behaviors@v1').sha256[:12]}"
    preds = list(_sdk(KEY).predictions.list(project=pid1))
    by_task = {p.task: p for p in preds}
    tasks1 = _tasks(admin, pid1)
    assert len(tasks1) == len(F.ALL_KEYS) == len(by_task)
    for t in tasks1:
        key = (t["data"]["trace_id"], t["data"]["segment_index"])
        pred = by_task[t["id"]]
        assert pred.model_version == mv
        assert pred.result[0]["value"]["choices"] == [F.baseline_label(*key)]
        # Non-ASCII text survives the round trip exactly, and the context highlights the segment.
        seg = store.segments(key[0])[key[1]]
        assert t["data"]["segment"] == seg.text
        assert "<mark>" in t["data"]["context_html"]

    # Re-push changes nothing.
    again = push_study(store, name, admin)
    assert again.tasks_created == 0 and again.projects_created == 0
    assert len(_tasks(admin, pid1)) == len(F.ALL_KEYS)

    # Two real users annotate through the API with their own tokens.
    for tok, answers, pseud in ((tok1, ANN1, p1), (tok2, ANN2, p2)):
        ls = _sdk(tok)
        for t in _tasks(admin, _project_of(store, name, pseud)):
            key = (t["data"]["trace_id"], t["data"]["segment_index"])
            if tok == tok2 and key == ANN2_SKIP:
                ls.annotations.create(id=t["id"], result=[], was_cancelled=True)
            else:
                ls.annotations.create(id=t["id"], result=_choice(answers[key]), lead_time=LEAD.get(key, 1.0))

    pulled = pull_study(store, name, admin, run_id="run-test-1")
    assert pulled.skips == 1 and pulled.rejected == []
    humans = store.labels(source="human", study=name)
    got = {(lab.annotator, lab.trace_id, lab.segment_index): lab.label for lab in humans}
    want = {(p1, *k): v for k, v in ANN1.items()} | {(p2, *k): v for k, v in ANN2.items() if k != ANN2_SKIP}
    assert got == want
    codebook_sha = load_codebook("six-behaviors@v1").sha256
    for lab in humans:
        key = (lab.trace_id, lab.segment_index)
        assert lab.codebook_version == codebook_sha and lab.study == name and lab.run_id == "run-test-1"
        assert lab.extra["accepted_prediction"] is (lab.label == F.baseline_label(*key))
        assert lab.extra["lead_time_s"] == LEAD.get(key, 1.0)
    # Skips are not labels; e-mails never reach the labels table.
    assert (p2, *ANN2_SKIP) not in got
    dump = json.dumps([list(map(str, r)) for r in _labels_snapshot(store)])
    assert "@example.org" not in dump

    # Re-pull changes nothing (not even run ids).
    before = _labels_snapshot(store)
    again = pull_study(store, name, admin, run_id="run-test-2")
    assert again.labels_written == 0 and again.labels_unchanged == len(want)
    assert _labels_snapshot(store) == before

    # Disagreements: t-latex#2 and t-zwj#1 (t-cjk#0 has one label, so no disagreement).
    dis = disagreements(store, name)
    assert [(d.trace_id, d.segment_index) for d in dis] == [("t-latex", 2), ("t-zwj", 1)]

    # The study measures the judge (it names one), so by default the adjudicator does not see it.
    adj = adjudicate_study(store, name, admin, adjudicator=ea)
    assert adj.disagreements == 2 and adj.tasks_created == 2 and adj.show_judge is False and adj.warnings == []
    adj_tasks = _tasks(admin, adj.project_id)
    pa = _pseudonym(store, ea)
    for t in adj_tasks:
        html = t["data"]["labels_html"]
        assert p1 in html and p2 in html and "judge" not in html and F.BASELINE not in json.dumps(t["data"])
        assert "@example.org" not in json.dumps(t["data"])
    status = disagreement_status(store, name)
    assert (len(status.adjudicated), len(status.open), status.awaiting, status.unsent) == (0, 2, 2, 0)
    choice = {("t-latex", 2): "reflection", ("t-zwj", 1): "planning"}
    ls_adj = _sdk(toka)
    for t in adj_tasks:
        ls_adj.annotations.create(id=t["id"], result=_choice(choice[(t["data"]["trace_id"], t["data"]["segment_index"])]))
    again = adjudicate_study(store, name, admin)
    assert again.tasks_created == 0
    adjudicated = {(lab.trace_id, lab.segment_index): (lab.annotator, lab.label) for lab in store.labels(source="adjudicated", study=name)}
    assert adjudicated == {k: (f"adjudicator:{pa}", v) for k, v in choice.items()}
    # After full adjudication nothing is open (issue 14: status used to keep counting them).
    status = disagreement_status(store, name)
    assert sorted((d.trace_id, d.segment_index) for d in status.adjudicated) == sorted(choice) and status.open == ()
    adj_row = [r for r in study_status(store, name) if r.role == "adjudication"]
    assert [(r.assigned, r.labeled, r.remaining) for r in adj_row] == [(2, 2, 0)]

    ref = {(r.trace_id, r.segment_index): (r.label, r.basis) for r in reference_labels(store, name)}
    for key in F.ALL_KEYS:
        if key in choice:
            assert ref[key] == (choice[key], "adjudicated")
        elif key == ANN2_SKIP:
            assert ref[key] == (ANN1[key], "single")
        else:
            assert ref[key] == (ANN1[key], "unanimous")

    # An annotator changes one answer in Label Studio: the next pull replaces exactly that label.
    ann = next(a for t in _tasks(admin, pid1) for a in t["annotations"]
               if (t["data"]["trace_id"], t["data"]["segment_index"]) == ("t-cjk", 3))
    _sdk(tok1).annotations.update(id=ann["id"], result=_choice("reflection"))
    changed = pull_study(store, name, admin, run_id="run-test-3")
    assert changed.labels_written == 1
    lab = [x for x in store.labels(source="human", study=name, annotator=p1) if (x.trace_id, x.segment_index) == ("t-cjk", 3)]
    assert [(x.label, x.run_id) for x in lab] == [("reflection", "run-test-3")]


def test_blind_study_tasks_carry_no_prediction(admin, people, tmp_path):
    store = F.make_store(tmp_path / "b.duckdb")
    (e1, _), (e2, _) = people["ann1"], people["ann2"]
    name = "blind-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1, e2], strategy="stratified", n=6, seed=1, overlap=1, blind=True,
                 judge_annotator=F.BASELINE)
    push_study(store, name, admin)
    n_tasks = 0
    for person in study_people(store, name):
        pid = _project_of(store, name, person)
        assert list(_sdk(KEY).predictions.list(project=pid)) == []
        for t in _tasks(admin, pid):
            n_tasks += 1
            assert t["predictions"] == [] and t["total_predictions"] == 0
            assert "baseline" not in json.dumps(t["data"])
        assert len(_tasks(admin, pid)) == len(assignments(store, name, person))
    assert n_tasks == 6  # overlap 1: every sampled segment exactly once


def test_span_mode_offsets_and_misaligned_regions(admin, people, tmp_path):
    store = F.make_store(tmp_path / "sp.duckdb")
    (e1, tok1) = people["ann1"]
    name = "span-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1], strategy="trace", n_traces=3, seed=0, overlap=1, blind=False,
                 judge_annotator=F.BASELINE, mode="span")
    push_study(store, name, admin)
    pid = _project_of(store, name, _pseudonym(store, e1))
    tasks = {t["data"]["trace_id"]: t for t in _tasks(admin, pid)}
    assert sorted(tasks) == ["t-cjk", "t-latex", "t-zwj"]
    preds = {p.task: p for p in _sdk(KEY).predictions.list(project=pid)}
    ls = _sdk(tok1)
    for tid, t in tasks.items():
        trace = store.get_trace(tid)
        assert t["data"]["trace"] == trace.text
        result = [dict(r, value=dict(r["value"])) for r in preds[t["id"]].result]
        regions = [r for r in result if r["type"] == "labels"]
        # Pre-made regions are exact code-point spans of the segments.
        assert [(r["value"]["start"], r["value"]["end"]) for r in regions] == [(s.char_start, s.char_end) for s in store.segments(tid)]
        if tid == "t-latex":
            # Segment 3 follows the 🤔: give its region in UTF-16 units (+1), the LS-01 fault.
            for r in result:
                if r["id"] == "s3":
                    r["value"]["start"] += 1
                    r["value"]["end"] += 1
            # Segment 4's region text no longer matches anything: misaligned, must be rejected.
            for r in result:
                if r["id"] == "s4":
                    r["value"]["text"] = "not in the trace"
                    r["value"]["start"] += 2
        if tid == "t-zwj":
            for r in result:
                if r["id"] == "s1" and r["type"] == "choices":
                    r["value"]["choices"] = ["reflection"]
        if tid == "t-cjk":
            # Segment 2's offsets are off by 5 in every reading, but its text occurs once: re-anchored by text search.
            for r in result:
                if r["id"] == "s2":
                    r["value"]["start"] += 5
                    r["value"]["end"] += 5
        ls.annotations.create(id=t["id"], result=result)
    rep = pull_study(store, name, admin)
    got = {(lab.trace_id, lab.segment_index): (lab.label, lab.extra["anchored_by"]) for lab in store.labels(source="human", study=name)}
    want = {k: (F.baseline_label(*k), "codepoints") for k in F.ALL_KEYS}
    want[("t-latex", 3)] = ("restatement", "utf16")
    del want[("t-latex", 4)]
    want[("t-zwj", 1)] = ("reflection", "codepoints")
    want[("t-cjk", 2)] = ("fact", "text-search")
    assert got == want
    assert len(rep.rejected) == 1 and "misaligned" in rep.rejected[0] and "'s4'" in rep.rejected[0]
    # The re-anchored region is reported (count and list) and stored as re-anchored.
    assert len(rep.reanchored) == 1 and "region 's2'" in rep.reanchored[0] and "segment t-cjk#2" in rep.reanchored[0]
    flags = {(lab.trace_id, lab.segment_index): lab.extra["re_anchored"] for lab in store.labels(source="human", study=name)}
    assert [k for k, v in flags.items() if v] == [("t-cjk", 2)]

    # --strict-offsets rejects the re-anchored region: its label goes, named, and the rejection is listed.
    strict = pull_study(store, name, admin, strict_offsets=True)
    assert strict.labels_removed == 1 and strict.reanchored == []
    assert len(strict.removed) == 1 and strict.removed[0].startswith(f"{_pseudonym(store, e1)} t-cjk#2: fact removed")
    assert sum("--strict-offsets" in r and "'s2'" in r for r in strict.rejected) == 1 and len(strict.rejected) == 2
    assert ("t-cjk", 2) not in {(lab.trace_id, lab.segment_index) for lab in store.labels(source="human", study=name)}


def test_errors_unreachable_bad_token_and_no_key(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = F.make_store(tmp_path / "e.duckdb")
    create_study(store, "s", annotators=["a@example.org"], n=2, overlap=1)
    with pytest.raises(ReviewError, match=rf"127\.0\.0\.1:{port} is not reachable.*scripts/labelstudio\.sh start"):
        push_study(store, "s", LabelStudioClient(f"http://127.0.0.1:{port}", "x" * 40, timeout=5))
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    with pytest.raises(ReviewError, match="LABEL_STUDIO_API_KEY"):
        LabelStudioClient(f"http://127.0.0.1:{port}")
    assert store.execute("SELECT count(*) FROM review_projects").fetchone()[0] == 0


def test_bad_token(admin, tmp_path):
    store = F.make_store(tmp_path / "t.duckdb")
    create_study(store, "s", annotators=["a@example.org"], n=2, overlap=1)
    with pytest.raises(ReviewError, match=r"refused the API key \(HTTP 401"):
        push_study(store, "s", LabelStudioClient(URL, "f" * 40))
    assert "f" * 40 not in str(store.execute("SELECT * FROM runs").fetchall())


def test_missing_accounts_are_all_named_at_once_with_the_public_invite_link(admin, people, tmp_path):
    store = F.make_store(tmp_path / "m.duckdb")
    missing = [f"nobody{i}-{uuid.uuid4().hex[:6]}@example.org" for i in range(3)]
    create_study(store, "s", annotators=[people["ann1"][0], *missing], n=3, overlap=1)
    public = LabelStudioClient(URL, KEY, public="https://review.lab.example")
    with pytest.raises(ReviewError) as err:
        push_study(store, "s", public)
    msg = str(err.value)
    assert "3 people have no Label Studio account" in msg
    assert all(e in msg for e in missing) and people["ann1"][0] not in msg
    assert "https://review.lab.example/user/signup/?token=" in msg and URL not in msg
    assert store.execute("SELECT count(*) FROM review_projects").fetchone()[0] == 0


def test_another_users_annotation_never_removes_the_owners_label(admin, people, tmp_path):
    """The issue-14 reproduction: one annotator, one task; the owner labels, then somebody else does."""
    store = F.make_store(tmp_path / "own.duckdb")
    (e1, tok1), (_, tok_out) = people["ann1"], people["outsider"]
    name = "own-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1], n=1, seed=4, overlap=1, trace_ids=["t-cjk"])
    push_study(store, name, admin)
    p1 = _pseudonym(store, e1)
    [task] = _tasks(admin, _project_of(store, name, p1))
    key = (task["data"]["trace_id"], task["data"]["segment_index"])
    mine = _sdk(tok1).annotations.create(id=task["id"], result=_choice("reflection"))
    first = pull_study(store, name, admin)
    assert (first.labels_written, first.labels_removed, first.rejected) == (1, 0, [])
    stored = _labels_snapshot(store)

    theirs = _sdk(tok_out).annotations.create(id=task["id"], result=_choice("fact"))
    second = pull_study(store, name, admin)
    assert (second.labels_written, second.labels_unchanged, second.labels_removed) == (0, 1, 0)
    assert second.removed == [] and second.replaced == [] and second.superseded == []
    assert len(second.rejected) == 1 and f"annotation {theirs.id} " in second.rejected[0] and "not by" in second.rejected[0]
    assert _labels_snapshot(store) == stored
    assert [(x.trace_id, x.segment_index, x.label, x.extra["ls_annotation_id"]) for x in store.labels(source="human", study=name)] == [
        (*key, "reflection", mine.id)]
    assert dict(store.execute("SELECT ls_annotation_id, status FROM review_annotations WHERE study = ?", [name]).fetchall()) == {
        mine.id: "label", theirs.id: "rejected"}

    # The other user edits the owner's annotation: its new content is not the owner's; the stored label stays.
    _sdk(tok_out).annotations.update(id=mine.id, result=_choice("execution"))
    third = pull_study(store, name, admin)
    assert third.labels_written == 0 and third.labels_removed == 0 and third.removed == []
    assert any(f"annotation {mine.id} " in r and "last saved by" in r for r in third.rejected)
    assert [x.label for x in store.labels(source="human", study=name)] == ["reflection"]

    # The owner saves their annotation again: theirs again, and the replacement is named.
    _sdk(tok1).annotations.update(id=mine.id, result=_choice("planning"))
    fourth = pull_study(store, name, admin)
    assert fourth.labels_written == 1 and len(fourth.replaced) == 1
    assert fourth.replaced[0].startswith(f"{p1} {key[0]}#{key[1]}: reflection (annotation {mine.id}) -> planning")
    # ... and deleting it removes the label, named with the reason.
    _sdk(tok1).annotations.delete(id=mine.id)
    fifth = pull_study(store, name, admin)
    assert fifth.labels_removed == 1 and fifth.removed == [
        f"{p1} {key[0]}#{key[1]}: planning removed: annotation {mine.id} no longer exists in Label Studio (deleted)"]


def test_edited_config_outside_codebook_and_foreign_annotator(admin, people, tmp_path):
    store = F.make_store(tmp_path / "c.duckdb")
    (e1, tok1), (_, tok_out) = people["ann1"], people["outsider"]
    name = "cfg-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1], n=3, seed=5, overlap=1)
    push_study(store, name, admin)
    pid = _project_of(store, name, _pseudonym(store, e1))
    tasks = _tasks(admin, pid)

    # A label outside the codebook: refused, nothing written.
    _sdk(tok1).annotations.create(id=tasks[0]["id"], result=_choice("planning"))
    bad = _sdk(tok1).annotations.create(id=tasks[1]["id"], result=_choice("musing"))
    before = (_labels_snapshot(store), store.execute("SELECT count(*) FROM review_annotations").fetchone()[0])
    with pytest.raises(ReviewError, match=r"'musing' is not in the codebook"):
        pull_study(store, name, admin)
    assert (_labels_snapshot(store), store.execute("SELECT count(*) FROM review_annotations").fetchone()[0]) == before
    _sdk(tok1).annotations.delete(id=bad.id)

    # Someone else annotates in ann1's project: rejected, never a label.
    _sdk(tok_out).annotations.create(id=tasks[2]["id"], result=_choice("fact"))
    rep = pull_study(store, name, admin)
    assert rep.labels_written == 1 and len(rep.rejected) == 1 and "not by" in rep.rejected[0]
    assert [(lab.trace_id, lab.segment_index, lab.label) for lab in store.labels(source="human", study=name)] == [
        (tasks[0]["data"]["trace_id"], tasks[0]["data"]["segment_index"], "planning")
    ]

    # The labeling config is edited by hand in the UI: push and pull refuse; --restore-config repairs.
    cfg_xml = _sdk(KEY).projects.get(pid).label_config
    _sdk(KEY).projects.update(pid, label_config=cfg_xml.replace('<Choice value="fact" hotkey="4"/>', '<Choice value="fact" hotkey="4"/><Choice value="musing"/>'))
    before = _labels_snapshot(store)
    with pytest.raises(ReviewError, match="edited by hand"):
        pull_study(store, name, admin)
    with pytest.raises(ReviewError, match="edited by hand"):
        push_study(store, name, admin)
    assert _labels_snapshot(store) == before
    push_study(store, name, admin, restore_config=True)
    assert _sdk(KEY).projects.get(pid).label_config == cfg_xml
    assert pull_study(store, name, admin).labels_unchanged == 1


def test_cli_push_pull_status(admin, people, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    store = F.make_store(tmp_path / "cli.duckdb")
    store.close()
    (e1, _), (e2, _) = people["ann1"], people["ann2"]
    monkeypatch.setenv("LABEL_STUDIO_URL", URL)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", KEY)
    public = "https://review.lab.example"
    monkeypatch.setenv("LABEL_STUDIO_PUBLIC_URL", public)
    db = str(tmp_path / "cli.duckdb")
    runner = CliRunner()
    r = runner.invoke(app, ["review", "create", "cli", "-a", e1, "-a", e2, "--n", "4", "--overlap", "2", "--db", db])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["review", "push", "cli", "--db", db])
    assert r.exit_code == 0, r.output
    with Store(db) as st:  # each person's project link, at the PUBLIC url, is printed whole on one line
        for email in (e1, e2):
            link = f"{public}/projects/{_project_of(st, 'cli', _pseudonym(st, email))}/data"
            assert any(link in line for line in r.output.splitlines()), r.output
    assert URL not in r.output  # no loopback link reaches people on other machines
    r = runner.invoke(app, ["review", "pull", "cli", "--db", db])
    assert r.exit_code == 0 and "labels written 0" in r.output, r.output
    r = runner.invoke(app, ["review", "status", "cli", "--db", db])
    assert r.exit_code == 0 and "never" not in r.output, r.output
    assert "disagreements: 0 (adjudicated 0, open 0)" in r.output and e1 not in r.output
    r = runner.invoke(app, ["review", "status", "cli", "--db", db, "--show-people"])
    assert r.exit_code == 0 and e1 in r.output and e2 in r.output, r.output
    # Adjudicating while annotation is open warns that every member can browse the adjudication project.
    r = runner.invoke(app, ["review", "adjudicate", "cli", "--adjudicator", people["adj"][0], "--db", db])
    assert r.exit_code == 0, r.output
    assert "annotation is still open" in r.output and "every member" in r.output and f"{public}/projects/" in r.output
    with Store(db) as st:
        assert "@" not in str(st.execute("SELECT * FROM runs").fetchall())  # --show-people never reaches the store
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "f" * 40)
    r = runner.invoke(app, ["review", "pull", "cli", "--db", db])
    assert r.exit_code == 2 and "refused the API key" in r.output


def test_blind_span_study_premade_regions_carry_no_judge_label(admin, people, tmp_path):
    store = F.make_store(tmp_path / "bs.duckdb")
    (e1, _) = people["ann1"]
    name = "bspan-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1], strategy="trace", n_traces=2, seed=4, overlap=1, blind=True, mode="span")
    push_study(store, name, admin)
    pid = _project_of(store, name, _pseudonym(store, e1))
    preds = list(_sdk(KEY).predictions.list(project=pid))
    assert len(preds) == 2
    for p in preds:
        assert p.model_version == "ror-segments"
        assert {r["type"] for r in p.result} == {"labels"}  # regions only: no behavior, no judge
        assert {lab for r in p.result for lab in r["value"]["labels"]} == {"segment"}


def test_copied_task_is_rejected_and_a_deleted_annotation_removes_its_label(admin, people, tmp_path):
    store = F.make_store(tmp_path / "dup.duckdb")
    (e1, tok1) = people["ann1"]
    name = "dup-" + uuid.uuid4().hex[:6]
    create_study(store, name, annotators=[e1], n=3, seed=2, overlap=1)
    push_study(store, name, admin)
    pid = _project_of(store, name, _pseudonym(store, e1))
    tasks = sorted(_tasks(admin, pid), key=lambda t: t["id"])
    ls = _sdk(tok1)
    first = ls.annotations.create(id=tasks[0]["id"], result=_choice("planning"))
    ls.annotations.create(id=tasks[1]["id"], result=_choice("fact"))
    assert pull_study(store, name, admin).labels_written == 2
    # Somebody imports a copy of task 0 by hand (same data, so the same ror_external_id) and labels it,
    # and the annotator deletes the original annotation: the copy is not a task ror pushed.
    copy = _sdk(KEY).projects.import_tasks(id=pid, request=[{"data": tasks[0]["data"]}], return_task_ids=True).task_ids[0]
    ls.annotations.create(id=copy, result=_choice("conclusion"))
    ls.annotations.delete(id=first.id)
    rep = pull_study(store, name, admin)
    assert rep.labels_removed == 1 and rep.labels_written == 0
    assert len(rep.rejected) == 1 and f"task {copy} " in rep.rejected[0] and "not pushed by ror" in rep.rejected[0]
    key1 = (tasks[1]["data"]["trace_id"], tasks[1]["data"]["segment_index"])
    assert [(lab.trace_id, lab.segment_index, lab.label) for lab in store.labels(source="human", study=name)] == [(*key1, "fact")]
    # A re-push neither adopts the copy as the task nor creates one; the copy stays rejected.
    assert push_study(store, name, admin).tasks_created == 0
    again = pull_study(store, name, admin)
    assert again.rejected == rep.rejected and again.labels_written == 0


def test_cli_missing_accounts_never_reach_the_runs_table(admin, people, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    F.make_store(tmp_path / "acc.duckdb").close()
    monkeypatch.setenv("LABEL_STUDIO_URL", URL)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", KEY)
    monkeypatch.setenv("LABEL_STUDIO_PUBLIC_URL", "https://review.lab.example")
    db = str(tmp_path / "acc.duckdb")
    missing = [f"late{i}-{uuid.uuid4().hex[:6]}@example.org" for i in range(2)]
    runner = CliRunner()
    r = runner.invoke(app, ["review", "create", "acc", "-a", people["ann1"][0], "-a", missing[0], "-a", missing[1], "--n", "3",
                            "--overlap", "1", "--db", db])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["review", "push", "acc", "--db", db])
    assert r.exit_code != 0
    flat = " ".join(r.output.split())
    assert "2 people have no Label Studio account" in flat and all(e in flat for e in missing), r.output
    assert "https://review.lab.example/user/signup/?token=" in flat.replace(" ", "")  # rich may wrap the long link
    with Store(db) as st:
        assert "@" not in str(st.execute("SELECT * FROM runs").fetchall())
        assert st.execute("SELECT count(*) FROM review_projects").fetchone()[0] == 0
