"""The viewer: a self-contained static site to look at labelled traces and a study dashboard.

:func:`build_view` writes it from a store (``ror view``); :func:`build_view_from_export` from an
exported dataset folder (``ror view --from-export``); :func:`serve` serves a built site on 127.0.0.1.
See :mod:`ror_annotate.view.build` for the layout of the site.
"""

from .build import ViewOptions, ViewSummary, build_view

__all__ = ["ViewOptions", "ViewSummary", "build_view"]
