"""Adjudication: settle human disagreements, and the reference label of every reviewed segment.

``adjudicate_study`` sends every segment of a study whose human labels disagree to one adjudication
project (shown with all labels given, humans by pseudonym and the judge marked as such), then pulls
the adjudicator's choices as ``source="adjudicated"`` labels (annotator ``"adjudicator:<pseudonym>"``).

:func:`reference_labels` is the one definition of the study's reference label that exports and
``ror agree`` should use: the adjudicated label where there is one, else the humans' label when
they all agree; segments still in dispute have none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError, ReviewError
from ..reference import ReferenceLabel, reference_labels_from
from .labelstudio import LabelStudioClient
from .studies import (
    Study, check_email, ensure_tables, load_study, person_email, pseudonym_for, register_person, study_items, update_study,
)
from .sync import (
    ADJUDICATION_ROLE, ANNOTATOR_ROLE, PullReport, _get_or_create_project, _project_refs, _record_tasks, _segment_task,
    _segments_by_trace, _server_tasks, _user_id, judge_labels_for, pull_study, study_status,
)
from . import config as cfg

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

SegmentKey = tuple[str, int]


@dataclass(frozen=True)
class Disagreement:
    """A segment whose human labels in a study are not unanimous: ``labels`` is ``[(pseudonym, behavior)]``."""

    trace_id: str
    segment_index: int
    labels: tuple[tuple[str, str], ...]


def disagreements(store: "Store", name: str) -> list[Disagreement]:
    """Segments of study ``name`` with at least two human labels that are not all the same."""
    by_key: dict[SegmentKey, list[tuple[str, str]]] = defaultdict(list)
    for lab in store.labels(source="human", study=name):
        by_key[(lab.trace_id, lab.segment_index)].append((lab.annotator, lab.label))
    return [
        Disagreement(k[0], k[1], tuple(sorted(v)))
        for k, v in sorted(by_key.items())
        if len(v) >= 2 and len({lab for _, lab in v}) > 1
    ]


@dataclass(frozen=True)
class DisagreementStatus:
    """A study's disagreements split by whether the adjudicator has settled them.

    ``adjudicated``: an adjudicated label exists for the segment. ``open``: not yet; of those,
    ``awaiting`` are already tasks in the adjudication project and ``unsent`` are not (run
    ``ror review adjudicate`` to send them).
    """

    adjudicated: tuple[Disagreement, ...]
    open: tuple[Disagreement, ...]
    awaiting: int
    unsent: int

    @property
    def total(self) -> int:
        return len(self.adjudicated) + len(self.open)


def disagreement_status(store: "Store", name: str) -> DisagreementStatus:
    """Split the disagreements of study ``name`` into adjudicated and open (from the store, as of the last pull)."""
    ensure_tables(store)
    settled = {(lab.trace_id, lab.segment_index) for lab in store.labels(source="adjudicated", study=name)}
    sent = {(r[0], int(r[1])) for r in store.execute(
        "SELECT t.trace_id, t.segment_index FROM review_tasks t JOIN review_projects p ON t.ls_project_id = p.ls_project_id "
        "AND t.study = p.study WHERE p.study = ? AND p.role = ?", [name, ADJUDICATION_ROLE]).fetchall()}
    items = disagreements(store, name)
    done = tuple(d for d in items if (d.trace_id, d.segment_index) in settled)
    still = tuple(d for d in items if (d.trace_id, d.segment_index) not in settled)
    awaiting = sum((d.trace_id, d.segment_index) in sent for d in still)
    return DisagreementStatus(done, still, awaiting, len(still) - awaiting)


def measures_judge(study: Study) -> bool:
    """Whether the study's reference labels will be compared with a judge (it names a ``judge_annotator``).

    Then the adjudicator should not see that judge's label: a reference nudged toward the judge
    inflates the judge's measured agreement.
    """
    return study.judge_annotator is not None


@dataclass
class AdjudicationReport:
    """What one ``adjudicate`` call did; ``warnings`` are for the person running it."""

    disagreements: int
    tasks_created: int
    project_id: int
    project_url: str
    pull: PullReport
    show_judge: bool = False
    warnings: list[str] = field(default_factory=list)


def check_adjudicator(store: "Store", name: str, adjudicator: str) -> str:
    """The pseudonym ``adjudicator`` (an e-mail) would have in study ``name``, checked and computed without writing.

    Raises
    ------
    InputError
        E100: not an e-mail.
    ConfigError
        The study already has another adjudicator (one study has one adjudicator); E775: ``adjudicator``
        is one of the study's annotators (adjudication must be independent).
    """
    email = check_email(adjudicator, role="adjudicator").lower()
    pseudonym = pseudonym_for(store, email)
    study = load_study(store, name)
    annotators = {r[0] for r in store.execute(
        "SELECT pseudonym FROM review_study_people WHERE study = ? AND role = 'annotator'", [name]).fetchall()}
    if pseudonym in annotators:
        raise adjudicator_is_annotator(email, name)
    if study.adjudicator and study.adjudicator != pseudonym:
        raise ConfigError(f"study {name!r} already has adjudicator {study.adjudicator}; one study has one adjudicator")
    return pseudonym


def adjudicator_is_annotator(email: str, name: str) -> ConfigError:
    """The error (E775) for an adjudicator who is also one of the study's annotators.

    Adjudication settles the disagreements between the study's annotators, and its label becomes the
    reference the judges and the annotators are measured against (:func:`reference_labels`): an
    annotator who adjudicates would settle their own disagreements in their own favour, and their
    agreement with the reference would be inflated. The adjudicator must be someone else.
    """
    return ConfigError(
        f"adjudicator {email!r} is also an annotator of study {name!r}; adjudication must be independent of the "
        "annotators it settles: pass --adjudicator with the e-mail of someone who does not annotate this study",
        code="E775",
    )


def set_adjudicator(store: "Store", name: str, adjudicator: str) -> str:
    """Make ``adjudicator`` (an e-mail) study ``name``'s adjudicator; idempotent. Returns the pseudonym.

    Raises
    ------
    InputError, ConfigError
        As :func:`check_adjudicator`.
    """
    pseudonym = check_adjudicator(store, name, adjudicator)
    register_person(store, adjudicator)
    if pseudonym not in [r[0] for r in store.execute(
            "SELECT pseudonym FROM review_study_people WHERE study = ? AND role = 'adjudicator'", [name]).fetchall()]:
        store.execute("INSERT INTO review_study_people VALUES (?, ?, 'adjudicator')", [name, pseudonym])
    if load_study(store, name).adjudicator != pseudonym:
        update_study(store, name, adjudicator=pseudonym)
    return pseudonym


def adjudicate_study(
    store: "Store", name: str, client: LabelStudioClient, *, adjudicator: str | None = None, show_judge: bool | None = None,
    run_id: str | None = None, strict_offsets: bool = False,
) -> AdjudicationReport:
    """Push new disagreements to the study's adjudication project and pull the adjudications.

    Idempotent: a disagreement already in the project is not pushed again (stable external id
    ``"<study>/adj/<trace_id>#<index>"``). Pull the annotators' work first (``ror review pull``):
    disagreements are computed from the stored human labels.

    Parameters
    ----------
    adjudicator : str, optional
        E-mail of the adjudicator's Label Studio account; required the first time unless the study
        was created with one.
    show_judge : bool, optional
        Show the judge's label (marked "judge") to the adjudicator. Default: hidden when the study
        measures the judge (:func:`measures_judge`), so the reference stays independent of it.
    strict_offsets : bool
        Passed to :func:`~.sync.pull_study`.

    Warnings (in the report): annotation is still open (some annotator has unlabeled segments as of
    the last pull). Open-source Label Studio lets every member open every project, so annotators
    could browse the adjudication project, with the other annotators' labels, while they still work.

    Raises
    ------
    ConfigError
        No adjudicator known, or a different one than the study's.
    ReviewError
        As for push and pull.
    """
    ensure_tables(store)
    study = load_study(store, name)
    if adjudicator:
        set_adjudicator(store, name, adjudicator)
        study = load_study(store, name)
    if not study.adjudicator:
        raise ConfigError(f"study {name!r} has no adjudicator: pass --adjudicator EMAIL (their Label Studio account)")
    if study.adjudicator in {r[0] for r in store.execute(
            "SELECT pseudonym FROM review_study_people WHERE study = ? AND role = 'annotator'", [name]).fetchall()}:
        # a study stored before this was checked: the adjudicator named there annotates it too
        raise adjudicator_is_annotator(person_email(store, study.adjudicator), name)
    if not _project_refs(store, name):
        raise ReviewError(f"study {name!r} has not been pushed yet: run `ror review push {name}` and `ror review pull {name}` first")
    client.whoami()
    _user_id(store, client, study.adjudicator)
    if show_judge is None:
        show_judge = not measures_judge(study)
    warnings = []
    still = [r for r in study_status(store, name) if r.role == ANNOTATOR_ROLE and r.remaining > 0]
    if still:
        warnings.append(
            f"annotation is still open ({sum(r.remaining for r in still)} segments of {len(still)} annotators unlabeled as of the "
            "last pull): open-source Label Studio lets every member browse every project, so annotators can open the "
            "adjudication project and see the other annotators' labels"
            + (" and the judge's" if show_judge and study.judge_annotator else "")
            + ". Adjudicate after annotation has closed, or accept that the remaining labels are not independent")
    items = disagreements(store, name)
    ref, _ = _get_or_create_project(store, client, study, ADJUDICATION_ROLE, study.adjudicator)
    judge = judge_labels_for(store, study) if show_judge else {}
    by_trace = _segments_by_trace(store, {d.trace_id for d in items})
    tasks: dict[str, dict] = {}
    for trace in store.iter_traces(sorted(by_trace)):
        segs = by_trace[trace.trace_id]
        pos = {s.segment_index: i for i, s in enumerate(segs)}
        for d in (d for d in items if d.trace_id == trace.trace_id):
            given = list(d.labels)
            j = judge.get((d.trace_id, d.segment_index))
            if j is not None:
                given.append((f"judge ({j.annotator})", j.label))
            ext = f"{name}/adj/{d.trace_id}#{d.segment_index}"
            tasks[ext] = _segment_task(study, trace, segs, pos[d.segment_index], ext, None, labels_html=cfg.labels_html(given))
    on_server = _server_tasks(client, ref.ls_project_id)
    missing = [t for ext, t in tasks.items() if ext not in on_server]
    created = client.import_tasks(ref.ls_project_id, missing) if missing else 0
    if missing:
        on_server = _server_tasks(client, ref.ls_project_id)
    with store.transaction():
        _record_tasks(store, study, ref, on_server, {})
    update_study(store, name, state="adjudicating")
    pull = pull_study(store, name, client, run_id=run_id, strict_offsets=strict_offsets)
    return AdjudicationReport(len(items), created, ref.ls_project_id, client.project_url(ref.ls_project_id), pull,
                              show_judge=show_judge, warnings=warnings)


def _study_exists(store: "Store", name: str) -> bool:
    try:
        load_study(store, name)
    except ReviewError:
        return False
    return True


def reference_labels(store: "Store", name: str | None = None) -> list[ReferenceLabel]:
    """The reference label of every reviewed segment of study ``name`` (or of every study if None).

    Rule (:func:`ror_annotate.reference.reference_labels_from`, shared with exports and ``ror
    agree``): the latest adjudicated label wins; else each human's latest label, when they all
    agree (``basis="unanimous"`` for two or more, ``"single"`` for one). Segments whose humans
    disagree and that are not adjudicated yet, or that nobody labeled, are left out. With
    ``name=None`` the labels of every study are pooled. Sorted by ``(trace_id, segment_index)``.
    """
    ensure_tables(store)
    refs = reference_labels_from(store.labels(source=("human", "adjudicated"), study=name), study=name)
    # Labels may carry a study name without a study record (imported from elsewhere): then the
    # labeled segments are the study's items.
    if name is not None and _study_exists(store, name):
        items = set(study_items(store, name))
        return [r for key, r in refs.items() if key in items]
    return list(refs.values())
