"""The report's figures as a reader sees them: drawn without switching matplotlib's
backend (a chapter's own plots after them still show inline), at the page's width and
150 dpi, with plain numbers and a legend for every colour; captions from the same
rows."""
import io

import pytest

from onelaunch.report import figures

KROWS = [
    {"kernel": "rms_qkv", "gbps": 1333.2, "pct_of_read": 31.3, "bytes": 6.3e6},
    {"kernel": "rope_kv_write", "gbps": 5.08, "pct_of_read": 0.12, "bytes": 8.2e3},
    {"kernel": "attention (plain)", "gbps": 30.18, "pct_of_read": 0.7, "bytes": 5.2e5},
    {"kernel": "broken", "gbps": None, "pct_of_read": None, "bytes": 1e6},
    {"kernel": "lm_head_argmax", "gbps": 3865.0, "pct_of_read": 90.9, "bytes": 4.67e8},
]


def _png_size(png: bytes):
    from PIL import Image
    return Image.open(io.BytesIO(png)).size


def test_figures_leave_the_backend_alone():
    import matplotlib
    before = matplotlib.get_backend()
    rows = [{"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0,
             "floor_ms": 1.0, "agree": "8/8"}]
    figures.render_frame(rows, ["graph"], 0, ["m"])
    figures.kernel_figure(KROWS, 4.25, "head")
    assert matplotlib.get_backend() == before


def test_kernel_figure_reads_at_page_width(monkeypatch):
    from matplotlib.figure import Figure
    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self) or
                        real(self, *a, **k))
    f = figures.kernel_figure(KROWS, 4.253, "qwen, context 512")
    w, h = _png_size(f.png)
    assert w == round(figures.PAGE_W * figures.DPI)
    fig = drawn[-1]
    from matplotlib.text import Text
    texts = [t for t in fig.findobj(Text) if t.get_text().strip()]
    words = " | ".join(t.get_text() for t in texts)
    assert "1,333 GB/s, 31%" in words and "<1%" in words and "e+0" not in words
    assert "broken" not in words                       # a failed check has no bar
    assert "streaming read, this run: 4,253 GB/s" in words          # the legend
    assert "attention (plain): one program a head" in words
    assert min(t.get_fontsize() for t in texts) >= figures.FONT
    assert fig.axes[0].get_xscale() == "log"
    assert "lm_head_argmax, reaches 91%" in f.caption
    assert "rope_kv_write, <1%" in f.caption


def test_ladder_frame_has_a_legend_for_its_colours(monkeypatch):
    from matplotlib.figure import Figure
    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self) or
                        real(self, *a, **k))
    rows = [{"model": "m", "rung": "HF eager", "ctx": 8, "ms_per_token": 20.0,
             "floor_ms": 1.0, "agree": "8/8"},
            {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0,
             "floor_ms": 1.0, "agree": "8/8", "order": 1},
            {"model": "m", "rung": "pdl", "ctx": 8, "ms_per_token": 1.5,
             "floor_ms": 1.0, "agree": "8/8", "order": 2}]
    figures.render_frame(rows, ["HF eager", "graph", "pdl"], 2, ["m"])
    legend = [t.get_text() for t in drawn[-1].axes[0].get_legend().get_texts()]
    assert any("peer" in t for t in legend) and any("our rung" in t for t in legend)
    assert any("this frame" in t for t in legend)


def _frame(monkeypatch, rows, rungs, k):
    """The axes of each model in frame ``k``, as drawn."""
    from matplotlib.figure import Figure
    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self) or
                        real(self, *a, **k))
    figures.render_frame(rows, rungs, k, sorted({r["model"] for r in rows}))
    return drawn[-1].axes


def _bar_colours(ax):
    """The colours of the bars drawn (a hatched bar's is its edge's), as hex."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import Rectangle
    return {to_hex(p.get_edgecolor() if p.get_facecolor()[3] == 0 else p.get_facecolor())
            for p in ax.patches if isinstance(p, Rectangle)}


def _legend(ax):
    """(colours of the legend's patches, as hex; all its labels)."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import Patch
    leg = ax.get_legend()
    colours = {to_hex(h.get_edgecolor() if h.get_facecolor()[3] == 0 else h.get_facecolor())
               for h in leg.legend_handles if isinstance(h, Patch)}
    return colours, [t.get_text() for t in leg.get_texts()]


def _whiskers(ax):
    """[(y, x from, x to)] of the whiskers drawn."""
    return sorted((float(seg[0][1]), float(seg[0][0]), float(seg[1][0]))
                  for c in ax.collections if c.get_gid() == "whisker"
                  for seg in c.get_segments())


SPREAD_ROWS = [
    {"model": "m", "rung": "HF eager", "ctx": 8, "ms_per_token": 20.0, "floor_ms": 1.0,
     "agree": "8/8", "ms_min": 18.0, "ms_max": 23.0},
    {"model": "m", "rung": "HF static", "ctx": 8, "ms_per_token": 5.0, "floor_ms": 1.0,
     "agree": "8/8"},                                           # no spread recorded
    {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0, "floor_ms": 1.0,
     "agree": "8/8", "order": 1, "ms_min": 1.9, "ms_max": 2.3},
    {"model": "m", "rung": "fused", "ctx": 8, "ms_per_token": 3.0, "floor_ms": 1.0,
     "agree": "6/8", "order": 2, "ms_min": 2.9, "ms_max": 3.1,  # check failed: no time
     "flips": [{"step": 1, "margin": 3.0, "near_tie_below": 0.125}]},
    {"model": "m", "rung": "pdl", "ctx": 8, "ms_per_token": 1.5, "floor_ms": 1.0,
     "agree": "8/8", "order": 3}]
SPREAD_RUNGS = ["HF eager", "HF static", "graph", "fused", "pdl"]


def test_ladder_frame_draws_a_whisker_only_where_a_row_has_a_spread(monkeypatch):
    ax, = _frame(monkeypatch, SPREAD_ROWS, SPREAD_RUNGS, 4)
    # HF eager (0) and graph (2): min to max; HF static and pdl recorded none, and fused
    # failed its check (no time, so no spread either)
    assert _whiskers(ax) == [(0.0, 18.0, 23.0), (2.0, 1.9, 2.3)]
    assert "min-max of the timed repeats" in _legend(ax)[1]
    lo, hi = ax.get_xlim()
    assert lo < 1.9 and hi > 23.0                       # no whisker is cut off
    from matplotlib.text import Text
    texts = [t for t in ax.figure.findobj(Text) if t.get_text().strip()]
    assert min(t.get_fontsize() for t in texts) >= figures.FONT    # values still readable
    # a frame whose bars have no spread draws none, and has no key for one
    ax, = _frame(monkeypatch, SPREAD_ROWS, SPREAD_RUNGS[:2] + ["pdl"], 1)
    assert _whiskers(ax) == [(0.0, 18.0, 23.0)]
    bare = [{k: v for k, v in r.items() if not k.startswith("ms_m")} for r in SPREAD_ROWS]
    ax, = _frame(monkeypatch, bare, SPREAD_RUNGS, 4)
    assert _whiskers(ax) == [] and "min-max of the timed repeats" not in _legend(ax)[1]
    assert not [c for c in ax.collections if c.get_gid() == "whisker"]


@pytest.mark.parametrize("rungs, k", [(SPREAD_RUNGS, 4),     # ours, this frame's, failed
                                      (SPREAD_RUNGS, 1),     # this frame's is a peer
                                      (SPREAD_RUNGS, 3),     # this frame's failed its check
                                      (SPREAD_RUNGS[:2], 1),  # chapter 1: peers only
                                      (SPREAD_RUNGS[:2], 0)])
def test_ladder_legend_lists_exactly_the_colours_drawn(monkeypatch, rungs, k):
    rows = [r for r in SPREAD_ROWS if r["rung"] in rungs]
    ax, = _frame(monkeypatch, rows, rungs, k)
    drawn = _bar_colours(ax)
    assert drawn and _legend(ax)[0] == drawn
    words = " | ".join(_legend(ax)[1])
    assert ("this frame's peer" in words) == (figures.PEER_NOW_C in drawn)
    assert ("our rung" in words) == (figures.OURS_C in drawn)
    if len(rungs) == 2:            # chapters 1-2: no bar of ours, so no key for one
        assert "our rung" not in words and "this frame's rung" not in words


def test_ladder_frames_of_one_slider_have_one_size():
    sizes = {_png_size(figures.render_frame(SPREAD_ROWS, SPREAD_RUNGS, k, ["m"]))
             for k in range(len(SPREAD_RUNGS))}
    assert len(sizes) == 1


def test_ladder_caption_mentions_the_whiskers_only_when_drawn():
    assert "whiskers" in figures.ladder_figure(SPREAD_ROWS).caption
    bare = [{k: v for k, v in r.items() if not k.startswith("ms_m")} for r in SPREAD_ROWS]
    assert "whiskers" not in figures.ladder_figure(bare).caption
