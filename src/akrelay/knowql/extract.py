"""Sentence-level reading for the extractive composer: question types, terms, sentences and quantities.

Everything here is a pure function of text, so an answer stays deterministic
per snapshot. The rules are general (a question's type from its opening words,
a unit grammar for quantities, light suffix stemming) rather than tuned to any
one corpus: the composer must answer questions nobody wrote a rule for.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from akrelay.search.analysis import fold
from akrelay.search.question import STOP_WORDS

_WORD = re.compile(r"\w+", re.UNICODE)
#: Words that shape a question but say nothing about its topic.
FILLER = frozenset("""
happen happens happened happening known say says said thing things kind sort exactly actually really typically
usually generally currently long often anything something someone take takes taking took taken make makes
making made get gets getting gotten need needs needed given give gives come comes came put puts goes going went
""".split())
#: Irregular English verb forms, so that "kept" meets "keeps" and "held" meets "holds".
IRREGULAR = {"kept": "keep", "held": "hold", "ran": "run", "brought": "bring", "found": "find", "built": "build",
             "sent": "send", "grew": "grow", "grown": "grow", "shrank": "shrink", "shrunk": "shrink",
             "broke": "break", "broken": "break", "froze": "freeze", "frozen": "freeze", "wrote": "write",
             "written": "write", "lost": "lose", "left": "leave", "chose": "choose", "chosen": "choose",
             "began": "begin", "begun": "begin", "fell": "fall", "fallen": "fall", "rose": "rise", "risen": "rise",
             "caught": "catch", "thought": "think", "paid": "pay", "told": "tell", "sold": "sell", "spent": "spend",
             "led": "lead", "fed": "feed", "met": "meet", "drove": "drive", "driven": "drive", "slept": "sleep",
             "spoke": "speak", "spoken": "speak", "stole": "steal", "stolen": "steal", "struck": "strike",
             "threw": "throw", "thrown": "throw", "understood": "understand", "woke": "wake", "bought": "buy",
             "taught": "teach", "fought": "fight", "sought": "seek", "knew": "know", "drew": "draw",
             "drawn": "draw", "flew": "fly", "flown": "fly", "hid": "hide", "hidden": "hide", "rode": "ride",
             "shook": "shake", "shot": "shoot", "sank": "sink", "sunk": "sink", "swung": "swing", "dealt": "deal",
             "meant": "mean", "bent": "bend", "lent": "lend", "dug": "dig", "stuck": "stick", "hung": "hang",
             "data": "datum", "indices": "index", "indexes": "index", "children": "child", "men": "man"}
_NEGATIONS = frozenset("""not no never none neither nor cannot without isn aren doesn don didn wasn weren won hasn
haven shouldn couldn wouldn""".split())
_YESNO_OPENERS = frozenset("""
is are was were do does did can could should will would has have had must may might shall isn aren doesn don
didn wasn weren won
""".split())
_CAUSAL = re.compile(r"\b(because|due to|caused by|causes?|since|as a result|so that|leads? to|results? in|"
                     r"reason|owing to|triggers?|therefore)\b", re.IGNORECASE)


# ---- question types ------------------------------------------------------------------------

_FOCUS = re.compile(r"\b(?:what|which)(?: is| are| was| were)? (?:the |a |an )?(.+?) (?:of|in|for|between|on|"
                    r"at|does|do|did|is|are|that|when|with|from|to)\b")


def focus(ask: str) -> list[str]:
    """The attribute a "what is the X of Y" ask asks for, as stems (empty when the ask has no such form)."""
    match = _FOCUS.search(" ".join(tokens(ask[:300])))
    return content_stems(match.group(1)) if match else []


@dataclass(frozen=True)
class Question:
    """What kind of answer an ask wants, and which unit class (``time``, ``size``, ...) if it asks a quantity."""

    kind: str                 # duration, count, quantity, why, yesno, which
    unit_class: str | None    # the expected unit class, when the ask names or implies one
    unit: str | None          # the expected unit itself (canonical), when the ask names one
    counted: tuple[str, ...]  # "how many <counted>": stems of the (up to two) words that may name what is counted

    def counts(self, word: str | None) -> bool:
        """Whether ``word`` names what a "how many" ask counts."""
        return word is not None and any(same_stem(stem(word), c) for c in self.counted)


def question_type(ask: str) -> Question:
    words = [w.lower() for w in _WORD.findall(fold(ask))]
    text = " ".join(words)
    unit_class, unit = _asked_unit(words)
    if words and words[0] in _YESNO_OPENERS:
        return Question("yesno", None, None, ())
    if re.search(r"\bhow (long|much time)\b", text) or re.search(r"\bhow many (ms|milliseconds?|seconds?|minutes?|"
                                                                  r"hours?|days?|weeks?|months?|years?)\b", text):
        return Question("duration", "time", unit if unit_class == "time" else None, ())
    match = re.search(r"\bhow many (\w+)((?: \w+)?)", text)
    if match:
        counted = match.group(1)
        if unit_class is not None and _UNITS.get(counted, (None,))[0] == unit_class:
            return Question("quantity", unit_class, unit, ())
        nouns = [w for w in (counted, match.group(2).strip()) if w and w not in STOP_WORDS and w not in FILLER]
        return Question("count", None, None, tuple(stem(w) for w in nouns))
    if re.search(r"\b(how (much|big|large|fast|high|low|far|old|often|small|heavy|hot|cold|many)|what "
                 r"(size|percentage|percent|rate|temperature|value|number|amount|limit|threshold|ratio|speed|"
                 r"latency|length|interval|timeout|duration|age|version|share|proportion|fraction)|at what|which (size|value|"
                 r"version|temperature|number))\b", text) or unit_class is not None:
        if re.search(r"\btemperature\b", text) and unit_class is None:
            unit_class = "temperature"
        if re.search(r"\b(percentage|percent|share|proportion|fraction)\b", text) and unit_class is None:
            unit_class = "percent"
        if re.search(r"\b(latency|timeout|interval|duration|age)\b", text) and unit_class is None:
            unit_class = "time"
        return Question("quantity", unit_class, unit, ())
    if re.search(r"\b(why|what (causes|caused|makes|made)|reason)\b", text):
        return Question("why", None, None, ())
    return Question("which", None, None, ())


#: Nouns that name a quantity's class: an ask saying "temperature" is answered by "35 °C".
CLASS_NOUNS = {"temperatur": "temperature", "percentag": "percent", "percent": "percent", "share": "percent",
               "proportion": "percent", "fraction": "percent", "duration": "time", "latency": "time",
               "tim": "time", "interval": "time", "delay": "time", "timeout": "time", "lifetim": "time",
               "period": "time", "uptim": "time", "ag": "time", "size": "size",
               "capacity": "size", "frequency": "frequency", "voltag": "voltage", "distanc": "length"}


def classes(text: str) -> set[str]:
    """The unit classes of the quantities ``text`` states."""
    return {q.unit_class for q in quantities(text) if q.unit_class is not None}


def _asked_unit(words: Sequence[str]) -> tuple[str | None, str | None]:
    """A unit the ask names ("in bytes", "how many seconds"), as (class, canonical unit)."""
    for i, word in enumerate(words):
        known = _UNITS.get(word)
        if i and words[i - 1] in ("per", "a", "an", "each", "every"):
            continue  # "per day" is a rate's denominator, not the unit asked for
        if known is not None and word not in ("s", "b", "h", "m", "c", "f"):
            return known[0], known[2]
    return None, None


# ---- terms ------------------------------------------------------------------------------------

_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ied", "ies", "ed", "es", "s", "ly")


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """A light suffix stemmer: ``restarting``/``restarts`` -> ``restart``, ``caches``/``cache`` -> ``cach``."""
    word = word.lower()
    word = IRREGULAR.get(word, word)
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


@functools.lru_cache(maxsize=4096)
def tokens(text: str) -> tuple[str, ...]:
    """Folded word runs of ``text`` (for positions and proximity); cached, a turn reads a sentence often."""
    return tuple(w.lower() for w in _WORD.findall(fold(text)))


def content_stems(text: str) -> list[str]:
    """The topic stems of ``text``: stop and filler words dropped, duplicates kept once, in order."""
    seen: dict[str, None] = {}
    for word in tokens(text):
        if len(word) < 3 or word in STOP_WORDS or word in FILLER:
            continue
        if word.isdigit():
            continue
        seen.setdefault(stem(word), None)
    return list(seen)


def same_stem(a: str, b: str) -> bool:
    return a == b or (len(a) >= 5 and len(b) >= 5 and (a.startswith(b) or b.startswith(a)))


class StemSet:
    """Stems indexed for :func:`same_stem`: exact membership, and prefix matches through their first 5 letters
    (so a lookup costs a few comparisons, not one per stem)."""

    __slots__ = ("exact", "prefixes")

    def __init__(self, stems: Iterable[str] = ()) -> None:
        self.exact = set(stems)
        self.prefixes: dict[str, list[str]] | None = None  # built on the first lookup that needs it

    def __contains__(self, term: object) -> bool:
        if not isinstance(term, str):
            return False
        if term in self.exact:
            return True
        if len(term) < 5:
            return False
        if self.prefixes is None:
            self.prefixes = {}
            for item in self.exact:
                if len(item) >= 5:
                    self.prefixes.setdefault(item[:5], []).append(item)
        return any(c.startswith(term) or term.startswith(c) for c in self.prefixes.get(term[:5], ()))



def matched(term: str, stems: "StemSet | Iterable[str]") -> bool:
    """Whether ``term`` meets one of ``stems`` (equal, or one a prefix of the other from 5 letters on)."""
    return term in (stems if isinstance(stems, StemSet) else StemSet(stems))


def weights(terms: Sequence[str], documents: Sequence[StemSet]) -> dict[str, float]:
    """Local IDF of each ask term over the candidate documents: a word every candidate shares counts least.
    A word no candidate holds counts as much as one only a single candidate holds: it cannot tell the
    candidates apart, and a paraphrase ("reboot" for "restart") should not sink the one that answers."""
    n = len(documents)
    out = {}
    for term in terms:
        df = sum(1 for doc in documents if matched(term, doc))
        out[term] = 1.0 + math.log(1.0 + (n + 1) / (max(df, 1) + 0.5))
    return out


# ---- sentences ----------------------------------------------------------------------------------

#: What one text contributes to an answer: its first characters, sentences and sentence length. Statements
#: may be long (the envelope allows far more): the bounds keep a turn linear and small.
MAX_TEXT_CHARS = 6000
MAX_SENTENCES = 40
MAX_SENTENCE_CHARS = 600
_BOUNDARY = re.compile(r"(?<=[.!?;])\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREV = re.compile(r"\b(e\.g|i\.e|etc|vs|approx|cf|fig|no|ca|e\.g\.,|i\.e\.,)\.$", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (not after common abbreviations or inside decimals), bounded by
    :data:`MAX_TEXT_CHARS`, :data:`MAX_SENTENCES` and :data:`MAX_SENTENCE_CHARS`."""
    text = " ".join(str(text)[:MAX_TEXT_CHARS].split())
    if not text:
        return []
    out: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if _ABBREV.search(text[max(start, match.start() - 8):match.start()]):
            continue
        out.append(text[start:match.start()])
        start = match.end()
        if len(out) >= MAX_SENTENCES:
            break
    else:
        out.append(text[start:])
    return [s.strip()[:MAX_SENTENCE_CHARS] for s in out if s.strip()][:MAX_SENTENCES]


def negated(text: str) -> bool:
    """Whether ``text`` says "not" an odd number of times (a yes/no answer's polarity)."""
    return sum(1 for w in tokens(text) if w in _NEGATIONS) % 2 == 1


def causal(text: str) -> bool:
    return _CAUSAL.search(text) is not None


# ---- quantities ---------------------------------------------------------------------------------

#: unit word -> (class, factor to the class's base unit, canonical unit name)
_UNITS: dict[str, tuple[str, float, str]] = {}
for _names, _cls, _factor, _canon in (
        (("ms", "msec", "millisecond", "milliseconds"), "time", 0.001, "ms"),
        (("us", "microsecond", "microseconds", "µs"), "time", 0.000001, "us"),
        (("s", "sec", "secs", "second", "seconds"), "time", 1.0, "s"),
        (("min", "mins", "minute", "minutes"), "time", 60.0, "min"),
        (("h", "hr", "hrs", "hour", "hours"), "time", 3600.0, "h"),
        (("day", "days"), "time", 86400.0, "day"),
        (("week", "weeks"), "time", 604800.0, "week"),
        (("month", "months"), "time", 2592000.0, "month"),
        (("year", "years"), "time", 31536000.0, "year"),
        (("b", "byte", "bytes"), "size", 1.0, "B"),
        (("kb", "kilobyte", "kilobytes"), "size", 1000.0, "kB"),
        (("kib",), "size", 1024.0, "KiB"),
        (("mb", "megabyte", "megabytes"), "size", 1e6, "MB"),
        (("mib",), "size", 1024.0 ** 2, "MiB"),
        (("gb", "gigabyte", "gigabytes"), "size", 1e9, "GB"),
        (("gib",), "size", 1024.0 ** 3, "GiB"),
        (("tb", "terabyte", "terabytes"), "size", 1e12, "TB"),
        (("percent", "%", "pct"), "percent", 1.0, "%"),
        (("c", "celsius", "°c", "degc"), "temperature", 1.0, "°C"),
        (("degree", "degrees"), "temperature", 1.0, "°C"),
        (("f", "fahrenheit", "°f"), "temperature", 1.0, "°F"),
        (("hz", "hertz"), "frequency", 1.0, "Hz"),
        (("khz",), "frequency", 1e3, "kHz"),
        (("mhz",), "frequency", 1e6, "MHz"),
        (("ghz",), "frequency", 1e9, "GHz"),
        (("v", "volt", "volts"), "voltage", 1.0, "V"),
        (("w", "watt", "watts"), "power", 1.0, "W"),
        (("m", "meter", "meters", "metre", "metres"), "length", 1.0, "m"),
        (("km", "kilometer", "kilometers"), "length", 1000.0, "km"),
        (("cm",), "length", 0.01, "cm"),
        (("mm",), "length", 0.001, "mm"),
        (("rps", "qps"), "rate", 1.0, "/s"),
        (("x",), "ratio", 1.0, "x")):
    for _name in _names:
        _UNITS[_name] = (_cls, _factor, _canon)

_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
                      "ninety": 90, "hundred": 100, "dozen": 12, "once": 1, "twice": 2})
_DIGIT = re.compile(r"\d")
_QUANTITY = re.compile(
    r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3}){1,5}(?:\.\d{1,9})?|\d{1,15}(?:\.\d{1,9})?|(?:%s)\b)(?![\w.]{0,12}\d)"
    r"(?:\s?(?P<unit>%%|°\s?[CF]\b|[A-Za-zµ]+))?" % "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True)),
    re.IGNORECASE)


@dataclass(frozen=True)
class Quantity:
    value: float
    unit: str | None          # canonical unit (None: a bare number)
    unit_class: str | None    # time, size, percent, temperature, ... or None
    noun: str | None          # the word after the number when it is not a unit ("12 retries")
    text: str                 # the span as written ("about 40 seconds" -> "40 seconds")

    def base(self) -> float:
        """The value in its class's base unit (seconds, bytes)."""
        if self.unit is None:
            return self.value
        for cls, factor, canon in _UNITS.values():
            if canon == self.unit and cls == self.unit_class:
                return self.value * factor
        return self.value


@functools.lru_cache(maxsize=4096)
def quantities(sentence: str) -> tuple[Quantity, ...]:
    """The quantities ``sentence`` states, in order (cached, as :func:`tokens`)."""
    if not _DIGIT.search(sentence) and not _NUMBER_WORDS.keys() & set(tokens(sentence)):
        return ()  # most sentences state no number: skip the unit grammar
    out = []
    for match in _QUANTITY.finditer(sentence):
        raw, unit_word = match.group("num"), match.group("unit")
        low = raw.lower()
        if low in _NUMBER_WORDS:
            if not unit_word:
                continue  # a bare "one" is rarely a quantity
            value = float(_NUMBER_WORDS[low])
        else:
            value = float(raw.replace(",", ""))
        unit = cls = noun = None
        span = raw
        if unit_word:
            key = unit_word.lower().replace(" ", "")
            known = _UNITS.get(key)
            if known is not None:
                cls, _, unit = known
                span = match.group(0)
            elif key.isalpha() and key not in STOP_WORDS:
                noun = key
                span = match.group(0)
        if low in _NUMBER_WORDS and unit is None and noun is None:
            continue  # "one of them": a number word counts only with a unit or a noun
        out.append(Quantity(value, unit, cls, noun, span.strip()))
    return tuple(out)


def convert(quantity: Quantity, unit: str) -> float | None:
    """``quantity`` expressed in ``unit`` (same class), or None when the classes differ."""
    target = next(((cls, factor) for cls, factor, canon in _UNITS.values() if canon == unit), None)
    if target is None or quantity.unit_class != target[0]:
        return None
    if target[0] == "temperature":
        return quantity.value if quantity.unit == unit else None
    return quantity.base() / target[1]


def unit_of_name(name: str, description: str = "") -> tuple[str | None, str | None]:
    """A unit named by a shape property (``timeout_ms``, ``mtu_bytes``, "in seconds"), as (class, unit)."""
    words = [w for w in re.split(r"[^a-z0-9%°]+", (name + " " + description).lower()) if w]
    for word in reversed(words):  # a suffix ("_ms") names the unit more often than a prefix
        known = _UNITS.get(word)
        if known is not None and (len(word) > 1 or word in ("s", "h")):
            return known[0], known[2]
    return None, None


def answer_quantity(sentence: str, question: Question) -> Quantity | None:
    """The quantity of ``sentence`` that answers ``question``: the expected unit first, then any unit-bearing
    number, then (for counts) a number followed by the counted noun."""
    found = quantities(sentence)
    if not found:
        return None
    if question.unit_class is not None:
        typed = [q for q in found if q.unit_class == question.unit_class]
        if typed:
            return typed[0]
        if question.kind == "duration":
            return None
    if question.kind == "count":
        for q in found:
            if question.counts(q.noun):
                return q
        bare = [q for q in found if q.unit_class is None]
        return bare[0] if bare else found[0]
    with_unit = [q for q in found if q.unit_class is not None]
    return with_unit[0] if with_unit else found[0]


def format_number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"
