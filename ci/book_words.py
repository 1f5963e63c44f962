#!/usr/bin/env python3
"""Words a reader reads on each page of the built book: prose (text outside code cells)
plus what the cells print (outputs), the process words a page prints
(:func:`onelaunch.report.wording.process_words`) and any comparison word that
contradicts its ratio (:func:`onelaunch.report.wording.contradictions`).

    python ci/book_words.py [_build/html]     # one line a page, then the total

tests/test_book.py fails the build above :data:`BOOK_WORDS` in all or
:data:`PAGE_WORDS` on one page, on any process word, or on "0.62x faster".
"""
from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK_WORDS = 13_000          # the book's budget (notes/book-plan.md)
PAGE_WORDS = 2_000           # one page's


class _Page(HTMLParser):
    """Text inside the page's ``<main>``/``<article>``, split into prose and outputs;
    code, scripts, styles, header links and the table of contents are not read."""

    def __init__(self):
        super().__init__()
        self.stack, self.prose, self.out, self.depth = [], [], [], 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class", "") or ""
        if tag in ("article", "main"):
            self.depth += 1
        mode = None
        if "cell_output" in cls or "output" in cls.split():
            mode = "out"
        elif "cell_input" in cls or tag == "pre" or "highlight" in cls:
            mode = "code"
        elif tag in ("script", "style") or "headerlink" in cls or "toc" in cls:
            mode = "skip"
        if tag in ("br", "img", "meta", "link", "input", "hr", "source", "wbr"):
            return
        self.stack.append((tag, mode))

    def handle_endtag(self, tag):
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break
        if tag in ("article", "main"):
            self.depth -= 1

    def handle_data(self, data):
        if self.depth <= 0:
            return
        modes = [m for _, m in self.stack if m]
        mode = modes[0] if modes else "prose"
        if mode == "prose":
            self.prose.append(data)
        elif mode == "out":
            self.out.append(data)


def read(page: Path) -> dict:
    """One page: its prose and output words and the process words it prints."""
    sys.path.insert(0, str(ROOT))
    from onelaunch.report.wording import contradictions, process_words
    p = _Page()
    p.feed(page.read_text(errors="replace"))
    prose, out = " ".join(p.prose), " ".join(p.out)
    return {"page": page.stem, "prose": len(prose.split()), "outputs": len(out.split()),
            "words": len(prose.split()) + len(out.split()),
            "process_words": process_words(prose + " " + out),
            "contradictions": contradictions(prose + " " + out)}


def pages(html: Path) -> list[Path]:
    """The book's pages: ``book/*.html`` and ``notebooks/*.html`` (the search, index and
    bibliography pages of Sphinx are not the book's text)."""
    return sorted(list((html / "book").glob("*.html")) + list((html / "notebooks").glob("*.html")))


def problems(stats: list[dict], book: int = BOOK_WORDS, page: int = PAGE_WORDS) -> list[str]:
    """Lines naming what is over its budget and every page that prints a process word."""
    out = [f"{s['page']}: {s['words']} words (over {page})" for s in stats
           if s["words"] > page]
    total = sum(s["words"] for s in stats)
    if total > book:
        out.append(f"the book: {total} words (over {book})")
    out += [f"{s['page']}: process words {s['process_words']}" for s in stats
            if s["process_words"]]
    out += [f"{s['page']}: a comparison word against its ratio {s['contradictions']}"
            for s in stats if s.get("contradictions")]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    html = Path(argv[0]) if argv else ROOT / "_build" / "html"
    stats = [read(p) for p in pages(html)]
    for s in stats:
        print(f"{s['page']:28s} prose {s['prose']:6d}  outputs {s['outputs']:6d}  "
              f"{' '.join(s['process_words'])}")
    print(f"{'TOTAL':28s} {sum(s['words'] for s in stats):6d} words", flush=True)
    bad = problems(stats)
    print("\n".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
