"""The agreement report leaves matplotlib's global state alone and returns real Figure objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from ror_annotate.agreement import Ratings, agreement

ROOT = Path(__file__).resolve().parents[1]


def _result():
    m = np.array([["a", "a", "b"], ["b", "b", "b"], ["a", "b", "a"], ["c", "c", "c"], ["a", "a", "a"]], dtype=object)
    return agreement(Ratings.from_matrix(m, annotators=["x", "y", "z"], groups=["t1", "t1", "t2", "t2", "t3"]),
                     reference="majority", n_resamples=20)


def test_importing_and_writing_the_report_keep_the_global_backend(tmp_path):
    """Run in a fresh interpreter whose backend is 'svg': neither the import nor a full report may switch it."""
    script = textwrap.dedent(
        f"""
        import json, sys
        import matplotlib
        before = (matplotlib.get_backend(), matplotlib.rcParams["backend"])
        import ror_annotate.agreement_report as rep
        after_import = (matplotlib.get_backend(), matplotlib.rcParams["backend"])
        import numpy as np
        from ror_annotate.agreement import Ratings, agreement
        m = np.array([["a", "a", "b"], ["b", "b", "b"], ["a", "b", "a"], ["c", "c", "c"]], dtype=object)
        res = agreement(Ratings.from_matrix(m), reference="majority", n_resamples=10)
        rep.write_report(res, {str(tmp_path / "rep")!r})
        after_write = (matplotlib.get_backend(), matplotlib.rcParams["backend"])
        print(json.dumps({{"before": before, "after_import": after_import, "after_write": after_write,
                           "pyplot": "matplotlib.pyplot" in sys.modules}}))
        """
    )
    env = {**os.environ, "MPLBACKEND": "svg", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == ["svg", "svg"]
    assert seen["after_import"] == seen["before"]
    assert seen["after_write"] == seen["before"]
    assert seen["pyplot"] is False  # no pyplot figure registry involved
    for name in ("confusion.png", "per_class.png"):
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_are_plain_figure_objects():
    from matplotlib.figure import Figure

    from ror_annotate.agreement_report import confusion_figure, per_class_figure

    d = _result().to_dict()
    conf = confusion_figure(d)
    assert isinstance(conf, Figure)
    heatmaps = [ax for ax in conf.axes if ax.get_images()]
    assert [ax.get_xlabel() for ax in heatmaps] == ["x", "y", "z"]
    np.testing.assert_array_equal(
        [[float(t.get_text()) for t in heatmaps[0].texts]],
        [np.asarray(d["per_class"]["annotators"]["x"]["confusion_matrix"], dtype=float).ravel()],
    )
    bars = per_class_figure(d)
    assert isinstance(bars, Figure) and len(bars.axes) == 1
    assert len(bars.axes[0].patches) == 3 * 3  # three annotators x three classes
    no_ref = _result().to_dict()
    no_ref["per_class"] = None
    assert confusion_figure(no_ref) is None and per_class_figure(no_ref) is None


def test_confusion_panels_do_not_overlap_with_the_six_behaviors():
    """Issue 27: each panel's tick labels (the long behavior names) stay clear of the next panel."""
    from ror_annotate.agreement_report import confusion_figure
    from ror_annotate.records import BEHAVIORS

    rng = np.random.default_rng(0)
    m = np.array([[BEHAVIORS[i] for i in rng.integers(0, 6, size=4)] for _ in range(60)], dtype=object)
    d = agreement(Ratings.from_matrix(m, annotators=["annotator-one", "annotator-two", "judge", "human"], categories=list(BEHAVIORS)),
                  reference="majority", n_resamples=5).to_dict()
    fig = confusion_figure(d)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_images()]
    boxes = [ax.get_tightbbox(renderer) for ax in panels]
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 <= right.x0, (left, right)
    width, height = fig.get_size_inches() * fig.dpi
    assert all(b.x0 >= 0 and b.x1 <= width and b.y0 >= 0 and b.y1 <= height for b in boxes)
