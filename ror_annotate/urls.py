"""One check for every endpoint URL a user gives: the judge's ``--base-url``, Label Studio's
``--url`` / ``LABEL_STUDIO_URL`` / ``--public-url``.

``urllib.parse`` raises ``ValueError`` for a URL it cannot read (an unclosed IPv6 bracket, a port
that is not a number in 0-65535), and the HTTP clients raise their own errors later; both reached
the user as tracebacks (``ValueError: Invalid IPv6 URL``, ``InvalidURL: Invalid port``), and a URL
with a space in it was sent requests. Here such a URL is one coded line (``E778``), its password
hidden.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from .errors import ConfigError

__all__ = ["BAD_URL", "check_http_url", "redact_url"]

#: Code of a URL that cannot be parsed.
BAD_URL = "E778"


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` hidden, even when the URL cannot be parsed."""
    from .provenance import scrub_url

    try:
        return scrub_url(url)
    except ValueError:
        return re.sub(r"//[^/@]*@", "//***@", url)


def check_http_url(url: str, *, option: str, example: str) -> SplitResult:
    """``url`` split into its parts, once it is known to be readable as a URL.

    Parameters
    ----------
    url : str
        The URL as the user gave it.
    option : str
        How the user gave it (``--base-url``, ``LABEL_STUDIO_URL / --url``), named in the error.
    example : str
        A well-formed value, shown in the error.

    Raises
    ------
    ConfigError
        E778: it cannot be parsed (an unclosed IPv6 bracket, a port outside 0-65535 or not a number,
        whitespace or a control character in it).
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number in 0-65535)
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
            raise ValueError("it holds whitespace or a control character")
    except ValueError as exc:
        raise ConfigError(
            f"{option} {redact_url(url)!r} cannot be read as a URL ({exc}); give e.g. {example} "
            "(an IPv6 host in brackets: http://[::1]:8000)", code=BAD_URL,
        ) from None
    return parts
