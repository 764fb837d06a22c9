"""Word lists for the near-miss guard (guard.py): times and dates, units, words that carry no
question of their own, and words that mean the same in a question. Each list was written
from general knowledge and checked against the tuning part of the labelled pairs only
(bench/data/cache_pairs.tsv, cache_pairs_tune.tsv); the test part never shaped them.
"""

from __future__ import annotations

# canonical time token for each word; "tonight" is today's night
TIME_WORDS: dict[str, tuple[str, ...]] = {
    "today": ("today",), "tonight": ("today", "night"), "tomorrow": ("tomorrow",),
    "tmrw": ("tomorrow",), "yesterday": ("yesterday",), "morning": ("morning",),
    "mornings": ("morning",), "afternoon": ("afternoon",), "afternoons": ("afternoon",),
    "evening": ("evening",), "evenings": ("evening",), "night": ("night",), "nights": ("night",),
    "overnight": ("night",), "noon": ("noon",), "midday": ("noon",), "midnight": ("midnight",),
    "breakfast": ("breakfast",), "brunch": ("brunch",), "lunch": ("lunch",), "dinner": ("dinner",),
    "weekday": ("weekday",), "weekdays": ("weekday",), "weekend": ("weekend",),
    "weekends": ("weekend",), "christmas": ("christmas",), "xmas": ("christmas",),
    "easter": ("easter",), "boxing": ("boxing",), "holiday": ("holiday",), "holidays": ("holiday",),
    "summer": ("summer",), "winter": ("winter",), "autumn": ("autumn",),
}
for _i, _d in enumerate("monday tuesday wednesday thursday friday saturday sunday".split()):
    TIME_WORDS[_d] = TIME_WORDS[_d + "s"] = (_d,)
    TIME_WORDS[_d[:3]] = (_d,)
for _m in ("january february march april june july august september october november "
           "december").split():  # not "may": a verb far more often
    TIME_WORDS[_m] = (_m,)
TIME_WORDS.pop("sat")  # "I sat", "sun" is the star, "wed" is married: too often not a day
TIME_WORDS.pop("sun")
TIME_WORDS.pop("wed")
# words that are a time only after "the", "in", "this", "next", "last", "every", "of"
TIME_AFTER_ARTICLE = {"fall": "autumn", "spring": "spring"}
TIME_MODIFIED = {"week", "weekend", "month", "year", "night", "morning", "evening", "summer",
                 "winter", "spring", "autumn", "fall", "season", "time"}
TIME_MODIFIERS = {"this", "next", "last", "previous", "coming"}
MERIDIEM = {"am": "am", "a.m": "am", "a.m.": "am", "pm": "pm", "p.m": "pm", "p.m.": "pm"}

# units, measures and currencies -> one canonical name
_UNITS = """
km kilometre kilometres kilometer kilometers kms | mile miles mi | m metre metres meter meters
cm centimetre centimetres centimeter centimeters | mm millimetre millimetres millimeter millimeters
inch inches in. | foot feet ft | yard yards yd | kg kilo kilos kilogram kilograms kgs
g gram grams gr | mg milligram milligrams | lb lbs pound pounds | oz ounce ounces
stone stones | ton tons tonne tonnes | ml millilitre millilitres milliliter milliliters
l litre litres liter liters | gallon gallons gal | quart quarts | pint pints | cup cups
tablespoon tablespoons tbsp tbs | teaspoon teaspoons tsp | stick sticks
celsius centigrade °c | fahrenheit °f | kelvin | mph | kph km/h kmh | kb kilobyte kilobytes
mb megabyte megabytes | gb gigabyte gigabytes gig gigs | tb terabyte terabytes
kbps | mbps | gbps | watt watts | volt volts | amp amps ampere amperes | kwh | hz | khz
mhz | ghz | mmhg | bpm | calorie calories kcal | joule joules
second seconds sec secs | minute minutes min mins | hour hours hr hrs | day days
week weeks | month months | year years yr yrs | decade decades | century centuries
acre acres | hectare hectares | sqft | sqm
dollar dollars usd $ | euro euros eur € | gbp £ quid | yen jpy ¥ | rupee rupees inr
franc francs chf | peso pesos | yuan rmb cny | cent cents | penny pence
percent % | degree degrees
"""
UNITS: dict[str, str] = {}
for _group in _UNITS.replace("\n", " | ").split("|"):
    _names = _group.split()
    for _name in _names:
        UNITS[_name] = _names[0]
# a letter that is a unit only right after a number: "200 c", "5 g", "10 m"
UNIT_AFTER_NUMBER = {"c": "celsius", "f": "fahrenheit", "m": "m", "g": "g", "l": "l", "v": "volt",
                     "w": "watt", "a": "amp"}
SQUARE = {"square", "sq", "cubic"}

# carry no question of their own: dropped before two questions are aligned word by word
STOPWORDS = set("""
a an the my your our their his her its i you we they he she it me us them mine yours
is are was were be been being am do does did doing can could would should will shall
might must have has had having to of for on in at by with from about as into onto
please hey hi hello so and or but if then there here this that these those some any
just really actually also too very what whats what's how hows how's which tell know
want wanted wanting like would'd i'm im i'd id i've ive u ur r get got getting go going
way ways possible possibly ok okay thanks thank pls plz help explain me up out one
still ever already only much many anyone someone something anything
""".split())

# question words that ask for different things; "how", "what" and "which" are used for
# one another in paraphrases, these are not
WH_WORDS = {"who", "when", "where", "why", "whom", "whose"}

# words (stems, as guard.stem makes them) that mean the same in a question, for the
# one-slot substitution check: "turn on" == "enable" is not a different question
_SAME = """
buy purchase order | cancel stop end terminate | begin start | delete remove erase
change edit update modify alter switch replace | fix repair solve resolve | get obtain receive
see view check find look show | send ship mail deliver | cost price charge fee cost | cheap inexpensive
big large | small little tiny | quick fast rapid speedy | slow sluggish | help assist support
error bug issue problem | broken damaged smashed faulty | refund reimburse | receipt invoice bill
parcel package shipment delivery order | car vehicle auto | phone mobile smartphone cell
laptop computer pc notebook | app application program software | account profile
email e-mail mail | password passcode | photo picture image | film movie | shop store
customer client | job work | begin commence | choose pick select | need require
happy glad | sick ill | doctor physician | kid child children | guarantee warranty
voucher coupon code promo discount | worth value | show display | make create
class session lesson course | trip journey | ticket pass | hotel accommodation lodging
"""
SYNONYMS: dict[str, int] = {}
for _n, _group in enumerate(_SAME.replace("\n", " | ").split("|")):
    for _word in _group.split():
        SYNONYMS.setdefault(_word, _n)

# two-word verbs -> one word, before alignment ("turn on" is "enable")
PHRASES: dict[tuple[str, str], str] = {
    ("turn", "on"): "enable", ("switch", "on"): "enable", ("turn", "off"): "disable",
    ("switch", "off"): "disable", ("log", "in"): "login", ("sign", "in"): "login",
    ("log", "out"): "logout", ("sign", "out"): "logout", ("sign", "up"): "register",
    ("set", "up"): "setup", ("opt", "out"): "unsubscribe", ("pick", "up"): "collect",
    ("find", "out"): "learn", ("look", "up"): "find", ("figure", "out"): "understand",
    ("get", "rid"): "remove", ("put", "off"): "postpone", ("back", "up"): "backup",
}
