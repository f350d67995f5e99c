"""Text normalisation shared by the memory and retrieval layers: words of any script as search terms.

Below both layers, so that extraction (which matches a fact's words to its evidence clauses) and BM25
(which indexes them) agree on what a word is without memory importing from retrieval.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your yours
    yourself yourselves s t d ll m re ve""".split()
)
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
"""Kana and Han (CJK ideographs): scripts written without spaces between words."""
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")
"""A run of CJK characters, or a word of letters and digits in any other script."""
_HAS_CJK = re.compile(rf"[{_CJK}]")
_WORD = re.compile(r"[^\W_]+")
"""A word of letters and digits: what :data:`_TOKEN` finds in a text without CJK characters."""
_VOWEL = re.compile(r"[aeiouy]")
TERMS_VERSION = "1"
"""Version of :func:`tokenize`'s output: bump it with any change that gives some text other terms, so that terms a
store kept from the older tokenizer are made anew rather than matched against the new query terms."""


@lru_cache(maxsize=200_000)
def light_stem(word: str) -> str:
    """A light suffix stripper (plural -s/-es/-ies, -ing, -ed, final -e) so inflections of a word meet."""
    if len(word) > 4 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        word = word[:-3] + "y"
    elif word.endswith(("sses", "ches", "shes", "xes", "zes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 3 and _VOWEL.search(stem):
            word = stem[:-1] if stem[-1] == stem[-2] and stem[-1] not in "lsz" else stem
            break
    if len(word) > 3 and word.endswith("e") and not word.endswith("ee"):
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """BM25 terms of ``text`` in any script: NFKC-normalised and casefolded words of letters and digits.

    Words of space-separated scripts ("Zürich", "Москва") are kept whole, English stopwords dropped and
    the rest lightly stemmed. Chinese and Japanese put no spaces between words, so a run of Han or Kana
    gives each character and each pair of adjacent characters: one-character words still match, and a
    two-character word ("北京", "東京") matches its own pair, so it outranks its characters met apart.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    if not _HAS_CJK.search(text):  # most text: one pass of the simpler pattern, no per-word branch on the script
        return [light_stem(word) for word in _WORD.findall(text) if word not in STOPWORDS]
    terms = []
    for cjk, word in _TOKEN.findall(text):
        if cjk:
            terms += list(cjk) + [cjk[i : i + 2] for i in range(len(cjk) - 1)]
        elif word not in STOPWORDS:
            terms.append(light_stem(word))
    return terms
