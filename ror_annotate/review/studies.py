"""Review studies: which segments humans see, who sees which, and how that is persisted.

A study is a named, persisted record (:class:`Study`) of: the sampled segments (``review_items``),
the annotators and which items each one gets (``review_assignments``, overlap by construction), blind
or not, the codebook version, the sampling strategy and its seed, and the study's state.

Sampling strategies are registered by name (:func:`register_strategy`), spaCy-style:

``random``
    A uniform sample of segments (without replacement).
``stratified``
    Stratified by the judge's label with equal allocation per behavior, so rare behaviors are not
    starved; strata smaller than their share are taken whole and the remainder is redistributed.
``disagreement``
    Disagreement first: segments where two judges (or two samples of one judge) disagree, then the
    segments with the lowest judge confidence, then a random fill.
``trace``
    Every segment of ``n_traces`` randomly chosen traces (context-rich studies, span mode).
``uncertainty``
    The segments a machine rater is least sure of, plus a random control stratum, with every
    item's exact inclusion probability (:func:`sample_uncertainty`), so ``ror agree --weighted``
    can give design-unbiased estimates.

Every item stores its ``stratum`` and ``inclusion_probability`` (``review_items``): ``random``
studies store ``n / N`` and stratum ``control``; ``uncertainty`` studies store 1 in stratum
``uncertainty`` and ``n_c / (N - m)`` in stratum ``control``; strategies without a known design
store NULL.

Every strategy sorts its candidates by ``(trace_id, segment_index)`` before drawing with
``random.Random(seed)``, so a study is reproducible from its parameters and the store.

Annotator identities: an annotator is given by e-mail (their Label Studio account). Only a
pseudonym ``"h-" + sha256(salt + ":" + email)[:10]`` (per-store random salt) appears on labels;
e-mails live only in the private table ``review_people``, which no export reads.
"""

from __future__ import annotations

import json
import math
import random
import re
import secrets
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError, InputError, ReviewError
from ..options import CHARS_MAX, Seed, StageOptions
from ..records import BEHAVIORS, Label, sha256_text, utc_now
from ..registry import Registry
from ..store import to_naive_utc

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

SegmentKey = tuple[str, int]
StudyMode = Literal["segment", "span"]
StudyState = Literal["created", "pushed", "adjudicating"]

#: Tables of the review stage (component ``"review"`` in ``schema_versions``).
REVIEW_MIGRATIONS: tuple[str, ...] = (
    # v1
    """
    CREATE TABLE review_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
    CREATE TABLE review_studies (
        name VARCHAR PRIMARY KEY,
        mode VARCHAR NOT NULL,
        blind BOOLEAN NOT NULL,
        overlap INTEGER NOT NULL,
        codebook_name VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        strategy VARCHAR NOT NULL,
        seed BIGINT NOT NULL,
        parameters VARCHAR NOT NULL,
        judge_annotator VARCHAR,
        adjudicator VARCHAR,
        context_chars INTEGER NOT NULL,
        state VARCHAR NOT NULL,
        server_url VARCHAR,
        created_at TIMESTAMP NOT NULL,
        updated_at TIMESTAMP NOT NULL
    );
    -- PRIVATE: e-mails of annotators. Never read by exports, cards or logs.
    CREATE TABLE review_people (
        pseudonym VARCHAR PRIMARY KEY,
        email VARCHAR NOT NULL UNIQUE,
        ls_user_id INTEGER,
        server_url VARCHAR
    );
    CREATE TABLE review_study_people (
        study VARCHAR NOT NULL, pseudonym VARCHAR NOT NULL, role VARCHAR NOT NULL,
        PRIMARY KEY (study, pseudonym, role)
    );
    CREATE TABLE review_items (
        study VARCHAR NOT NULL, trace_id VARCHAR NOT NULL, segment_index INTEGER NOT NULL, item_order INTEGER NOT NULL,
        PRIMARY KEY (study, trace_id, segment_index)
    );
    CREATE TABLE review_assignments (
        study VARCHAR NOT NULL, pseudonym VARCHAR NOT NULL, trace_id VARCHAR NOT NULL, segment_index INTEGER NOT NULL,
        PRIMARY KEY (study, pseudonym, trace_id, segment_index)
    );
    CREATE TABLE review_projects (
        study VARCHAR NOT NULL, role VARCHAR NOT NULL, pseudonym VARCHAR NOT NULL,
        server_url VARCHAR NOT NULL, ls_project_id INTEGER NOT NULL, config_sha256 VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL, last_pull_at TIMESTAMP,
        PRIMARY KEY (study, role, pseudonym)
    );
    CREATE TABLE review_tasks (
        study VARCHAR NOT NULL, ls_project_id INTEGER NOT NULL, external_id VARCHAR NOT NULL, ls_task_id INTEGER NOT NULL,
        trace_id VARCHAR NOT NULL, segment_index INTEGER,
        shown_label VARCHAR, shown_model_version VARCHAR,
        PRIMARY KEY (ls_project_id, external_id)
    );
    CREATE TABLE review_annotations (
        ls_project_id INTEGER NOT NULL, ls_annotation_id INTEGER NOT NULL,
        study VARCHAR NOT NULL, role VARCHAR NOT NULL, pseudonym VARCHAR NOT NULL, ls_task_id INTEGER NOT NULL,
        completed_by INTEGER, updated_at VARCHAR NOT NULL,
        status VARCHAR NOT NULL, reason VARCHAR, n_labels INTEGER NOT NULL,
        PRIMARY KEY (ls_project_id, ls_annotation_id)
    );
    """,
    # v2: the sampling design of each item (uncertainty-first review with honest estimates)
    """
    ALTER TABLE review_items ADD COLUMN stratum VARCHAR;
    ALTER TABLE review_items ADD COLUMN inclusion_probability DOUBLE;
    """,
)


def ensure_tables(store: "Store") -> None:
    """Create or upgrade the review tables in ``store`` (idempotent), and declare the tables that name
    segments: a Label Studio server holds tasks made from them, so a trace under review must not be
    re-segmented (the store refuses)."""
    current = store.schema_version("review")
    if store.read_only and 0 < current < len(REVIEW_MIGRATIONS):
        return  # an older review schema read without writing: readers of the v1 columns still work (study_design copes)
    store.migrate("review", REVIEW_MIGRATIONS)
    for table in ("review_items", "review_assignments", "review_tasks"):
        store.register_trace_dependent(table, "refuse", component="review")


class Study(BaseModel):
    """A persisted review study.

    ``overlap`` is the number of annotators who label each item (a segment in ``segment`` mode, a
    whole trace in ``span`` mode). ``context_chars`` is the trace context shown on each side of a
    segment, in characters (code points), snapped outward to segment boundaries.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    mode: StudyMode = "segment"
    blind: bool = True
    overlap: int = Field(2, ge=1)
    codebook_name: str
    codebook_version: str
    strategy: str
    seed: int = 0
    parameters: dict[str, Any] = Field(default_factory=dict)
    judge_annotator: str | None = None
    adjudicator: str | None = Field(None, description="Pseudonym of the adjudicator.")
    context_chars: int = Field(1200, ge=0, le=CHARS_MAX)
    state: StudyState = "created"
    server_url: str | None = None
    created_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)


# ------------------------------------------------------------------------------------ identities
def _salt(store: "Store") -> str:
    row = store.execute("SELECT value FROM review_meta WHERE key = 'pseudonym_salt'").fetchone()
    if row:
        return row[0]
    salt = secrets.token_hex(16)
    store.execute("INSERT INTO review_meta VALUES ('pseudonym_salt', ?)", [salt])
    return salt


def pseudonym_for(store: "Store", email: str) -> str:
    """The pseudonymous annotator id of ``email`` in this store: ``"h-"`` + 10 hex characters.

    Salted per store (a random salt kept in ``review_meta``), so pseudonyms cannot be reversed by
    hashing candidate e-mails without the store, and differ between stores.
    """
    ensure_tables(store)
    return "h-" + sha256_text(_salt(store) + ":" + email.strip().lower())[:10]


#: What an annotator e-mail must look like before it is stored or sent to Label Studio: one "@", a
#: local part and a domain without spaces, control characters or the specials of RFC 5322 that Label
#: Studio's sign-up (Django's EmailValidator) refuses, so a study is never stored with an annotator
#: whose account can never be created. The local part must be ASCII (Django's user_regex).
_EMAIL = re.compile(r"""[^\s\x00-\x1f\x7f@<>()\[\]\\,;:"]+@[^\s\x00-\x1f\x7f@<>()\[\]\\,;:"'.][^\s\x00-\x1f\x7f@<>()\[\]\\,;:"']*""")
#: Django's EmailValidator (django/core/validators.py of Django 5.2, the version Label Studio 1.x runs; its
#: sign-up form's check): the local part a dot-atom (no leading, trailing or double dot); the domain
#: ``localhost`` or dot-separated labels of letters, digits and inner hyphens (at most 63 characters
#: each, Unicode letters allowed) whose last label holds letters only, at least two (or is ``xn--``
#: punycode). Label Studio also refuses an address longer than 254 characters (its user model's
#: ``email`` field: "Email is too long"). Addresses that passed _EMAIL alone (``a@b.c``, ``a@x_y.org``,
#: ``a..b@x.org``, ``a@123.45``) were refused at sign-up, after the study had recorded them.
_DJANGO_USER = re.compile(r"[-!#$%&'*+/=?^_`{}|~0-9A-Z]+(?:\.[-!#$%&'*+/=?^_`{}|~0-9A-Z]+)*", re.IGNORECASE)
_UL = "\u00a1-\uffff"
_DJANGO_DOMAIN = re.compile(
    r"[a-z" + _UL + r"0-9](?:[a-z" + _UL + r"0-9-]{0,61}[a-z" + _UL + r"0-9])?"  # hostname
    r"(?:\.(?!-)[a-z" + _UL + r"0-9-]{1,63}(?<!-))*"  # further labels
    r"\.(?!-)(?:[a-z" + _UL + r"-]{2,63}|xn--[a-z0-9]{1,59})(?<!-)",  # top-level label
    re.IGNORECASE,
)
_EMAIL_MAX = 254
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _django_accepts(email: str) -> bool:
    user, domain = email.rsplit("@", 1)
    if len(email) > _EMAIL_MAX or not _DJANGO_USER.fullmatch(user):
        return False
    return domain == "localhost" or _DJANGO_DOMAIN.fullmatch(domain) is not None


def check_email(email: str, *, role: str = "annotator") -> str:
    """``email`` stripped, or InputError (E100) naming it (as the ``role`` it was given for: annotator or
    adjudicator) when it cannot be a Label Studio account e-mail."""
    email = email.strip()
    # Label Studio's sign-up (Django's EmailValidator) takes an ASCII local part only ("brk.ünï@x.org" is refused)
    if not _EMAIL.fullmatch(email) or email.endswith(".") or not email.split("@", 1)[0].isascii() or not _django_accepts(email):
        raise InputError(f"{role} {email[:120]!r} is not an e-mail address; give the {role}'s Label Studio account e-mail")
    return email


def check_study_name(name: str) -> str:
    """``name``, or ConfigError E753 when it is not a study name (letters, digits, ``._-``; a letter or digit first)."""
    if not _STUDY_NAME.fullmatch(name):
        raise ConfigError(
            f"study name {name[:120]!r} is not allowed: use letters, digits, '.', '_' and '-', starting with a letter or digit "
            "(e.g. pilot-1)", code="E753",
        )
    return name


def register_person(store: "Store", email: str) -> str:
    """Record ``email`` in the private people table and return its pseudonym (InputError E100: not an e-mail)."""
    email = check_email(email)
    pseudonym = pseudonym_for(store, email)
    store.execute(
        "INSERT INTO review_people (pseudonym, email) VALUES (?, ?) ON CONFLICT DO NOTHING", [pseudonym, email.lower()]
    )
    return pseudonym


def person_email(store: "Store", pseudonym: str) -> str:
    """The e-mail behind ``pseudonym`` (private; for talking to Label Studio only)."""
    row = store.execute("SELECT email FROM review_people WHERE pseudonym = ?", [pseudonym]).fetchone()
    if not row:
        raise ReviewError(f"no annotator {pseudonym!r} in {store.path}; add them when creating the study (--annotator EMAIL)")
    return row[0]


# ------------------------------------------------------------------------------------ strategies
class SamplingInput(BaseModel):
    """What a sampling strategy sees: the candidate segments and the judge labels on them.

    ``segments`` is sorted by ``(trace_id, segment_index)``; ``judge_labels`` maps a segment key to
    the labels of the judge annotators the study compares (one per annotator, possibly several
    samples such as ``"openai:m@s2"``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    segments: list[SegmentKey]
    judge_labels: dict[SegmentKey, list[Label]] = Field(default_factory=dict)
    judge_annotator: str | None = None
    #: Every machine rater's labels per candidate segment (judges, baseline, aggregates, verifiers,
    #: imports); filled only for strategies marked ``needs_machine_labels`` (``uncertainty``).
    machine_labels: dict[SegmentKey, list[Label]] = Field(default_factory=dict)


Strategy = Callable[..., "list[SegmentKey] | Selection"]
#: The sampling strategies (``ror review create --strategy``); entry-point group ``ror_annotate.strategies``.
STRATEGIES: Registry[Strategy] = Registry("strategies", what="sampling strategy")


class Selection(BaseModel):
    """A strategy's sample with its design: the stratum and exact inclusion probability of each item.

    ``keys``, ``strata`` and ``inclusion_probabilities`` are parallel lists (one entry per sampled
    segment); ``population`` is the number of candidate segments ``N``.
    """

    keys: list[SegmentKey]
    strata: list[str]
    inclusion_probabilities: list[float]
    population: int
    details: dict[str, Any] = Field(default_factory=dict)


def register_strategy(name: str) -> Callable[[Strategy], Strategy]:
    """Decorator: register ``fn(inp: SamplingInput, *, n, n_traces, seed, **options) -> keys`` as ``name``.

    The function returns the sampled keys, or a :class:`Selection` when it knows each item's
    inclusion probability. Registering a taken name replaces it (as before the registry existed).
    """

    def deco(fn: Strategy) -> Strategy:
        STRATEGIES.register(name, fn, replace=True)
        return fn

    return deco


def available_strategies() -> list[str]:
    """Names of the registered sampling strategies."""
    return STRATEGIES.names()


def get_strategy(name: str) -> Strategy:
    """The strategy registered as ``name``; :class:`ConfigError` lists the valid names otherwise."""
    found = STRATEGIES.find(name)
    if found is None:
        raise ConfigError(f"unknown sampling strategy {name!r}. Available strategies: {', '.join(available_strategies())}")
    return found


def _need_n(n: int | None, strategy: str) -> int:
    if n is None or n < 1:
        raise ConfigError(f"the {strategy!r} strategy needs a sample size: pass --n N (N >= 1)")
    return n


def _judge_label(inp: SamplingInput, key: SegmentKey) -> Label | None:
    for lab in inp.judge_labels.get(key, []):
        if lab.annotator == inp.judge_annotator:
            return lab
    return None


@register_strategy("random")
def sample_random(inp: SamplingInput, *, n: int | None, seed: int, **_: Any) -> Selection:
    """A uniform random sample of ``n`` segments without replacement (all of them if fewer).

    Every segment's inclusion probability is ``n / N`` (simple random sampling without
    replacement of ``n`` of ``N`` candidates); stratum ``control``.
    """
    n = _need_n(n, "random")
    rng = random.Random(seed)
    N = len(inp.segments)
    picked = rng.sample(inp.segments, min(n, N))
    return Selection(keys=picked, strata=["control"] * len(picked), inclusion_probabilities=[len(picked) / N] * len(picked), population=N)


@register_strategy("stratified")
def sample_stratified(inp: SamplingInput, *, n: int | None, seed: int, **_: Any) -> list[SegmentKey]:
    """Stratified by the judge label, equal allocation: ``n / 6`` per behavior.

    A behavior with fewer segments than its share contributes all of them and the shortfall is
    redistributed equally over the others (repeatedly), so the sample has ``min(n, candidates)``
    segments. Segments without a judge label are not candidates.
    """
    n = _need_n(n, "stratified")
    if inp.judge_annotator is None:
        raise ConfigError("the 'stratified' strategy needs judge labels: pass --judge-annotator (e.g. baseline:cue-v1)")
    strata: dict[str, list[SegmentKey]] = {b: [] for b in BEHAVIORS}
    for key in inp.segments:
        lab = _judge_label(inp, key)
        if lab is not None:
            strata[lab.label].append(key)
    if not any(strata.values()):
        raise ConfigError(f"no segment has a label from judge annotator {inp.judge_annotator!r}; run `ror label` first or pick another --judge-annotator")
    quota = _equal_allocation({b: len(v) for b, v in strata.items()}, n)
    rng = random.Random(seed)
    picked: list[SegmentKey] = []
    for b in BEHAVIORS:
        picked += rng.sample(strata[b], quota[b])
    rng.shuffle(picked)
    return picked


def _equal_allocation(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Split ``n`` as equally as possible over strata capped at their sizes (water filling).

    Strata are filled from the smallest up: each gets ``min(size, floor(left / strata_left))``, so a
    small stratum's unused share passes to the larger ones; any remainder goes one by one to the
    strata with room, in key order.
    """
    quota = {k: 0 for k in sizes}
    left = min(n, sum(sizes.values()))
    order = sorted(sizes, key=lambda k: (sizes[k], list(sizes).index(k)))
    for i, k in enumerate(order):
        quota[k] = min(sizes[k], left // (len(order) - i))
        left -= quota[k]
    for k in sizes:
        if left and quota[k] < sizes[k]:
            quota[k] += 1
            left -= 1
    return quota


@register_strategy("disagreement")
def sample_disagreement(
    inp: SamplingInput, *, n: int | None, seed: int, low_confidence: float = 0.6, **_: Any
) -> list[SegmentKey]:
    """Disagreement first: judges (or samples) disagree, then low judge confidence, then random.

    Order: every segment whose judge labels (all compared annotators) are not unanimous, in random
    order; then segments whose lowest judge confidence is below ``low_confidence``, least confident
    first; then the rest at random. The first ``n`` are taken.
    """
    n = _need_n(n, "disagreement")
    if not inp.judge_labels:
        raise ConfigError("the 'disagreement' strategy needs judge labels on the candidate segments: run `ror label` first")
    rng = random.Random(seed)
    ranked = []
    for key in inp.segments:
        labs = inp.judge_labels.get(key, [])
        disagree = len({lab.label for lab in labs}) > 1
        confs = [lab.confidence for lab in labs if lab.confidence is not None]
        conf = min(confs) if confs else 1.0
        tier = 0 if disagree else (1 if conf < low_confidence else 2)
        ranked.append((tier, conf if tier == 1 else 0.0, rng.random(), key))
    ranked.sort()
    return [r[3] for r in ranked[:n]]


@register_strategy("trace")
def sample_traces(inp: SamplingInput, *, n_traces: int | None, seed: int, **_: Any) -> list[SegmentKey]:
    """Every segment of ``n_traces`` traces drawn uniformly (context-rich and span-mode studies)."""
    if n_traces is None or n_traces < 1:
        raise ConfigError("the 'trace' strategy needs the number of traces: pass --traces N (N >= 1)")
    by_trace: dict[str, list[SegmentKey]] = defaultdict(list)
    for key in inp.segments:
        by_trace[key[0]].append(key)
    chosen = random.Random(seed).sample(sorted(by_trace), min(n_traces, len(by_trace)))
    return [key for tid in chosen for key in by_trace[tid]]


def _rater_confidence(inp: SamplingInput, rater: str) -> dict[SegmentKey, float]:
    """The latest label confidence of ``rater`` per segment (E723 without labels, E724 without confidences)."""
    conf: dict[SegmentKey, float] = {}
    seen = False
    for key, labs in inp.machine_labels.items():
        mine = [lab for lab in labs if lab.annotator == rater]
        if mine:
            seen = True
            newest = max(mine, key=lambda lab: lab.created_at)
            if newest.confidence is not None:
                conf[key] = newest.confidence
    if not seen:
        present = sorted({lab.annotator for labs in inp.machine_labels.values() for lab in labs})
        raise ConfigError(f"--rater {rater!r} has no labels on the candidate segments; machine raters with labels: {', '.join(present) or 'none'}", code="E723")
    if not conf:
        raise ConfigError(f"--rater {rater!r} has labels but no confidence on them; pick an aggregate (ror aggregate) or a judge that reports one", code="E724")
    return conf


def _latest_aggregate(inp: SamplingInput) -> str | None:
    """The aggregate rater (``source="aggregate"``, with confidences) whose newest label is the latest; None without one."""
    newest: dict[str, Any] = {}
    for labs in inp.machine_labels.values():
        for lab in labs:
            if lab.source == "aggregate" and lab.confidence is not None:
                newest[lab.annotator] = max(newest.get(lab.annotator, lab.created_at), lab.created_at)
    return max(newest, key=lambda a: (newest[a], a)) if newest else None


def _modal_share(inp: SamplingInput) -> dict[SegmentKey, float]:
    """Share of machine raters (each one's latest label) agreeing with the modal label, on segments with two or more."""
    conf: dict[SegmentKey, float] = {}
    for key, labs in inp.machine_labels.items():
        latest_per: dict[str, Label] = {}
        for lab in labs:
            if lab.annotator not in latest_per or lab.created_at > latest_per[lab.annotator].created_at:
                latest_per[lab.annotator] = lab
        if len(latest_per) >= 2:
            votes = [lab.label for lab in latest_per.values()]
            conf[key] = max(votes.count(v) for v in set(votes)) / len(votes)
    return conf


def _uncertainty_scores(inp: SamplingInput, rater: str | None) -> tuple[dict[SegmentKey, float], str]:
    """Confidence per segment of the chosen rater, and a description of where it comes from."""
    if rater is not None:
        return _rater_confidence(inp, rater), f"confidence of {rater}"
    chosen = _latest_aggregate(inp)
    if chosen is not None:
        return _rater_confidence(inp, chosen), f"confidence of {chosen} (latest aggregate)"
    conf = _modal_share(inp)
    if not conf:
        raise ConfigError(
            "the 'uncertainty' strategy needs an aggregate's confidence (ror aggregate), a --rater with confidences, "
            "or at least two machine raters on the segments to measure their disagreement", code="E723",
        )
    return conf, "share of machine raters agreeing with the modal label (no aggregate in the store)"


@register_strategy("uncertainty")
def sample_uncertainty(
    inp: SamplingInput, *, n: int | None, seed: int, control_fraction: float = 0.25, rater: str | None = None, **_: Any
) -> Selection:
    """Uncertainty first: the ``m`` least confident segments, plus a random control stratum of ``n_c``.

    Design (``N`` candidate segments, sample size ``n``):

    - ``n_c = round(n * control_fraction)`` (at least 1 when ``control_fraction > 0``), ``m = n - n_c``.
    - **Uncertainty stratum**: the ``m`` segments with the lowest confidence of the chosen rater
      (ties broken by a seeded random key). The selection is deterministic given the labels, so
      each of these segments has inclusion probability ``pi_i = 1``.
    - **Control stratum**: a simple random sample without replacement of ``n_c`` of the other
      ``N - m`` segments (including those without a confidence), so ``pi_i = n_c / (N - m)``.

    With these ``pi_i`` the Horvitz-Thompson (1952) and Hajek estimators of ``ror agree --weighted``
    are design-unbiased (resp. consistent) for the whole candidate population.

    The confidence is the ``rater``'s label confidence; by default the latest aggregate's
    (``source="aggregate"``), else, without an aggregate, the share of machine raters agreeing with
    the modal label on the segment (segments with fewer than two machine labels are only
    candidates of the control stratum).

    Raises
    ------
    ConfigError
        E723: no usable rater; E724: the rater has no confidences; E728: ``control_fraction``
        outside [0, 1).
    """
    n = _need_n(n, "uncertainty")
    if not 0.0 <= control_fraction < 1.0:
        raise ConfigError(f"--control-fraction must be in [0, 1), got {control_fraction}", code="E728")
    conf, basis = _uncertainty_scores(inp, rater)
    N = len(inp.segments)
    n = min(n, N)
    n_c = round(n * control_fraction)
    if control_fraction > 0:
        n_c = max(1, n_c)
    rng = random.Random(seed)
    ranked = sorted((conf[k], rng.random(), k) for k in inp.segments if k in conf)
    m = min(n - n_c, len(ranked))
    top = [r[2] for r in ranked[:m]]
    taken = set(top)
    rest = [k for k in inp.segments if k not in taken]
    n_c = min(n - m, len(rest))
    control = rng.sample(rest, n_c)
    p_c = n_c / len(rest) if rest else 0.0
    return Selection(
        keys=top + control, strata=["uncertainty"] * m + ["control"] * n_c,
        inclusion_probabilities=[1.0] * m + [p_c] * n_c, population=N,
        details={"basis": basis, "m": m, "n_control": n_c, "control_fraction": control_fraction,
                 "max_confidence_in_uncertainty_stratum": ranked[m - 1][0] if m else None},
    )


sample_uncertainty.needs_machine_labels = True  # type: ignore[attr-defined]


def sample_size_for_ci_width(width: float, *, proportion: float = 0.5, confidence: float = 0.95) -> int:
    """Segments needed so a proportion (e.g. judge-human accuracy) has a CI of total width ``width``.

    Normal-approximation (Wald) interval for a binomial proportion: ``n = z^2 p (1 - p) / (width / 2)^2``
    with ``z`` the ``(1 + confidence) / 2`` standard-normal quantile (e.g. Agresti, *Categorical Data
    Analysis*, 3rd ed., eq. 1.14). ``proportion=0.5`` is the conservative (largest) choice.

    Raises
    ------
    ConfigError
        ``width`` not in (0, 1), or ``proportion`` / ``confidence`` not in (0, 1).
    """
    from statistics import NormalDist

    for name, value in (("width", width), ("proportion", proportion), ("confidence", confidence)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"{name} must be in (0, 1), got {value}")
    z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    return math.ceil(z * z * proportion * (1.0 - proportion) / (width / 2.0) ** 2)


# ------------------------------------------------------------------------------------ assignment
def assign_overlap(units: Sequence[Any], annotators: Sequence[str], overlap: int, *, seed: int) -> dict[str, list[Any]]:
    """Give every unit to exactly ``overlap`` distinct annotators, balanced by construction.

    Units are shuffled with ``seed``; unit ``i`` goes to annotators ``(i * overlap + j) mod k`` for
    ``j < overlap`` (``k`` annotators), so each annotator gets ``len(units) * overlap / k`` units up
    to one, and with ``overlap < k`` every pair of annotators shares about as many units.

    Returns ``{annotator: [units in shuffled order]}``.

    Raises
    ------
    ConfigError
        ``overlap`` is larger than the number of annotators, or below 1.
    """
    k = len(annotators)
    if overlap < 1 or overlap > k:
        raise ConfigError(f"overlap {overlap} needs at least {overlap} annotators, got {k}: add --annotator or lower --overlap")
    order = list(units)
    random.Random(seed).shuffle(order)
    out: dict[str, list[Any]] = {a: [] for a in annotators}
    for i, unit in enumerate(order):
        for j in range(overlap):
            out[annotators[(i * overlap + j) % k]].append(unit)
    return out


# ------------------------------------------------------------------------------------ persistence
def _judge_labels_for(
    store: "Store", keys: set[SegmentKey], annotators: set[str] | None, machine: dict[SegmentKey, list[Label]] | None = None
) -> dict[SegmentKey, list[Label]]:
    out: dict[SegmentKey, list[Label]] = defaultdict(list)
    # from the machine labels already read when there are (one read of the labels table, not two)
    labels = store.labels(source=["judge", "baseline"]) if machine is None else [
        lab for labs in machine.values() for lab in labs if lab.source in ("judge", "baseline")]
    for lab in labels:
        key = (lab.trace_id, lab.segment_index)
        if key in keys and (annotators is None or lab.annotator in annotators or lab.annotator.split("@s")[0] in annotators):
            out[key].append(lab)
    return dict(out)


def _machine_labels_for(store: "Store", keys: set[SegmentKey]) -> dict[SegmentKey, list[Label]]:
    kinds = store.rater_kinds()
    out: dict[SegmentKey, list[Label]] = defaultdict(list)
    for lab in store.labels():
        key = (lab.trace_id, lab.segment_index)
        if key in keys and lab.source not in ("human", "adjudicated") and kinds.get(lab.annotator, "machine") == "machine":
            out[key].append(lab)
    return dict(out)


def resolve_judge_annotator(store: "Store", requested: str | None) -> str | None:
    """The judge annotator whose labels a study shows and stratifies by.

    ``requested`` must have labels in the store; ``None`` picks the only judge/baseline annotator if
    there is exactly one, else returns None (strategies that need one then ask for it).
    """
    present = sorted({a for src, a, _ in store.annotators() if src in ("judge", "baseline")})
    if requested is not None:
        if requested not in present:
            raise ConfigError(
                f"no judge labels from annotator {requested!r} in {store.path}. "
                f"Judge annotators with labels: {', '.join(present) or 'none (run `ror label` first)'}"
            )
        return requested
    return present[0] if len(present) == 1 else None


class StudyOptions(StageOptions):
    """Options of ``ror review create`` / :func:`create_study` (each documented there).

    ``mode`` is checked when the model is built; the other checks (known strategy and codebook,
    sample size, overlap) run in :func:`create_study`, with the same errors as before.
    """

    stage: ClassVar[str] = "the review study"
    strategy: str = "random"
    n: int | None = None
    n_traces: int | None = None
    seed: Seed = 0
    overlap: int = 2
    blind: bool = True
    mode: StudyMode = "segment"
    codebook: str = "six-behaviors@v1"
    judge_annotator: str | None = None
    compare_annotators: tuple[str, ...] | None = None
    adjudicator: str | None = None
    context_chars: int = Field(1200, ge=0, le=CHARS_MAX)
    low_confidence: float = 0.6
    control_fraction: float = 0.25
    rater: str | None = None


def create_study(  # noqa: C901  (one branch per option check before anything is written)
    store: "Store",
    name: str,
    options: StudyOptions | None = None,
    *,
    annotators: Sequence[str],
    trace_ids: Sequence[str] | None = None,
    **kwargs: Any,
) -> Study:
    """Sample segments, assign them to annotators with the given overlap, and persist the study.

    Parameters
    ----------
    store : Store
        Must hold segmented traces (and judge labels for ``stratified`` / ``disagreement`` / non-blind).
    name : str
        Study name (letters, digits, ``.``, ``_``, ``-``); unique in the store.
    options : StudyOptions, optional
        The settings below as one model; else they are given as keywords (``**kwargs``), validated
        by :meth:`StudyOptions.from_options` (an unknown name: ConfigError with the closest one).
    annotators : sequence of str
        Annotators' Label Studio account e-mails (kept private; labels carry pseudonyms).
    strategy : {"random", "stratified", "disagreement", "trace", "uncertainty"} or a registered name
    n : int, optional
        Number of segments to sample (all strategies but ``trace``).
    n_traces : int, optional
        Number of whole traces (``trace`` strategy).
    seed : int
        Seed of the sampling and of the assignment; same inputs and seed give the same study.
    overlap : int
        Annotators per item (segment, or trace in ``span`` mode); ``1 <= overlap <= len(annotators)``.
    blind : bool
        If True annotators never see a judge label; if False the judge label is a pre-selected prediction.
    mode : {"segment", "span"}
        One task per segment, or one task per trace with the segments as pre-made regions.
    codebook : str
        Versioned codebook name; its sha256 is the ``codebook_version`` of every human label.
    judge_annotator : str, optional
        Whose judge labels are shown (non-blind) and stratified by; must have labels in the store.
    compare_annotators : sequence of str, optional
        Judge annotators compared by ``disagreement`` (default: every judge/baseline annotator).
    adjudicator : str, optional
        E-mail of the adjudicator (may be given later to ``adjudicate``).
    context_chars : int
        Trace context shown on each side of a segment, in characters.
    trace_ids : sequence of str, optional
        Restrict candidates to these traces.
    low_confidence : float
        ``disagreement`` strategy: judge confidence below this counts as uncertain.
    control_fraction : float
        ``uncertainty`` strategy: share of the sample drawn as a simple random control stratum.
    rater : str, optional
        ``uncertainty`` strategy: whose confidence ranks the segments (default: the latest aggregate,
        else the disagreement among machine raters).

    Returns
    -------
    Study

    Raises
    ------
    ConfigError
        Study exists, unknown strategy or codebook, missing sample size, bad overlap, no judge labels.
    InputError
        An annotator is not an e-mail address.
    """
    from ..codebook import load_codebook

    options = StudyOptions.resolve(options, kwargs)
    o = options
    strategy, n, n_traces, seed, overlap, blind, mode = o.strategy, o.n, o.n_traces, o.seed, o.overlap, o.blind, o.mode
    codebook, judge_annotator, compare_annotators, adjudicator = o.codebook, o.judge_annotator, o.compare_annotators, o.adjudicator
    context_chars, low_confidence, control_fraction, rater = o.context_chars, o.low_confidence, o.control_fraction, o.rater
    check_study_name(name)
    for email in annotators:
        check_email(email)
    ensure_tables(store)
    if store.execute("SELECT 1 FROM review_studies WHERE name = ?", [name]).fetchone():
        raise ConfigError(f"study {name!r} already exists in {store.path}; pick another name (studies are immutable once sampled)")
    emails = list(dict.fromkeys(a.strip().lower() for a in annotators))
    if len(emails) != len(list(annotators)):
        raise InputError("the same annotator e-mail is given twice; each annotator must be a different Label Studio user")
    if adjudicator and adjudicator.strip().lower() in emails:
        from .adjudicate import adjudicator_is_annotator

        raise adjudicator_is_annotator(adjudicator.strip().lower(), name)
    fn = get_strategy(strategy)
    cb = load_codebook(codebook)
    judge = resolve_judge_annotator(store, judge_annotator)
    if not blind and judge is None:
        raise ConfigError("a non-blind study shows a judge label: pass --judge-annotator (or use --blind)")
    segments = store.segments()
    if trace_ids is not None:
        wanted = set(trace_ids)
        segments = [s for s in segments if s.trace_id in wanted]
    keys = sorted((s.trace_id, s.segment_index) for s in segments)
    if not keys:
        raise ConfigError(f"no segments in {store.path}{' for the given traces' if trace_ids else ''}: run `ror ingest` and `ror segment` first")
    compare = set(compare_annotators) | ({judge} if judge else set()) if compare_annotators else None
    machine = _machine_labels_for(store, set(keys)) if getattr(fn, "needs_machine_labels", False) else None
    inp = SamplingInput(segments=keys, judge_labels=_judge_labels_for(store, set(keys), compare, machine), judge_annotator=judge)
    if machine is not None:
        inp.machine_labels = machine
    chosen = fn(inp, n=n, n_traces=n_traces, seed=seed, low_confidence=low_confidence, control_fraction=control_fraction, rater=rater)
    design = chosen if isinstance(chosen, Selection) else None
    picked = list(chosen.keys) if isinstance(chosen, Selection) else list(chosen)
    if not picked:
        raise ConfigError(f"the {strategy!r} strategy selected no segments from {store.path}")
    if not blind:
        unlabeled = [k for k in picked if _judge_label(inp, k) is None]
        if unlabeled:
            raise ConfigError(
                f"{len(unlabeled)} sampled segments (e.g. {unlabeled[0][0]}#{unlabeled[0][1]}) have no label from "
                f"{judge!r}, so a non-blind study cannot show one; label them first or use --blind"
            )
    study = Study(
        name=name, mode=mode, blind=blind, overlap=overlap, codebook_name=cb.versioned_name, codebook_version=cb.sha256,
        strategy=strategy, seed=seed, judge_annotator=judge, context_chars=context_chars,
        parameters={"n": n, "n_traces": n_traces, "trace_ids": list(trace_ids) if trace_ids else None,
                    "compare_annotators": sorted(compare) if compare else None, "low_confidence": low_confidence,
                    **({"control_fraction": control_fraction, "rater": rater} if strategy == "uncertainty" else {}),
                    **({"design": {"population": design.population, **design.details}} if design is not None else {})},
    )
    with store.transaction():
        people = [register_person(store, e) for e in emails]
        units: list[Any] = sorted({k[0] for k in picked}) if mode == "span" else list(picked)
        assignment = assign_overlap(units, people, overlap, seed=seed)
        if adjudicator:
            study = study.model_copy(update={"adjudicator": register_person(store, adjudicator)})
        _insert_study(store, study)
        store.execute("INSERT INTO review_study_people SELECT ?, unnest(?), 'annotator'", [name, people])
        if study.adjudicator:
            store.execute("INSERT INTO review_study_people VALUES (?, ?, 'adjudicator')", [name, study.adjudicator])
        store.execute(
            "INSERT INTO review_items (study, trace_id, segment_index, item_order, stratum, inclusion_probability) "
            "SELECT ?, unnest(?), unnest(?), unnest(?), unnest(?), unnest(?)",
            [name, [k[0] for k in picked], [k[1] for k in picked], list(range(len(picked))),
             list(design.strata) if design else [None] * len(picked),
             list(design.inclusion_probabilities) if design else [None] * len(picked)],
        )
        by_trace: dict[str, list[int]] = defaultdict(list)
        for tid, idx in picked:
            by_trace[tid].append(idx)
        rows: list[tuple[str, str, int]] = []
        for person, got in assignment.items():
            for unit in got:
                if mode == "span":
                    rows += [(person, unit, idx) for idx in by_trace[unit]]
                else:
                    rows.append((person, unit[0], unit[1]))
        store.execute(
            "INSERT INTO review_assignments SELECT ?, unnest(?), unnest(?), unnest(?)",
            [name, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
        )
    return study


def _insert_study(store: "Store", s: Study) -> None:
    store.execute(
        "INSERT INTO review_studies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [s.name, s.mode, s.blind, s.overlap, s.codebook_name, s.codebook_version, s.strategy, s.seed,
         json.dumps(s.parameters, sort_keys=True), s.judge_annotator, s.adjudicator, s.context_chars, s.state,
         s.server_url, to_naive_utc(s.created_at), to_naive_utc(s.updated_at)],
    )


def load_study(store: "Store", name: str) -> Study:
    """The stored study ``name``; :class:`ReviewError` lists the existing studies otherwise."""
    from datetime import timezone

    ensure_tables(store)
    row = store.execute(
        "SELECT name, mode, blind, overlap, codebook_name, codebook_version, strategy, seed, parameters, judge_annotator, "
        "adjudicator, context_chars, state, server_url, created_at, updated_at FROM review_studies WHERE name = ?",
        [name],
    ).fetchone()
    if row is None:
        names = [r[0] for r in store.execute("SELECT name FROM review_studies ORDER BY name").fetchall()]
        raise ReviewError(f"no study {name!r} in {store.path}. Studies: {', '.join(names) or 'none (ror review create)'}")
    return Study(
        name=row[0], mode=row[1], blind=row[2], overlap=row[3], codebook_name=row[4], codebook_version=row[5],
        strategy=row[6], seed=row[7], parameters=json.loads(row[8]), judge_annotator=row[9], adjudicator=row[10],
        context_chars=row[11], state=row[12], server_url=row[13],
        created_at=row[14].replace(tzinfo=timezone.utc), updated_at=row[15].replace(tzinfo=timezone.utc),
    )


def update_study(store: "Store", name: str, **fields: Any) -> None:
    """Set columns of a stored study (state, server_url, adjudicator) and bump ``updated_at``."""
    allowed = {"state", "server_url", "adjudicator"}
    bad = set(fields) - allowed
    if bad:
        raise ValueError(f"cannot update {sorted(bad)} of a study; only {sorted(allowed)}")
    sets = ", ".join(f"{k} = ?" for k in fields) + ", updated_at = ?"
    store.execute(f"UPDATE review_studies SET {sets} WHERE name = ?", [*fields.values(), to_naive_utc(utc_now()), name])


def study_people(store: "Store", name: str, role: str = "annotator") -> list[str]:
    """Pseudonyms with ``role`` in study ``name``, sorted."""
    return [r[0] for r in store.execute(
        "SELECT pseudonym FROM review_study_people WHERE study = ? AND role = ? ORDER BY pseudonym", [name, role]
    ).fetchall()]


def study_items(store: "Store", name: str) -> list[SegmentKey]:
    """The sampled segments of study ``name``, in sampling order."""
    return [(r[0], r[1]) for r in store.execute(
        "SELECT trace_id, segment_index FROM review_items WHERE study = ? ORDER BY item_order", [name]
    ).fetchall()]


def study_design(store: "Store", name: str) -> list[tuple[SegmentKey, str | None, float | None]]:
    """``((trace_id, segment_index), stratum, inclusion_probability)`` of every item of study ``name``, in sampling order.

    Stratum and probability are None for items of strategies without a known design (and of
    studies created before the design was stored).
    """
    if store.schema_version("review") < 2:  # a store written before designs were stored, opened read-only
        return [(key, None, None) for key in study_items(store, name)]
    return [((r[0], r[1]), r[2], r[3]) for r in store.execute(
        "SELECT trace_id, segment_index, stratum, inclusion_probability FROM review_items WHERE study = ? ORDER BY item_order", [name]
    ).fetchall()]


def assignments(store: "Store", name: str, pseudonym: str) -> list[SegmentKey]:
    """Segments assigned to ``pseudonym`` in study ``name``, sorted by trace and index."""
    return [(r[0], r[1]) for r in store.execute(
        "SELECT trace_id, segment_index FROM review_assignments WHERE study = ? AND pseudonym = ? "
        "ORDER BY trace_id, segment_index", [name, pseudonym]
    ).fetchall()]
