"""The word-level vote over transcripts of one recording (`streamer.longform.vote`), on hand-built
hypotheses: pure, no model."""

from __future__ import annotations

from streamer.longform.vote import Voted, VoteWord, align, vote, words_of


def texts(voted: list[Voted]) -> list[str]:
    return [v.word.text for v in voted]


def test_the_majority_overrules_a_style_the_prompt_set():
    """"5-0-0" (one hypothesis) against "500" (two): the majority's form, with its surface text."""
    prompted = words_of([" Dial 5-0-0 now.", " Then hang up."])
    unprompted = words_of([" Dial 500 now. Then hang up."])
    fast = words_of([" dial 500 now then hang up"])
    voted = vote([prompted, unprompted, fast])
    assert texts(voted) == ["Dial", "500", "now.", "Then", "hang", "up."]
    assert [v.source for v in voted] == [0, 1, 0, 0, 0, 0]  # the backbone's word wherever it is in the majority
    assert [v.segment for v in voted] == [0, 0, 0, 1, 1, 1]  # in the backbone's segments


def test_words_split_or_joined_differently_are_the_same_phrase():
    """Word by word, "voice over IP" / "voiceover IP" / "VoiceOverIP" split three ways and "voice"
    was lost; as phrases they agree, and the backbone's spelling stays."""
    hyps = [words_of([" dial voice over IP now"]), words_of([" dial voiceover IP now"]), words_of([" Dial VoiceOverIP now"])]
    assert texts(vote(hyps)) == ["dial", "voice", "over", "IP", "now"]
    assert texts(vote(hyps, phrases=False)) == ["dial", "over", "IP", "now"]
    voted = vote([words_of([" the blacklist"]), words_of([" the black list"]), words_of([" the 5-0-0 list"])])
    assert texts(voted) == ["the", "blacklist"]


def test_a_tie_goes_to_the_backbone():
    assert texts(vote([words_of([" caller"]), words_of([" color"])])) == ["caller"]
    assert texts(vote([words_of([" caller"]), words_of([" color"]), words_of([" collar"])])) == ["caller"]


def test_words_only_one_hypothesis_has_are_dropped_and_words_it_lacks_are_kept():
    voted = vote([words_of([" press one thank you"]), words_of([" press one"]), words_of([" press one"])])
    assert texts(voted) == ["press", "one"]
    voted = vote([words_of([" press"]), words_of([" press one"]), words_of([" press one"])])
    assert texts(voted) == ["press", "one"]


def test_words_keep_the_segment_they_come_from_and_punctuation_alone_is_no_word():
    words = words_of([" Hello there.", " - ", " Bye."])
    assert [(w.text, w.segment) for w in words] == [("Hello", 0), ("there.", 0), ("Bye.", 2)]
    assert words[1].key == "there" and VoteWord("¿Qué?", 0).key == "qué" and VoteWord("5-0-0", 0).key == "5-0-0"


def test_alignment_keeps_every_word_of_every_hypothesis_in_order():
    hyps = [words_of([" a b c d"]), words_of([" a x c"]), words_of([" b c d e"])]
    slots = align(hyps)
    assert all(len(slot) == 3 for slot in slots)
    for h, words in enumerate(hyps):
        assert [s[h] for s in slots if s[h] is not None] == words


def test_words_far_apart_in_time_are_not_aligned():
    """Within BAND_S of each other the same word shares a slot; a minute apart it does not."""
    here = words_of([" hello"], [(0.0, 1.0)])
    assert len(align([here, words_of([" hello"], [(5.0, 6.0)])])) == 1
    slots = align([here, words_of([" hello"], [(60.0, 61.0)])])
    assert [[w is not None for w in slot] for slot in slots] == [[True, False], [False, True]]


def test_the_same_hypotheses_give_the_same_words():
    hyps = [words_of([" one two three four"]), words_of([" one too three for"]), words_of([" won two three four"])]
    assert vote(hyps) == vote(hyps)
    assert texts(vote(hyps)) == ["one", "two", "three", "four"]


def test_revise_rewrites_the_backbone_segments_in_place_and_keeps_their_times():
    from streamer.longform.transcript import TranscriptSegment
    from streamer.longform.vote import revise
    from streamer.model.weights import load_model

    tok = load_model("tiny.en").tokenizer

    def seg(start: float, end: float, text: str) -> TranscriptSegment:
        return TranscriptSegment(id=0, seek=0, start=start, end=end, text=text, tokens=tok.encode(text), avg_logprob=-0.1,
                                 compression_ratio=1.0, no_speech_prob=0.0, temperature=0.0, token_logprobs=[-0.1] * 3)

    segments = [seg(0.0, 2.0, " Dial 5-0-0 now."), seg(2.0, 3.0, " Thank you."), seg(3.0, 5.0, " Goodbye.")]
    untouched = segments[2]
    revise(segments, [[(0.1, 2.0, " Dial 500 now."), (3.0, 4.8, " Goodbye.")], [(0.0, 5.0, " dial 500 now goodbye")]], tok.encode)
    assert [(s.start, s.end, s.text) for s in segments] == [(0.0, 2.0, " Dial 500 now."), (2.0, 3.0, ""), (3.0, 5.0, " Goodbye.")]
    assert segments[0].tokens == tok.encode(" Dial 500 now.") and segments[0].token_logprobs == []
    assert segments[1].tokens == [] and segments[2] is untouched and untouched.token_logprobs == [-0.1] * 3
