"""Push a study to Label Studio, pull annotations back as labels, and report progress.

Design (the open-source edition has no task assignment, overlap control or reviewer role):

* one Label Studio project per annotator per study, holding exactly that annotator's assigned
  items, with ``maximum_annotations=1``; overlap is decided by :func:`~.studies.assign_overlap`
  before anything is pushed, so it holds by construction;
* blind studies push no prediction at all (segment mode), so the judge's label never reaches the
  annotator's browser; annotators never share a project, so nobody sees another's annotation;
* on pull every annotation must be ``completed_by`` the project's annotator, and last saved by them
  (``updated_by``); anything else (another user working in someone else's project, or editing
  their annotation) is rejected and reported, never stored as a label, and never changes what is
  stored for the project's annotator: "superseded" is decided only among the owner's own
  annotations of a task, and a label whose annotation another user edited is kept as it was;
* task identity is the stable ``ror_external_id`` in task data; pushing reads the project's tasks
  back first, so re-pushing never duplicates a task;
* pulls are idempotent: keyed by Label Studio annotation id and ``updated_at``; unchanged
  annotations are not rewritten, changed ones replace the label (``Label.label_id`` is one per
  segment, source, annotator, codebook and study), deleted or skipped ones remove it; every label a
  pull removes or replaces is named in :class:`PullReport`;
* the labeling config's sha256 is recorded at creation; a config edited by hand in the UI is
  detected and refused on push and pull.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import CodebookError, ReviewError
from ..records import BEHAVIORS, Annotator, Label, Segment, Trace, utc_now
from ..store import to_naive_utc
from . import config as cfg
from .labelstudio import LabelStudioClient, anchor_span
from .studies import Study, assignments, ensure_tables, load_study, person_email, study_people, update_study

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

ANNOTATOR_ROLE = "annotator"
ADJUDICATION_ROLE = "adjudication"


@dataclass(frozen=True)
class ProjectRef:
    """One Label Studio project of a study (``role`` ``"annotator"`` or ``"adjudication"``)."""

    study: str
    role: str
    pseudonym: str
    server_url: str
    ls_project_id: int
    config_sha256: str


@dataclass
class PushReport:
    """What a push did, per project: ``(pseudonym, project id, project URL, tasks created, tasks total)``."""

    projects_created: int = 0
    tasks_created: int = 0
    tasks_total: int = 0
    projects: list[tuple[str, int, str, int, int]] = field(default_factory=list)


@dataclass
class PullReport:
    """What a pull did.

    ``rejected`` holds one human-readable reason per rejected annotation or span region;
    ``superseded`` one line per older annotation of a person replaced by their newer one;
    ``removed`` and ``replaced`` name every stored label the pull deleted or overwrote (annotator
    pseudonym, segment, old and new label, why); ``reanchored`` names every span region placed on
    its segment only by searching for its text (its offsets matched neither code points nor
    UTF-16 units).
    """

    labels_written: int = 0
    labels_unchanged: int = 0
    labels_removed: int = 0
    skips: int = 0
    rejected: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    reanchored: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ helpers
def codebook_summary(study: Study) -> str:
    """Summary of the study's codebook, after checking it is the version the study was created with."""
    from ..codebook import load_codebook, summary

    cb = load_codebook(study.codebook_name)
    if cb.sha256 != study.codebook_version:
        raise CodebookError(
            f"study {study.name!r} was created with codebook {study.codebook_name} sha256 {study.codebook_version[:12]}, "
            f"but that name now loads sha256 {cb.sha256[:12]}; restore the frozen file or create a new study"
        )
    return summary(cb)


def study_config(study: Study, role: str) -> str:
    """The labeling config XML of a study's project with ``role``."""
    summary = codebook_summary(study)
    if role == ADJUDICATION_ROLE:
        return cfg.adjudication_config(summary)
    return cfg.span_config(summary) if study.mode == "span" else cfg.segment_config(summary)


def _project_refs(store: "Store", study: str, role: str | None = None) -> list[ProjectRef]:
    sql = "SELECT study, role, pseudonym, server_url, ls_project_id, config_sha256 FROM review_projects WHERE study = ?"
    params: list[Any] = [study]
    if role is not None:
        sql += " AND role = ?"
        params.append(role)
    return [ProjectRef(*r) for r in store.execute(sql + " ORDER BY role, pseudonym", params).fetchall()]


def _check_config(client: LabelStudioClient, ref: ProjectRef) -> Any:
    project = client.project(ref.ls_project_id)
    if project is None:
        raise ReviewError(
            f"project {ref.ls_project_id} of study {ref.study!r} ({ref.role} {ref.pseudonym}) no longer exists at "
            f"{client.url}; its annotations are gone from the server. Create a new study to start over"
        )
    if cfg.config_sha256(project.label_config or "") != ref.config_sha256:
        raise ReviewError(
            f"the labeling config of project {ref.ls_project_id} ({client.project_url(ref.ls_project_id)}) was edited by hand "
            f"in the Label Studio UI: its sha256 no longer matches the config ror pushed for study {ref.study!r}. Labels "
            "given under another config cannot be trusted, so ror refuses to continue. Undo the edit (Settings > Labeling "
            f"Interface) or run `ror review push {ref.study} --restore-config`"
        )
    return project


def user_ids(store: "Store", client: LabelStudioClient, pseudonyms: Sequence[str], users: dict[str, int] | None = None) -> dict[str, int]:
    """``{pseudonym: Label Studio user id}`` for every person given, recording the ids in ``review_people``.

    Raises
    ------
    ReviewError
        One or more people have no account on the server: the message names all of them at once
        (pseudonym and e-mail, local output only) with the organization's invite link.
    """
    users = users if users is not None else client.users_by_email()
    emails = {p: person_email(store, p) for p in dict.fromkeys(pseudonyms)}
    missing = [f"{p} ({e})" for p, e in emails.items() if e not in users]
    if missing:
        raise _no_accounts(client, missing)
    out = {}
    for p, e in emails.items():
        out[p] = users[e]
        store.execute("UPDATE review_people SET ls_user_id = ?, server_url = ? WHERE pseudonym = ?", [users[e], client.url, p])
    return out


def require_accounts(
    store: "Store", name: str, client: LabelStudioClient, *, adjudicator: str | None = None, adjudicating: bool = False
) -> None:
    """Check, before a command starts its run, that everybody it needs has an account on the server.

    Push needs every annotator; pull also the adjudicator once an adjudication project exists;
    ``adjudicating`` adds the study's adjudicator, and ``adjudicator`` (an e-mail) a new one. Done before :meth:`Store.run` so that the error,
    which names people by e-mail for the person running ror, never reaches the ``runs`` table.

    Raises
    ------
    ReviewError
        As :func:`user_ids`: all people without an account, at once, with the invite link.
    """
    from .studies import pseudonym_for

    ensure_tables(store)
    study = load_study(store, name)
    people = list(study_people(store, name))
    if study.adjudicator and (adjudicating or _project_refs(store, name, ADJUDICATION_ROLE)):
        people.append(study.adjudicator)
    pairs = {p: person_email(store, p) for p in people}
    if adjudicator:  # possibly not registered in this store yet: computed, not written
        email = adjudicator.strip().lower()
        pairs.setdefault(pseudonym_for(store, email), email)
    users = client.users_by_email()
    missing = [f"{p} ({e})" for p, e in pairs.items() if e not in users]
    if missing:
        raise _no_accounts(client, missing)


def _no_accounts(client: LabelStudioClient, missing: list[str]) -> ReviewError:
    return ReviewError(
        f"{len(missing)} {'person has' if len(missing) == 1 else 'people have'} no Label Studio account at {client.public_url}: "
        f"{', '.join(missing)}. Send them the invite link {client.invite_url()} to sign up with exactly these e-mails, "
        "then run the command again"
    )


def _user_id(store: "Store", client: LabelStudioClient, pseudonym: str, users: dict[str, int] | None = None) -> int:
    return user_ids(store, client, [pseudonym], users)[pseudonym]


def _get_or_create_project(
    store: "Store", client: LabelStudioClient, study: Study, role: str, pseudonym: str, *, restore_config: bool = False
) -> tuple[ProjectRef, bool]:
    xml = study_config(study, role)
    existing = [r for r in _project_refs(store, study.name, role) if r.pseudonym == pseudonym]
    if existing:
        ref = existing[0]
        if ref.server_url != client.url:
            raise ReviewError(f"study {study.name!r} lives on {ref.server_url}, not {client.url}: pass --url {ref.server_url}")
        if restore_config and cfg.config_sha256(xml) == ref.config_sha256:
            client.set_config(ref.ls_project_id, xml)
        _check_config(client, ref)
        return ref, False
    mv = _model_version(study) if role == ANNOTATOR_ROLE else None
    title = f"ror {study.name} / {pseudonym}" if role == ANNOTATOR_ROLE else f"ror {study.name} / adjudication"
    description = (
        f"ror_annotate study {study.name!r} ({study.mode} mode, {'blind' if study.blind else 'non-blind'}), "
        f"{role} {pseudonym}, codebook {study.codebook_name} ({study.codebook_version[:12]}). "
        "Only the named person labels this project."
    )
    show = role == ANNOTATOR_ROLE and (study.mode == "span" or not study.blind)
    pid = client.create_project(title=title, description=description, label_config=xml, model_version=mv, show_predictions=show)
    ref = ProjectRef(study.name, role, pseudonym, client.url, pid, cfg.config_sha256(xml))
    store.execute(
        "INSERT INTO review_projects VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
        [ref.study, ref.role, ref.pseudonym, ref.server_url, ref.ls_project_id, ref.config_sha256, to_naive_utc(utc_now())],
    )
    return ref, True


def _model_version(study: Study) -> str | None:
    if study.blind:
        return "ror-segments" if study.mode == "span" else None
    return f"{study.judge_annotator}@{study.codebook_version[:12]}"


def _segments_by_trace(store: "Store", trace_ids: set[str]) -> dict[str, list[Segment]]:
    out: dict[str, list[Segment]] = {}
    for tid in sorted(trace_ids):
        out[tid] = store.segments(tid)
    return out


def judge_labels_for(store: "Store", study: Study) -> dict[tuple[str, int], Label]:
    """The judge label per segment that a non-blind study shows (its ``judge_annotator``).

    When the judge labeled a segment under several codebook versions, the study's codebook wins,
    then the newest label.
    """
    if not study.judge_annotator:
        return {}
    best: dict[tuple[str, int], Label] = {}
    for lab in store.labels(source=["judge", "baseline"], annotator=study.judge_annotator):
        key = (lab.trace_id, lab.segment_index)
        old = best.get(key)
        rank = (lab.codebook_version == study.codebook_version, lab.created_at)
        if old is None or rank > (old.codebook_version == study.codebook_version, old.created_at):
            best[key] = lab
    return best


# ------------------------------------------------------------------------------------ tasks
def _segment_task(study: Study, trace: Trace, segs: list[Segment], pos: int, ext: str, shown: Label | None, **extra: Any) -> dict:
    seg = segs[pos]
    data = {
        "ror_external_id": ext, "ror_study": study.name, "trace_id": seg.trace_id, "segment_index": seg.segment_index,
        "char_start": seg.char_start, "char_end": seg.char_end, "segment": seg.text,
        "problem_html": cfg.problem_html(trace), "context_html": cfg.context_html(trace, segs, pos, study.context_chars),
        **extra,
    }
    task: dict[str, Any] = {"data": data}
    if shown is not None:
        pred: dict[str, Any] = {"model_version": _model_version(study), "result": [cfg.choice_result(shown.label)]}
        if shown.confidence is not None:
            pred["score"] = shown.confidence
        task["predictions"] = [pred]
    return task


def _span_task(study: Study, trace: Trace, segs: list[Segment], ext: str, judge: dict[tuple[str, int], Label]) -> dict:
    result: list[dict] = []
    for s in segs:
        shown = None if study.blind else judge[(s.trace_id, s.segment_index)].label
        result += cfg.region_results(s, shown)
    data = {"ror_external_id": ext, "ror_study": study.name, "trace_id": trace.trace_id, "trace": trace.text,
            "problem_html": cfg.problem_html(trace), "segment_indices": [s.segment_index for s in segs]}
    return {"data": data, "predictions": [{"model_version": _model_version(study), "result": result}]}


def _server_tasks(client: LabelStudioClient, project_id: int) -> dict[str, dict]:
    """``{ror_external_id: task}``; of several tasks with one id (a hand-made copy), the first imported one."""
    out: dict[str, dict] = {}
    for t in sorted(client.export_tasks(project_id), key=lambda t: int(t["id"])):
        ext = t.get("data", {}).get("ror_external_id")
        if ext:
            out.setdefault(ext, t)
    return out


def _record_tasks(store: "Store", study: Study, ref: ProjectRef, tasks: dict[str, dict], shown: dict[str, tuple[str | None, str | None]]) -> None:
    rows = []
    for ext, t in tasks.items():
        d = t["data"]
        label, mv = shown.get(ext, (None, None))
        rows.append((study.name, ref.ls_project_id, ext, int(t["id"]), d["trace_id"], d.get("segment_index"), label, mv))
    if rows:
        store.con.executemany("INSERT OR REPLACE INTO review_tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)


def push_study(store: "Store", name: str, client: LabelStudioClient, *, restore_config: bool = False) -> PushReport:
    """Create or reuse each annotator's project and import the tasks not yet there.

    Idempotent: tasks are identified by ``data.ror_external_id`` (``"<study>/<trace_id>#<index>"`` in
    segment mode, ``"<study>/<trace_id>"`` in span mode) read back from the server, so re-pushing
    creates nothing new.

    Raises
    ------
    ReviewError
        Server unreachable, bad token, an annotator without an account (the message gives the
        invite link), a config edited in the UI, a project deleted on the server.
    CodebookError
        The study's codebook file changed since the study was created.
    """
    ensure_tables(store)
    study = load_study(store, name)
    if study.server_url and study.server_url != client.url:
        raise ReviewError(f"study {name!r} was pushed to {study.server_url}, not {client.url}: pass --url {study.server_url}")
    client.whoami()
    users = client.users_by_email()
    people = study_people(store, name)
    user_ids(store, client, people, users)  # every annotator needs an account before anything is created
    judge = judge_labels_for(store, study) if not study.blind else {}
    report = PushReport()
    for person in people:
        ref, created = _get_or_create_project(store, client, study, ANNOTATOR_ROLE, person, restore_config=restore_config)
        report.projects_created += int(created)
        keys = assignments(store, name, person)
        by_trace = _segments_by_trace(store, {k[0] for k in keys})
        wanted = defaultdict(set)
        for tid, idx in keys:
            wanted[tid].add(idx)
        tasks: dict[str, dict] = {}
        shown: dict[str, tuple[str | None, str | None]] = {}
        for trace in store.iter_traces(sorted(by_trace)):
            segs = by_trace[trace.trace_id]
            if study.mode == "span":
                ext = f"{name}/{trace.trace_id}"
                tasks[ext] = _span_task(study, trace, [s for s in segs if s.segment_index in wanted[trace.trace_id]], ext, judge)
                continue
            for pos, s in enumerate(segs):
                if s.segment_index in wanted[trace.trace_id]:
                    ext = f"{name}/{s.trace_id}#{s.segment_index}"
                    lab = judge.get((s.trace_id, s.segment_index))
                    tasks[ext] = _segment_task(study, trace, segs, pos, ext, lab)
                    shown[ext] = (lab.label, _model_version(study)) if lab else (None, None)
        on_server = _server_tasks(client, ref.ls_project_id)
        missing = [t for ext, t in tasks.items() if ext not in on_server]
        if missing:
            report.tasks_created += client.import_tasks(ref.ls_project_id, missing)
            on_server = _server_tasks(client, ref.ls_project_id)
        with store.transaction():
            _record_tasks(store, study, ref, {e: t for e, t in on_server.items() if e in tasks}, shown)
        report.tasks_total += len(tasks)
        report.projects.append((person, ref.ls_project_id, client.project_url(ref.ls_project_id), len(missing), len(tasks)))
    update_study(store, name, state="pushed" if study.state == "created" else study.state, server_url=client.url)
    return report


# ------------------------------------------------------------------------------------ pull
@dataclass
class _Parsed:
    """One annotation's outcome before anything is written.

    ``keep_stored``: the annotation is the owner's newest on its task but another user saved it
    last, so its content is rejected and what is stored for that task stays as it was.
    """

    ls_annotation_id: int
    ls_task_id: int
    completed_by: int | None
    updated_at: str
    status: str  # "label" | "skip" | "rejected" | "superseded"
    reason: str | None = None
    labels: list[Label] = field(default_factory=list)
    keep_stored: bool = False
    region_problems: list[str] = field(default_factory=list)
    reanchored: list[str] = field(default_factory=list)


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _note(result: list[dict]) -> str | None:
    texts = [t for r in result if r.get("from_name") == cfg.NOTE_FROM for t in r.get("value", {}).get("text", [])]
    return "\n".join(texts).strip() or None


def _choice(item: dict, where: str, bad: list[str]) -> str | None:
    values = item.get("value", {}).get("choices", [])
    if len(values) != 1:
        bad.append(f"{where}: expected exactly one behavior, got {values}")
        return None
    if values[0] not in BEHAVIORS:
        bad.append(f"{where}: label {values[0]!r} is not in the codebook ({', '.join(BEHAVIORS)})")
        return None
    return values[0]


def _classify(ann: dict, p: _Parsed, *, owner: str, user_id: int, newest_own: int | None, where: str) -> None:
    """Set ``p.status`` for an annotation ``completed_by`` the project's owner.

    Only the owner's own annotations of a task compete: the one created last is their answer and
    older ones are superseded. Another user's annotation on the task never takes part, so it can
    neither supersede nor displace the owner's (issue 14). Creation order (the annotation id), not
    ``updated_at``, decides, because another user's edit of an old annotation bumps ``updated_at``.
    """
    editor = ann.get("updated_by")
    if newest_own is not None:
        p.status, p.reason = "superseded", (
            f"{where}: an older annotation by {owner} on the same task (their newest is annotation {newest_own})")
    elif editor is not None and editor != user_id:
        p.status, p.keep_stored = "rejected", True
        p.reason = (f"{where}: {owner}'s annotation was last saved by Label Studio user {editor}, not by {owner}; its content "
                    f"is not {owner}'s, so it is not imported and what is stored for this task is kept as it was")
    elif ann.get("was_cancelled"):
        p.status = "skip"


def _parse_project(
    store: "Store", client: LabelStudioClient, study: Study, ref: ProjectRef, user_id: int, run_id: str | None, bad: list[str],
    *, strict_offsets: bool = False,
) -> list[_Parsed]:
    """Read one project's annotations into labels; codebook violations go to ``bad``."""
    _check_config(client, ref)
    source = "adjudicated" if ref.role == ADJUDICATION_ROLE else "human"
    annotator = f"adjudicator:{ref.pseudonym}" if ref.role == ADJUDICATION_ROLE else ref.pseudonym
    known = {r[0]: (r[1], r[2], r[3]) for r in store.execute(
        "SELECT external_id, segment_index, shown_label, shown_model_version FROM review_tasks WHERE ls_project_id = ?",
        [ref.ls_project_id]).fetchall()}
    # the task ids ror imported: a copy of a task carries its ror_external_id but is not one of them
    pushed = {int(r[0]) for r in store.execute("SELECT ls_task_id FROM review_tasks WHERE ls_project_id = ?",
                                               [ref.ls_project_id]).fetchall()}
    allowed = set(assignments(store, study.name, ref.pseudonym)) if ref.role == ANNOTATOR_ROLE else None
    out: list[_Parsed] = []
    traces: dict[str, Trace] = {}
    for task in client.export_tasks(ref.ls_project_id):
        data = task.get("data", {})
        ext = data.get("ror_external_id")
        newest_own: int | None = None
        for ann in sorted(task.get("annotations", []), key=lambda a: int(a["id"]), reverse=True):
            p = _Parsed(int(ann["id"]), int(task["id"]), ann.get("completed_by"), ann.get("updated_at") or "", "label")
            where = f"annotation {p.ls_annotation_id} on task {p.ls_task_id} of project {ref.ls_project_id} ({client.project_url(ref.ls_project_id)})"
            out.append(p)
            if ext not in known:
                p.status, p.reason = "rejected", f"{where}: the task was not pushed by ror (no known ror_external_id)"
            elif p.ls_task_id not in pushed:
                p.status, p.reason = "rejected", (
                    f"{where}: the task was not pushed by ror (a copy of the task ror pushed for {ext}, made in Label Studio)")
            elif p.completed_by != user_id:
                p.status, p.reason = "rejected", (
                    f"{where}: completed by Label Studio user {p.completed_by}, not by {ref.pseudonym} whose project this is "
                    f"(another user worked in this project; blinding and overlap are not guaranteed for it); {ref.pseudonym}'s "
                    "own annotations are not affected")
            else:
                _classify(ann, p, owner=ref.pseudonym, user_id=user_id, newest_own=newest_own, where=where)
                newest_own = p.ls_annotation_id if newest_own is None else newest_own
            if p.status != "label":
                continue
            result = ann.get("result") or []
            base = dict(
                source=source, annotator=annotator, codebook_version=study.codebook_version, run_id=run_id, study=study.name,
                created_at=_parse_time(ann["created_at"]), rationale=_note(result),
            )
            extra = {"ls_annotation_id": p.ls_annotation_id, "ls_task_id": p.ls_task_id, "ls_project_id": ref.ls_project_id,
                     "updated_at": p.updated_at, "lead_time_s": ann.get("lead_time")}
            if study.mode == "span" and ref.role == ANNOTATOR_ROLE:
                tid = data["trace_id"]
                if tid not in traces:
                    traces[tid] = store.get_trace(tid)
                p.labels = _span_labels(store, traces[tid], result, allowed, base, extra, where, bad, p, strict_offsets=strict_offsets)
            else:
                choices = [r for r in result if r.get("from_name") == cfg.CHOICE_FROM and r.get("type") == "choices"]
                if len(choices) != 1:
                    p.status, p.reason = "rejected", f"{where}: expected one behavior choice, found {len(choices)}"
                    continue
                label = _choice(choices[0], where, bad)
                if label is None:
                    continue
                idx, shown_label, shown_mv = known[ext]
                key = (data["trace_id"], int(idx))
                if allowed is not None and key not in allowed:
                    p.status, p.reason = "rejected", f"{where}: segment {key[0]}#{key[1]} is not assigned to {ref.pseudonym}"
                    continue
                if ref.role == ANNOTATOR_ROLE and not study.blind:
                    origins = {r.get("origin") for r in choices if r.get("origin")}
                    extra.update(shown_label=shown_label, shown_model_version=shown_mv,
                                 accepted_prediction=label == shown_label, ui_origin=next(iter(origins), None))
                p.labels = [Label(trace_id=key[0], segment_index=key[1], label=label, extra=extra, **base)]
            if not p.labels and p.status == "label":
                p.status, p.reason = "rejected", p.reason or f"{where}: no usable label in the annotation"
    return out


def _span_labels(
    store: "Store", trace: Trace, result: list[dict], allowed: set | None, base: dict, extra: dict, where: str, bad: list[str],
    p: _Parsed, *, strict_offsets: bool = False,
) -> list[Label]:
    """Labels of a span-mode annotation, one per region placed on a study segment.

    Regions placed only by text search (offsets match neither code points nor UTF-16 units) go to
    ``p.reanchored`` and their labels carry ``anchored_by="text-search"``, ``re_anchored=True``;
    with ``strict_offsets`` they are rejected instead. Regions that cannot be placed on a segment
    go to ``p.region_problems``, one entry each.
    """
    segs = {(s.char_start, s.char_end): s for s in store.segments(trace.trace_id)}
    regions = {r.get("id"): r for r in result if r.get("type") == "labels"}
    labels: list[Label] = []
    for item in result:
        if item.get("from_name") != cfg.CHOICE_FROM or item.get("type") != "choices":
            continue
        rid = item.get("id")
        at = f"{where}, region {rid!r}"
        value = dict(regions.get(rid, {}).get("value", {}))
        value.update({k: v for k, v in item.get("value", {}).items() if k in ("start", "end", "text")})
        if "start" not in value or "end" not in value:
            p.region_problems.append(f"{at}: the region has no offsets")
            continue
        label = _choice(item, at, bad)
        if label is None:
            continue
        start, end = int(value["start"]), int(value["end"])
        try:
            a = anchor_span(trace.text, start, end, value.get("text", ""))
        except ReviewError as exc:
            p.region_problems.append(f"{at}: {exc.message}")
            continue
        if a.how == "text-search":
            moved = (f"{at}: offsets [{start}, {end}) match neither code points nor UTF-16 units; its text "
                     f"{value.get('text', '')[:40]!r} occurs once, at [{a.start}, {a.end})")
            if strict_offsets:
                p.region_problems.append(moved + ", but --strict-offsets refuses re-anchoring")
                continue
        seg = segs.get((a.start, a.end))
        if seg is None or (allowed is not None and (seg.trace_id, seg.segment_index) not in allowed):
            p.region_problems.append(
                f"{at}: [{a.start}, {a.end}) ({a.how}) is not one of the study's segments of trace {trace.trace_id!r}")
            continue
        if a.how == "text-search":
            p.reanchored.append(f"{moved}, re-anchored to segment {seg.trace_id}#{seg.segment_index}")
        labels.append(Label(trace_id=seg.trace_id, segment_index=seg.segment_index, label=label,
                            extra={**extra, "region_id": rid, "anchored_by": a.how, "re_anchored": a.how == "text-search"}, **base))
    if p.region_problems:
        p.reason = "; ".join(p.region_problems)
    return labels


def pull_study(
    store: "Store", name: str, client: LabelStudioClient, *, run_id: str | None = None, strict_offsets: bool = False
) -> PullReport:
    """Import every annotation of the study's projects (annotators' and adjudication) as labels.

    Human labels get ``source="human"`` and the annotator's pseudonym; adjudications get
    ``source="adjudicated"`` and ``"adjudicator:<pseudonym>"``. Skips are recorded in
    ``review_annotations`` (status ``skip``), never as labels. Everything is validated before the
    first write, and all writes happen in one transaction.

    The stored labels of annotator A depend only on A's own annotations in A's own project: an
    annotation by anybody else, in any project, is rejected and changes nothing stored for A.
    Every label the pull removes or replaces is named in the report (``removed``, ``replaced``).

    Parameters
    ----------
    strict_offsets : bool
        Span mode: reject regions whose offsets match neither code points nor UTF-16 units instead
        of re-anchoring them by searching for their text (re-anchored regions are reported either way).

    Raises
    ------
    ReviewError
        Server unreachable, bad token, config edited in the UI, people without an account, or
        labels outside the codebook (the message lists them; nothing is written).
    """
    ensure_tables(store)
    study = load_study(store, name)
    refs = _project_refs(store, name)
    if not refs:
        raise ReviewError(f"study {name!r} has not been pushed yet: run `ror review push {name}` first")
    client.whoami()
    uids = user_ids(store, client, [ref.pseudonym for ref in refs])
    bad: list[str] = []
    parsed: list[tuple[ProjectRef, list[_Parsed]]] = []
    for ref in refs:
        parsed.append((ref, _parse_project(store, client, study, ref, uids[ref.pseudonym], run_id, bad, strict_offsets=strict_offsets)))
    if bad:
        raise ReviewError(
            f"{len(bad)} annotations of study {name!r} carry labels outside the codebook {study.codebook_name}; "
            f"nothing was imported. Fix them in Label Studio (or check the labeling config): " + "; ".join(bad[:5])
            + (" ..." if len(bad) > 5 else "")
        )
    report = PullReport()
    with store.transaction():
        for ref, items in parsed:
            _write_project(store, study, ref, items, report)
            store.execute("UPDATE review_projects SET last_pull_at = ? WHERE ls_project_id = ? AND study = ?",
                          [to_naive_utc(utc_now()), ref.ls_project_id, name])
    return report


def _why_gone(old: Label, by_id: dict[int, _Parsed]) -> str:
    ann = old.extra.get("ls_annotation_id")
    p = by_id.get(ann) if isinstance(ann, int) else None
    if p is None:
        return f"annotation {ann} no longer exists in Label Studio (deleted)"
    if p.status == "skip":
        return f"annotation {ann} is now a skip"
    if p.status == "superseded":
        return f"annotation {ann} is superseded by a newer annotation of the same person"
    if p.status == "rejected":
        return f"annotation {ann} is rejected now ({p.reason})"
    return f"annotation {ann} no longer labels this segment"


def _write_project(store: "Store", study: Study, ref: ProjectRef, items: list[_Parsed], report: PullReport) -> None:
    source = "adjudicated" if ref.role == ADJUDICATION_ROLE else "human"
    annotator = f"adjudicator:{ref.pseudonym}" if ref.role == ADJUDICATION_ROLE else ref.pseudonym
    before = {r[0]: (r[1], r[2]) for r in store.execute(
        "SELECT ls_annotation_id, updated_at, status FROM review_annotations WHERE ls_project_id = ?", [ref.ls_project_id]).fetchall()}
    current = {lab.label_id: lab for lab in store.labels(source=source, annotator=annotator, study=study.name)}
    by_id = {p.ls_annotation_id: p for p in items}
    keep: set[str] = set()
    fresh: list[Label] = []
    for p in items:
        if p.status == "skip":
            report.skips += 1
        if p.region_problems:
            report.rejected.extend(p.region_problems)
        elif p.reason and p.status == "rejected":
            report.rejected.append(p.reason)
        elif p.reason and p.status == "superseded":
            report.superseded.append(p.reason)
        report.reanchored.extend(p.reanchored)
        for lab in p.labels:
            keep.add(lab.label_id)
            old = current.get(lab.label_id)
            if before.get(p.ls_annotation_id) == (p.updated_at, p.status) and old is not None and old.extra.get("ls_annotation_id") == p.ls_annotation_id:
                report.labels_unchanged += 1
                continue
            fresh.append(lab)
            if old is not None:
                report.replaced.append(
                    f"{annotator} {lab.trace_id}#{lab.segment_index}: {old.label} (annotation {old.extra.get('ls_annotation_id')}) "
                    f"-> {lab.label} (annotation {p.ls_annotation_id}, updated {p.updated_at})")
    # Another account saved the owner's newest annotation of a task last: its content is unknown, so
    # whatever is stored for that task stays exactly as it was (an edit never takes away what the owner gave).
    frozen = {p.ls_task_id for p in items if p.keep_stored}
    for lid, old in current.items():
        if lid not in keep and old.extra.get("ls_task_id") in frozen:
            keep.add(lid)
    stale = [lid for lid in current if lid not in keep]
    for lid in stale:
        old = current[lid]
        report.removed.append(f"{annotator} {old.trace_id}#{old.segment_index}: {old.label} removed: {_why_gone(old, by_id)}")
    if stale:
        report.labels_removed += store.delete_labels(stale)
    report.labels_written += store.upsert_labels(fresh)
    _declare_human(store, study, ref, annotator, source)
    store.execute("DELETE FROM review_annotations WHERE ls_project_id = ?", [ref.ls_project_id])
    if items:
        store.con.executemany(
            "INSERT INTO review_annotations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(ref.ls_project_id, p.ls_annotation_id, study.name, ref.role, ref.pseudonym, p.ls_task_id, p.completed_by,
              p.updated_at, p.status, p.reason, len(p.labels)) for p in items],
        )


def _declare_human(store: "Store", study: Study, ref: ProjectRef, annotator: str, source: str) -> None:
    """Declare the project's person as a human rater (pseudonym only), keeping every study they labelled in."""
    before = store.declared_annotators().get(annotator)
    studies = sorted({*(before.details.get("studies", []) if before is not None else []), study.name})
    role = "adjudicator" if ref.role == ADJUDICATION_ROLE else "annotator"
    store.upsert_annotators([Annotator(
        annotator=annotator, kind="human", source=source, codebook_version=study.codebook_version, study=study.name,
        details={"role": role, "pseudonym": ref.pseudonym, "studies": studies},
    )])


# ------------------------------------------------------------------------------------ status
@dataclass(frozen=True)
class AnnotatorProgress:
    """Progress of one annotator (or the adjudicator) as of the last pull. Counts are segments."""

    pseudonym: str
    role: str
    assigned: int
    labeled: int
    skipped: int
    rejected: int
    project_id: int | None
    last_pull_at: datetime | None

    @property
    def remaining(self) -> int:
        return max(self.assigned - self.labeled - self.skipped, 0)


def study_status(store: "Store", name: str) -> list[AnnotatorProgress]:
    """Per-annotator progress from the store (as of the last pull; no server needed).

    Segment counts: ``skipped`` counts skipped tasks (a whole trace's segments in span mode).
    The adjudication row's ``assigned`` is the number of disagreements pushed for adjudication.
    """
    ensure_tables(store)
    study = load_study(store, name)
    refs = {(r.role, r.pseudonym): r for r in _project_refs(store, name)}
    out = []
    for person in study_people(store, name):
        out.append(_progress(store, study, person, ANNOTATOR_ROLE, len(assignments(store, name, person)), refs.get((ANNOTATOR_ROLE, person))))
    for (role, person), ref in refs.items():
        if role == ADJUDICATION_ROLE:
            n = _count(store, "SELECT count(*) FROM review_tasks WHERE ls_project_id = ?", [ref.ls_project_id])
            out.append(_progress(store, study, person, role, n, ref))
    return out


def _progress(store: "Store", study: Study, person: str, role: str, assigned: int, ref: ProjectRef | None) -> AnnotatorProgress:
    source, annotator = ("adjudicated", f"adjudicator:{person}") if role == ADJUDICATION_ROLE else ("human", person)
    labeled = len(store.labels(source=source, annotator=annotator, study=study.name))
    skipped = rejected = 0
    last = None
    if ref is not None:
        rows = store.execute(
            "SELECT status, count(*) FROM review_annotations WHERE ls_project_id = ? GROUP BY status", [ref.ls_project_id]
        ).fetchall()
        counts = {r[0]: int(r[1]) for r in rows}
        skipped = counts.get("skip", 0)
        if study.mode == "span" and role == ANNOTATOR_ROLE and skipped:
            skipped = _span_skipped_segments(store, ref)
        rejected = counts.get("rejected", 0)
        row = store.execute("SELECT last_pull_at FROM review_projects WHERE ls_project_id = ? AND study = ?", [ref.ls_project_id, study.name]).fetchone()
        last = row[0].replace(tzinfo=timezone.utc) if row and row[0] else None
    return AnnotatorProgress(person, role, assigned, labeled, skipped, rejected, ref.ls_project_id if ref else None, last)


def _span_skipped_segments(store: "Store", ref: ProjectRef) -> int:
    rows = store.execute(
        "SELECT t.trace_id FROM review_annotations a JOIN review_tasks t ON a.ls_project_id = t.ls_project_id "
        "AND a.ls_task_id = t.ls_task_id WHERE a.ls_project_id = ? AND a.status = 'skip'", [ref.ls_project_id]).fetchall()
    traces = {r[0] for r in rows}
    return _count(store, "SELECT count(*) FROM review_assignments WHERE study = ? AND pseudonym = ? AND list_contains(?, trace_id)",
                  [ref.study, ref.pseudonym, sorted(traces)])


def _count(store: "Store", sql: str, params: list[Any]) -> int:
    row = store.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


__all__: Sequence[str] = (
    "ADJUDICATION_ROLE", "ANNOTATOR_ROLE", "AnnotatorProgress", "ProjectRef", "PullReport", "PushReport",
    "judge_labels_for", "pull_study", "push_study", "require_accounts", "study_config", "study_status", "user_ids",
)
