"""Teacher-forced attention statistics (nmt.study.attention_stats): what a study records of each run's attention."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.model import ModelConfig, Seq2Seq
from nmt.special import EOS_ID
from nmt.study.attention_stats import attention_statistics


class WordIds:
    """A tokenizer stand-in: each word's length + 4 is its id (ids 0-3 are special), EOS appended."""

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[4 + len(w) % 20 for w in t.split()] + [EOS_ID] for t in texts]

    encode_tgt = encode_src


PAIRS = [("a bb ccc", "dd e"), ("ffff g hh iii jjjj kk", "l mm nnn"), ("o", "pp qqq r ssss")]


def _model(attention: str) -> Seq2Seq:
    torch.manual_seed(0)
    config = ModelConfig(embed_size=8, encoder_hidden_size=8, hidden_size=16, dropout=0.0, attention=attention)
    return Seq2Seq(config, 30, 30)


@pytest.mark.parametrize("attention", ["bahdanau", "luong"])
def test_statistics_lie_between_one_position_and_uniform(attention):
    stats = attention_statistics(_model(attention), WordIds(), PAIRS, batch_size=2)
    assert stats["sentences"] == 3 and stats["tokens"] == 3 + 4 + 5  # every real target token, EOS included
    assert 0.0 <= stats["entropy"] <= stats["uniform_entropy"] + 1e-6
    sources = [len(s.split()) + 1 for s, _ in PAIRS]
    targets = [len(t.split()) + 1 for _, t in PAIRS]
    expected = sum(n * math.log(s) for s, n in zip(sources, targets, strict=True)) / sum(targets)
    assert stats["uniform_entropy"] == pytest.approx(expected)  # log S over each token's own source: no padding
    assert 1 / max(sources) <= stats["max_weight"] <= 1.0 and stats["score_spread"] >= 0.0


def test_batching_does_not_change_the_statistics():
    model = _model("luong")
    one, all_ = (attention_statistics(model, WordIds(), PAIRS, batch_size=b) for b in (1, 64))
    assert one == pytest.approx(all_)  # padding a shorter source never receives attention


def test_sharper_scores_give_lower_entropy_and_a_larger_spread():
    model = _model("luong")
    before = attention_statistics(model, WordIds(), PAIRS)
    with torch.no_grad():
        model.attention.key_proj.weight.mul_(20.0)  # general score s^T W h, scaled up
    after = attention_statistics(model, WordIds(), PAIRS)
    assert after["entropy"] < before["entropy"] and after["score_spread"] > before["score_spread"]
    assert after["max_weight"] > before["max_weight"]


def test_no_alignment_no_statistics():
    assert attention_statistics(_model("none"), WordIds(), PAIRS) is None
    assert attention_statistics(_model("luong"), WordIds(), []) is None
