"""Units without an LLM (``--units turns``): every turn one unit, attributes and a triple by simple rules.

For CPU benchmarks and as an ablation. The rules, kept deliberately small:

- **gist**: the turn's first sentence that has at least four words (else its first sentence), cut at
  the first clause break (``, and``, ``, but``, ``;``) and at 15 words.
- **triple**: subject = speaker. When the gist has a first-person verb (``I went to ...``, ``we've
  adopted ...``) the predicate is that verb with a following particle and the object the rest of the
  clause; otherwise predicate ``says`` and object the gist. Traces then group a speaker's turns that
  share a verb (``Caroline went to``), the turns-mode analogue of a subject-relation; ``says`` units
  state no relation and stay out of traces.
- **entities**: runs of capitalised words that do not start a sentence (names, places, titles), plus
  the head noun after a possessive or article (``my dog``, ``a helpful group``); stopwords never count.
- **locations**: capitalised runs after ``in/at/to/from/near``, and common venue nouns (``beach``,
  ``museum``) after an article or possessive; they are kept out of the entities.
- **fact time**: :func:`~qgmem_train.memory.timeparse.resolve_time_expressions` on the turn text.
"""

from __future__ import annotations

import re

from qgmem_train.memory.sentences import split_sentences
from qgmem_train.memory.timeparse import resolve_time_expressions
from qgmem_train.memory.types import MemoryUnit
from qgmem_train.memory.windows import Window

GIST_WORDS = 15
MAX_ATTRIBUTES = 8
FALLBACK_PREDICATE = "says"

_STOP = set(
    "a an the and or but if so to of in on at for with from by as is are was were be been am i i'm i've i'll i'd you "
    "your yours he she it we they them us our my me his her its their this that these those there here what which who "
    "whom whose when where why how not no yes do does did have has had will would can could should may might must "
    "just really very too also oh hey hi hello wow thanks thank okay ok well yeah sure great good nice awesome cool "
    "lol haha hmm sorry please let let's all any some much many more most such than then now".split()
)
_VENUES = set(
    "beach park gym museum school library office home house church hospital cafe restaurant bar store shop mall "
    "university college campus studio theater theatre cinema stadium zoo lake mountain mountains forest garden "
    "airport station hotel center centre clinic farm camp".split()
)
_CLAUSE = re.compile(r",\s+(?:and|but|so|because)\s+|;\s+|\s+-\s+|\s+and\s+(?=(?:it|I|we|he|she|they)\b)")
_FIRST_PERSON = re.compile(
    r"\b(?:I|we)(?:'m|'ve|'ll|'d| am| have| had| will| was| were| just| really| also| finally| recently| always| still"
    r"| never| so| actually| totally| definitely| currently| already| even| usually| often)*\s+"
    r"([a-z]+(?:ed|ing|s)?)(\s+(?:to|about|on|in|at|for|with|up|out|into|from|by|over))?\s*(.*)",
    re.IGNORECASE,
)
_CAPS = re.compile(r"\b([A-Z][\w'&-]*(?:\s+(?:of\s+|the\s+)?[A-Z][\w'&-]*)*)")
_DET_PHRASE = re.compile(r"\b(?:my|our|his|her|their|a|an|the)((?:\s+[a-z][a-z-]+){1,3})")
_PLACE_PREP = re.compile(r"\b(?:in|at|to|from|near)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)")


def gist(text: str) -> str:
    """The turn's first substantive clause, at most :data:`GIST_WORDS` words."""
    sentences = split_sentences(text) or [text.strip()]
    sentence = next((s for s in sentences if len(s.split()) >= 4), sentences[0])
    clause = _CLAUSE.split(sentence)[0].strip()
    words = clause.split()
    return " ".join(words[:GIST_WORDS]).rstrip(".!?,;:")


def triple(speaker: str, text: str) -> tuple[str, str, str]:
    """(subject, predicate, object) of a turn by the first-person-verb rule."""
    summary = gist(text)
    m = _FIRST_PERSON.search(summary)
    if m and m[1].lower() not in _STOP and m[3].strip():
        predicate = (m[1] + (m[2] or "")).lower().strip()
        return speaker, predicate, m[3].strip()
    return speaker, FALLBACK_PREDICATE, summary


def _sentence_starts(text: str) -> set[int]:
    starts = {0}
    for m in re.finditer(r"[.!?]\s+|\n+", text):
        starts.add(m.end())
    return starts


def _determined_nouns(text: str) -> list[str]:
    """Head nouns after an article or possessive: the last of up to three non-stopwords (``a helpful group``)."""
    nouns = []
    for m in _DET_PHRASE.finditer(text):
        words = []
        for word in m.group(1).split():
            if word in _STOP:
                break
            words.append(word)
        if words and len(words[-1]) > 2:
            nouns.append(words[-1])
    return nouns


def attributes(text: str) -> tuple[list[str], list[str]]:
    """(entities, locations) of a turn by the capitalisation and venue rules."""
    starts = _sentence_starts(text)
    locations: list[str] = []
    for m in _PLACE_PREP.finditer(text):
        if m.group(1).lower() not in _STOP:
            locations.append(m.group(1))
    nouns = _determined_nouns(text)
    locations += [noun for noun in nouns if noun in _VENUES]
    entities: list[str] = []
    for m in _CAPS.finditer(text):
        phrase = m.group(1)
        if m.start() in starts:
            words = phrase.split()
            if len(words) == 1:
                continue
            phrase = " ".join(words[1:])
        if phrase.lower() in _STOP or phrase in locations:
            continue
        entities.append(phrase)
    entities += [noun for noun in nouns if noun not in _VENUES]
    unique = lambda items: list(dict.fromkeys(items))[:MAX_ATTRIBUTES]  # noqa: E731
    return unique(entities), unique(locations)


def window_turn_units(window: Window, positions: dict[str, int]) -> list[MemoryUnit]:
    """One unit per new turn of ``window``; ``positions`` gives each turn's place in the conversation."""
    units = []
    time = window.session.time
    for turn in window.new:
        subject, predicate, obj = triple(turn.speaker, turn.text)
        entities, locations = attributes(turn.text)
        units.append(MemoryUnit(
            id=turn.id,
            session_id=window.session.id,
            fact_text=f"{turn.speaker}: {turn.text}",
            subject=subject,
            predicate=predicate,
            object=obj,
            source_turn_ids=[turn.id],
            source_text=f"{turn.speaker}: {turn.text}",
            utterance_time=time,
            serial=positions[turn.id],
            fact_time=resolve_time_expressions(turn.text, time).spans,
            entities=entities,
            locations=locations,
        ))
    return units
