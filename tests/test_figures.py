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
