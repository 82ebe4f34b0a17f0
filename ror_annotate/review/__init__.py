"""The human review queue in Label Studio: studies, blind review, overlap and adjudication.

Stage flow: :func:`create_study` samples segments and assigns them to annotators (overlap by
construction) -> :func:`push_study` creates one Label Studio project per annotator -> annotators
label -> :func:`pull_study` stores their labels (``source="human"``, pseudonymous annotator ids) ->
:func:`adjudicate_study` settles disagreements (``source="adjudicated"``) ->
:func:`reference_labels` gives the reference label per segment for exports and agreement.
:func:`review_start` / :func:`review_finish` chain these steps for the common case (start the server,
create, accounts, push; pull and agreement).

The Label Studio SDK is imported only when a client is made, so importing this package is cheap.
"""

from .adjudicate import (
    AdjudicationReport, Disagreement, DisagreementStatus, ReferenceLabel, adjudicate_study, disagreement_status, disagreements,
    measures_judge, reference_labels,
)
from .labelstudio import (
    Anchored, LabelStudioClient, anchor_span, codepoint_to_utf16, public_url, server_url, signup_annotator, utf16_to_codepoint,
)
from .studies import (
    STRATEGIES, Selection, Study, StudyOptions, assign_overlap, available_strategies, create_study, load_study, register_strategy,
    sample_size_for_ci_width, study_design,
)
from .sync import AnnotatorProgress, PullReport, PushReport, pull_study, push_study, study_status
from .flow import ReviewFinishOptions, ReviewFinishSummary, ReviewStartOptions, ReviewStartSummary, review_finish, review_start

__all__ = [
    "AdjudicationReport", "Anchored", "AnnotatorProgress", "Disagreement", "DisagreementStatus", "LabelStudioClient", "PullReport", "PushReport",
    "ReferenceLabel", "Study", "adjudicate_study", "anchor_span", "assign_overlap", "available_strategies",
    "codepoint_to_utf16", "create_study", "disagreement_status", "disagreements", "measures_judge", "public_url", "server_url", "load_study", "pull_study", "push_study", "reference_labels",
    "register_strategy", "sample_size_for_ci_width", "signup_annotator", "study_status", "utf16_to_codepoint",
    "STRATEGIES", "Selection", "StudyOptions", "study_design",
    "ReviewFinishOptions", "ReviewFinishSummary", "ReviewStartOptions", "ReviewStartSummary", "review_finish", "review_start",
]
