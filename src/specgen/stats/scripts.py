"""The script an answer is written in: the most frequent script among its letters.

Code-point ranges of the scripts drafter data usually mixes; letters elsewhere count as
"other", and an answer with no letter (digits, punctuation, empty) is "none". Only the first
`SAMPLE_CHARS` characters are looked at, and ASCII text is Latin without a scan.
"""

from __future__ import annotations

import re

SAMPLE_CHARS = 4000

_SCRIPTS = {
    "latin": r"A-Za-z\u00c0-\u024f\u1e00-\u1eff",
    "cjk": r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
    "kana": r"\u3040-\u30ff\u31f0-\u31ff",
    "hangul": r"\uac00-\ud7af\u1100-\u11ff\u3130-\u318f",
    "cyrillic": r"\u0400-\u04ff",
    "greek": r"\u0370-\u03ff",
    "arabic": r"\u0600-\u06ff\u0750-\u077f",
    "hebrew": r"\u0590-\u05ff",
    "devanagari": r"\u0900-\u097f",
    "thai": r"\u0e00-\u0e7f",
}
_PATTERNS = {name: re.compile(f"[{chars}]") for name, chars in _SCRIPTS.items()}
_ANY_LETTER = re.compile(r"[^\W\d_]")
_ASCII_LETTER = re.compile(r"[A-Za-z]")


def script_of(text: str) -> str:
    """latin, cjk, kana, hangul, cyrillic, greek, arabic, hebrew, devanagari, thai, other or
    none (no letter)."""
    text = text[:SAMPLE_CHARS]
    if text.isascii():
        return "latin" if _ASCII_LETTER.search(text) else "none"
    counts = {name: len(p.findall(text)) for name, p in _PATTERNS.items()}
    letters = len(_ANY_LETTER.findall(text))
    known = sum(counts.values())
    best = max(counts, key=lambda k: counts[k])
    if letters - known > counts[best]:
        return "other"
    return best if counts[best] else ("other" if letters else "none")
