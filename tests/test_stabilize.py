"""Local agreement between successive partial hypotheses."""

from __future__ import annotations

from streamer.streaming.stabilize import LocalAgreement, split_units, unit_key


def feed(hypotheses: list[str]) -> list[tuple[str, str]]:
    """(stable, unstable) after each hypothesis, with the space between them dropped."""
    agreement = LocalAgreement()
    out = []
    for h in hypotheses:
        s = agreement.update(h)
        assert s.text == s.stable + s.unstable
        out.append((s.stable, s.unstable.lstrip()))
    return out


def test_growing_hypotheses_stabilise_their_agreed_prefix():
    got = feed([
        " And so my",
        " And so my fellow",
        " And so my fellow Americans",
        " And so my fellow Americans, ask not",
    ])
    assert got == [
        ("", "And so my"),  # nothing to agree with yet
        ("And so my", "fellow"),
        ("And so my fellow", "Americans"),
        ("And so my fellow Americans,", "ask not"),
    ]


def test_revised_tail_is_not_stable():
    # The last word of a growing window is often cut in half and then corrected.
    got = feed([" ask not what your coun", " ask not what your country can", " ask not what your country can do"])
    assert got[1] == ("ask not what your", "country can")
    assert got[2] == ("ask not what your country can", "do")


def test_case_and_punctuation_do_not_break_agreement():
    got = feed([" Hello world, this", " hello, World. This is", " Hello world, this is it"])
    assert got[1] == ("hello, World. This", "is")  # words become stable as the newest spells them
    assert got[2] == ("hello, World. This is", "it")  # and keep that spelling
    assert unit_key(" World.") == unit_key("world,") == "world"
    assert unit_key(" ...") == "..."  # a unit of punctuation alone still compares


def test_stable_prefix_never_shrinks():
    agreement = LocalAgreement()
    agreement.update(" the quick brown fox")
    first = agreement.update(" the quick brown fox jumps")
    assert first.stable == "the quick brown fox"
    # A hypothesis that revises stable words does not take them back...
    revised = agreement.update(" the quack brown")
    assert revised.stable == "the quick brown fox"
    assert revised.text == "the quick brown fox"
    # ...nor extends the stable text until hypotheses agree with it again.
    again = agreement.update(" the quick brown fox jumps over")
    assert again.stable == "the quick brown fox" and again.unstable == " jumps over"
    final = agreement.update(" the quick brown fox jumps over the")
    assert final.stable == "the quick brown fox jumps over" and final.unstable == " the"
    stables = [first.stable, revised.stable, again.stable, final.stable]
    assert all(b.startswith(a) for a, b in zip(stables, stables[1:]))  # append-only text


def test_text_is_stable_then_unstable():
    agreement = LocalAgreement()
    agreement.update(" It is a test")
    s = agreement.update(" It is a test of the")
    assert (s.text, s.stable, s.unstable) == ("It is a test of the", "It is a test", " of the")
    assert agreement.update("It is a test of the day").text == "It is a test of the day"
    first = LocalAgreement().update("  Leading and trailing  ")
    assert (first.text, first.stable, first.unstable) == ("Leading and trailing", "", "Leading and trailing")


def test_scripts_without_spaces_agree_per_character():
    assert split_units("我们今天 hello") == ["我", "们", "今", "天", " hello"]
    got = feed(["我们今天", "我们今天去"])
    assert got[1] == ("我们今天", "去")
