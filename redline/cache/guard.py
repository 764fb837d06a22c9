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
  list of antonym pairs plus prefixes (un-, dis-, de-, in-, im-, non-).

Known blind spot: lower-case names ("weather in paris" vs "weather in berlin") are not
recognised as names; the similarity threshold has to keep those apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
                 "single": "1", "double": "2", "triple": "3", "half": "0.5", "dozen": "12"}

NEGATIONS = {"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor",
             "without", "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt",
             "werent", "wont", "wouldnt", "shouldnt", "couldnt", "hasnt", "havent", "hadnt",
             "mustnt", "aint", "unable", "fail", "fails", "failed", "failing", "stopped"}

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
    for m in _TOKEN.finditer(text):
        token = m.group().rstrip("'’-")
        low = token.lower().replace("’", "'")
        if _NUMBER.fullmatch(token):
            numbers.add(_number(token))
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
        if len(token) >= 2 and token.isupper():  # acronyms, even first: "PDF", "USB"
            names.add(low)
        elif token[0].isupper() and token != "I" and not _starts_sentence(text, m.start()):
            names.add(low)
        words.add(stem(low))
    for m in _QUOTED.finditer(text):
        names.add(normalise_quote(m.group(1)))
    for m in _SPECIAL.finditer(text):
        names.add(m.group().lower().rstrip(".,;:!?"))
    return Features(frozenset(words), frozenset(numbers), frozenset(names), negated,
                    " ".join(text.lower().replace("’", "'").split()))


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


def differences(a: str, b: str) -> list[str]:
    """Why `a` and `b` must not share an answer; [] when the guard sees no reason."""
    fa, fb = features(a), features(b)
    reasons = []
    if fa.numbers != fb.numbers:
        reasons.append("numbers")
    if _missing_names(fa, fb):
        reasons.append("names")
    if fa.negated != fb.negated:
        reasons.append("negation")
    if _opposed(fa.words - fb.words, fb.words - fa.words):
        reasons.append("opposites")
    return reasons


def allows(a: str, b: str) -> bool:
    return not differences(a, b)
