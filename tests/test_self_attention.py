"""Self-attention over the encoder states (nmt.self_attention, model.self_attention_layers): the layer's
properties on random tensors, its equality with torch's own multi-head attention and with the formula
softmax(Q K^T / sqrt(d)) V, and the layer inside the model: every decoder attention and every experiment preset
trains with it, checkpoints with and without it load, and `attention=none` reads its vector from it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from nmt.attention import ATTENTIONS
from nmt.cli.common import CONFIG_DIR, build_model_config
from nmt.encoder import Encoder
from nmt.loss import token_loss
from nmt.model import ModelConfig, Seq2Seq
from nmt.restore import model_from_checkpoint
from nmt.self_attention import SelfAttention, SelfAttentionBlock, SelfAttentionStack
from nmt.special import BOS_ID, PAD_ID

D, HEADS = 12, 3
EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


def states_and_mask(lengths: list[int], size: int = D, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random states (B, S, size), zero on padding, and the mask (B, S) of `lengths`."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    return torch.randn(len(lengths), S, size, generator=g) * mask[:, :, None], mask


def test_weights_sum_to_one_over_real_positions_and_are_zero_on_padding():
    torch.manual_seed(0)
    stack = SelfAttentionStack(layers=2, heads=HEADS, size=D, dropout=0.0)
    states, mask = states_and_mask([5, 2, 7, 1])
    out, weights = stack(states, mask)
    assert out.shape == states.shape and len(weights) == 2
    for w in weights:
        assert w.shape == (4, HEADS, 7, 7) and w.dtype == torch.float32
        torch.testing.assert_close(w.sum(-1), torch.ones(4, HEADS, 7))
        assert (w.masked_select(~mask[:, None, None, :].expand_as(w)) == 0).all()  # exactly zero
    assert (out[~mask] == 0).all()  # padding rows stay zero, as the encoder's states are


def test_padding_does_not_change_the_real_positions():
    torch.manual_seed(0)
    stack = SelfAttentionStack(layers=2, heads=HEADS, size=D, dropout=0.3).eval()
    states, mask = states_and_mask([4, 6])
    padded = torch.cat([states, torch.zeros(2, 5, D)], dim=1)  # (B, S + 5, D)
    padded_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], dim=1)
    out, weights = stack(states, mask)
    out_padded, weights_padded = stack(padded, padded_mask)
    torch.testing.assert_close(out_padded[:, :6], out)
    for w, wp in zip(weights, weights_padded, strict=True):
        torch.testing.assert_close(wp[:, :, :6, :6], w)


def test_the_whole_encoder_is_padding_invariant_with_the_layer():
    torch.manual_seed(0)
    encoder = Encoder(20, 8, 6, self_attention_layers=1, self_attention_heads=2).eval()
    src = torch.tensor([[5, 6, 7, 8, 2]])
    alone = encoder(src, torch.tensor([5]))
    batch = torch.tensor([[5, 6, 7, 8, 2, PAD_ID, PAD_ID], [9, 10, 11, 12, 13, 14, 2]])
    together = encoder(batch, torch.tensor([5, 7]))
    torch.testing.assert_close(together.states[0, :5], alone.states[0])
    torch.testing.assert_close(together.summary[0], alone.summary[0])
    torch.testing.assert_close(together.self_attention[0][0, :, :5, :5], alone.self_attention[0][0])


def test_equals_torch_multihead_attention_with_copied_weights():
    torch.manual_seed(0)
    ours = SelfAttention(D, HEADS)
    theirs = nn.MultiheadAttention(D, HEADS, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]) + 0.1)
        for proj, bias in zip((ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_bias.split(D), strict=True):
            proj.bias.copy_(bias)  # nonzero biases, so that they are compared too
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.fill_(0.05)
        ours.out_proj.bias.fill_(0.05)
    states, mask = states_and_mask([6, 3, 4])
    context, weights = ours(states, states, states, mask)
    ref, ref_weights = theirs(states, states, states, key_padding_mask=~mask, average_attn_weights=False)
    torch.testing.assert_close(context, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


def test_one_head_with_identity_projections_is_the_formula():
    """softmax(Q K^T / sqrt(d)) V with Q = K = V = X: the notes' self-attention, written out."""
    attention = SelfAttention(D, heads=1)
    with torch.no_grad():
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            proj.weight.copy_(torch.eye(D))
            proj.bias.zero_()
    x, mask = states_and_mask([5], seed=3)
    context, weights = attention(x, x, x, mask)
    expected_weights = torch.softmax(x[0] @ x[0].T / math.sqrt(D), dim=-1)  # (S, S)
    torch.testing.assert_close(weights[0, 0], expected_weights)
    torch.testing.assert_close(context[0], expected_weights @ x[0])


def test_permuting_the_positions_permutes_the_outputs():
    """The layer alone has no notion of order (the LSTM before it gives the positions theirs)."""
    torch.manual_seed(0)
    block = SelfAttentionBlock(D, HEADS, dropout=0.0)
    states, mask = states_and_mask([7])
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    out, weights = block(states, mask)
    out_p, weights_p = block(states[:, perm], mask[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(weights_p, weights[:, :, perm][:, :, :, perm])


def test_heads_must_divide_the_state_size():
    with pytest.raises(ValueError, match="self_attention_heads=5 .* divide the encoder state size 12"):
        SelfAttention(12, 5)
    with pytest.raises(ValueError, match="self_attention_layers must be 0 or more"):
        Encoder(20, 8, 6, self_attention_layers=-1)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src_lengths, tgt_lengths = [6, 4, 2], [5, 3, 4]
    src = torch.full((3, 6), PAD_ID)
    tgt_in, tgt_out = torch.full((3, 5), PAD_ID), torch.full((3, 5), PAD_ID)
    for b, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[b, :n] = torch.randint(4, 20, (n,), generator=g)
        tgt_out[b, :m] = torch.randint(4, 20, (m,), generator=g)
        tgt_in[b, 0], tgt_in[b, 1:m] = BOS_ID, tgt_out[b, : m - 1]
    return src, torch.tensor(src_lengths), tgt_in, tgt_out


def train_a_few_steps(model: Seq2Seq, steps: int = 4) -> list[float]:
    """Loss of one batch over `steps` Adam steps on it."""
    src, lengths, tgt_in, tgt_out = batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits, _ = model(src, lengths, tgt_in)
        loss, n = token_loss(logits, tgt_out)
        (loss / n).backward()
        optimizer.step()
        losses.append(float(loss.detach()) / n)
    return losses


SMALL = dict(embed_size=8, encoder_hidden_size=6, hidden_size=12, dropout=0.0)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_every_decoder_attention_trains_with_the_layer(attention):
    torch.manual_seed(0)
    model = Seq2Seq(ModelConfig(attention=attention, self_attention_layers=2, self_attention_heads=2, **SMALL), 20, 20)
    losses = train_a_few_steps(model)
    assert losses[-1] < losses[0]
    assert all(p.grad is not None for n, p in model.named_parameters() if "self_attention" in n)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_with_a_layer_and_trains(experiment):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}", "model.self_attention_layers=1"])
    config = build_model_config(cfg.model, cfg.attention)
    assert config.self_attention_layers == 1
    torch.manual_seed(0)
    model = Seq2Seq(config, 20, 20)
    assert model.has_self_attention
    losses = train_a_few_steps(model, steps=3)
    assert losses[-1] < losses[0]


def test_one_seed_starts_the_rest_of_the_model_from_the_same_weights_with_and_without_the_layer():
    weights = []
    for layers in (0, 1):
        torch.manual_seed(7)
        weights.append(Seq2Seq(ModelConfig(attention="bahdanau", self_attention_layers=layers, **SMALL), 20, 20))
    plain, with_layer = (m.state_dict() for m in weights)
    assert all(torch.equal(plain[k], with_layer[k]) for k in plain)
    assert {k for k in with_layer if k not in plain} == {
        k for k in with_layer if k.startswith("encoder.self_attention.")
    }


def test_none_reads_its_vector_where_the_lstm_final_states_stand():
    """Without the layer, the sentence vector is the LSTM's final state, which is the forward state at the last real
    token and the backward one at the first; with it, the same positions of the self-attended states."""
    src, lengths, _, _ = batch()
    for layers in (0, 1):
        torch.manual_seed(0)
        encoder = Encoder(20, 8, 6, self_attention_layers=layers, self_attention_heads=2).eval()
        out = encoder(src, lengths)
        expected = torch.cat([out.states[torch.arange(3), lengths - 1, :6], out.states[:, 0, 6:]], dim=-1)
        torch.testing.assert_close(out.summary, expected)
        assert len(out.self_attention) == layers


def payload(model: Seq2Seq) -> dict:
    return {
        "model": model.state_dict(),
        "model_config": model.config.to_dict(),
        "src_vocab": model.src_vocab,
        "tgt_vocab": model.tgt_vocab,
    }


def test_checkpoints_with_and_without_the_layer_load(monkeypatch):
    monkeypatch.setattr("nmt.restore.Tokenizer", lambda src, tgt: None)  # the model alone is under test
    src, lengths, tgt_in, _ = batch()
    for layers in (0, 1):
        torch.manual_seed(0)
        model = Seq2Seq(ModelConfig(attention="luong", self_attention_layers=layers, **SMALL), 20, 20).eval()
        data = {**payload(model), "spm_src": b"", "spm_tgt": b""}
        if layers == 0:  # a checkpoint from before the layer existed: its config lacks both keys
            for key in ("self_attention_layers", "self_attention_heads"):
                del data["model_config"][key]
        restored, _ = model_from_checkpoint(data)
        assert restored.has_self_attention == bool(layers)
        torch.testing.assert_close(restored(src, lengths, tgt_in)[0], model(src, lengths, tgt_in)[0])


# ------------------------------------------------------------------------ a real run: TensorBoard and nmt-translate
@pytest.fixture(scope="module")
def run_with_layer(tmp_path_factory) -> Path:
    """A few steps of `experiment=quick` with two self-attention layers of two heads, validated once with a heatmap."""
    from nmt.cli.common import build_run, compose_config

    root = tmp_path_factory.mktemp("selfattention")
    overrides = [
        "experiment=quick",
        "data.train_size=300",
        "model.self_attention_layers=2",
        "model.self_attention_heads=2",
        "trainer.max_steps=4",
        "trainer.valid_every=4",
        "trainer.heatmaps=1",
        "trainer.progress=false",
        "trainer.threads=1",
        f"paths.data_dir={root / 'data'}",
    ]
    build_run(compose_config(overrides), root / "run", "cpu").train()
    return root / "run"


def test_validation_draws_the_self_attention_to_tensorboard(run_with_layer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_with_layer / "tensorboard"), size_guidance={"images": 0}).Reload()
    images = events.Tags()["images"]
    assert "attention/valid_0" in images and "self_attention/valid_0" in images
    (image,) = events.Images("self_attention/valid_0")
    assert image.step == 4 and image.width > 0 and image.height > 0


def test_nmt_translate_plot_writes_a_map_per_layer_and_head(run_with_layer, tmp_path):
    import subprocess
    import sys

    from nmt.translator import Translator

    ckpt = run_with_layer / "checkpoints" / "last.pt"
    translator = Translator.from_checkpoint(ckpt)
    (best,) = translator.translate(["one two three"])[0]
    weights = translator.self_attention("one two three")
    S = len(best.src_pieces)
    assert weights.shape == (2, 2, S, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, S))
    assert translator.self_attention("   ") is None
    nmt_translate = Path(sys.executable).parent / "nmt-translate"
    proc = subprocess.run(
        [str(nmt_translate), str(ckpt), "--plot", str(tmp_path / "maps"), "one two three", "", "four five"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert names == ["1-self.png", "1.png", "3-self.png", "3.png"]
    for png in (tmp_path / "maps").iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nmt_evaluate_draws_the_self_attention_beside_each_heatmap(run_with_layer, tmp_path):
    from nmt.evaluation import evaluate
    from nmt.translator import Translator

    translator = Translator.from_checkpoint(run_with_layer / "checkpoints" / "last.pt")
    pairs = [("one two three", "three two one"), ("four five", "five four"), ("six", "six")]
    result = evaluate(translator, pairs, heatmaps=2, out_dir=tmp_path, split="test")
    assert len(result["heatmaps"]) == 2
    for entry in result["heatmaps"]:
        assert Path(entry["self_attention_file"]).name == f"test_{entry['sentence']}-self.png"
        assert Path(entry["self_attention_file"]).read_bytes()[:4] == b"\x89PNG"


def test_the_handbook_s_figures_are_those_of_the_committed_runs():
    """docs/usage.md's comparison quotes docs/self_attention/*.json: every figure in it is found in those files."""
    import json

    docs = Path(__file__).resolve().parent.parent / "docs"
    text = (docs / "usage.md").read_text(encoding="utf-8")
    section = text.split("### Measured: one layer against none", 1)[1].split("\n## ", 1)[0]
    for layers in ("0_layers", "1_layer"):
        bench = json.loads((docs / "self_attention" / f"benchmark_{layers}.json").read_text())
        f = bench["figures"]
        assert bench["model"]["config"]["self_attention_layers"] == int(layers[0])
        assert f"{f['parameters']:,}" in section and f"{f['sentences_per_s']:.1f}" in section
        assert f"{f['bleu_greedy']:.2f} / {f['bleu_beam5']:.2f}" in section
        assert f"{f['decode_s_greedy']:.2f} / {f['decode_s_beam5']:.2f}" in section
        assert f"{f['peak_train_gib']:.2f}" in section
        assert f"{bench['train']['steps']:,}" in section
        synthetic = json.loads((docs / "self_attention" / f"synthetic_rnnsearch_{layers}.json").read_text())
        assert f"**{synthetic['bleu']:.2f}**" in section


def test_nmt_train_refuses_heads_that_do_not_divide_in_one_line(tmp_path):
    import subprocess
    import sys

    cmd = [
        str(Path(sys.executable).parent / "nmt-train"),
        "experiment=quick",
        "data.train_size=300",
        "model.self_attention_layers=1",
        "model.self_attention_heads=5",
        "trainer.progress=false",
        f"paths.data_dir={tmp_path / 'data'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # the data is prepared first (its progress bar may come before)
    assert last.startswith("error: model.self_attention_heads=5") and "divide the encoder state size" in last
