"""The near-miss guard: a semantic hit is refused when two questions that embed close
together still ask different things. Embedders place "order 1042" next to "order 2977",
"enable" next to "disable" and "Paris" next to "Berlin"; GPTCache, LiteLLM and vLLM's
semantic router all serve such wrong hits. The guard is lexical and cheap (~20 µs):

- numbers: digits and number words must match as sets ("two" == "2");
- named things: capitalised words (not the first word of a sentence), acronyms, codes
  with digits, quoted strings, e-mails and URLs of one question must appear in the other
  (in any case: "Python" matches "python");
- negation: one question negated ("not", "never", "n't", "without", ...) and not the other;
- opposites: a word only in one question whose opposite is only in the other, from a
  list of antonym pairs plus prefixes (un-, dis-, de-, in-, im-, non-);
- times and dates: am/pm, today/tomorrow/tonight, weekdays, months, seasons, meals,
  "this/next/last week" must match as sets ("6:30 am" vs "6:30 pm");
- units, measures and currencies: when both questions name some, the same ones
  ("5 mg per kg" vs "5 ml per kg", "celsius" == "°C");
- order and direction: two words that both questions share, with "to", "into", "from",
  "than", "in" or "per" between them in both, in opposite order ("miles to km" vs "km to
  miles"); "A and B", "A or B", "A vs B" may swap;
- question words: who / when / where / why asking for different things;
- one-slot substitution: the questions are word for word the same (once words that carry
  no question of their own are dropped) except one or two words in one place, and those
  are not synonyms ("weather in lisbon" vs "weather in porto", "install pip on ubuntu" vs
  "on fedora"): this is how a lower-case name, product or topic differs.

The word lists are in lexicon.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from redline.cache.lexicon import (
    MERIDIEM,
    PHRASES,
    SQUARE,
    STOPWORDS,
    SYNONYMS,
    TIME_AFTER_ARTICLE,
    TIME_MODIFIED,
    TIME_MODIFIERS,
    TIME_WORDS,
    UNIT_AFTER_NUMBER,
    UNITS,
    WH_WORDS,
)

# a token: letters, digits, inner apostrophes/hyphens; . , : / only between digits (3.5, 1,000, 10:30)
_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9'’-]|[.,:/](?=\d))*")
_NUMBER = re.compile(r"[\d.,:/]+")
_QUOTED = re.compile(r"[\"“”‘'`]([^\"“”’'`]{2,})[\"“”’'`]")
_SPECIAL = re.compile(r"\S+@\S+\.\w+|https?://\S+|www\.\S+|[#@][A-Za-z_]\w*")

NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS |= {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70",
                 "eighty": "80", "ninety": "90", "hundred": "100", "thousand": "1000",
                 "million": "1000000", "billion": "1000000000", "first": "1", "second": "2",
                 "third": "3", "fourth": "4", "fifth": "5", "once": "1", "twice": "2",
                 "single": "1", "double": "2", "triple": "3", "half": "0.5", "dozen": "12",
                 "couple": "2", "pair": "2", "few": "few", "several": "several", "dozens": "12s",
                 "hundreds": "100s", "thousands": "1000s", "millions": "1000000s"}

NEGATIONS = {"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor",
             "without", "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt",
             "werent", "wont", "wouldnt", "shouldnt", "couldnt", "hasnt", "havent", "hadnt",
             "mustnt", "aint", "unable", "fail", "fails", "failed", "failing", "stopped",
             "avoid", "refuse", "refuses", "refused", "lack", "lacks"}

_PAIRS = """
enable disable | on off | start stop | open close | increase decrease | add remove | buy sell
lock unlock | upload download | import export | login logout | log-in log-out | sign-in sign-out
subscribe unsubscribe | accept reject | accept decline | allow deny | allow block | include exclude
in out | up down | before after | min max | minimum maximum | more less | most least | higher lower
highest lowest | largest smallest | bigger smaller | big small | long short | longer shorter
fast slow | faster slower | cheap expensive | cheapest priciest | hot cold | warm cool | heavy light
early late | earlier later | first last | true false | positive negative | win lose | pros cons
advantage disadvantage | benefit drawback | push pull | send receive | sent received | give take
north south | east west | left right | male female | day night | old new | oldest newest
connect disconnect | install uninstall | activate deactivate | encrypt decrypt | mount unmount
join leave | enter exit | arrive depart | arrival departure | import export | inbound outbound
internal external | inside outside | above below | over under | top bottom | front back
public private | online offline | upgrade downgrade | credit debit | deposit withdraw | income expense
profit loss | gain lose | asleep awake | sleep wake | freeze unfreeze | hide show | visible hidden
always never | all none | everyone nobody | can cannot | should shouldnt | must mustnt
safe dangerous | legal illegal | possible impossible | agree disagree | like dislike | love hate
best worst | better worse | good bad | easy hard | easy difficult | simple complex | strong weak
rich poor | wet dry | full empty | present absent | success failure | succeed fail | pass fail
hire fire | employ dismiss | borrow lend | lend borrow | teach learn | ask answer | question answer
import export | increase reduce | raise lower | expand shrink | expand collapse | zoom-in zoom-out
mute unmute | pause resume | archive unarchive | follow unfollow | block unblock | pin unpin
""".replace("\n", " | ")

_PREFIXES = ("un", "dis", "de", "in", "im", "non", "ir", "il")


def _key(word: str) -> str:
    """stem() until it stops changing: it is not idempotent ("flossing" -> "floss" -> "flos")."""
    while (shorter := stem(word)) != word:
        word = shorter
    return word


def stem(word: str) -> str:
    w = word.lower().replace("’", "'").replace("'", "")
    for suffix in ("est", "ing", "ed", "es", "er", "s", "e"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            break
    return w


def _opposites() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pair in _PAIRS.split("|"):
        words = pair.split()
        if len(words) != 2:
            continue
        a, b = stem(words[0]), stem(words[1])
        out.setdefault(a, set()).add(b)
        out.setdefault(b, set()).add(a)
    return out


OPPOSITES = _opposites()


@dataclass(frozen=True)
class Features:
    words: frozenset[str]  # stems
    numbers: frozenset[str]
    names: frozenset[str]
    negated: bool
    lower: str  # the whole text, lower-case, for "is this name anywhere in the other one?"
    times: frozenset[str] = frozenset()
    units: frozenset[str] = frozenset()
    wh: frozenset[str] = frozenset()
    content: tuple[str, ...] = ()  # stems of the words that carry the question, in order
    counts: frozenset[tuple[str, str]] = frozenset()  # (number, the word it counts): ("2", "adult")
    links: tuple[tuple[str, str, str], ...] = ()  # (word, "to"/"from"/..., word), in order


def _number(token: str) -> str:
    t = token.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+", token) else token
    return t.lstrip("0") or "0" if t.isdigit() else t


def _starts_sentence(text: str, at: int) -> bool:
    before = text[:at].rstrip(" \t\"'“‘(*-")
    return not before or before[-1] in ".!?:;\n"


def features(text: str) -> Features:
    words: set[str] = set()
    numbers: set[str] = set()
    names: set[str] = set()
    negated = False
    prev = ""
    for m in _TOKEN.finditer(text):
        token = m.group().rstrip("'’-")
        low = token.lower().replace("’", "'")
        after_number, prev = bool(_NUMBER.fullmatch(prev)), token
        if _NUMBER.fullmatch(token):
            numbers.add(_number(token))
            continue
        glued = _UNIT_CODE.fullmatch(low)
        if glued and (glued.group(2) in _GLUED_SUFFIXES or glued.group(2) in UNITS):
            # "7am", "5gb", "2nd", "10k": the number, and its unit or time compared below
            n = _number(glued.group(1))
            numbers.add(str(int(n) * 1000) if glued.group(2) == "k" and n.isdigit() else n)
            continue
        if any(c.isdigit() for c in token):  # a code: A4, 2FA, SKU-123, iPhone15
            names.add(low)
            continue
        for part in low.split("-"):
            if part in NUMBER_WORDS:
                numbers.add(NUMBER_WORDS[part])
        if low.endswith("n't") or low.replace("'", "") in NEGATIONS or \
                low.startswith(("non-", "not-", "no-")):
            negated = True
        if low in TIME_WORDS or low in UNITS or (after_number and low in UNIT_AFTER_NUMBER):
            words.add(stem(low))  # "Monday", "GB", "25 C": times and units have their own rules
            continue
        if len(token) >= 2 and token.isupper():  # acronyms, even first: "PDF", "USB"
            names.add(low)
        elif token[0].isupper() and token != "I" and not _starts_sentence(text, m.start()):
            names.add(low)
        words.add(stem(low))
    for m in _QUOTED.finditer(text):
        names.add(normalise_quote(m.group(1)))
    for m in _SPECIAL.finditer(text):
        names.add(m.group().lower().rstrip(".,;:!?"))
    low_tokens = [m.group().rstrip("'’-").lower().replace("’", "'") for m in _TOKEN.finditer(text)]
    times, units = _times(low_tokens), _units(low_tokens, text)
    names -= {t for t in low_tokens if _UNIT_CODE.fullmatch(t)}  # "10am", "5kg": compared below
    content = _content(_phrases(low_tokens))
    return Features(frozenset(words), frozenset(numbers), frozenset(names), negated,
                    " ".join(text.lower().replace("’", "'").split()), frozenset(times),
                    frozenset(units), frozenset(t for t in low_tokens if t in WH_WORDS),
                    content=content, links=_links(low_tokens), counts=_counts(low_tokens))


# a number glued to a unit or am/pm: "10am", "5kg", "25mb", "1tb"
_UNIT_CODE = re.compile(r"(\d+(?:[.,:]\d+)?)([a-z°]+)")
_DIRECTION = {"to", "into", "from", "than", "in", "per", "towards", "onto", "for", "with", "by",
              "before", "after", "over"}
_GLUED_SUFFIXES = {"am", "pm", "st", "nd", "rd", "th", "k", "x", "s"}


def _phrases(tokens: list[str]) -> list[str]:
    out: list[str] = []
    for t in tokens:
        if out and (out[-1], t) in PHRASES:
            out[-1] = PHRASES[(out[-1], t)]
        else:
            out.append(t)
    return out


def _content(tokens: list[str]) -> tuple[str, ...]:
    """The words that carry the question, canonical, in order (numbers are compared apart)."""
    out = []
    for i, t in enumerate(tokens):
        if t in STOPWORDS or _NUMBER.fullmatch(t):
            continue
        if t in UNITS:
            out.append(UNITS[t])
        elif t in UNIT_AFTER_NUMBER and i and _NUMBER.fullmatch(tokens[i - 1]):
            out.append(UNIT_AFTER_NUMBER[t])
        else:
            out.append(_canonical(t))
    return tuple(out)


def _canonical(token: str) -> str:
    """Stem, and the same stem for words of one synonym group (for alignment)."""
    s = stem(token)
    group = _SYNONYM_STEMS.get(token, _SYNONYM_STEMS.get(s))
    return f"~{group}" if group is not None else s


# stem() is not idempotent ("class" -> "clas", "classes" -> "class"): key both forms
_SYNONYM_STEMS = {**{stem(w): g for w, g in SYNONYMS.items()}, **SYNONYMS}


def _times(tokens: list[str]) -> set[str]:
    out: set[str] = set()
    for i, t in enumerate(tokens):
        prev = tokens[i - 1] if i else ""
        glued = _UNIT_CODE.fullmatch(t)
        if glued and glued.group(2) in ("am", "pm"):
            out.add(glued.group(2))
        elif t in MERIDIEM and (_NUMBER.fullmatch(prev) or "." in t):
            out.add(MERIDIEM[t])
        elif t in TIME_WORDS:
            out.update(TIME_WORDS[t])
        elif t in TIME_AFTER_ARTICLE and prev in ("the", "in", "this", "next", "last", "every", "of"):
            out.add(TIME_AFTER_ARTICLE[t])
        if t in TIME_MODIFIED and prev in TIME_MODIFIERS:
            out.add(f"{prev} {TIME_AFTER_ARTICLE.get(t, t)}")
    return out


def _units(tokens: list[str], text: str) -> set[str]:
    out = {name for sym, name in (("$", "dollar"), ("€", "euro"), ("£", "gbp"), ("¥", "yen"),
                                 ("%", "percent"), ("°", "degree")) if sym in text}
    for i, t in enumerate(tokens):
        prev = tokens[i - 1] if i else ""
        glued = _UNIT_CODE.fullmatch(t)
        name = None
        if glued and glued.group(2) not in ("am", "pm", "st", "nd", "rd", "th", "s"):
            unit = glued.group(2)
            name = UNITS.get(unit) or UNIT_AFTER_NUMBER.get(unit) or unit
        elif t in UNITS:
            name = UNITS[t]
        elif t in UNIT_AFTER_NUMBER and _NUMBER.fullmatch(prev):
            name = UNIT_AFTER_NUMBER[t]
        if name is not None:
            out.add(("square " if prev in SQUARE else "") + name)
    if "fl" in tokens and "oz" in out:  # "fl oz" is a volume, "oz" a weight
        out = (out - {"oz"}) | {"fl oz"}
    return out


def _counts(tokens: list[str]) -> frozenset[tuple[str, str]]:
    """Each number with the content word right after it: "2 adults and 1 child"."""
    out = set()
    for i, t in enumerate(tokens):
        n = _number(t) if _NUMBER.fullmatch(t) else NUMBER_WORDS.get(t)
        if n is None:
            continue
        word = next((tokens[j] for j in range(i + 1, min(i + 3, len(tokens)))
                     if tokens[j] not in STOPWORDS and not _NUMBER.fullmatch(tokens[j])), None)
        if word is not None:
            out.add((n, _key(word)))
    return frozenset(out)


def _links(tokens: list[str]) -> tuple[tuple[str, str, str], ...]:
    """(x, word, y) for each direction word and each content word x of the three before it
    and y of the three after it, within its clause: "from boston to new york" gives
    ("boston", "to", "new") and ("boston", "to", "york")."""
    out = []
    for i, t in enumerate(tokens):
        if t not in _DIRECTION:
            continue
        left: list[str] = []
        for j in range(i - 1, -1, -1):
            if tokens[j] in _DIRECTION or len(left) == 3:
                break
            if tokens[j] not in STOPWORDS:
                left.append(_key(tokens[j]))
        right: list[str] = []
        for j in range(i + 1, len(tokens)):
            if tokens[j] in _DIRECTION or len(right) == 3:
                break
            if tokens[j] not in STOPWORDS:
                right.append(_key(tokens[j]))
        out += [(x, t, y) for x in left for y in right]
    return tuple(out)


def normalise_quote(text: str) -> str:
    return " ".join(text.lower().split())


def _opposed(only_a: frozenset[str], only_b: frozenset[str]) -> bool:
    for a in only_a:
        if OPPOSITES.get(a, set()) & only_b:
            return True
        if len(a) < 4:  # "in" + "to" is not the opposite of "to"
            continue
        for p in _PREFIXES:
            if (p + a) in only_b or (a.startswith(p) and len(a) - len(p) >= 4 and a[len(p):] in only_b):
                return True
    return False


def _missing_names(fa: Features, fb: Features) -> bool:
    """A name of one question that the other does not mention, even in lower case."""
    for names, other in ((fa.names - fb.names, fb.lower), (fb.names - fa.names, fa.lower)):
        for name in names:
            if not re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", other):
                return True
    return False


def _numbers_differ(fa: Features, fb: Features) -> bool:
    if fa.numbers == fb.numbers:  # the same numbers; do they count the same things?
        counted_a, counted_b = dict((w, n) for n, w in fa.counts), dict((w, n) for n, w in fb.counts)
        return any(counted_b.get(w, n) != n for w, n in counted_a.items())
    # "a pound" is "one pound": a lone 1 on one side against "a"/"an" on the other
    for x, y in ((fa, fb), (fb, fa)):
        if x.numbers - y.numbers == {"1"} and y.numbers <= x.numbers and \
                re.search(r"\b(a|an|per|each)\b", y.lower):
            return False
    return True


def _reordered(fa: Features, fb: Features) -> bool:
    """Both link the same two words by the same direction word, in opposite order."""
    return any((y, w, x) in fb.links for x, w, y in fa.links if x != y and (x, w, y) not in fb.links)


# a swap of the first word is how a question is put ("contact"/"reach support") as often as
# what it asks ("join"/"record a zoom meeting"); the embedder tells those apart only near the
# top (tuning part: such paraphrases 0.77-0.97, such near misses 0.50-0.80)
FIRST_WORD_SWAP_MIN = 0.85


def _substituted(fa: Features, fb: Features, similarity: float | None) -> bool:
    """Word for word the same but for one or two words in one place, not synonyms."""
    ops = [op for op in SequenceMatcher(None, fa.content, fb.content, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace":
        return False
    _, i1, i2, j1, j2 = ops[0]
    shared = len(fa.content) - (i2 - i1)
    if shared < 1 or i2 - i1 > 2 or j2 - j1 > 2:
        return False
    if i1 == 0 and j1 == 0 and similarity is not None and similarity >= FIRST_WORD_SWAP_MIN:
        return False
    gone, new = set(fa.content[i1:i2]), set(fb.content[j1:j2])
    if any(x[:5] == y[:5] for x in gone for y in new if len(x) >= 5 and len(y) >= 5):
        return False  # one word, two forms: "summarize" / "summary"
    return not (gone & set(fb.content) or new & set(fa.content))  # a moved word is no swap


def differences(a: str, b: str, similarity: float | None = None) -> list[str]:
    """Why `a` and `b` must not share an answer; [] when the guard sees no reason.
    `similarity`: their embeddings' cosine, where known (see FIRST_WORD_SWAP_MIN)."""
    fa, fb = features(a), features(b)
    reasons = []
    if _numbers_differ(fa, fb):
        reasons.append("numbers")
    if _missing_names(fa, fb):
        reasons.append("names")
    if fa.negated != fb.negated:
        reasons.append("negation")
    if _opposed(fa.words - fb.words, fb.words - fa.words):
        reasons.append("opposites")
    if fa.times != fb.times:
        reasons.append("time")
    if fa.units and fb.units and fa.units != fb.units:
        reasons.append("units")
    if _reordered(fa, fb):
        reasons.append("order")
    if fa.wh and fb.wh and fa.wh != fb.wh:
        reasons.append("question")
    if _substituted(fa, fb, similarity):
        reasons.append("substitution")
    return reasons


def allows(a: str, b: str, similarity: float | None = None) -> bool:
    return not differences(a, b, similarity)
