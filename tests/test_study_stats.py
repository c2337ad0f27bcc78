"""Tests for the study's statistics: BLEU from our own sentence statistics against sacrebleu, the seeds x
sentences bootstrap, sacrebleu's paired test as the study calls it, seed pairing and the window figure.

    python -m pytest -q tests/test_study_stats.py
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from nmt.metrics import (
    bleu_from_statistics,
    bleu_statistics,
    bootstrap_bleu,
    bootstrap_scores,
    percentile_interval,
    resample_counts,
)
from nmt.study_runs import Run
from nmt.study_stats import Output, pair_seeds, paired_cell, paired_p, seed_cell

README = Path(__file__).parents[1] / "README.md"


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
    batch = np.stack([stats[:10].sum(0), stats[10:50].sum(0)])  # (2, 10) -> (2,): many sums at once
    assert bleu_from_statistics(batch).shape == (2,)


def test_bootstrap_interval_contains_the_estimate_and_one_seed_is_the_plain_bootstrap(text):
    hyps = _system(text, 0.7, 3)
    bleu, low, high = bootstrap_bleu(hyps, text, samples=500)
    assert bleu == round(sacrebleu.corpus_bleu(hyps, [text]).score, 2) and low < bleu < high
    stats = bleu_statistics(hyps, text)
    rng = np.random.default_rng(7)  # the plain bootstrap by hand: resample sentences, score each resample
    by_hand = bleu_from_statistics(resample_counts(len(text), 300, rng) @ stats)
    assert np.allclose(bootstrap_scores([stats], 300, seed=7), by_hand)
    cell = seed_cell([Output.of(hyps, text, text)], range(len(text)), 500)
    assert (cell["bleu"], cell["low"], cell["high"]) == (bleu, low, high)


def test_seed_interval_widens_with_seeds_that_disagree(text):
    good, bad = _system(text, 0.9, 4), _system(text, 0.5, 5)
    one = seed_cell([Output.of(good, text, text)], range(len(text)), 400)
    same = seed_cell([Output.of(good, text, text)] * 3, range(len(text)), 400)
    assert (same["low"], same["high"]) == (one["low"], one["high"])  # identical seeds: nothing to add
    apart = seed_cell([Output.of(good, text, text), Output.of(bad, text, text)], range(len(text)), 400)
    assert apart["bleu"] == pytest.approx(sum(apart["seed_bleu"]) / 2, abs=0.006)
    assert apart["low"] <= apart["bleu"] <= apart["high"]
    assert apart["low"] < min(apart["seed_bleu"]) + 1 and apart["high"] > max(apart["seed_bleu"]) - 1
    assert seed_cell([Output.of(good, text, text)], [], 100)["low"] is None  # an empty bucket
    assert seed_cell([Output.of(good, text, text)], range(10), 0)["low"] is None  # no bootstrap
    assert percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))


# --------------------------------------------------------------------------------------- paired tests
def test_paired_test_a_system_against_itself_is_not_significant(text):
    hyps = _system(text, 0.7, 6)
    assert paired_p(hyps, hyps, text, 200) == 1.0
    zeros_a, zeros_b = ["x"] * 20, ["y"] * 20  # different outputs, both BLEU 0 in every resample
    assert paired_p(zeros_a, zeros_b, text[:20], 200) == 1.0
    one_differs = list(hyps)
    one_differs[0] = text[0]
    assert paired_p(one_differs, hyps, text, 500) > 0.05


def test_paired_test_finds_a_clearly_better_system(text):
    good, bad = _system(text, 0.95, 7), _system(text, 0.5, 8)
    assert paired_p(good, bad, text, 500) < 0.05
    outs = [
        (Output.of(good, text, text), Output.of(bad, text, text)),
        (Output.of(good, text, text), Output.of(good, text, text)),
    ]
    cell = paired_cell(outs, range(len(text)), 300)  # two seed pairs: one clearly better, one the same
    assert cell["delta"] > 0 and len(cell["p"]) == 2 and cell["p"][0] < 0.05 and cell["p"][1] == 1.0
    assert cell["p_max"] == 1.0 and paired_cell(outs, [], 300) is None


def _run(attention: str, seed: int) -> Run:
    return Run(Path(f"{attention}{seed}"), {"seed": seed, "attention": {"name": attention}}, [], 1, 1, 1.0, True)


def test_seed_pairs_match_seeds_and_fall_back_to_seed_order():
    system, base = [_run("luong", s) for s in (3, 1, 2)], [_run("none", s) for s in (1, 2)]
    assert [(a.path.name, b.path.name) for a, b in pair_seeds(system, base)] == [
        ("luong1", "none1"),
        ("luong2", "none2"),
    ]
    other = [_run("none", s) for s in (8, 7)]
    assert [(a.path.name, b.path.name) for a, b in pair_seeds(system, other)] == [
        ("luong1", "none7"),
        ("luong2", "none8"),
    ]


def test_window_figure_is_a_png(tmp_path):
    from nmt.plotting import bleu_by_window_figure, save_figure

    rows = [{"k": k, "bleu": 20.0 - k, "low": 18.0 - k, "high": 22.0 - k, "source_words": 25.0 * k} for k in (1, 2, 3)]
    fig = bleu_by_window_figure({"a": rows, "b": [dict(r, low=None) for r in rows]})
    path = save_figure(fig, tmp_path / "w.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
