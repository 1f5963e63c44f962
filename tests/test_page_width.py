"""Pages a reader can see: at 1280 px (and 1264, with a scrollbar) no table, code block
or widget of a chapter or the results page is wider than the book's text column, so
nothing needs a sideways scrollbar. Needs a built book and Debian's chromium, as
tests/test_browser.py (whose server and browser fixtures this reuses)."""
from __future__ import annotations

import pytest

from test_browser import HTML, browser, site  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

WIDE = """() => {
  const main = document.querySelector('article.bd-article') ||
               document.querySelector('main');
  const right = main.getBoundingClientRect().right;
  const out = [];
  const sel = 'table, pre, .pst-scrollable-table-container, .onelaunch-ladder, ' +
              '.onelaunch-ladder .jupyter-widgets, div.cell_output';
  for (const el of main.querySelectorAll(sel)) {
    const scrolls = ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    // past the column's edge, or a sideways scrollbar of its own
    if (el.getBoundingClientRect().right > right + 0.5 ||
        (scrolls && el.scrollWidth > el.clientWidth + 1)) {
      out.push(`${el.tagName}.${String(el.className).slice(0, 30)}: ` +
               `${el.scrollWidth} px in ${el.clientWidth}: ` +
               (el.innerText || '').slice(0, 40).replace(/\\n/g, ' '));
    }
  }
  return out;
}"""


def _pages():
    pages = sorted(p.relative_to(HTML).as_posix()
                   for p in (HTML / "notebooks").glob("*.html"))
    return pages + ["book/results.html", "book/intro.html"]


@pytest.mark.parametrize("width", [1280, 1264])
def test_nothing_is_wider_than_the_column(site, browser, width):  # noqa: F811
    page = browser.new_page(viewport={"width": width, "height": 900})
    wide = {}
    for rel in _pages():
        page.goto(f"{site}/{rel}")
        page.wait_for_timeout(500)
        found = page.evaluate(WIDE)
        if found:
            wide[rel] = found
    page.close()
    assert not wide, "wider than the text column:\n" + "\n".join(
        f"{p}: {x}" for p, xs in wide.items() for x in xs)
