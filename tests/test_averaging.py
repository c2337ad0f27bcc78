"""nmt.averaging: the weights' exponential moving average (trainer.average_decay) follows its formula, is what
validation scores and checkpoints translate with, never what training steps from, and resumes exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nmt.averaging import WeightAverage
from nmt.checkpoint import load_checkpoint
from nmt.cli.common import build_run, compose_config
from nmt.errors import ConfigError
from nmt.restore import model_from_checkpoint

TINY = [
    "experiment=quick",
    "data.train_size=200",
    "data.valid_size=20",
    "data.test_size=10",
    "model=small",
    "model.embed_size=16",
    "model.encoder_hidden_size=16",
    "model.hidden_size=32",
    "trainer.batch_tokens=300",
    "trainer.max_epochs=null",
    "trainer.valid_every=3",
    "trainer.heatmaps=0",
    "trainer.progress=false",
    "trainer.amp=off",
    "trainer.threads=1",
]


def test_the_average_follows_its_formula_and_applying_it_restores_the_weights():
    """d = min(decay, (1 + step) / (10 + step)) each step, in fp64 by hand; inside `applied` the module holds the
    average, after it its own weights bit for bit."""
    layer = nn.Linear(3, 2)
    average = WeightAverage(layer, 0.5)
    expected = [p.detach().double().clone() for p in layer.parameters()]
    g = torch.Generator().manual_seed(0)
    for step in range(1, 6):
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(torch.randn(p.shape, generator=g))
        d = min(0.5, (1 + step) / (10 + step))  # 0.18, 0.25, 0.31, 0.36, 0.4: then 0.5 from step 8
        expected = [d * e + (1 - d) * p.detach().double() for e, p in zip(expected, layer.parameters(), strict=True)]
        average.update(layer, step)
    for got, want in zip(average.values, expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    weights = [p.detach().clone() for p in layer.parameters()]
    with average.applied(layer):
        assert all(torch.equal(p, a) for p, a in zip(layer.parameters(), average.values, strict=True))
    assert all(torch.equal(p, w) for p, w in zip(layer.parameters(), weights, strict=True))


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5, -0.1])
def test_a_decay_outside_0_1_is_refused_naming_the_key(decay):
    with pytest.raises(ConfigError, match=r"trainer.average_decay=.*between 0 and 1"):
        WeightAverage(nn.Linear(2, 2), decay)


def train(tmp_path, name, *overrides, resume=None):
    cfg = compose_config([*TINY, f"paths.data_dir={tmp_path / 'data'}", *overrides])
    trainer = build_run(cfg, tmp_path / name, "cpu", resume=str(resume) if resume else None)
    trainer.train()
    return trainer


def test_training_steps_from_the_weights_and_checkpoints_translate_with_the_average(tmp_path, one_thread):
    """The same run with and without averaging trains the same weights (the loss curve is the same); the
    checkpoint holds both, validation scored the average, and the model a checkpoint rebuilds is the average
    unless asked for the weights."""
    plain = train(tmp_path, "plain", "trainer.max_steps=6")
    averaged = train(tmp_path, "averaged", "trainer.max_steps=6", "trainer.average_decay=0.9")
    ours, theirs = averaged.module.state_dict(), plain.module.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)  # training never steps from the average
    train_losses = [[h["loss"] for h in t.history if h["kind"] == "train"] for t in (plain, averaged)]
    assert train_losses[0] == train_losses[1]
    data = load_checkpoint(tmp_path / "averaged" / "checkpoints" / "last.pt")
    assert "average" not in load_checkpoint(tmp_path / "plain" / "checkpoints" / "last.pt")
    assert data["average"]["decay"] == 0.9 and data["average"]["model"].keys() == data["model"].keys()
    names = [n for n, _ in averaged.module.named_parameters()]
    assert any(not torch.equal(data["average"]["model"][n], data["model"][n]) for n in names)
    rebuilt, _ = model_from_checkpoint(data)
    raw, _ = model_from_checkpoint(data, averaged=False)
    for n in names:
        assert torch.equal(rebuilt.state_dict()[n], data["average"]["model"][n])
        assert torch.equal(raw.state_dict()[n], data["model"][n])
    valid = [h for h in averaged.history if h["kind"] == "valid"]
    assert valid and valid[-1]["loss"] != [h for h in plain.history if h["kind"] == "valid"][-1]["loss"]


def test_a_resumed_run_continues_the_same_average(tmp_path, one_thread):
    """Stopped at step 3 and resumed to 6, the average is the uninterrupted run's, bit for bit; a run that
    turns averaging on at a resume starts its average at the checkpoint's weights."""
    whole = train(tmp_path, "whole", "trainer.max_steps=6", "trainer.average_decay=0.9")
    train(tmp_path, "split", "trainer.max_steps=3", "trainer.average_decay=0.9")
    last = tmp_path / "split" / "checkpoints" / "last.pt"
    resumed = train(tmp_path, "split", "trainer.max_steps=6", "trainer.average_decay=0.9", resume=last)
    assert all(torch.equal(a, b) for a, b in zip(resumed.average.values, whole.average.values, strict=True))
    train(tmp_path, "late", "trainer.max_steps=3")
    late = tmp_path / "late" / "checkpoints" / "last.pt"
    weights = load_checkpoint(late)["model"]
    turned_on = build_run(
        compose_config([*TINY, f"paths.data_dir={tmp_path / 'data'}", "trainer.average_decay=0.9"]),
        tmp_path / "late",
        "cpu",
    )
    turned_on.restore(late)
    assert all(
        torch.equal(v, weights[n]) for n, v in zip(turned_on.average.names, turned_on.average.values, strict=True)
    )
