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
    assert [ax.get_title() for ax in heatmaps] == ["x", "y", "z"]
    assert {ax.get_xlabel() for ax in heatmaps} == {"rater's label"}
    assert {ax.get_ylabel() for ax in heatmaps} == {"reference label (majority of the other annotators)"}
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


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_per_class_figure_is_titled_and_its_legend_covers_no_bar():
    """The legend once sat inside the axes, over the first classes' bars; it stands right of them now."""
    from ror_annotate.agreement_report import per_class_figure

    fig = per_class_figure(_result().to_dict())
    ax = fig.axes[0]
    assert ax.get_title() == "Per-class F1 vs majority of the other annotators (error bars: 95% trace-bootstrap interval)"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("behavior", "F1")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["x", "y", "z"]
    assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_reliability_legend_covers_no_point_and_stays_in_the_figure():
    """Bins at (low confidence, accuracy 1) and (high confidence, accuracy 0): the two corners a legend inside used."""
    from ror_annotate.agreement.reliability import reliability_figure

    def bins(points):
        return [{"low": k / 10, "mean_confidence": c, "accuracy": a, "n": n} for k, (c, a, n) in enumerate(points)]

    raters = [
        {"name": "judge-with-a-long-name:model-x", "n_bins": 10, "n_items": 30, "ece": {"value": 0.4},
         "bins": bins([(0.05, 1.0, 10), (0.15, 0.0, 0), (0.25, 0.0, 0), (0.35, 1.0, 5), (0.45, 0.5, 5), (0.55, 0.5, 0), (0.65, 0.0, 0),
                       (0.75, 0.0, 0), (0.85, 0.0, 0), (0.95, 0.02, 10)])},
        {"name": "aggregate:dawid-skene", "n_bins": 10, "n_items": 20, "ece": {"value": 0.1},
         "bins": bins([(0.05, 0.0, 0)] * 9 + [(0.97, 0.95, 20)])},
    ]
    fig = reliability_figure({"raters": raters, "reference": "adjudicated, else unanimous humans"})
    top = fig.axes[0]
    assert (top.get_xlabel(), top.get_ylabel()) == ("mean confidence in bin", "accuracy vs human reference")
    assert fig.axes[1].get_ylabel() == "labels per bin"
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = top.get_legend().get_window_extent(renderer)
    points = np.vstack([line.get_xydata() for line in top.get_lines()[1:]])
    assert len(points) == 5
    for x, y in top.transData.transform(points):
        assert not (box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1), (x, y, box)
    width, height = fig.get_size_inches() * fig.dpi
    assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height


def test_an_undefined_f1_is_marked_n_a_not_drawn_as_zero():
    """Classes absent from the reference and never labelled have no F1: no bar of height 0 (read as F1 = 0), an "n/a"."""
    from ror_annotate.agreement_report import per_class_figure

    m = np.array([["a", "a"], ["a", "a"], ["a", "b"]], dtype=object)
    d = agreement(Ratings.from_matrix(m, annotators=["x", "y"], groups=["t1", "t2", "t3"], categories=["a", "b", "c"]),
                  reference="majority", n_resamples=5).to_dict()
    assert d["per_class"]["annotators"]["x"]["classes"]["c"]["f1"]["value"] is None  # the premise, from the statistics
    ax = per_class_figure(d).axes[0]
    centers = sorted(round(p.get_x() + p.get_width() / 2, 6) for p in ax.patches)
    assert all(c < 1.5 for c in centers)  # bars for a and b only (x = 0, 1), none at c (x = 2)
    assert [(round(t.get_position()[0], 6), t.get_text()) for t in ax.texts] == [(1.8, "n/a"), (2.2, "n/a")]
    assert ax.get_xlim() == (-0.5, 2.5)
    assert "n/a: F1 undefined" in ax.get_xlabel()
