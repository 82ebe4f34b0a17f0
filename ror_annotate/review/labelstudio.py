"""The edge to a Label Studio server: client calls with clear errors, and offset conversion.

Everything that talks HTTP to Label Studio goes through :class:`LabelStudioClient`, a thin wrapper
over ``label-studio-sdk`` (2.x) that turns transport and auth failures into
:class:`~ror_annotate.errors.ReviewError` messages naming the URL and the fix. The API key comes only
from the environment (``LABEL_STUDIO_API_KEY``) and is never stored or printed.

Offsets: inside ror_annotate offsets are Python code points. Label Studio's ``Text`` regions are code
points in 1.23, but browsers count UTF-16 code units and upstream has a history of off-by-one spans
after astral characters (shared/pitfalls/LS-01). :func:`anchor_span` therefore trusts the region's
``text`` and checks the offsets against it before anything is stored.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError, ReviewError
from ..provenance import scrub_url

#: Defaults match scripts/labelstudio.sh.
DEFAULT_URL = "http://127.0.0.1:8089"
URL_ENV = "LABEL_STUDIO_URL"
#: The address people open in their browser (a reverse proxy, a tunnel); links are built from it.
PUBLIC_URL_ENV = "LABEL_STUDIO_PUBLIC_URL"
KEY_ENV = "LABEL_STUDIO_API_KEY"
START_HINT = "start it with `bash scripts/labelstudio.sh start` (or `ror review serve`), or set LABEL_STUDIO_URL"


def server_url(url: str | None = None) -> str:
    """The server URL: ``url``, else ``$LABEL_STUDIO_URL``, else :data:`DEFAULT_URL` (no trailing slash).

    Raises
    ------
    ConfigError
        E778: the value cannot be read as a URL (:func:`ror_annotate.urls.check_http_url`).
    """
    from ..urls import check_http_url

    value = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
    check_http_url(value, option=f"{URL_ENV} / --url", example=DEFAULT_URL)
    return value


def public_url(public: str | None = None, *, server: str | None = None) -> str:
    """The base of every link ror prints for people: ``public``, else ``$LABEL_STUDIO_PUBLIC_URL``, else the server URL.

    ror talks to the server at :func:`server_url` (often loopback, on the server's machine), while
    annotators on other machines open the public address (a TLS reverse proxy, an SSH tunnel).

    Raises
    ------
    ConfigError
        The value is not an ``http://`` or ``https://`` URL.
    """
    from ..urls import check_http_url

    value = (public or os.environ.get(PUBLIC_URL_ENV) or server_url(server)).rstrip("/")
    check_http_url(value, option=f"{PUBLIC_URL_ENV} / --public-url", example="https://label.lab.org")
    if not re.match(r"^https?://[^/\s]+", value):
        raise ConfigError(f"{PUBLIC_URL_ENV} / --public-url must be an http:// or https:// URL, got {scrub_url(value)!r}")
    # Links are printed and handed to people: never with the server's user:password in them.
    return re.sub(r"^(https?://)[^/@\s]*@", r"\1", value)


# ------------------------------------------------------------------------------------ offsets
def codepoint_to_utf16(text: str, index: int) -> int:
    """UTF-16 code-unit offset of code-point offset ``index`` in ``text`` (astral characters count 2)."""
    return len(text[:index].encode("utf-16-le")) // 2


def utf16_to_codepoint(text: str, offset: int) -> int | None:
    """Code-point offset of UTF-16 offset ``offset`` in ``text``; None if it splits a surrogate pair or is out of range."""
    units = 0
    for i, ch in enumerate(text):
        if units == offset:
            return i
        if units > offset:
            return None
        units += 2 if ord(ch) > 0xFFFF else 1
    return len(text) if units == offset else None


@dataclass(frozen=True)
class Anchored:
    """A span located in code points; ``how`` says which reading of the offsets matched."""

    start: int
    end: int
    how: Literal["codepoints", "utf16", "text-search"]


def anchor_span(text: str, start: int, end: int, span_text: str) -> Anchored:
    """Locate a Label Studio span in ``text`` as code-point offsets, trusting ``span_text``.

    Policy (shared/pitfalls/LS-01): accept ``start``/``end`` as code points if
    ``text[start:end] == span_text``; else read them as UTF-16 code units and convert; else, if
    ``span_text`` occurs exactly once in ``text``, re-anchor there; else refuse.

    Parameters
    ----------
    text : str
        The full task text (the trace).
    start, end : int
        The region's offsets as Label Studio gave them.
    span_text : str
        The region's ``value.text``.

    Returns
    -------
    Anchored

    Raises
    ------
    ReviewError
        Neither reading matches and the text is absent or ambiguous: the span is misaligned.
    """
    if 0 <= start <= end <= len(text) and text[start:end] == span_text:
        return Anchored(start, end, "codepoints")
    cs, ce = utf16_to_codepoint(text, start), utf16_to_codepoint(text, end)
    if cs is not None and ce is not None and text[cs:ce] == span_text:
        return Anchored(cs, ce, "utf16")
    if span_text:
        hits = [m.start() for m in re.finditer(re.escape(span_text), text)]
        if len(hits) == 1:
            return Anchored(hits[0], hits[0] + len(span_text), "text-search")
        found = f"occurs {len(hits)} times" if hits else "does not occur"
    else:
        found = "is empty"
    raise ReviewError(
        f"span [{start}, {end}) with text {span_text[:60]!r} is misaligned: the text at those offsets (read as code points "
        f"or as UTF-16 units) differs, and the span text {found} in the trace, so it cannot be re-anchored"
    )


# ------------------------------------------------------------------------------------ client
class LabelStudioClient:
    """A Label Studio server, as the review stage uses it.

    Parameters
    ----------
    url : str, optional
        Server URL ror calls (default ``$LABEL_STUDIO_URL`` or ``http://127.0.0.1:8089``).
    api_key : str, optional
        For tests and scripts; commands read ``$LABEL_STUDIO_API_KEY`` only (secrets come from the
        environment). A legacy token or a personal access token (JWT).
    timeout : float
        Seconds per HTTP request.
    public : str, optional
        Base URL of the links printed for people (default ``$LABEL_STUDIO_PUBLIC_URL``, else ``url``).

    Raises
    ------
    ReviewError
        No API key in the environment.
    ConfigError
        ``label-studio-sdk`` is not installed (the ``review`` extra).
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 120.0, public: str | None = None) -> None:
        self.url = server_url(url)
        self.public_url = public_url(public, server=self.url)
        key = api_key or os.environ.get(KEY_ENV)
        if not key:
            raise ReviewError(
                f"no Label Studio API key: set {KEY_ENV} to the token of the Label Studio admin at {scrub_url(self.url)} "
                f"(`bash scripts/labelstudio.sh env` prints the local one; in the UI: Account & Settings > Access Token)"
            )
        try:
            from label_studio_sdk import LabelStudio  # heavy import (pandas, opencv): keep it lazy
        except ImportError as exc:
            raise ConfigError(f"the review queue needs label-studio-sdk ({exc}): pip install 'ror_annotate[review]'") from None

        self._ls = LabelStudio(base_url=self.url, api_key=key, timeout=timeout)
        self._user: Any = None

    # ---------------------------------------------------------------- error mapping
    def _call(self, what: str, fn: Any, *args: Any, _none_on_404: bool = False, **kwargs: Any) -> Any:
        import httpx
        from label_studio_sdk.core.api_error import ApiError

        try:
            return fn(*args, **kwargs)
        except httpx.TransportError as exc:
            raise ReviewError(f"Label Studio at {scrub_url(self.url)} is not reachable ({type(exc).__name__} while trying to {what}): {START_HINT}") from None
        except ApiError as exc:
            if _none_on_404 and exc.status_code == 404:
                return None
            body = str(exc.body)[:300]
            if exc.status_code in (401, 403):
                raise ReviewError(
                    f"Label Studio at {scrub_url(self.url)} refused the API key (HTTP {exc.status_code} while trying to {what}: {body}). "
                    f"Set {KEY_ENV} to a valid token of that server; a legacy token only works if the server was first "
                    "started with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true (scripts/labelstudio.sh does this)"
                ) from None
            raise ReviewError(f"Label Studio at {scrub_url(self.url)} answered HTTP {exc.status_code} while trying to {what}: {body}") from None

    def whoami(self) -> Any:
        """The user the API key belongs to (checks reachability and the key once per client)."""
        if self._user is None:
            self._user = self._call("identify the API key's user", self._ls.users.whoami)
        return self._user

    # ---------------------------------------------------------------- users
    def users_by_email(self) -> dict[str, int]:
        """``{email (lower case): user id}`` for every user of the organization."""
        users = self._call("list users", self._ls.users.list)
        return {u.email.lower(): int(u.id) for u in users if u.email}

    def invite_url(self) -> str:
        """Absolute signup link of the organization at the public URL (what new annotators open to create their account)."""
        invite = self._call("read the organization's invite link", self._ls.organizations.invites.get_invite_link)
        return f"{self.public_url}{invite.invite_url}"

    # ---------------------------------------------------------------- projects and tasks
    def project(self, project_id: int) -> Any | None:
        """The project ``project_id``, or None if it no longer exists."""
        return self._call(f"read project {project_id}", self._ls.projects.get, project_id, _none_on_404=True)

    def project_url(self, project_id: int) -> str:
        """Browser URL of a project's data manager, at the public URL."""
        return f"{self.public_url}/projects/{project_id}/data"

    def create_project(
        self, *, title: str, description: str, label_config: str, model_version: str | None = None, show_predictions: bool = False
    ) -> int:
        """Create a project (one annotation per task, skip button on) and return its id."""
        p = self._call(
            f"create project {title!r}", self._ls.projects.create,
            title=title, description=description, label_config=label_config, maximum_annotations=1,
            show_skip_button=True, show_collab_predictions=show_predictions, model_version=model_version or "",
            enable_empty_annotation=False,
        )
        return int(p.id)

    def import_tasks(self, project_id: int, tasks: Sequence[dict], *, batch_size: int = 500) -> int:
        """Import tasks (with their predictions) in batches; returns how many were created."""
        created = 0
        for i in range(0, len(tasks), batch_size):
            r = self._call(
                f"import tasks into project {project_id}", self._ls.projects.import_tasks,
                id=project_id, request=list(tasks[i:i + batch_size]), return_task_ids=True,
            )
            created += int(r.task_count or 0)
        return created

    def set_config(self, project_id: int, label_config: str) -> None:
        """Replace a project's labeling config (used only to restore the study's own config)."""
        self._call(f"restore the config of project {project_id}", self._ls.projects.update, project_id, label_config=label_config)

    def export_tasks(self, project_id: int) -> list[dict]:
        """Every task of a project with its annotations (sync JSON export; ``completed_by`` is a user id)."""
        return self._call(f"export project {project_id}", self._ls.projects.exports.as_json, project_id)


# ------------------------------------------------------------------------------------ accounts
def signup_errors(page: str) -> str:
    """The form errors of a refused sign-up page, ``"; "``-joined (empty when none is found).

    Label Studio puts them in ``<ul class="field_errors"><li>...</li></ul>`` (and older pages in an
    element whose class holds ``error``): the text of each such element, tags dropped and white space
    collapsed. (The first element's text alone is only the white space before its ``<li>``, which
    once left the E600 line ending in "refused the signup of X:" with no reason.)
    """
    found = []
    for block in re.findall(r'class="[^"]*error[^"]*"[^>]*>(.*?)</(?:ul|div|p|span)>', page, flags=re.S):
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", block)).split())
        if text and text not in found:
            found.append(text)
    return "; ".join(found)


def signup_annotator(url: str, invite_url: str, email: str, password: str, *, timeout: float = 60.0) -> str:
    """Create a Label Studio account through the organization's invite link and return its API token.

    This is what a human does in a browser (open the invite link, sign up); scripted for tests and
    for setting up many annotators at once. The open-source edition ignores passwords given to
    ``POST /api/users/``, so the signup form is the only route to a user who can log in.

    Parameters
    ----------
    url : str
        Server URL.
    invite_url : str
        The link from :meth:`LabelStudioClient.invite_url`.
    email, password : str
        The new account (password at least 8 characters).

    Returns
    -------
    str
        The new user's API token (legacy token), to pass as ``LABEL_STUDIO_API_KEY`` for that user.

    Raises
    ------
    ReviewError
        The server is unreachable or refused the signup (e.g. the e-mail is taken).
    """
    import httpx

    url = url.rstrip("/")
    # The printed link is built from the public URL; the form is posted to the server ror reaches.
    at = invite_url.find("/user/signup/")
    invite_url = invite_url[at:] if at >= 0 else invite_url
    try:
        with httpx.Client(base_url=url, follow_redirects=False, timeout=timeout) as c:
            page = c.get(invite_url)
            csrf = c.cookies.get("csrftoken")
            if page.status_code != 200 or not csrf:
                raise ReviewError(f"the invite link {scrub_url(invite_url)} did not give a signup form (HTTP {page.status_code})")
            r = c.post(invite_url, data={"email": email, "password": password, "csrfmiddlewaretoken": csrf},
                       headers={"Referer": invite_url if invite_url.startswith("http") else url + invite_url})
            if r.status_code != 302:
                raise ReviewError(f"Label Studio at {scrub_url(url)} refused the signup of {email}: {signup_errors(r.text) or f'HTTP {r.status_code}'}")
            tok = c.get("/api/current-user/token")
            token = tok.json().get("token") if tok.status_code == 200 and "json" in tok.headers.get("content-type", "") else None
            if not token:
                # a bare httpx.HTTPStatusError would reach the user as a traceback
                raise ReviewError(f"Label Studio at {scrub_url(url)} signed up {email} but gave no API token "
                                  f"(HTTP {tok.status_code} from /api/current-user/token); log in once in the browser and retry")
            return str(token)
    except httpx.TransportError as exc:
        raise ReviewError(f"Label Studio at {scrub_url(url)} is not reachable ({type(exc).__name__}): {START_HINT}") from None
