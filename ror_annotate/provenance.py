"""Provenance helpers: the tool version, the versions of the libraries a run used, and the one
secret scrubber (:func:`scrub_text`) applied to everything the product stores, prints or writes."""

from __future__ import annotations

import base64
import os
import re
import threading
from functools import lru_cache
from importlib import metadata
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from . import __version__

#: Libraries whose versions are recorded with every run.
TRACKED_PACKAGES = (
    "ror_annotate", "duckdb", "spacy", "pydantic", "datasets", "pyarrow", "numpy",
    "openai", "tokenizers", "transformers", "torch", "label-studio-sdk",
)


def tool_version() -> str:
    """``"ror_annotate <version>"``: the provenance string written on every exported row."""
    return f"ror_annotate {__version__}"


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Installed versions of :data:`TRACKED_PACKAGES` (absent packages are omitted)."""
    versions: dict[str, str] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


# --------------------------------------------------------------------------- secrets
# One scrubber for everything the product stores, prints or writes (issue 27, "Secrets"): the store's
# runs (parameters, counts), judge_failures.reason, the progress file, and every error line.

#: Parameter names whose values are secrets (``runs.parameters``; query parameters of URLs).
_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|credential)", re.IGNORECASE)
#: ``//user:password@`` in any URL (the password may hold anything but ``/?#@``).
_URL_PASSWORD = re.compile(r"(//[^/?#@:\s]*):[^/?#@\s]*@")
#: An ``Authorization`` header value as endpoints echo it: ``Bearer <token>`` / ``Basic <base64>``.
_AUTH_VALUE = re.compile(r"\b(Bearer|Basic)(\s+)([A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
#: Environment variables that hold tokens of the services the product talks to; any other variable
#: whose name ends in ``_API_KEY``, ``_TOKEN``, ``_SECRET`` or ``_PASSWORD`` is read as one too.
SECRET_ENV_VARS = (
    "OPENAI_API_KEY", "LABEL_STUDIO_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN",
    "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY", "MISTRAL_API_KEY",
)
_SECRET_ENV_NAME = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD|_ACCESS_KEY)$")
#: Values that are not secrets although they sit in such variables (the judge's local placeholder key).
_NOT_SECRET = {"sk-no-key-required", "EMPTY", "none", "None", "true", "false"}
#: Shorter values are not scrubbed as plain text (a 3-character "secret" would cut words apart).
MIN_SECRET_CHARS = 6
_REGISTERED: set[str] = set()
_REGISTER_LOCK = threading.Lock()
MASK = "***"


def register_secret(value: str | None) -> None:
    """Add ``value`` (an API key, a password) to the secrets :func:`scrub_text` removes, with its
    ``Bearer``/``Basic`` encodings; values shorter than :data:`MIN_SECRET_CHARS` are ignored."""
    if not value or len(value) < MIN_SECRET_CHARS or value in _NOT_SECRET:
        return
    with _REGISTER_LOCK:
        _REGISTERED.add(value)


def register_url_secrets(url: str | None) -> None:
    """Register the credentials written into ``url`` (``http://user:password@host``): the password,
    its percent-decoded form, and ``base64(user:password)``, which HTTP clients send as
    ``Authorization: Basic ...`` and which proxies echo back in their error texts."""
    if not url or "://" not in url:
        return
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    if password is None:
        return
    for raw_user, raw_pw in ((user or "", password), (unquote(user or ""), unquote(password))):
        register_secret(raw_pw)
        pair = f"{raw_user}:{raw_pw}".encode()
        register_secret(base64.b64encode(pair).decode("ascii"))


def known_secrets() -> list[str]:
    """Every secret value :func:`scrub_text` removes, longest first: the registered ones, the tokens
    in the environment (:data:`SECRET_ENV_VARS` and any ``*_API_KEY``/``*_TOKEN``/``*_SECRET``/
    ``*_PASSWORD`` variable), and the credentials of URLs in ``*_URL`` variables."""
    values = set(_REGISTERED)
    for name, value in os.environ.items():
        if not value:
            continue
        if name in SECRET_ENV_VARS or _SECRET_ENV_NAME.search(name):
            if len(value) >= MIN_SECRET_CHARS and value not in _NOT_SECRET:
                values.add(value)
        elif name.endswith("_URL") and "@" in value:
            try:
                parts = urlsplit(value)
                user, password = parts.username, parts.password
            except ValueError:
                continue
            if password and len(password) >= MIN_SECRET_CHARS:
                values.add(password)
                values.add(base64.b64encode(f"{user or ''}:{password}".encode()).decode("ascii"))
    return sorted(values, key=len, reverse=True)


def scrub_url(url: str) -> str:
    """``url`` with a password in it (``http://user:KEY@host``) and secret-looking query parameters
    (``?api-key=KEY``, ``?token=...``) replaced by ``***``; any other string is returned unchanged.

    Proxies and gateways are often given their key inside ``--base-url``; the URL itself is worth
    keeping as provenance, the key is not.
    """
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_PASSWORD.sub(r"\1:***@", url)
    netloc = _URL_PASSWORD.sub(r"\1:***@", "//" + parts.netloc)[2:]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        secret = [_SECRET_KEY.search(k) is not None or k.lower() in ("key", "sig", "signature") for k, _ in pairs]
        if any(secret):
            query = urlencode([(k, "***" if hide else v) for (k, v), hide in zip(pairs, secret)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub_text(text: str) -> str:
    """``text`` with every known secret replaced by ``***``: the values of :func:`known_secrets`
    (also inside longer strings), ``Authorization`` values (``Bearer ...``, ``Basic ...``), and the
    password of every URL in it (``//user:***@host``). Apply it to any text before it is stored,
    printed or written; the result is safe to show.
    """
    if not text:
        return text
    for secret in known_secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    text = _AUTH_VALUE.sub(_mask_auth_value, text)
    if "//" in text and "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
    return text


def _mask_auth_value(m: re.Match[str]) -> str:
    scheme, space, value = m.group(1), m.group(2), m.group(3)
    if scheme.lower() == "basic":
        # Only what decodes as ``user:password`` (prose such as "Basic information" stays).
        try:
            secret = ":" in base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
        except ValueError:
            secret = False
    else:
        # A bearer token holds a digit or punctuation; an English word after "Bearer" stays.
        secret = any(not c.isalpha() for c in value)
    return f"{scheme}{space}{MASK}" if secret else m.group(0)


def scrub_value(value: Any) -> Any:
    """:func:`scrub_text` applied to every string inside ``value`` (dicts, lists and tuples walked;
    dict keys too); other values are returned as they are."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrub_text(k) if isinstance(k, str) else k: scrub_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub_value(v) for v in value)
    return value


def scrub_secrets(parameters: dict[str, Any]) -> dict[str, Any]:
    """Return ``parameters`` with the value of every key that looks like a secret replaced by ``"***"``,
    and secrets inside string values removed (:func:`scrub_url`, then :func:`scrub_text`).

    Used before anything is written to ``runs.parameters`` or a log: API keys and tokens come from the
    environment and must never reach the store.
    """
    clean: dict[str, Any] = {}
    for key, value in parameters.items():
        if _SECRET_KEY.search(str(key)) and value not in (None, "", False):
            clean[key] = "***"
        elif isinstance(value, dict):
            clean[key] = scrub_secrets(value)
        elif isinstance(value, str):
            clean[key] = scrub_text(scrub_url(value))
        elif isinstance(value, (list, tuple)):
            clean[key] = [scrub_text(scrub_url(v)) if isinstance(v, str) else v for v in value]
        else:
            clean[key] = value
    return clean
