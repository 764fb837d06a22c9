from redline.engine.detok import Detokenizer


def test_plain_text_passes_through():
    d = Detokenizer()
    assert d.feed(b"Hello") + d.feed(b" world") + d.flush() == "Hello world"


def test_utf8_split_across_tokens_is_held_until_whole():
    d = Detokenizer()
    euro = "€".encode()
    assert d.feed(euro[:1]) == ""
    assert d.feed(euro[1:]) == "€"


def test_stop_string_across_tokens_is_cut_and_never_released():
    d = Detokenizer(stop=("STOP",))
    out = d.feed(b"abc ST")
    assert out == "abc "  # "ST" might begin the stop: held back
    out += d.feed(b"OP and more")
    assert out == "abc "
    assert d.stopped
    assert d.flush() == ""


def test_held_prefix_released_when_it_is_not_a_stop():
    d = Detokenizer(stop=("STOP",))
    assert d.feed(b"ST") == ""
    assert d.feed(b"ART") == "START"
    assert not d.stopped


def test_earliest_of_several_stops_wins():
    d = Detokenizer(stop=("world", "lo"))
    assert d.feed(b"hello world") == "hel"


def test_the_stop_string_is_kept_when_asked():
    """vLLM's include_stop_str_in_output: the text up to and with the stop that ended it."""
    d = Detokenizer(stop=("lo", "world"), include_stop=True)
    assert d.feed(b"hello world") == "hello"
    assert d.stopped
    # of two stops starting at the same place, the longer one is the one kept
    d = Detokenizer(stop=("wor", "world!"), include_stop=True)
    assert d.feed(b"a world! b") == "a world!"


def test_no_stop_string_ends_the_text_while_checks_are_off():
    """vLLM's min_tokens: before it is reached a stop string goes out as text."""
    d = Detokenizer(stop=("STOP",))
    assert d.feed(b"one STOP two", check=False) == "one STOP two"
    assert not d.stopped
    assert d.feed(b" STOP three") == " "
    assert d.stopped
