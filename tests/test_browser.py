"""The built book in a real browser, offline: the ladder slider renders from the widget
state in the static page (no kernel), moving it changes the frame, and no page asks for
anything outside localhost (the widget JavaScript comes from the book's _static/).

Uses Debian's chromium (/usr/bin/chromium; `ci/setup.sh` installs it) through
Playwright's Python package with ``executable_path``: no `playwright install`.
Needs a built book (`bash ci/book.sh`, or tests/test_book.py earlier in the run).
Screenshots go to _build/screenshots/.
"""
from __future__ import annotations

import functools
import http.server
import os
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = os.environ.get("ONELAUNCH_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PAGES = ["book/results.html", "book/intro.html", "book/methodology.html",
         "book/run_yourself.html", "notebooks/09_the_answer.html",
         "notebooks/01_what_one_token_costs.html", "notebooks/02_the_oracle.html",
         "book/references.html"]

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site():
    if not (HTML / "book" / "results.html").exists():
        env = {**os.environ, "ONELAUNCH_SKIP_SETUP": "1"}
        subprocess.run(["bash", str(ROOT / "ci" / "book.sh")], check=True, env=env)
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run ci/setup.sh (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _local(url: str) -> bool:
    u = urlparse(url)
    if u.scheme in ("data", "blob", "about"):
        return True
    return u.scheme in ("http", "https", "ws") and u.hostname in ("127.0.0.1", "localhost")


def _visible_frame(page):
    """The src of the one frame image the Stack shows (a blob URL per frame; the Stack
    renders the selected child only, or hides the others)."""
    imgs = page.locator(".onelaunch-ladder img")
    shown = [imgs.nth(i) for i in range(imgs.count()) if imgs.nth(i).is_visible()]
    assert len(shown) == 1, f"expected one visible frame, saw {len(shown)}"
    return shown[0].get_attribute("src")


def test_ladder_slider_offline(site, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site}/book/results.html", wait_until="networkidle")
    slider = page.locator(".onelaunch-ladder .widget-slider")
    slider.wait_for(state="visible", timeout=20_000)
    page.locator(".onelaunch-ladder img").first.wait_for(state="visible", timeout=20_000)
    handle = page.locator(".onelaunch-ladder .noUi-handle").first
    top = float(handle.get_attribute("aria-valuemax"))
    assert top >= 1, f"the slider has {top + 1:.0f} positions; expected one per rung"
    assert float(handle.get_attribute("aria-valuenow")) == top, "it should start on the last rung"
    before = _visible_frame(page)
    page.locator(".onelaunch-ladder").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "results-last-rung.png"), full_page=False)

    handle.focus()
    page.keyboard.press("Home")  # first rung
    page.wait_for_timeout(300)
    first = _visible_frame(page)
    assert first != before, "moving the slider to the first rung did not change the frame"
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    second = _visible_frame(page)
    assert second not in (first,), "one step right did not change the frame"
    page.locator(".onelaunch-ladder").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "results-rung-2.png"), full_page=False)
    # sphinx-thebe (always loaded by jupyter-book 1.x, unused here) declares its config
    # constant twice on every page; the declaration fails harmlessly and loads nothing
    errors = [e for e in errors if "THEBE_JS_URL" not in e]
    assert not errors, f"JavaScript errors on the page: {errors}"
    outside = [u for u in requests if not _local(u)]
    assert not outside, f"the page asked for something outside localhost: {outside}"
    assert any(u.endswith("embed.js") or "jupyter-widgets/embed.js" in u for u in requests), \
        "the widget JavaScript was not loaded from _static/"
    page.close()


@pytest.mark.parametrize("path", PAGES)
def test_pages_stay_local(site, browser, path):
    page = browser.new_page(viewport={"width": 1200, "height": 1600})
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    resp = page.goto(f"{site}/{path}", wait_until="networkidle")
    assert resp is not None and resp.ok, f"{path}: HTTP {resp and resp.status}"
    outside = [u for u in requests if not _local(u)]
    assert not outside, f"{path} asked for something outside localhost: {outside}"
    page.screenshot(path=str(SHOTS / (path.replace("/", "_") + ".png")), full_page=True)
    page.close()


def test_chapter_code_fits_without_scrolling(site, browser):
    """Every chapter's code cells (88-character lines) show whole at a laptop's width: no
    code block scrolls sideways."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    wide = {}
    for f in sorted((HTML / "notebooks").glob("[0-9][0-9]_*.html")):
        page.goto(f"{site}/notebooks/{f.name}", wait_until="load")
        n = page.evaluate("""() => [...document.querySelectorAll(
            'div.cell_input div.highlight pre')].filter(
            p => p.scrollWidth > p.clientWidth + 2).length""")
        if n:
            wide[f.name] = n
    page.close()
    assert not wide, f"code blocks that scroll sideways: {wide}"
