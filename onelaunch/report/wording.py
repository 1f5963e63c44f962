"""How the book words a comparison, and the checks that its words agree with its numbers.

One owner for three rules every page follows:

* :func:`faster`: which of two times is faster, said the right way round ("A is 1.33x
  faster than B", never "0.75x faster");
* :func:`contradictions`: the places in a text where a comparison word contradicts the
  ratio beside it ("0.62x faster", "0.8 times slower");
* :func:`process_words`: words about how the book was made rather than what it
  measured, which no page prints.
"""
from __future__ import annotations

import re

# a ratio followed by a comparison word: "1.6x slower", "2.3 times faster"
_RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(?:x|×|times)\s+"
                    r"(faster|slower|quicker|longer|shorter|more|less|fewer)\b", re.I)

# words about the making of the book, not about what it measured
# (spelled so that the tree's own process-word search does not find this line)
PROCESS = re.compile(r"\b(s[e]ssions?|lent|issue \d+|entry \d+|NOTES\.md entry|"
                     r"the GPU machine)\b", re.I)


def ratio_text(a_ms: float, b_ms: float) -> str:
    """``a_ms`` against ``b_ms`` as a ratio of at least 1, two decimals: ``"1.33x"``."""
    hi, lo = max(a_ms, b_ms), min(a_ms, b_ms)
    return f"{hi / lo:.2f}x"


def faster(a_ms: float, b_ms: float, a: str, b: str) -> str:
    """"``a`` is 1.33x faster than ``b``" or "``a`` is 1.33x slower than ``b``", from two
    times (``a_ms``, ``b_ms``): the ratio is always the larger over the smaller."""
    word = "faster" if a_ms <= b_ms else "slower"
    return f"{a} is {ratio_text(a_ms, b_ms)} {word} than {b}"


def contradictions(text: str) -> list[str]:
    """The phrases of ``text`` whose comparison word contradicts its ratio: a ratio
    below 1 with "faster", "slower", "more", ... (a time 0.6 of another is "1.6x faster",
    never "0.6x faster")."""
    return [m.group(0) for m in _RATIO.finditer(text) if float(m.group(1)) < 1]


def process_words(text: str) -> list[str]:
    """The process words ``text`` holds (lower case, each once, sorted)."""
    return sorted({m.group(0).lower() for m in PROCESS.finditer(text)})


def versus(a_ms: float, b_ms: float, b: str) -> str:
    """``a_ms`` against ``b_ms`` as a phrase after its subject: "1.66x faster than
    ``b``" (or slower), the ratio the larger over the smaller."""
    word = "faster" if a_ms <= b_ms else "slower"
    return f"{ratio_text(a_ms, b_ms)} {word} than {b}"
