"""Tests for the study's statistics (nmt.study.stats), each against values computed independently here:
BLEU from our own sentence statistics against sacrebleu, a bootstrap on four items worked by hand (the draws,
the window weights, BLEU per draw, the paired p-value, a seed cell, the interaction), sacrebleu's own paired
test on the same draws, seeds that disagree, Holm and p-values at the threshold, and the window figure.

    python -m pytest -q tests/test_study_stats.py
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from nmt.metrics import bleu_from_statistics, bleu_statistics, percentile_interval
from nmt.study.stats import (
    Draws,
    Output,
    add_holm,
    bleu_draws,
    combine,
    format_p,
    holm,
    interaction,
    paired_cell,
    paired_p,
    seed_cell,
    seed_draws,
)

README = Path(__file__).parents[1] / "README.md"

# four items, two systems; every item shares 4-grams with its reference, so every resample has matches of
# every order and BLEU does not change when all statistics are scaled (the windows' test below relies on it)
REFS = [
    "the cat sat on the mat today",
    "a small dog ran in the park",
    "it is raining in the city again",
    "we all went home early that night",
]
BASE = ["the cat sat on the mat", "a dog ran in the park", "it is raining in a city", "we went home early that night"]
SYS = [
    "the cat sat on the mat today",
    "a small dog ran in a park",
    "it is raining again",
    "we all went home early that day",
]
# six draws of the four items, written out: each row is how often each item is drawn, summing to 4
COUNTS = np.array([[1, 1, 1, 1], [2, 0, 1, 1], [0, 2, 2, 0], [1, 1, 0, 2], [3, 0, 0, 1], [0, 1, 3, 0]])


def _system(references: list[str], keep: float, seed: int) -> list[str]:
    """A made-up system's outputs: each reference with some words dropped and neighbours swapped."""
    rng = random.Random(seed)
    out = []
    for ref in references:
        words = [w for w in ref.split() if rng.random() < keep]
        if len(words) > 3 and rng.random() < 0.5:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        out.append(" ".join(words))
    return out


def _sacrebleu(hyps: list[str], refs: list[str], counts) -> float:
    """sacrebleu's BLEU of the corpus in which item i appears counts[i] times."""
    h = [x for x, c in zip(hyps, counts, strict=True) for _ in range(int(c))]
    r = [x for x, c in zip(refs, counts, strict=True) for _ in range(int(c))]
    return sacrebleu.corpus_bleu(h, [r]).score


def _out(hyps: list[str], refs: list[str] = REFS) -> Output:
    return Output.of(hyps, refs, [len(r.split()) for r in refs])


@pytest.fixture(scope="module")
def text() -> list[str]:
    """Real English text with punctuation, numbers, code and markup: the README's non-empty lines."""
    return [line.strip() for line in README.read_text(encoding="utf-8").splitlines() if line.strip()][:400]


# ------------------------------------------------------------------------------------- BLEU statistics
def test_bleu_from_our_statistics_equals_sacrebleu_on_real_text(text):
    hyps = _system(text, 0.8, 1)
    hyps[:4] = ["", "a .", text[4], text[5] + " extra words at the end  "]  # empty, tiny, exact, longer
    stats = bleu_statistics(hyps, text)
    assert stats.shape == (len(text), 10) and stats.dtype == np.int64
    assert float(bleu_from_statistics(stats.sum(0))) == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [text]).score, abs=1e-6
    )
    rng = random.Random(2)
    for size in (1, 2, 5, 30):  # subsets: single sentences (zero matches, short ones) up to a small corpus
        for _ in range(15):
            idx = rng.sample(range(len(text)), size)
            ours = float(bleu_from_statistics(stats[idx].sum(0)))
            theirs = sacrebleu.corpus_bleu([hyps[i] for i in idx], [[text[i] for i in idx]]).score
            assert ours == pytest.approx(theirs, abs=1e-6)
    assert Output.of(hyps, text, [1] * len(text)).bleu() == pytest.approx(sacrebleu.corpus_bleu(hyps, [text]).score)
    batch = np.stack([stats[:10].sum(0), stats[10:50].sum(0)])  # (2, 10) -> (2,): many sums at once
    assert bleu_from_statistics(batch).shape == (2,)


# ------------------------------------------------------------------------------ a bootstrap by hand
def test_draws_are_numpy_choice_counted_by_hand():
    for n, samples, seed in ((4, 6, 13), (3, 5, 12345), (1, 3, 0)):
        idx = np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)
        counts = [[0] * n for _ in range(samples)]
        for b in range(samples):
            for j in range(n):
                counts[b][idx[b][j]] += 1
        draws = Draws.of(n, samples, seed)
        assert draws.samples == samples and draws.counts.tolist() == counts
        assert all(sum(row) == n for row in counts)


def test_window_weights_by_hand():
    draws = Draws(COUNTS.astype(float))
    # k = 1, every item its own unit: the weights are the draw counts themselves
    assert draws.weights([0, 1, 2, 3]).tolist() == COUNTS.tolist()
    assert draws.weights([0, 1, 2, 3], [1, 1, 1, 1]).tolist() == COUNTS.tolist()
    # k = 2 on captions: a window weighs the mean count of its two captions
    expected = [[(row[0] + row[1]) / 2, (row[2] + row[3]) / 2] for row in COUNTS.tolist()]
    assert draws.weights([0, 1, 2, 3], [2, 2]).tolist() == expected
    # k = 3: windows of 3 and of the 1 left over
    expected = [[(row[0] + row[1] + row[2]) / 3, row[3]] for row in COUNTS.tolist()]
    assert draws.weights([0, 1, 2, 3], [3, 1]) == pytest.approx(np.array(expected))
    # chapter units (a record's "units"): items 0-2 in chapter 0, item 3 in chapter 1; two chapters drawn
    chapters = Draws(COUNTS[:, :2].astype(float))
    by_item = chapters.weights([0, 0, 0, 1])
    for b, row in enumerate(COUNTS[:, :2].tolist()):
        assert by_item[b].tolist() == [row[0], row[0], row[0], row[1]]  # every item gets its chapter's count
    by_window = chapters.weights([0, 0, 0, 1], [2, 1, 1])  # windows of 2 in chapter 0: [0, 1], [2]; then [3]
    for b, row in enumerate(COUNTS[:, :2].tolist()):
        assert by_window[b].tolist() == [row[0], row[0], row[1]]  # every window of a chapter: its count
    with pytest.raises(ValueError, match="sum to 3"):
        draws.weights([0, 1, 2, 3], [2, 1])


def test_bleu_per_draw_by_hand():
    weights = Draws(COUNTS.astype(float)).weights([0, 1, 2, 3])
    ours = bleu_draws(_out(BASE).stats, weights)
    assert ours.shape == (len(COUNTS),)
    for b, row in enumerate(COUNTS):
        assert ours[b] == pytest.approx(_sacrebleu(BASE, REFS, row), abs=1e-9)
    # windows of k = 2: each window weighs a half-integer; twice the weights repeats each window a whole
    # number of times, and (with matches of every order) BLEU is the same for statistics scaled by 2
    window_refs = [REFS[0] + " " + REFS[1], REFS[2] + " " + REFS[3]]
    window_hyps = [SYS[0] + " " + SYS[1], SYS[2] + " " + SYS[3]]
    w2 = Draws(COUNTS.astype(float)).weights([0, 1, 2, 3], [2, 2])
    ours = bleu_draws(_out(window_hyps, window_refs).stats, w2)
    for b, row in enumerate(COUNTS.tolist()):
        twice = [row[0] + row[1], row[2] + row[3]]
        assert ours[b] == pytest.approx(_sacrebleu(window_hyps, window_refs, twice), abs=1e-9)


def test_paired_p_and_paired_cell_by_hand():
    weights = COUNTS.astype(float)
    B = len(COUNTS)
    observed = sacrebleu.corpus_bleu(SYS, [REFS]).score - sacrebleu.corpus_bleu(BASE, [REFS]).score
    diffs = [abs(_sacrebleu(SYS, REFS, row) - _sacrebleu(BASE, REFS, row)) for row in COUNTS]
    mean = sum(diffs) / B
    count = 0
    for d in diffs:  # sacrebleu's rule: resampled |difference| centred on its mean, beyond the observed one
        if d - mean > abs(observed):
            count += 1
    assert 0 < count < B  # a p-value away from both ends, so that the check below means something
    p = (count + 1) / (B + 1)
    system, baseline = _out(SYS), _out(BASE)
    assert paired_p(bleu_draws(system.stats, weights), bleu_draws(baseline.stats, weights), observed) == p
    assert paired_p(bleu_draws(baseline.stats, weights), bleu_draws(system.stats, weights), -observed) == p
    cell = paired_cell([(system, baseline)], weights)
    assert cell["p"] == cell["p_seeds"][0] == p and cell["deltas"] == [round(observed, 2)] and cell["seeds_agree"]
    # against itself (identical outputs) or an observed difference of 0: no evidence, p = 1
    same = paired_cell([(baseline, _out(list(BASE)))], weights)
    assert same["p"] == 1.0 and not same["seeds_agree"]
    assert paired_p(np.array([1.0, 2.0]), np.array([2.0, 1.0]), 0.0) == 1.0


def test_seed_cell_by_hand():
    weights = COUNTS.astype(float)
    seeds = np.array([[1, 1], [2, 0], [0, 2], [1, 1], [2, 0], [0, 2]])  # (B, S): seeds drawn per replicate
    outputs = [_out(BASE), _out(SYS)]
    per_seed = [sacrebleu.corpus_bleu(BASE, [REFS]).score, sacrebleu.corpus_bleu(SYS, [REFS]).score]
    values, plain = [], []
    for b, row in enumerate(COUNTS):
        draw = [_sacrebleu(BASE, REFS, row), _sacrebleu(SYS, REFS, row)]
        values.append((seeds[b][0] * draw[0] + seeds[b][1] * draw[1]) / 2)
        plain.append((draw[0] + draw[1]) / 2)
    for resample, vals in ((seeds, values), (None, plain)):
        low, high = np.percentile(vals, [2.5, 97.5])
        cell = seed_cell(outputs, weights, resample)
        assert cell["bleu"] == round((per_seed[0] + per_seed[1]) / 2, 2)
        assert cell["seed_bleu"] == [round(x, 2) for x in per_seed]
        assert (cell["low"], cell["high"]) == (round(low, 2), round(high, 2))
    assert seed_draws(2, 50, 7).tolist() == Draws.of(2, 50, 7).counts.tolist()
    assert percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))


def test_interaction_by_hand():
    window_refs = [REFS[0] + " " + REFS[1], REFS[2] + " " + REFS[3]]
    joined = lambda hyps: [hyps[0] + " " + hyps[1], hyps[2] + " " + hyps[3]]  # noqa: E731
    system = [(_out(SYS), _out(joined(SYS), window_refs)), (_out(BASE), _out(joined(SYS), window_refs))]
    baseline = [(_out(BASE), _out(joined(BASE), window_refs)), (_out(SYS), _out(joined(BASE), window_refs))]
    per_seed = []
    for (s1, sk), (b1, bk) in zip(system, baseline, strict=True):
        ratio = lambda one, k: (  # noqa: E731
            sacrebleu.corpus_bleu(k.hypotheses, [k.references]).score
            / sacrebleu.corpus_bleu(one.hypotheses, [one.references]).score
        )
        per_seed.append(ratio(s1, sk) - ratio(b1, bk))
    w1 = Draws(COUNTS.astype(float)).weights([0, 1, 2, 3])
    w2 = Draws(COUNTS.astype(float)).weights([0, 1, 2, 3], [2, 2])
    x = interaction(system, baseline, (w1, w2), None)
    assert x["per_seed"] == [round(d, 3) for d in per_seed] and x["seeds"] == 2
    assert x["difference"] == round(sum(per_seed) / 2, 3)
    assert x["ci95"][0] <= x["ci95"][1]


# ------------------------------------------------------------------------- sacrebleu's own paired test
def test_paired_p_equals_sacrebleus_paired_bootstrap_on_the_same_draws(text, monkeypatch):
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    monkeypatch.setenv("SACREBLEU_SEED", "12345")  # PairedTest's seed (its default), as _paired_bs_test uses it
    B = 1000
    for n, keep in ((40, 0.8), (80, 0.8)):
        refs = text[:n]
        base, system = _system(refs, keep, 1), _system(refs, keep, 2)
        test = PairedTest([("baseline", base), ("system", system)], {"BLEU": BLEU()}, [refs], "bs", B)
        _, scores = test()
        theirs = scores["BLEU"][1]
        assert 2 / (B + 1) < theirs.p_value < 0.5  # neither end, so that agreeing means something
        s, b = _out(system, refs), _out(base, refs)
        assert s.bleu() == pytest.approx(theirs.score) and b.bleu() == pytest.approx(scores["BLEU"][0].score)
        draws = Draws.of(n, B, 12345).weights(range(n))  # k = 1, each caption its own unit
        ours = paired_p(bleu_draws(s.stats, draws), bleu_draws(b.stats, draws), s.bleu() - b.bleu())
        assert abs(ours - theirs.p_value) <= 2 / (B + 1), (ours, theirs.p_value)


# --------------------------------------------------------------------------------- seeds and Holm
def test_seeds_that_disagree_in_sign_are_never_significant():
    cells = [combine([2.5, -0.4], [0.0001, 0.0001]), combine([-3.0, 1.0, -2.0], [1e-9, 1e-9, 1e-9])]
    zero = combine([1.5, 0.0], [0.0001, 0.0001])  # a seed pair with no difference at all does not agree either
    agree = combine([1.0, 2.0], [0.0001, 0.0002])
    add_holm([*cells, zero, agree])
    assert [c["seeds_agree"] for c in (*cells, zero, agree)] == [False, False, False, True]
    assert all(c["p_holm"] < 0.05 and not c["significant"] for c in (*cells, zero))
    assert agree["significant"] and agree["p"] == 0.0002 and agree["delta"] == 1.5
    # and through paired_cell: one seed clearly better, the other clearly worse
    weights = Draws.of(len(REFS), 1000, 5).counts
    cell = paired_cell([(_out(SYS), _out(BASE)), (_out(BASE), _out(SYS))], weights)
    add_holm([cell])
    assert cell["deltas"][0] == -cell["deltas"][1] != 0 and not cell["seeds_agree"] and not cell["significant"]


def test_holm_against_a_hand_computed_example():
    ps = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> kept at 0.06 (monotone)
    assert holm(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5 x 2 capped at 1, and 0.6 may not fall below it
    assert holm([0.2]) == [0.2] and holm([]) == []


def test_p_values_at_the_threshold_are_decided_unrounded_and_printed_truncated():
    at, below = combine([1.0], [0.05]), combine([1.0], [0.04995])
    add_holm([at])
    add_holm([below])
    assert at["p_holm"] == 0.05 and not at["significant"]
    assert below["p_holm"] == 0.04995 and below["significant"]
    assert format_p(0.04995, 1000) == "0.049" and format_p(0.05, 1000) == "0.050"
    B = 1000
    assert format_p(1 / (B + 1), B) == "< 0.001"  # the smallest p B resamples can give
    assert format_p(2 / (B + 1), B) == "0.001" and format_p(1.0, B) == "1.000" and format_p(None, B) == "-"
    for c in range(1, B + 2):  # every p sacrebleu's rule can give, and Holm's multiples: none below 0.05
        for m in (1, 2, 3, 7):  # prints as 0.05, none at or above prints below it
            p = min(1.0, m * c / (B + 1))
            shown = format_p(p, B)
            assert shown.startswith("0.05") == (0.05 <= p < 0.06) or shown.startswith("<")
            if not shown.startswith("<"):
                assert float(shown) <= p < float(shown) + 0.001


def test_window_figure_is_a_png(tmp_path):
    from nmt.plotting import bleu_by_window_figure, save_figure

    rows = [
        {"k": k, "bleu": 20.0 - k, "low": 18.0 - k, "high": 22.0 - k, "source_words": 12.0 * k, "seed_bleu": [19, 21]}
        for k in (1, 2, 3)
    ]
    fig = bleu_by_window_figure({"a": rows, "b": [dict(r, low=None) for r in rows]}, trained_k=2)
    path = save_figure(fig, tmp_path / "w.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
