"""The word-level vote over transcripts of one recording (`streamer.longform.vote`), on hand-built
and simulated hypotheses: pure, no model (but for `revise`'s tokens)."""

from __future__ import annotations

import random

import pytest

from streamer.longform.transcript import TranscriptSegment
from streamer.longform.vote import SegmentVote, Voted, VoteStream, VoteWord, align, revise, vote, words_of


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


# --- the confirmed backbone (accurate's rule since session 18) -------------------------------------

CONFIRM = (1.5, 0.6, 4)


def test_a_backbone_phrase_another_confirms_stands_against_the_rest():
    """"prepend" (the backbone and one more) against "pre-pen" (three): the majority takes
    "pre-pen", the confirmed backbone keeps "prepend"."""
    right, wrong = (" Press 1 to prepend the number.",), (" Press 1 to pre-pen the number.",)
    hyps = [words_of(list(right)), words_of(list(right))] + [words_of(list(wrong)) for _ in range(3)]
    assert texts(vote(hyps)) == ["Press", "1", "to", "pre-pen", "the", "number."]
    assert texts(vote(hyps, confirm=CONFIRM)) == ["Press", "1", "to", "prepend", "the", "number."]


def test_a_backbone_phrase_no_one_confirms_takes_the_others_vote():
    """The backbone alone says "color": the other four vote ("caller", three to one); a loop the
    backbone alone writes goes too."""
    hyps = [words_of([" I have a color waiting. waiting waiting waiting waiting waiting"])]
    hyps += [words_of([f" I have a {w} waiting."]) for w in ("caller", "collar", "caller", "caller")]
    assert [w.strip(".") for w in texts(vote(hyps, confirm=CONFIRM))] == ["I", "have", "a", "caller", "waiting"]


def test_a_passage_the_backbone_drops_comes_back_though_another_drops_it_too():
    """The backbone and one more skip a sentence that three say: an empty phrase is confirmed, but
    the backbone's word count there (0) is far below the others' median, so the others vote."""
    said = " Please press one to mute or unmute yourself."
    full = [(0.0, 3.0, " Hello there."), (4.0, 8.0, said), (9.0, 11.0, " Goodbye now.")]
    short = [full[0], full[2]]
    hyps = [words_of([t for _, _, t in h], [(a, b) for a, b, _ in h]) for h in (short, short, full, full, full)]
    assert " ".join(texts(vote(hyps, confirm=CONFIRM))) == "Hello there." + said + " Goodbye now."
    assert " ".join(texts(vote(hyps, confirm=(1.5, 0.6, 99)))) == "Hello there. Goodbye now."  # no guard: kept out


def test_an_unconfirmed_backbone_phrase_needs_overrule_others_agreeing_to_be_replaced():
    """`overrule` (off at 1, docs/notes/accuracy18b.md): the backbone alone says "caller", the
    others "color" three times and "collar" once. Any vote (1) or a majority of the four (3)
    replaces it; only a unanimous opposition (4) would, so it stands; against four "color" it goes."""
    def run(others: tuple[str, ...], overrule: int) -> str:
        hyps = [words_of([" I have a caller waiting."])] + [words_of([f" I have a {w} waiting."]) for w in others]
        stream = VoteStream(len(hyps), confirm=CONFIRM, overrule=overrule)
        return " ".join(v.word.text for h, words in enumerate(hyps) for v in stream.add(h, words))

    split, unanimous = ("color", "collar", "color", "color"), ("color",) * 4
    assert run(split, 1) == run(split, 3) == "I have a color waiting."
    assert run(split, 1) == " ".join(texts(vote([words_of([" I have a caller waiting."])]
                                                + [words_of([f" I have a {w} waiting."]) for w in split], confirm=CONFIRM)))
    assert run(split, 4) == "I have a caller waiting."
    assert run(unanimous, 4) == "I have a color waiting."


def test_a_passage_three_transcripts_skip_over_speech_stays_with_the_backbone():
    """The backbone and `fast` write 17 s of speech after a pause that `acc`, `unp` and `fast` with
    5 beams skip (their windows open at the same place; base, French: the first 17 s of speech were
    lost). Their word count there is 0 against the backbone's 25, so the guard's length check hands
    the run to the other four, and three empty phrases outvote `fast`. The VAD hears speech there
    and `fast` has words in the same slots: the backbone's words stay. A loop of the backbone that
    no one else writes still goes (`test_a_backbone_phrase_no_one_confirms_takes_the_others_vote`),
    and without speech the skip wins as before."""
    first = (2.9, 8.0, " Pour énumérer tous les usagers présents dans la conférence, veuillez appuyer sur 1.")
    rest = [(8.0, 12.0, " Pour éjecter tous les usagers réguliers, appuyez sur 2."),
            (12.0, 19.9, " Pour activer ou désactiver le mode sourdine de tous les usagers, appuyez sur 3.")]
    after = [(22.0, 25.5, " Pour enregistrer cette conférence, appuyez sur 4.")]
    full, skipped = [first] + rest + after, after
    fast = [first, (8.0, 12.0, " Pour éjecter tous les usagers réguliers appuyez sur deux."), rest[1]] + after
    hyps = [words_of([t for _, _, t in h], [(a, b) for a, b, _ in h]) for h in (full, skipped, skipped, fast, skipped)]
    said = " ".join(t.strip() for _, _, t in full)
    assert " ".join(texts(vote(hyps, confirm=CONFIRM))) == after[0][2].strip()  # what the product did
    assert " ".join(texts(vote(hyps, confirm=CONFIRM, speech=lambda a, b: b - a))) == said
    assert " ".join(texts(vote(hyps, confirm=CONFIRM, speech=lambda a, b: 0.0))) == after[0][2].strip()


# --- the vote as the transcripts are decoded ---------------------------------------------------------

def simulated(seed: int, words: int = 400) -> list[list[tuple[float, float, str]]]:
    """Four transcripts of one made-up recording, each as (start, end, text) segments in order: the
    same words with some substituted, dropped, added and respelled, segmented differently, their
    times a little off; pauses of 0.3-6 s between sentences."""
    rng = random.Random(seed)
    vocabulary = ["press", "one", "500", "5-0-0", "caller", "color", "voice", "mail", "box", "the", "to", "re-record"]
    spoken, t = [], 0.0
    for k in range(words):
        spoken.append((rng.choice(vocabulary), t))
        t += rng.uniform(0.2, 0.5) + (rng.uniform(0.3, 6.0) if k % 9 == 8 else 0.0)
    out = []
    for _ in range(4):
        heard = []
        for w, at in spoken:
            r = rng.random()
            if r < 0.05:
                continue
            heard.append((rng.choice(vocabulary) if r < 0.12 else w, at + rng.uniform(-0.5, 0.5)))
            if r > 0.97:
                heard.append((rng.choice(vocabulary), at + 0.1))
        heard.sort(key=lambda p: p[1])
        segments, i = [], 0
        while i < len(heard):
            n = rng.randint(1, 12)
            piece = heard[i:i + n]
            segments.append((round(piece[0][1], 2), round(piece[-1][1] + 0.3, 2), " " + " ".join(w for w, _ in piece)))
            i += n
        out.append(segments)
    return out


def fed(segments: list[list[tuple]], step: float, rng: random.Random):
    """(hypothesis, its next segments, until) as decoders running at different paces give them: a
    common clock, each hypothesis up to a few seconds behind it; then each complete."""
    given, clock = [0] * len(segments), 0.0
    end = max(b for s in segments for _, b, _ in s)
    while clock < end:
        clock += step
        for h in rng.sample(range(len(segments)), len(segments)):
            until = max(0.0, clock - rng.uniform(0.0, 3 * step))
            k = given[h]
            while given[h] < len(segments[h]) and segments[h][given[h]][0] < until:
                given[h] += 1
            yield h, segments[h][k:given[h]], until
    for h in range(len(segments)):
        yield h, segments[h][given[h]:], float("inf")


@pytest.mark.parametrize("seed,confirm", [(seed, None) for seed in range(6)] + [(seed, CONFIRM) for seed in range(3)])
def test_the_vote_as_the_transcripts_arrive_gives_the_words_of_the_vote_at_the_end(seed, confirm):
    """Whatever the pieces and their order, the words handed over as they become final are, in
    order, those of the vote on the whole transcripts (the majority, or with `confirm` the
    confirmed backbone); most of them come before the end."""
    hyps = simulated(seed)
    whole = vote([words_of([t for _, _, t in h], [(a, b) for a, b, _ in h]) for h in hyps], confirm=confirm)
    stream, early, got = VoteStream(4, confirm=confirm), 0, []
    given = [0] * 4
    for h, segments, until in fed(hyps, step=random.Random(seed).uniform(0.5, 20.0), rng=random.Random(seed)):
        words = words_of([t for _, _, t in segments], [(a, b) for a, b, _ in segments], first=given[h])
        given[h] += len(segments)
        new = stream.add(h, words, until)
        early += len(new) if until != float("inf") else 0
        got += new
    assert got == whole
    assert early > len(whole) // 2


def segment(start: float, end: float, text: str) -> TranscriptSegment:
    return TranscriptSegment(id=0, seek=0, start=start, end=end, text=text, tokens=[len(text)], avg_logprob=-0.1,
                             compression_ratio=1.0, no_speech_prob=0.0, temperature=0.0, token_logprobs=[-0.1])


@pytest.mark.parametrize("seed", range(3))
def test_segments_handed_on_as_they_become_final_are_those_revise_gives(seed):
    """`SegmentVote` hands each backbone segment on once, in order, rewritten as `revise` rewrites
    it on the whole transcripts; segments come before the end."""
    hyps = simulated(seed)
    backbone = [segment(*s) for s in hyps[0]]
    revise(backbone, hyps[1:], lambda text: [len(text)])
    voter, out, before_end = SegmentVote(4, lambda text: [len(text)]), [], 0
    for h, segments, until in fed(hyps, step=5.0, rng=random.Random(seed)):
        final = voter.add(h, [segment(*s) for s in segments] if h == 0 else segments, until)
        before_end += len(final) if until != float("inf") else 0
        out += final
    assert [(s.start, s.end, s.text, s.tokens) for s in out] == [(s.start, s.end, s.text, s.tokens) for s in backbone]
    assert before_end > len(backbone) // 2
