"""Tests for the study's statistics (nmt.study.resampling, nmt.study.stats), each against values computed
independently here: BLEU from our own sentence statistics against sacrebleu; a bootstrap on four items worked by
hand (the draws, what is drawn at each k, BLEU per draw, the paired p-value, a seed cell, the interaction);
sacrebleu's own paired test on the same draws, at k=1 and on the windows of the committed study; the spread of
BLEU when captions are summed into windows; the same-model seed pairs of the committed study; seeds that
disagree; Holm; every p-value of several B printed never below itself; Student's t quantiles and the coverage of
the t-interval; the window figure.

    python -m pytest -q tests/test_study_stats.py
"""

from __future__ import annotations

import functools
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from nmt.metrics import bleu_from_statistics, bleu_statistics
from nmt.study.records import StudyRun, read_record
from nmt.study.resampling import Draws, bleu_draws, block_items, block_weights, window_clusters
from nmt.study.stats import (
    Output,
    add_holm,
    combine,
    exact_p,
    format_p,
    holm,
    interaction,
    p_digits,
    paired_cell,
    paired_p,
    seed_cell,
    t_interval,
    t_quantile,
)

README = Path(__file__).parents[1] / "README.md"
RECORDS = Path(__file__).parents[1] / "docs" / "study" / "caption_windows" / "records"

# four items, two systems; every item shares 4-grams with its reference
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


def _joined(items: list[str]) -> list[str]:
    """The four items as two windows of k=2."""
    return [items[0] + " " + items[1], items[2] + " " + items[3]]


@pytest.fixture(scope="module")
def text() -> list[str]:
    """Real English text with punctuation, numbers, code and markup: the README's non-empty lines."""
    return [line.strip() for line in README.read_text(encoding="utf-8").splitlines() if line.strip()][:400]


@functools.cache
def _committed(name: str) -> StudyRun:
    return StudyRun.of(read_record(RECORDS / f"{name}.json.gz"))


@pytest.fixture
def committed():
    """The committed caption-window study's runs (greedy, test2016), by record name, each read when asked for."""
    if not RECORDS.is_dir():
        pytest.skip("no committed caption-windows records")
    return _committed


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


def test_what_is_drawn_at_each_k_by_hand():
    """Captions: the unit at k is the window. Chapters (a record's units): the chapter, every window in it.
    The interaction's blocks: one window of K and its K single items, drawn together."""
    assert window_clusters([0, 1, 2, 3], 1, None).tolist() == [0, 1, 2, 3]
    assert window_clusters([0, 2], 2, None).tolist() == [0, 1]  # each window its own unit
    assert window_clusters([0, 3], 3, None).tolist() == [0, 1]  # 7 captions at k=3: the last one left out
    chapters = [5, 5, 5, 5, 9, 9, 9]  # two chapters; windows of 2: [0, 1], [2, 3] in chapter 5, [4, 5] in 9
    assert window_clusters([0, 2, 4], 2, chapters).tolist() == [0, 0, 1]
    assert window_clusters(range(7), 1, chapters).tolist() == [0, 0, 0, 0, 1, 1, 1]
    draws = Draws(COUNTS[:, :2].astype(float))
    w = draws.weights(window_clusters([0, 2, 4], 2, chapters))
    assert w.tolist() == [[row[0], row[0], row[1]] for row in COUNTS[:, :2].tolist()]
    # blocks of K=2 over 5 captions: windows at 0 and 2; caption 4 is in no window and left out
    items, w1, w2 = block_weights([0, 2], 2, None, 6, 7)
    counts = Draws.of(2, 6, 7).counts
    assert items.tolist() == block_items([0, 2], 2).tolist() == [0, 1, 2, 3]
    assert w2.tolist() == counts.tolist()
    assert w1.tolist() == [[a, a, b, b] for a, b in counts.tolist()]


def test_bleu_per_draw_by_hand():
    weights = Draws(COUNTS.astype(float)).weights(range(4))
    ours = bleu_draws(_out(BASE).stats, weights)
    assert ours.shape == (len(COUNTS),)
    for b, row in enumerate(COUNTS):
        assert ours[b] == pytest.approx(_sacrebleu(BASE, REFS, row), abs=1e-9)
    # k = 2: the two windows are drawn as units, whole numbers of times: BLEU of the windows so repeated
    windows = Draws(COUNTS[:, :2].astype(float)).weights(window_clusters([0, 2], 2, None))
    ours = bleu_draws(_out(_joined(SYS), _joined(REFS)).stats, windows)
    for b, row in enumerate(COUNTS[:, :2].tolist()):
        assert ours[b] == pytest.approx(_sacrebleu(_joined(SYS), _joined(REFS), row), abs=1e-9)


def test_paired_p_and_paired_cell_by_hand():
    weights = COUNTS.astype(float)
    B = len(COUNTS)
    observed = sacrebleu.corpus_bleu(SYS, [REFS]).score - sacrebleu.corpus_bleu(BASE, [REFS]).score
    diffs = [abs(_sacrebleu(SYS, REFS, row) - _sacrebleu(BASE, REFS, row)) for row in COUNTS]
    mean = sum(diffs) / B
    count = sum(d - mean > abs(observed) for d in diffs)  # sacrebleu's rule: centred |difference| beyond it
    assert 0 < count < B  # a p-value away from both ends, so that the check below means something
    p = Fraction(count + 1, B + 1)
    system, baseline = _out(SYS), _out(BASE)
    assert paired_p(bleu_draws(system.stats, weights), bleu_draws(baseline.stats, weights), observed) == p
    assert paired_p(bleu_draws(baseline.stats, weights), bleu_draws(system.stats, weights), -observed) == p
    cell = paired_cell([(system, baseline)], weights)
    assert cell["p"] == cell["p_seeds"][0] == float(p) and cell["deltas"] == pytest.approx([observed])
    assert cell["seeds_agree"] and cell["ci_seeds"] is None  # one seed pair: no interval over seeds
    same = paired_cell([(baseline, _out(list(BASE)))], weights)  # against itself: no evidence, p = 1
    assert same["p"] == 1.0 and not same["seeds_agree"]
    assert paired_p(np.array([1.0, 2.0]), np.array([2.0, 1.0]), 0.0) == 1


def test_seed_cell_by_hand():
    weights = COUNTS.astype(float)
    outputs = [_out(BASE), _out(SYS)]
    per_seed = [sacrebleu.corpus_bleu(BASE, [REFS]).score, sacrebleu.corpus_bleu(SYS, [REFS]).score]
    mean = (per_seed[0] + per_seed[1]) / 2
    sd = abs(per_seed[0] - per_seed[1]) / 2**0.5  # two values: sample sd
    half = 12.7062047 * sd / 2**0.5  # t(0.975, 1 df) from a table
    draws = [(_sacrebleu(BASE, REFS, row) + _sacrebleu(SYS, REFS, row)) / 2 for row in COUNTS]
    low, high = np.percentile(draws, [2.5, 97.5])
    cell = seed_cell(outputs, weights)
    assert cell["bleu"] == pytest.approx(mean) and cell["seeds"] == 2 and cell["seed_bleu"] == pytest.approx(per_seed)
    assert cell["ci_seeds"] == pytest.approx([mean - half, mean + half], abs=0.002)
    assert cell["ci_test"] == pytest.approx([low, high])
    assert (cell["low"], cell["high"], cell["interval"]) == (*cell["ci_seeds"], "seeds")
    one = seed_cell(outputs[:1], weights)  # one seed: no interval over seeds; the row shows the test set's
    assert one["ci_seeds"] is None and [one["low"], one["high"]] == one["ci_test"] and one["interval"] == "test"


def test_interaction_by_hand():
    """Two seeds; K = 2: the blocks are the two windows, each with its two captions."""
    system = [(_out(SYS), _out(_joined(SYS), _joined(REFS))), (_out(BASE), _out(_joined(SYS), _joined(REFS)))]
    baseline = [(_out(BASE), _out(_joined(BASE), _joined(REFS))), (_out(SYS), _out(_joined(BASE), _joined(REFS)))]
    counts = COUNTS[:, :2].astype(float)
    blocks = (np.arange(4), np.repeat(counts, 2, axis=1), counts)

    def ratio(one: Output, k: Output, row=None) -> float:
        c1 = [1] * 4 if row is None else [row[0], row[0], row[1], row[1]]
        ck = [1, 1] if row is None else row
        return _sacrebleu(k.hypotheses, k.references, ck) / _sacrebleu(one.hypotheses, one.references, c1)

    per_seed = [ratio(*s) - ratio(*b) for s, b in zip(system, baseline, strict=True)]
    drawn = [
        np.mean([ratio(*s, row) - ratio(*b, row) for s, b in zip(system, baseline, strict=True)])
        for row in counts.tolist()
    ]
    x = interaction(system, baseline, blocks)
    assert x["per_seed"] == pytest.approx(per_seed) and x["seeds"] == 2
    assert x["difference"] == pytest.approx(sum(per_seed) / 2)
    assert x["ci_test"] == pytest.approx(list(np.percentile(drawn, [2.5, 97.5])))
    assert x["ci_seeds"] == pytest.approx(list(t_interval(per_seed)))


def test_interaction_leaves_out_draws_without_a_ratio():
    """A seed whose k=1 BLEU is 0 in some draws (it translates only the first window's captions): those draws
    have no ratio. Few of them: the interval is over the others; more than its 2.5% tail: no interval, never NaN."""
    junk = ["xx yy zz qq", "qq zz yy xx"]
    weak = (_out([*REFS[:2], *junk], REFS), _out(_joined(SYS), _joined(REFS)))
    system = [(_out(SYS), _out(_joined(SYS), _joined(REFS))), weak]
    baseline = [(_out(BASE), _out(_joined(BASE), _joined(REFS))), (_out(SYS), _out(_joined(BASE), _joined(REFS)))]
    counts = COUNTS[:, :2].astype(float)  # two of the six draws hold the second window only
    x = interaction(system, baseline, (np.arange(4), np.repeat(counts, 2, axis=1), counts))
    assert x["draws_undefined"] == 2 and x["ci_test"] is None and np.isfinite(x["difference"])
    counts = np.array([[1.0, 1.0]] * 79 + [[0.0, 2.0]])  # one draw of 80 without a ratio: 1.25%
    x = interaction(system, baseline, (np.arange(4), np.repeat(counts, 2, axis=1), counts))
    assert x["draws_undefined"] == 1 and x["ci_test"] == [x["difference"], x["difference"]]


# ------------------------------------------------------------------------- sacrebleu's own paired test
def _sacrebleu_p(base: list[str], system: list[str], refs: list[str], samples: int) -> float:
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("baseline", base), ("system", system)], {"BLEU": BLEU()}, [refs], "bs", samples)
    return test()[1]["BLEU"][1].p_value


def test_paired_p_equals_sacrebleus_paired_bootstrap_on_the_same_draws(text, monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", "12345")  # PairedTest's seed (its default), as _paired_bs_test uses it
    B = 1000
    for n, keep in ((40, 0.8), (80, 0.8)):
        refs = text[:n]
        base, system = _system(refs, keep, 1), _system(refs, keep, 2)
        theirs = _sacrebleu_p(base, system, refs, B)
        assert 2 / (B + 1) < theirs < 0.5  # neither end, so that agreeing means something
        s, b = _out(system, refs), _out(base, refs)
        draws = Draws.of(n, B, 12345).weights(window_clusters(range(n), 1, None))  # k = 1: each caption
        ours = paired_p(bleu_draws(s.stats, draws), bleu_draws(b.stats, draws), s.bleu() - b.bleu())
        assert abs(float(ours) - theirs) <= 2 / (B + 1), (ours, theirs)


def test_captions_summed_into_windows_keep_the_spread_sacrebleu_gives(committed):
    """none seed 1 at k=1: summing its captions' statistics in blocks of 4 leaves the corpus and its BLEU as
    they are, so drawing the blocks must leave the bootstrap SD of BLEU near sacrebleu's over the captions
    (about 0.455); a block weighing the mean draw count of its captions gives about 0.206."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import _bootstrap_resample

    one = committed("none_seed1").outputs["greedy"]["test_k1"]
    metric = BLEU()
    stats = metric._extract_corpus_statistics(one.hypotheses, [one.references])
    theirs = np.std([s.score for s in _bootstrap_resample(stats, metric, 1000)[1]])  # sacrebleu's, seed 12345
    blocks = one.stats.reshape(-1, 4, 10).sum(1)  # (250, 10)
    assert bleu_from_statistics(blocks.sum(0)) == pytest.approx(one.bleu())
    ours = bleu_draws(blocks, Draws.of(250, 1000, 12345).weights(window_clusters(range(0, 1000, 4), 4, None))).std()
    assert 0.8 < ours / theirs < 1.25, (ours, theirs)
    captions = Draws.of(1000, 1000, 12345).counts  # the old way: one caption draw, a block its captions' mean
    mean_counts = np.add.reduceat(captions, np.arange(0, 1000, 4), axis=1) / 4
    assert bleu_draws(blocks, mean_counts).std() / theirs < 0.6  # what the test would have caught


@pytest.mark.parametrize("model, seeds", [("none", (2, 3)), ("bahdanau", (2, 1))])
def test_same_model_seed_pairs_at_k4_are_not_significant_as_in_sacrebleu(committed, model, seeds, monkeypatch):
    """Two seeds of one model differ by chance: at k=4 their paired test on the windows is sacrebleu's own
    paired bootstrap on those windows (p about 0.162 and 0.127) and not below 0.05."""
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    a, b = (committed(f"{model}_seed{s}").outputs["greedy"]["test_k4"] for s in seeds)
    w = Draws.of(len(a.references), 1000, 12345).weights(window_clusters(range(0, 1000, 4), 4, None))
    ours = paired_p(bleu_draws(a.stats, w), bleu_draws(b.stats, w), a.bleu() - b.bleu())
    theirs = _sacrebleu_p(b.hypotheses, a.hypotheses, a.references, 1000)
    assert abs(float(ours) - theirs) <= 2 / 1001, (ours, theirs)
    assert ours > 0.05 and a.bleu() > b.bleu()


# --------------------------------------------------------------------------------- seeds and Holm
def test_seeds_that_disagree_in_sign_are_never_significant():
    tiny = Fraction(1, 1001)
    cells = [combine([2.5, -0.4], [tiny, tiny]), combine([-3.0, 1.0, -2.0], [tiny] * 3)]
    zero = combine([1.5, 0.0], [tiny, tiny])  # a seed pair with no difference at all does not agree either
    agree = combine([1.0, 2.0], [tiny, Fraction(2, 1001)])
    add_holm([*cells, zero, agree], 1000)
    assert [c["seeds_agree"] for c in (*cells, zero, agree)] == [False, False, False, True]
    assert all(c["p_holm"] < 0.05 and not c["significant"] for c in (*cells, zero))
    assert agree["significant"] and agree["p"] == 2 / 1001 and agree["delta"] == 1.5
    weights = Draws.of(len(REFS), 1000, 5).counts
    cell = paired_cell([(_out(SYS), _out(BASE)), (_out(BASE), _out(SYS))], weights)
    add_holm([cell], 1000)
    assert cell["deltas"][0] == -cell["deltas"][1] != 0 and not cell["seeds_agree"] and not cell["significant"]


def test_holm_against_a_hand_computed_example_exactly():
    ps = [Fraction(10, 1000), Fraction(40, 1000), Fraction(30, 1000), Fraction(5, 1000)]
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> kept at 0.06 (monotone)
    assert holm(ps) == [Fraction(3, 100), Fraction(6, 100), Fraction(6, 100), Fraction(2, 100)]
    assert holm([Fraction(1, 2), Fraction(3, 5)]) == [1, 1]  # 0.5 x 2 capped at 1, and 0.6 may not fall below it
    assert holm([Fraction(1, 5)]) == [Fraction(1, 5)] and holm([]) == []
    # at the threshold exactly: B = 1999, p = 100/2000 = 0.05 is not significant; 99/2000 is. In floating
    # point 3 x (100/6000 as a float) falls below 0.05; here the fractions decide.
    for count, significant in ((100, False), (99, True)):
        cells = [combine([1.0], [Fraction(count, 2000)])]
        add_holm(cells, 1999)
        assert cells[0]["significant"] == significant and exact_p(cells[0]["p_holm"], 1999) == Fraction(count, 2000)


@pytest.mark.parametrize("B", [1000, 1999, 4999, 9999, 19999])
def test_every_p_value_is_printed_rounded_up_with_digits_from_b(B):
    """For every m, p = (m + 1) / (B + 1) and its Holm multiples print with floor(log10(B + 1)) decimals, never
    lower than p and less than one printed step above it, read back exactly from the float study.json holds."""
    d = p_digits(B)
    assert d == {1000: 3, 1999: 3, 4999: 3, 9999: 4, 19999: 4}[B]
    step = Fraction(1, 10**d)
    for m in range(B + 1):
        for times in (1, 3):  # a raw p and a Holm multiple
            p = min(Fraction(1), times * Fraction(m + 1, B + 1))
            shown = format_p(float(p), B)
            assert len(shown.split(".")[1]) == d
            assert p <= Fraction(shown) < p + step, (m, times, shown)
    assert format_p(10 / 1001, 1000) == "0.010"  # Holm's 10 x 1/1001 = 0.00999, shown 0.009 before
    assert format_p(Fraction(102, 2000), 1999) == "0.051" and format_p(None, B) == "-"


def test_t_quantiles_match_tables_and_the_t_interval_covers_95_percent():
    table = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 9: 2.2621572, 30: 2.0422725}
    for df, value in table.items():
        assert t_quantile(df) == pytest.approx(value, abs=1e-6)
    assert t_interval([28.56, 20.53, 27.40]) == pytest.approx((14.72, 36.27), abs=0.01)  # Luong's k=1 BLEU, 3 seeds
    assert t_interval([3.0]) is None
    rng = np.random.default_rng(0)
    for n in (2, 3, 5):  # seeds drawn from a normal: the t-interval covers the mean 95% of the time
        x = rng.normal(10.0, 2.0, size=(40000, n))
        half = t_quantile(n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
        coverage = np.mean(np.abs(x.mean(axis=1) - 10.0) <= half)
        assert abs(coverage - 0.95) < 0.005, (n, coverage)


def test_window_figure_is_a_png(tmp_path):
    from nmt.plotting import bleu_by_window_figure, save_figure

    rows = [
        {"k": k, "bleu": 20.0 - k, "low": 18.0 - k, "high": 22.0 - k, "source_words": 12.0 * k, "seed_bleu": [19, 21]}
        for k in (1, 2, 3)
    ]
    fig = bleu_by_window_figure({"a": rows, "b": [dict(r, low=None) for r in rows]}, trained_k=2)
    path = save_figure(fig, tmp_path / "w.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
