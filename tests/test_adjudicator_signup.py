"""An adjudicator (or annotator) e-mail that Label Studio refuses must not get stuck in a study.

The refused addresses below are the ones the lead's Label Studio 1.x server refused at sign-up
(``Enter a valid email address.`` / ``Email is too long``, run by hand on 2026-12-07 through
``ror review start ... --adjudicator EMAIL``): before, each passed ``check_email``, was recorded as the
study's adjudicator, and a re-run with the right address was refused as "another adjudicator".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate.errors import InputError, ReviewError
from ror_annotate.review import flow
from ror_annotate.review.studies import check_email, create_study, load_study, person_email
from ror_annotate.store import Store

from .review_fixtures import two_segment_store

REFUSED_BY_LABEL_STUDIO = ["a5@b.c", "a5@x_y.org", "a5@-x.org", "a5@x-.org", "a5@" + "d" * 70 + ".org", "a5..b@lab.org",
                           ".a5@lab.org", "a5@lab..org", "a5@123.45", "a5@lab.o-", "a" * 300 + "@lab.org"]
ACCEPTED_BY_LABEL_STUDIO = ["adj@localhost", "ADJ5x@Lab.org", "a5'x@lab.org", " adj5y@lab.org "]


@pytest.mark.parametrize("email", REFUSED_BY_LABEL_STUDIO)
def test_an_address_label_studio_refuses_is_e100_before_anything_is_stored(email: str) -> None:
    with pytest.raises(InputError, match="is not an e-mail address") as info:
        check_email(email)
    assert info.value.code == "E100"


def test_a_bad_adjudicator_address_is_named_as_the_adjudicator(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    with pytest.raises(InputError, match=r"^adjudicator 'a5@b\.c' is not an e-mail address; give the adjudicator's"):
        flow.adjudicator_account(store, "pilot-1", object(), "a5@b.c")  # type: ignore[arg-type]
    store.close()


@pytest.mark.parametrize("email", ACCEPTED_BY_LABEL_STUDIO)
def test_an_address_label_studio_accepts_still_passes(email: str) -> None:
    assert check_email(email) == email.strip()


class _RefusingClient:
    """A server that refuses the sign-up of one address (what Label Studio does for reasons of its own)."""

    url = public_url = "http://ls.invalid"

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.users: set[str] = set()

    def users_by_email(self) -> dict[str, int]:
        return {u: k for k, u in enumerate(self.users)}

    def invite_url(self) -> str:
        return "http://ls.invalid/invite"


def test_a_refused_adjudicator_signup_records_nothing_and_a_rerun_with_another_goes_on(tmp_path: Path, monkeypatch) -> None:
    store = two_segment_store(tmp_path / "s.duckdb")
    create_study(store, "pilot-1", annotators=["ann1@lab.org", "ann2@lab.org"], strategy="random", n=2, overlap=2)
    client = _RefusingClient("bad@lab.org")

    def signup(url: str, invite: str, email: str, password: str) -> None:
        if email == client.refused:
            raise ReviewError(f"Label Studio at {url} refused the signup of {email}: for its own reasons", code="E600")
        client.users.add(email)

    monkeypatch.setattr(flow, "signup_annotator", signup)
    with pytest.raises(ReviewError):
        flow.adjudicator_account(store, "pilot-1", client, "bad@lab.org")  # type: ignore[arg-type]
    assert not load_study(store, "pilot-1").adjudicator  # was: the refused address, for good
    link = flow.adjudicator_account(store, "pilot-1", client, "adj@lab.org")  # type: ignore[arg-type]
    assert link is not None and link.email == "adj@lab.org" and link.new_account and link.password
    assert person_email(store, load_study(store, "pilot-1").adjudicator) == "adj@lab.org"
    again = flow.adjudicator_account(store, "pilot-1", client)  # type: ignore[arg-type]
    assert again is not None and not again.new_account and again.password is None
