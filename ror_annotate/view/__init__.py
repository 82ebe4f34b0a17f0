"""The viewer: a self-contained static site to look at labelled traces and a study dashboard.

:func:`build_view` writes it from a store (``ror view``); :func:`build_view_from_export` from an
exported dataset folder (``ror view --from-export``); :func:`make_server` serves a built site on 127.0.0.1.
See :mod:`ror_annotate.view.build` for the layout of the site.
"""

from .build import ViewOptions, ViewSummary, build_view, build_view_from_export
from .serve import make_server

__all__ = ["ViewOptions", "ViewSummary", "build_view", "build_view_from_export", "make_server"]
