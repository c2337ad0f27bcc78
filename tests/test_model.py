"""Tests for the model: every attention type (parametrised from the registry), the encoder, the decoder's
two code paths, padding, the loss, and the configs that build a model.

Everything runs on tiny random tensors except `test_real_config_real_batches` (slow): it composes the
real Hydra config for every file in configs/attention/ and trains a few steps on real batches of the
default corpus.
"""

from __future__ import annotations

import itertools
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nmt import decoder as decoder_module
from nmt.attention import (
    ATTENTIONS,
    AdditiveAttention,
    LocalAttention,
    LuongAttention,
    MultiHeadAttention,
    NoAttention,
    build_attention,
)
from nmt.cli.common import CONFIG_DIR, build_model_config, compose_config, load_data, typed
from nmt.cli.schema import schema_of
from nmt.data import TokenizerSettings, collate
from nmt.decoder import active_rows
from nmt.device_plan import CPU, imposed
from nmt.encoder import Encoder
from nmt.errors import ConfigError
from nmt.kernels.stepweight import StepMatrix, StepWeight
from nmt.loss import loss_rows, token_loss
from nmt.model import ModelConfig, Seq2Seq
from nmt.shapes import cat_rows, linear_rows, pad_rows, padded_count
from nmt.tokenizer import BOS_ID, PAD_ID
from nmt.trainer import OptimConfig, TrainerConfig

SRC_VOCAB, TGT_VOCAB = 13, 11  # different sizes, so a mix-up of the two shows as a shape error
EMBED, ENC_HIDDEN, HIDDEN = 6, 5, 12  # encoder states D = 10 != decoder hidden 12 (except for dot)
ENC_SIZE = 2 * ENC_HIDDEN
ATTENTION_FILES = sorted(p.stem for p in (Path(CONFIG_DIR) / "attention").glob("*.yaml"))
EXPERIMENT_FILES = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


def variants() -> list:
    """(id, attention name, query, options) for every registered attention, plus the luong scores and
    both query orders of bahdanau and none. A newly registered attention is covered with its default options."""
    out = []
    for name in ATTENTIONS:
        if name == "luong":
            scores = ("dot", "general", "concat")
            out += [pytest.param(name, "current", {"score": s}, id=f"luong-{s}") for s in scores]
        elif name in ("bahdanau", "none"):  # none: RNNencdec's order (previous) runs no step loop without feeding
            out += [pytest.param(name, q, {}, id=f"{name}-{q}") for q in ("previous", "current")]
        elif name == "local":  # a window narrower than the sentences, so the window matters
            out.append(pytest.param(name, "current", {"window": 2}, id="local-w2"))
        else:
            out.append(pytest.param(name, "current", {}, id=name))
    return out


VARIANTS = variants()


def hidden_for(options: dict) -> int:
    return ENC_SIZE if options.get("score") == "dot" else HIDDEN  # dot needs hidden == 2 * encoder hidden


def make_config(name: str, query: str = "current", options: dict | None = None, **overrides) -> ModelConfig:
    """A tiny ModelConfig for attention `name` (dropout off, so train and eval agree)."""
    options = dict(options or {})
    values = dict(
        embed_size=EMBED,
        encoder_hidden_size=ENC_HIDDEN,
        hidden_size=hidden_for(options),
        dropout=0.0,
        attention=name,
        attention_query=query,
        attention_options=options,
    )
    values.update(overrides)
    return ModelConfig(**values)


def make_model(name: str, query: str = "current", options: dict | None = None, **overrides) -> Seq2Seq:
    return Seq2Seq(make_config(name, query, options, **overrides), SRC_VOCAB, TGT_VOCAB)


def make_batch(src_lengths: list[int], tgt_lengths: list[int]):
    """Random padded (src, lengths, tgt_in, tgt_out): tgt_in = BOS + tgt_out[:-1], padded after a length."""
    B, S, T = len(src_lengths), max(src_lengths), max(tgt_lengths)
    src = torch.full((B, S), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((B, T), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD_ID, dtype=torch.long)
    for b, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[b, :n] = torch.randint(4, SRC_VOCAB, (n,))
        words = torch.randint(4, TGT_VOCAB, (m,))
        tgt_out[b, :m] = words
        tgt_in[b, 0] = BOS_ID
        tgt_in[b, 1:m] = words[:-1]
    return src, torch.tensor(src_lengths), tgt_in, tgt_out


def length_mask(lengths: list[int], S: int) -> torch.Tensor:
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_variants_cover_the_registry():
    assert {p.values[0] for p in VARIANTS} == set(ATTENTIONS)
    assert set(ATTENTION_FILES) == set(ATTENTIONS), "every attention has a config file and every file a class"


# ------------------------------------------------------------------------------------ attention alone


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_attention_weights_are_a_distribution_over_real_tokens(name, query, options, T):
    Q = hidden_for(options)
    att = build_attention(name, Q, ENC_SIZE, options)
    lengths = [3, 7, 1]
    B, S = len(lengths), max(lengths)
    mask = length_mask(lengths, S)
    states, summary = torch.randn(B, S, ENC_SIZE), torch.randn(B, ENC_SIZE)
    query_t = torch.randn(B, T, Q)
    keys, values = att.prepare(states, summary)
    context, weights = att(query_t, keys, values, mask)
    assert context.shape == (B, T, ENC_SIZE)
    assert weights.shape == (B, T, S)
    assert torch.isfinite(context).all()
    pad = ~mask[:, None, :].expand(B, T, S)
    assert (weights[pad] == 0).all(), "padding must get exactly zero weight"
    if att.has_alignment:
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(B, T))
    else:
        assert (weights == 0).all()

    # what sits in the padded positions cannot change the context
    pad_positions = ~mask[:, :, None]
    garbage = states.masked_fill(pad_positions, 0.0) + 100 * torch.randn(B, S, ENC_SIZE) * pad_positions
    context2, weights2 = att(query_t, *att.prepare(garbage, summary), mask)
    torch.testing.assert_close(context2, context)
    torch.testing.assert_close(weights2, weights)


@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_attention_all_steps_at_once_equals_one_step_at_a_time(name, query, options):
    """The batched call over T queries (teacher forcing) equals T calls with one query each (search)."""
    Q = hidden_for(options)
    att = build_attention(name, Q, ENC_SIZE, options)
    lengths = [4, 6]
    mask = length_mask(lengths, 6)
    keys, values = att.prepare(torch.randn(2, 6, ENC_SIZE), torch.randn(2, ENC_SIZE))
    query_t = torch.randn(2, 5, Q)
    context, weights = att(query_t, keys, values, mask)
    for t in range(5):
        c, w = att(query_t[:, t : t + 1], keys, values, mask)
        torch.testing.assert_close(c[:, 0], context[:, t])
        torch.testing.assert_close(w[:, 0], weights[:, t])


# ------------------------------------------------------------------------- scores against the formulas


def reference_additive(module: AdditiveAttention, query, states):
    """score(s, h) = v^T tanh(W_s s + W_h h + b), one (b, t, s) at a time."""
    W_s, W_h, b_h = module.query_proj.weight, module.key_proj.weight, module.key_proj.bias
    v = module.v.weight[0]
    B, T, S = query.size(0), query.size(1), states.size(1)
    scores = torch.empty(B, T, S)
    for i, t, j in itertools.product(range(B), range(T), range(S)):
        scores[i, t, j] = v @ torch.tanh(W_s @ query[i, t] + W_h @ states[i, j] + b_h)
    return scores


def reference_scores(att, query, states):
    if isinstance(att, AdditiveAttention):
        return reference_additive(att, query, states)
    if att.score_name == "concat":
        return reference_additive(att.additive, query, states)
    B, T, S = query.size(0), query.size(1), states.size(1)
    scores = torch.empty(B, T, S)
    for i, t, j in itertools.product(range(B), range(T), range(S)):
        s, h = query[i, t], states[i, j]
        # dot: s^T h;  general: s^T W h
        scores[i, t, j] = s @ h if att.score_name == "dot" else s @ (att.key_proj.weight @ h)
    return scores


def reference_softmax(scores, allowed):
    """Softmax over the allowed positions only, written out: exp(e - max) / sum."""
    e = scores.masked_fill(~allowed, float("-inf"))
    e = torch.exp(e - e.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


SCORED = [v for v in VARIANTS if v.values[0] in ("bahdanau", "luong")]


@pytest.mark.parametrize("name, query, options", SCORED)
def test_scores_match_the_formulas(name, query, options):
    Q = hidden_for(options)
    att = build_attention(name, Q, ENC_SIZE, options)
    lengths = [5, 3]
    mask = length_mask(lengths, 5)
    states, query_t = torch.randn(2, 5, ENC_SIZE), torch.randn(2, 3, Q)
    keys, values = att.prepare(states, torch.randn(2, ENC_SIZE))
    with torch.no_grad():
        expected_scores = reference_scores(att, query_t, states)
        torch.testing.assert_close(att.score(query_t, keys), expected_scores, atol=1e-5, rtol=1e-5)
        context, weights = att(query_t, keys, values, mask)
        expected = reference_softmax(expected_scores, mask[:, None, :].expand(2, 3, 5))
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(context, torch.einsum("bts,bsd->btd", expected, states), atol=1e-5, rtol=1e-5)


def test_multihead_matches_scaled_dot_product_per_head():
    heads, Q = 3, HIDDEN
    att = MultiHeadAttention(Q, ENC_SIZE, heads=heads)
    lengths = [4, 2]
    mask = length_mask(lengths, 4)
    states, query_t = torch.randn(2, 4, ENC_SIZE), torch.randn(2, 3, Q)
    with torch.no_grad():
        context, weights = att(query_t, *att.prepare(states, states[:, 0]), mask)
        d_k = Q // heads
        q, k, v = att.q_proj(query_t), att.k_proj(states), att.v_proj(states)  # W_Q s, W_K h, W_V h
        head_outputs, head_weights = [], []
        for h in range(heads):
            cut = slice(h * d_k, (h + 1) * d_k)
            scores = torch.einsum("btk,bsk->bts", q[..., cut], k[..., cut]) / math.sqrt(d_k)
            w = reference_softmax(scores, mask[:, None, :].expand(2, 3, 4))
            head_weights.append(w)
            head_outputs.append(torch.einsum("bts,bsk->btk", w, v[..., cut]))
        expected_context = att.out_proj(torch.cat(head_outputs, dim=-1))
    torch.testing.assert_close(weights, torch.stack(head_weights).mean(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(context, expected_context, atol=1e-5, rtol=1e-5)


def test_multihead_projections_start_xavier_uniform():
    """Xavier-uniform, as torch's nn.MultiheadAttention: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)), so the
    first scores are not flattened by nn.Linear's smaller default (see MultiHeadAttention's docstring)."""
    att = MultiHeadAttention(256, 128, heads=4)
    for proj in (att.q_proj, att.k_proj, att.v_proj, att.out_proj):
        fan_out, fan_in = proj.weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert float(proj.weight.detach().abs().max()) <= bound
        std = float(proj.weight.detach().std())
        assert std == pytest.approx(bound / math.sqrt(3), rel=0.05)  # U(-a, a) has std a / sqrt(3)


def local_centres(att: LocalAttention, query, lengths):
    """p_t = (len - 1) * sigmoid(v_p^T tanh(W_p s)), per sentence and step."""
    with torch.no_grad():
        last = torch.tensor(lengths, dtype=torch.float32)[:, None] - 1
        return last * torch.sigmoid(att.position(query)[..., 0])


def test_local_attention_matches_the_formula_and_stays_in_its_window():
    window, Q = 2, HIDDEN
    att = LocalAttention(Q, ENC_SIZE, window=window)
    lengths = [12, 9, 3]
    B, S, T = 3, 12, 6
    mask = length_mask(lengths, S)
    states, query_t = torch.randn(B, S, ENC_SIZE), 3 * torch.randn(B, T, Q)
    with torch.no_grad():
        nn.init.normal_(att.position[2].weight, std=3.0)  # spread the predicted centres over the sentence
        context, weights = att(query_t, *att.prepare(states, states[:, 0]), mask)
    centre = local_centres(att, query_t, lengths)  # (B, T)
    distance = torch.arange(S, dtype=torch.float32)[None, None, :] - centre[:, :, None]  # (B, T, S)
    outside = distance.abs() > window
    assert (weights[outside] == 0).all(), "local attention must put zero weight outside its window"
    assert ((weights > 0).sum(-1) <= 2 * window + 1).all()
    assert (weights[~mask[:, None, :].expand(B, T, S)] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, T))
    assert centre.max() - centre.min() > window, "the test needs centres in different places"
    sigma = window / 2
    with torch.no_grad():
        general = torch.einsum("btq,qd,bsd->bts", query_t, att.key_proj.weight, states)  # s^T W h
    allowed = ~outside & mask[:, None, :]
    expected = reference_softmax(general - distance**2 / (2 * sigma**2), allowed)
    torch.testing.assert_close(weights, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(context, torch.einsum("bts,bsd->btd", expected, states), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------- "none" and summary


def test_none_ignores_source_positions_and_the_query():
    att = NoAttention(HIDDEN, ENC_SIZE)
    B, S = 2, 6
    states, summary = torch.randn(B, S, ENC_SIZE), torch.randn(B, ENC_SIZE)
    mask = torch.ones(B, S, dtype=torch.bool)
    context, _ = att(torch.randn(B, 3, HIDDEN), *att.prepare(states, summary), mask)
    for _ in range(3):
        perm = torch.randperm(S)
        permuted, _ = att(torch.randn(B, 3, HIDDEN), *att.prepare(states[:, perm], summary), mask[:, perm])
        torch.testing.assert_close(permuted, context, rtol=0, atol=0)
    torch.testing.assert_close(context, summary[:, None, :].expand(B, 3, ENC_SIZE), rtol=0, atol=0)


def test_encoder_summary_is_fwd_at_last_real_token_and_bwd_at_first():
    enc = Encoder(SRC_VOCAB, EMBED, ENC_HIDDEN, num_layers=1, bidirectional=True)
    lengths = [4, 7, 2]
    src, src_lengths, _, _ = make_batch(lengths, [1, 1, 1])
    out = enc(src, src_lengths)
    H = ENC_HIDDEN
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out.summary[b, :H], out.states[b, n - 1, :H])  # forward: last real token
        torch.testing.assert_close(out.summary[b, H:], out.states[b, 0, H:])  # backward: first token
        assert (out.states[b, n:] == 0).all(), "encoder states are zero on padding"


@pytest.mark.parametrize("groups", [None, 8, 0], ids=["unpacked", "by length", "packed"])
def test_encoder_states_are_contiguous(monkeypatch, groups):
    """Each of the encoder's three LSTM paths hands the attention contiguous (B, S, D) states: a decoder
    step's C++ kernel (and search's) would otherwise copy the whole batch's states at every step."""
    import nmt.encoder

    enc = Encoder(SRC_VOCAB, EMBED, ENC_HIDDEN, num_layers=1, bidirectional=True)
    lengths = [5, 5, 5] if groups is None else [5, 3, 4]  # all full: the one unpacked LSTM call
    if groups is not None:
        monkeypatch.setattr(nmt.encoder, "MAX_LENGTH_GROUPS", groups)
    src, src_lengths, _, _ = make_batch(lengths, [1, 1, 1])
    states = enc(src, src_lengths).states
    assert states.shape == (3, 5, ENC_SIZE) and states.is_contiguous()
    transposed = torch.randn(5, 3, ENC_SIZE, requires_grad=True).transpose(0, 1)  # (B, S, D) the LSTM's way
    assert StepMatrix.of(transposed, None).matrix.is_contiguous()  # held contiguous for the steps


@pytest.mark.parametrize(
    "lengths", [[5, 7, 5, 2], [7, 1, 6, 2, 5, 3, 4, 7, 1], [4, 4, 4]], ids=["3 lengths", "7 lengths", "1 length"]
)
@pytest.mark.parametrize("layers", [1, 2])
def test_encoder_by_length_groups_gives_the_packed_lstm_result(monkeypatch, lengths, layers):
    """A padded batch on a CPU runs the unpacked LSTM once per source length: the same states, final states
    and gradients as the packed LSTM over the whole batch (other kernels: fp32 rounding apart)."""
    import nmt.encoder

    enc = Encoder(SRC_VOCAB, EMBED, ENC_HIDDEN, num_layers=layers, bidirectional=True)
    src, src_lengths, _, _ = make_batch(lengths, [1] * len(lengths))
    src = torch.cat([src, torch.full((len(lengths), 2), PAD_ID)], dim=1)  # padded past the longest sentence too
    results = []
    for groups in (len(set(lengths)), 0):  # by length groups, then packed (more lengths than allowed)
        monkeypatch.setattr(nmt.encoder, "MAX_LENGTH_GROUPS", groups)
        enc.zero_grad()
        out = enc(src, src_lengths)
        (out.states.pow(2).sum() + out.final_h.sum() + out.final_c.pow(2).sum()).backward()
        results.append((out, {n: p.grad.clone() for n, p in enc.named_parameters()}))
    (grouped, grouped_grads), (packed, packed_grads) = results
    for name in ("states", "final_h", "final_c"):
        torch.testing.assert_close(getattr(grouped, name), getattr(packed, name), rtol=1e-4, atol=1e-6, msg=name)
    assert (grouped.states[~grouped.mask] == 0).all(), "encoder states are zero on padding"
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_packed_encoder_packs_and_unpacks_as_torch_does():
    """The packed path's own packing (its order copied to the device without waiting, no lengths copied back):
    bitwise what pack_padded_sequence(enforce_sorted=False) and pad_packed_sequence give, gradients included."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from nmt.encoder import _pack, _unpack

    rnn = nn.LSTM(EMBED, ENC_HIDDEN, batch_first=True, bidirectional=True)
    x = torch.randn(6, 9, EMBED, requires_grad=True)
    lengths = torch.tensor([4, 9, 2, 9, 7, 1])

    def run(pack, unpack) -> list[torch.Tensor]:
        packed_states, (h, c) = rnn(pack(x, lengths))
        states = unpack(packed_states)  # (B, 11, D)
        return [states, h, c, *torch.autograd.grad(states.pow(2).sum() + h.sum(), [x, *rnn.parameters()])]

    ours = run(_pack, lambda packed: _unpack(packed, 11))
    torchs = run(
        lambda x, n: pack_padded_sequence(x, n, batch_first=True, enforce_sorted=False),
        lambda packed: pad_packed_sequence(packed, batch_first=True, total_length=11)[0],
    )
    for a, b in zip(ours, torchs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_keys_and_values_summed_over_steps_give_autograd_gradients(name, query, options, input_feeding, amp):
    """The decoder's loop hands keys and values to the steps through `for_steps` (one gradient over all steps:
    StepMatrix, StepKeys): the same loss and gradients as autograd's per-step gradients, added up."""
    model = make_model(name, query, options, input_feeding=input_feeding)
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2], [3, 2, 5])
    results = []
    for summed in (True, False):
        model.zero_grad()
        with pytest.MonkeyPatch.context() as mp:
            if not summed:
                mp.setattr(type(model.attention), "for_steps", lambda self, keys, values, dtype: (keys, values))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits, _ = model(src, lengths, tgt_in)
            loss, n = token_loss(logits.float(), tgt_out)
            (loss / n).backward()
        results.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (loss, grads), (loss_ref, grads_ref) = results
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    assert grads.keys() == grads_ref.keys()
    tol = dict(rtol=2e-2, atol=2e-3) if amp else dict(rtol=1e-4, atol=1e-6)  # bf16: products rounded elsewhere
    for k, g in grads_ref.items():
        torch.testing.assert_close(grads[k], g, **tol, msg=k)


TGT_DESCENDING = [9, 9, 8, 7, 7, 5, 4, 3, 3, 2, 1]  # a training batch: longest target first (the sampler's order)


def test_active_rows_counts_the_sentences_not_yet_ended():
    _, _, tgt_in, _ = make_batch([3] * 11, TGT_DESCENDING)
    assert active_rows(tgt_in) == [11, 10, 9, 7, 6, 5, 5, 3, 2]  # sentences longer than t
    assert active_rows(tgt_in, multiple=8) == [11, 11, 11, 8, 8, 8, 8, 8, 8]  # rounded up, at most B
    _, _, unsorted, _ = make_batch([3] * 3, [3, 2, 5])
    assert active_rows(unsorted) == [3] * 5  # a longer target after a shorter one: every row at every step
    for batch in (tgt_in, unsorted):  # the lengths given from the host count alike
        host = (batch != PAD_ID).sum(dim=1)
        assert active_rows(batch, 8, host) == active_rows(batch, 8)
        assert active_rows(batch, 1, host) == active_rows(batch)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_the_loop_without_ended_sentences_gives_the_same_loss_and_gradients(name, query, options, input_feeding, amp):
    """On a batch sorted longest target first, the teacher-forced loop computes step t for the sentences
    longer than t only (nmt.decoder.active_rows): the real positions' logits, the loss and every gradient are
    those of the loop over every row at every step; the positions after a sentence's end get no attention."""
    model = make_model(name, query, options, input_feeding=input_feeding)
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2, 5, 6, 3, 7, 1, 4, 2, 5], TGT_DESCENDING)
    real = tgt_out != PAD_ID
    results = []
    for drop in (True, False):
        model.zero_grad()
        with pytest.MonkeyPatch.context() as mp:
            if not drop:
                mp.setattr(decoder_module, "active_rows", lambda tgt_in, *_: [tgt_in.size(0)] * tgt_in.size(1))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits, weights = model(src, lengths, tgt_in)
            loss, n = token_loss(logits.float(), tgt_out)
            (loss / n).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), logits.detach()[real].float(), weights.detach(), grads))
    (loss, logits, weights, grads), (loss_ref, logits_ref, weights_ref, grads_ref) = results
    tol = dict(rtol=2e-2, atol=2e-3) if amp else dict(rtol=1e-4, atol=1e-6)  # bf16: other rows, other rounding
    torch.testing.assert_close(loss, loss_ref, rtol=1e-3 if amp else 1e-5, atol=0)
    torch.testing.assert_close(logits, logits_ref, **tol)
    torch.testing.assert_close(weights[real], weights_ref[real], **tol)
    looped = input_feeding or (query == "previous" and model.attention.reads_query)
    if looped and model.attention.has_alignment and not amp:  # (bf16: rows rounded up to 8, some computed)
        assert (weights[~real] == 0).all() and not (weights_ref[~real] == 0).all()
    assert grads.keys() == grads_ref.keys()
    for k, g in grads_ref.items():
        torch.testing.assert_close(grads[k], g, **tol, msg=k)


def test_none_context_is_the_encoder_summary_in_the_model():
    model = make_model("none").eval()
    src, lengths, tgt_in, _ = make_batch([4, 7, 2], [3, 2, 5])
    with torch.no_grad():
        enc, keys, values, _ = model.encode(src, lengths)
        context, weights = model.attention(torch.randn(3, 5, HIDDEN), keys, values, enc.mask)
    torch.testing.assert_close(context, enc.summary[:, None, :].expand(3, 5, ENC_SIZE), rtol=0, atol=0)
    assert (weights == 0).all()


def test_bridge_joins_the_bidirectional_halves_layer_by_layer():
    layers = 2
    enc = Encoder(SRC_VOCAB, EMBED, ENC_HIDDEN, num_layers=layers, bidirectional=True).eval()
    lstm = nn.LSTM(EMBED, ENC_HIDDEN, num_layers=layers, bidirectional=True, batch_first=True)
    lstm.load_state_dict(enc.rnn.state_dict())
    lengths = [5, 3, 6]
    src, src_lengths, _, _ = make_batch(lengths, [1, 1, 1])
    with torch.no_grad():
        out = enc(src, src_lengths)
        assert out.final_h.shape == out.final_c.shape == (layers, 3, ENC_SIZE)
        for b, n in enumerate(lengths):  # each sentence alone and unpadded, straight through nn.LSTM
            _, (h_n, c_n) = lstm(enc.embed(src[b : b + 1, :n]))  # h_n (2 * layers, 1, H): fwd_1, bwd_1, ...
            for l in range(layers):
                torch.testing.assert_close(out.final_h[l, b], torch.cat([h_n[2 * l, 0], h_n[2 * l + 1, 0]]))
                torch.testing.assert_close(out.final_c[l, b], torch.cat([c_n[2 * l, 0], c_n[2 * l + 1, 0]]))

    model = make_model("luong", encoder_layers=2, decoder_layers=2).eval()
    with torch.no_grad():
        enc_out, _, _, state = model.encode(src, src_lengths)
        torch.testing.assert_close(state.h, torch.tanh(model.decoder.bridge_h(enc_out.final_h)))
        torch.testing.assert_close(state.c, model.decoder.bridge_c(enc_out.final_c))
    zero = make_model("luong", bridge="zero")
    _, _, _, state = zero.encode(src, src_lengths)
    assert (state.h == 0).all() and (state.c == 0).all() and (state.feed == 0).all()


# ---------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_forward_shapes_and_gradients_reach_every_parameter(name, query, options):
    model = make_model(name, query, options)
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2], [3, 2, 5])
    logits, weights = model(src, lengths, tgt_in)
    assert logits.shape == (3, 5, TGT_VOCAB)
    assert weights.shape == (3, 5, 7)
    loss, n = token_loss(logits, tgt_out)
    assert n == 3 + 2 + 5 and torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


@pytest.mark.parametrize("encoder_layers, decoder_layers", [(2, 2), (2, 1), (1, 2)])
def test_deep_models_shapes_and_gradients(encoder_layers, decoder_layers):
    model = make_model("luong", encoder_layers=encoder_layers, decoder_layers=decoder_layers)
    src, lengths, tgt_in, tgt_out = make_batch([4, 6], [3, 4])
    logits, weights = model(src, lengths, tgt_in)
    assert logits.shape == (2, 4, TGT_VOCAB) and weights.shape == (2, 4, 6)
    token_loss(logits, tgt_out)[0].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_teacher_forcing_equals_step_by_step(name, query, options, input_feeding):
    model = make_model(name, query, options, input_feeding=input_feeding).eval()
    src, lengths, tgt_in, _ = make_batch([4, 7, 2], [3, 2, 5])
    with torch.no_grad():
        logits, weights = model(src, lengths, tgt_in)
        enc, keys, values, state = model.encode(src, lengths)
        step_logits, step_weights = [], []
        for t in range(tgt_in.size(1)):
            out, state, w = model.decoder.step(tgt_in[:, t], state, keys, values, enc.mask)
            step_logits.append(out)
            step_weights.append(w)
    assert torch.allclose(logits, torch.stack(step_logits, 1), atol=1e-5)
    assert torch.allclose(weights, torch.stack(step_weights, 1), atol=1e-5)


def reference_decoder(model: Seq2Seq, src, lengths, tgt_in):
    """The decoder loop written the plain way, with nn.LSTM one step at a time and autograd throughout."""
    dec = model.decoder
    enc, keys, values, state = model.encode(src, lengths)
    h, c, feed = state
    outputs = []
    for t in range(tgt_in.size(1)):
        inputs = [dec.embed(tgt_in[:, t])] + ([feed] if dec.input_feeding else [])
        if dec.query == "previous":
            inputs.append(model.attention(h[-1][:, None, :], keys, values, enc.mask)[0][:, 0])
        out, (h, c) = dec.rnn(torch.cat(inputs, dim=-1)[:, None, :], (h, c))
        if dec.query == "current":
            context = model.attention(out, keys, values, enc.mask)[0]
        else:
            context = inputs[-1][:, None, :]
        feed = torch.tanh(dec.combine(torch.cat([context, out], dim=-1)))[:, 0]
        outputs.append(feed)
    return dec.output(torch.stack(outputs, dim=1))


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(
    "name, query, input_feeding",
    [("bahdanau", "previous", True), ("bahdanau", "current", True), ("luong", "current", True)]
    + [("none", "previous", False)],  # no loop: one nn.LSTM call over [y_{t-1}; c] (the context reads no query)
)
def test_decoder_loop_and_its_gradients_equal_nn_lstm_step_by_step(name, query, input_feeding, layers):
    """The decoder's own LSTM step (with every step's weight gradient summed in one matmul) is nn.LSTM."""
    model = make_model(name, query, decoder_layers=layers, input_feeding=input_feeding)
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2], [3, 2, 5])
    logits, _ = model(src, lengths, tgt_in)
    token_loss(logits, tgt_out)[0].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected = reference_decoder(model, src, lengths, tgt_in)
    token_loss(expected, tgt_out)[0].backward()
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    for pname, p in model.named_parameters():
        torch.testing.assert_close(grads[pname], p.grad, atol=1e-5, rtol=1e-4, msg=pname)


@pytest.mark.parametrize(
    "src_lengths", [[6, 6, 6], [6, 4, 2], [9, 8, 7, 6, 5, 4, 3, 2, 1]], ids=["unpacked", "by-length", "packed"]
)
@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
def test_bf16_autocast_training_step_stays_close_to_fp32(input_feeding, src_lengths):
    """Under bf16 autocast the loss and gradients follow fp32 (the cell state and the loss stay fp32), on
    every CPU: with bf16 hardware or without it (where nn.LSTM runs in fp32, see nmt.precision.run_lstm), on
    every encoder path (one source length: unpacked; up to 8 on a CPU: once per length; more: packed) and
    both decoder paths."""
    model = make_model("bahdanau", "current", hidden_size=32, embed_size=16, input_feeding=input_feeding)
    src, lengths, tgt_in, tgt_out = make_batch(src_lengths, [5, 3, 4] * (len(src_lengths) // 3))
    results = []
    for bf16 in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(src, lengths, tgt_in)
        loss, n = token_loss(logits, tgt_out)
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        results.append((float(loss.detach()) / n, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss32, grad32), (loss16, grad16) = results
    assert abs(loss16 - loss32) < 0.02 * loss32
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


def test_lstm_without_bf16_hardware_runs_in_fp32_under_autocast(monkeypatch):
    """Where oneDNN has no bf16 LSTM kernel (CPUs without AVX-512 BF16 or AMX), run_lstm pauses autocast:
    the result is the fp32 LSTM's, exactly; elsewhere it is the LSTM called as it is."""
    from nmt import precision

    lstm = nn.LSTM(EMBED, HIDDEN, batch_first=True)
    x, state = torch.randn(3, 5, EMBED), (torch.randn(1, 3, HIDDEN), torch.randn(1, 3, HIDDEN))
    fp32, _ = lstm(x, state)
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = precision.run_lstm(lstm, x, tuple(s.to(torch.bfloat16) for s in state))
    assert out.dtype == h.dtype == c.dtype == torch.float32
    torch.testing.assert_close(out, lstm(x, tuple(s.to(torch.bfloat16).float() for s in state))[0])
    assert torch.equal(precision.run_lstm(lstm, x, state)[0], fp32)  # outside autocast: the plain call


def test_one_seed_gives_every_attention_the_same_encoder_decoder_and_embeddings():
    """The attention draws from its own random stream, so under one seed only its own parameters differ
    between runs of the bottleneck study (decoders of the same shape: same query order and input feeding)."""
    weights = {}
    for name, query, options in (v.values for v in VARIANTS if v.values[1] == "current"):
        options = {**options, "heads": 2} if name == "multihead" else options  # 2 heads divide D = 10
        torch.manual_seed(7)
        model = make_model(name, query, options, hidden_size=ENC_SIZE)  # dot needs hidden == D: give all that
        weights[(name, str(options))] = {k: v for k, v in model.state_dict().items() if ".attention." not in k}
    first, *rest = weights.values()
    assert len(rest) >= 4
    for key, other in weights.items():
        assert other.keys() == first.keys(), key
        assert all(torch.equal(first[k], other[k]) for k in first), key
    torch.manual_seed(8)
    assert not torch.equal(make_model("none", hidden_size=ENC_SIZE).encoder.embed.weight, first["encoder.embed.weight"])


@pytest.mark.parametrize("query", ["previous", "current"])
def test_query_order_previous_attends_with_the_old_state_current_with_the_new(query):
    """Bahdanau order scores with s_{t-1} (before the LSTM step), Luong order with h_t (after it)."""
    model = make_model("bahdanau", query, decoder_layers=2).eval()
    src, lengths, tgt_in, _ = make_batch([4, 7, 2], [3, 2, 5])
    with torch.no_grad():
        enc, keys, values, state = model.encode(src, lengths)
        for t in range(tgt_in.size(1)):
            before = state
            _, state, weights = model.decoder.step(tgt_in[:, t], state, keys, values, enc.mask)
            asking = before if query == "previous" else state
            _, expected = model.attention(asking.h[-1][:, None, :], keys, values, enc.mask)
            torch.testing.assert_close(weights, expected[:, 0])


@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
@pytest.mark.parametrize("name, query, options", VARIANTS)
def test_padding_does_not_leak_between_sentences(name, query, options, input_feeding):
    model = make_model(name, query, options, input_feeding=input_feeding).eval()
    src_lengths, tgt_lengths = [4, 7, 2], [3, 2, 5]
    src, lengths, tgt_in, _ = make_batch(src_lengths, tgt_lengths)
    with torch.no_grad():
        logits, weights = model(src, lengths, tgt_in)
        for i, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
            alone, alone_w = model(src[i : i + 1, :n], lengths[i : i + 1], tgt_in[i : i + 1, :m])
            assert torch.allclose(logits[i, :m], alone[0], atol=1e-5), f"sentence {i}"
            assert torch.allclose(weights[i, :m, :n], alone_w[0], atol=1e-5), f"sentence {i}"
            assert (weights[i, :, n:] == 0).all()


# ----------------------------------------------------------------------------------------- errors


def test_invalid_attention_settings_raise_value_error():
    with pytest.raises(ValueError, match="heads"):
        build_attention("multihead", 12, ENC_SIZE, {"heads": 5})
    with pytest.raises(ValueError, match="heads"):
        make_model("multihead", options={"heads": 5})
    with pytest.raises(ValueError, match="dot"):
        build_attention("luong", 12, 10, {"score": "dot"})
    with pytest.raises(ValueError, match="dot"):
        Seq2Seq(make_config("luong", options={"score": "dot"}, hidden_size=12), SRC_VOCAB, TGT_VOCAB)
    assert isinstance(build_attention("luong", 10, 10, {"score": "dot"}), LuongAttention)
    with pytest.raises(ValueError, match="score"):
        build_attention("luong", 12, 10, {"score": "cosine"})
    with pytest.raises(ValueError, match="unknown attention"):
        build_attention("sparsemax", 12, 10)
    with pytest.raises(ValueError, match="bogus"):
        build_attention("luong", 12, 10, {"bogus": 1})
    with pytest.raises(ValueError, match="window"):
        build_attention("local", 12, 10, {"window": 0})
    with pytest.raises(ValueError, match="query"):
        make_model("luong", query="next")
    with pytest.raises(ValueError, match="bridge"):
        make_model("luong", bridge="mean")


# ------------------------------------------------------------------------------------------- loss


def test_token_loss_ignores_padding():
    B, T, V = 3, 6, TGT_VOCAB
    logits = torch.randn(B, T, V)
    target = torch.randint(4, V, (B, T))
    target[0, 4:] = PAD_ID
    target[2, 1:] = PAD_ID
    loss, n = token_loss(logits, target)
    assert n == int((target != PAD_ID).sum()) == 4 + 6 + 1
    changed = logits.clone()
    changed[target == PAD_ID] = 50 * torch.randn(int((target == PAD_ID).sum()), V)
    for smoothing in (0.0, 0.1):
        torch.testing.assert_close(token_loss(changed, target, smoothing)[0], token_loss(logits, target, smoothing)[0])
    # the sum of -log p(target) over the real tokens only
    logp = torch.log_softmax(logits, -1)
    real = target != PAD_ID
    expected = -logp.gather(-1, target[..., None])[..., 0][real].sum()
    torch.testing.assert_close(loss, expected)


def test_label_smoothing_raises_the_loss_of_a_confident_correct_prediction():
    target = torch.tensor([[5, 7, 4]])
    logits = torch.full((1, 3, TGT_VOCAB), -10.0)
    logits[0, torch.arange(3), target[0]] = 10.0
    plain, _ = token_loss(logits, target, 0.0)
    smoothed, _ = token_loss(logits, target, 0.1)
    assert plain < 1e-3
    assert smoothed > plain + 0.1


@pytest.mark.parametrize("multiple", [1, 4, 64])
def test_loss_rows_are_the_real_tokens_and_a_few_padded_ones(multiple):
    target = make_batch([2, 2, 2, 2], [1, 7, 3, 6])[3]  # 17 real tokens of 28 positions
    rows = loss_rows(target, multiple)
    flat = target.reshape(-1)
    assert (rows[1:] > rows[:-1]).all()  # ascending, each position once
    assert set(torch.nonzero(flat != PAD_ID)[:, 0].tolist()) <= set(rows.tolist())
    assert len(rows) == (17 if multiple == 1 else 20 if multiple == 4 else 28)  # 64 > 28: every position
    assert (flat[rows] == PAD_ID).sum() == len(rows) - 17


@pytest.mark.parametrize("input_feeding", [True, False], ids=["feed", "nofeed"])
def test_training_on_loss_rows_gives_the_full_loss_and_gradients(input_feeding):
    model = make_model("bahdanau", input_feeding=input_feeding)
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2, 5], [3, 2, 5, 1])
    rows = loss_rows(tgt_out, 4)
    logits, _ = model(src, lengths, tgt_in, rows)
    assert logits.shape == (len(rows), TGT_VOCAB) == (12, TGT_VOCAB)
    loss, n = token_loss(logits, tgt_out.reshape(-1)[rows], 0.1)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    full, n_full = token_loss(model(src, lengths, tgt_in)[0], tgt_out, 0.1)
    full.backward()
    assert n == n_full == 11
    # fp32 throughout; the output layer's weight gradient sums over 12 rows here and 20 (8 of them zero) there,
    # which a CPU's matmul kernels may add up in another order: a margin above rounding, far below any real error
    torch.testing.assert_close(loss, full, rtol=1e-5, atol=1e-5)
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=1e-6, msg=k)


class MatmulShapes(TorchDispatchMode):
    """Records (rows, inner, columns) of every aten.mm and aten.addmm run inside it, backward included."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            a, b = args[-2], args[-1]
            self.shapes.append((a.size(0), a.size(1), b.size(1)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_rows_is_the_linear_map_over_a_padded_row_count(bias):
    """nmt.shapes: the matmuls forward and backward see 24 rows, not the 21 of a (3, 7) batch; same values."""
    x = torch.randn(3, 7, 10, requires_grad=True)
    weight = torch.randn(12, 10, requires_grad=True)
    b = torch.randn(12, requires_grad=True) if bias else None
    with MatmulShapes() as seen:
        y = linear_rows(x, weight, b, multiple=8)
        y.square().sum().backward()
    assert y.shape == (3, 7, 12)
    assert len(seen.shapes) == 3 and all(24 in s and 21 not in s for s in seen.shapes), seen.shapes
    leaves = [t for t in (x, weight, b) if t is not None]
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    ref = nn.functional.linear(x, weight, b)
    ref.square().sum().backward()
    # fp32; another row count may let a CPU's matmul kernel add up in another order: a margin above rounding
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    for g, t in zip(got, leaves, strict=True):
        torch.testing.assert_close(g, t.grad, rtol=1e-5, atol=1e-5)


def test_a_step_weights_gradient_sums_over_a_padded_row_count():
    """nmt.kernels.stepweight: 5 steps of 3 sentences are 15 rows; the one weight-gradient matmul sees 64
    (nmt.shapes)."""
    weight = torch.randn(12, 10, requires_grad=True)
    xs = torch.randn(5, 3, 10)
    step = StepWeight.of(weight, None)
    with MatmulShapes() as seen:
        torch.stack([step(x) for x in xs]).square().sum().backward()
    wgrad = [s for s in seen.shapes if s[0] == 12 and s[2] == 10]  # (out, rows, in): the weight's gradient
    assert [s[1] for s in wgrad] == [64], seen.shapes
    got, weight.grad = weight.grad.clone(), None
    torch.stack([x @ weight.t() for x in xs]).square().sum().backward()
    torch.testing.assert_close(got, weight.grad, rtol=1e-5, atol=1e-5)  # a sum in another order: see above


@pytest.mark.parametrize("rows", [[3, 5], [64], [1], [40, 24, 7]])
def test_rows_joined_in_one_copy_equal_joined_then_padded(rows):
    """nmt.shapes.cat_rows: the same rows and zero padding as pad_rows(torch.cat(...)), bf16 pieces among fp32
    ones promoted as torch.cat promotes them."""
    xs = [torch.randn(n, 6) for n in rows]
    got = cat_rows(xs)
    assert got.shape == (padded_count(sum(rows)), 6)
    assert torch.equal(got, pad_rows(torch.cat(xs)))
    mixed = [xs[0].bfloat16(), *xs[1:]]
    assert torch.equal(cat_rows(mixed), pad_rows(torch.cat(mixed)))


# ---------------------------------------------------------------------------------------- configs


def test_misspelt_model_key_fails_with_its_name():
    with pytest.raises(ConfigError, match="hiden_size"):
        build_model_config(OmegaConf.create({"hiden_size": 3}), OmegaConf.create({"name": "luong"}))


def test_unknown_attention_name_or_option_in_config_fails():
    with pytest.raises(ConfigError, match="sparsemax"):
        build_model_config(OmegaConf.create({}), OmegaConf.create({"name": "sparsemax"}))
    with pytest.raises(ConfigError, match="attention.scroe: Key 'scroe' not in 'LuongAttentionSchema'"):
        build_model_config(OmegaConf.create({"hidden_size": 12}), OmegaConf.create({"name": "luong", "scroe": "dot"}))
    with pytest.raises(ConfigError, match="Invalid value 'dott', expected one of \\[dot, general, concat\\]"):
        build_model_config(OmegaConf.create({}), OmegaConf.create({"name": "luong", "score": "dott"}))


def compose_train(overrides: list[str], config_dir: str = CONFIG_DIR, hydra_config: bool = False):
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=hydra_config)


SMALL_MODEL = ["model.embed_size=16", "model.encoder_hidden_size=16", "model.hidden_size=32"]


def forward_backward(model: Seq2Seq, src, lengths, tgt_in, tgt_out) -> float:
    model.zero_grad(set_to_none=True)
    logits, weights = model(src, lengths, tgt_in)
    assert logits.shape == (*tgt_in.shape, model.tgt_vocab) and weights.shape == (*tgt_in.shape, src.size(1))
    loss, n = token_loss(logits, tgt_out)
    (loss / n).backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    return float(loss.detach()) / n


@pytest.mark.parametrize("attention", ATTENTION_FILES)
def test_every_attention_config_builds_a_working_model(attention):
    cfg = compose_train([f"attention={attention}", *SMALL_MODEL])
    assert cfg.attention.name == attention
    model = Seq2Seq(build_model_config(cfg.model, cfg.attention), SRC_VOCAB, TGT_VOCAB)
    assert model.attention.__class__ is ATTENTIONS[attention]
    forward_backward(model, *make_batch([4, 7, 2], [3, 2, 5]))


NOT_GROUPS = ("experiment", "hydra", "launcher")  # global overrides, not a section with a schema
GROUP_FILES = sorted(p for p in Path(CONFIG_DIR).glob("*/*.yaml") if p.parent.name not in NOT_GROUPS)


def file_values(path: Path) -> tuple[dict, list]:
    """(the keys a group file sets itself, its defaults list)."""
    values = OmegaConf.to_container(OmegaConf.load(path))
    return values, values.pop("defaults", [])


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_default_is_written_once(path):
    """A group file selects a schema (nmt.cli.schema) or another file of its group, and sets only what
    differs from it: a default lives in the dataclass (or the signature a schema is read from), not here."""
    group, (values, defaults) = path.parent.name, file_values(path)
    base = [d for d in defaults if d != "_self_"]
    assert len(base) == 1, f"{path}: select exactly one schema or sibling, then _self_"
    if base[0].startswith("/schema/"):
        name = base[0].removeprefix("/schema/").removesuffix("@_here_").removeprefix(f"{group}_")
        inherited = OmegaConf.to_container(OmegaConf.structured(schema_of(group, name)))
    else:
        config = "evaluate" if group == "decoding" else "train"  # the groups of nmt-train, and decoding
        inherited = OmegaConf.to_container(compose_config([f"{group}={base[0]}"], config)[group])
    repeated = {k: v for k, v in values.items() if k in inherited and inherited[k] == v}
    assert not repeated, f"{path} repeats what it inherits: {repeated}"
    unknown = set(values) - set(inherited)
    assert not unknown, f"{path} sets keys its schema does not have: {unknown}"


def test_the_schema_rejects_a_bad_key_type_or_choice_while_composing():
    from hydra.errors import ConfigCompositionException

    for override, says in [
        ("trainer.patince=3", "patince"),
        ("trainer.patience=abc", "trainer.patience"),
        ("optim.schedule=cosine", "optim.schedule"),
        ("model.bridge=tanh", "model.bridge"),
        ("attention.query=next", "attention.query"),
        ("data.window=two", "data.window"),
    ]:
        with pytest.raises(ConfigCompositionException) as err:
            compose_config([override])
        assert says in str(err.value) + str(err.value.__cause__), override
    cfg = compose_config(["trainer.amp=off", "attention=bahdanau", "data.window=3"])
    trainer = typed(TrainerConfig, cfg.trainer, "trainer")
    assert trainer.amp == "off" and f"{trainer.amp}" == "off" and cfg.data.window == 3


def sweep_overrides(cfg) -> list[list[str]]:
    """Override lists covering every value of every swept parameter of a multirun config (each value once)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    choices = []
    parser = OverridesParser.create()
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(value)]
        choices.append([f"{key}={v}" for v in values])
    if not choices:
        return []
    longest = max(len(c) for c in choices)
    return [[c[min(i, len(c) - 1)] for c in choices] for i in range(longest)]


def check_composed(cfg) -> None:
    """Every section of a composed training config feeds its typed value, and the model can be built."""
    typed(TrainerConfig, cfg.trainer, "trainer")
    typed(OptimConfig, cfg.optim, "optim")
    typed(TokenizerSettings, cfg.tokenizer, "tokenizer")
    assert cfg.data.name
    model_config = build_model_config(cfg.model, cfg.attention)
    Seq2Seq(model_config, SRC_VOCAB, TGT_VOCAB)


def check_experiment(name: str, config_dir: str = CONFIG_DIR) -> int:
    """Compose experiment `name` (and each value of its sweep, if it is a multirun); returns how many."""
    cfg = compose_train([f"experiment={name}"], config_dir, hydra_config=True)
    check_composed(cfg)
    sweeps = sweep_overrides(cfg)
    for overrides in sweeps:
        swept = compose_train([f"experiment={name}", *overrides], config_dir)
        check_composed(swept)
        for override in overrides:
            key, value = override.split("=", 1)
            if key == "attention":
                assert swept.attention.name == value, f"the sweep's {override} did not take"
    return 1 + len(sweeps)


@pytest.mark.parametrize("experiment", EXPERIMENT_FILES)
def test_every_experiment_composes(experiment):
    check_experiment(experiment)


def test_multirun_experiments_compose(tmp_path):
    """An experiment that turns itself into a multirun (hydra.mode, hydra.sweeper.params) still composes."""
    config_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, config_dir)
    (config_dir / "experiment" / "sweep_demo.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /data: synthetic\n  - override /model: small\n"
        "hydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n"
        "      attention: none,bahdanau,luong\n      model.hidden_size: 32,64\n"
    )
    assert check_experiment("sweep_demo", str(config_dir)) == 1 + 3
    cfg = compose_train(["experiment=sweep_demo", "attention=bahdanau"], str(config_dir))
    assert cfg.attention.name == "bahdanau" and cfg.data.name == "synthetic"


# ------------------------------------------------------------------------------ the real thing (slow)


@pytest.fixture(scope="module")
def bible_data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bible-data"))


@pytest.fixture(scope="module")
def bible(bible_data_dir):
    """The default corpus, prepared once per module (training sentencepiece takes a while)."""
    cfg = compose_train([f"paths.data_dir={bible_data_dir}", "tokenizer.vocab_size=2000"])
    return load_data(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTION_FILES)
def test_real_config_real_batches(attention, bible, bible_data_dir):
    overrides = [
        f"attention={attention}",
        f"paths.data_dir={bible_data_dir}",
        "tokenizer.vocab_size=2000",
        "model.embed_size=32",
        "model.encoder_hidden_size=32",
        "model.hidden_size=64",
    ]
    cfg = compose_train(overrides)
    data = bible
    model = Seq2Seq(
        build_model_config(cfg.model, cfg.attention), data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size
    )
    assert model.attention.__class__ is ATTENTIONS[attention]
    train = data.encoded["train"]
    g = torch.Generator().manual_seed(1)
    indices = torch.randperm(len(train), generator=g)[:16].tolist()
    batches = [collate(train, indices[:8]), collate(train, indices[8:])]
    assert all((b.src_lengths < b.src.size(1)).any() for b in batches), "the batches should hold padding"
    first = batches[0]

    def eval_loss() -> float:
        model.eval()
        with torch.no_grad():
            logits, _ = model(first.src, first.src_lengths, first.tgt_in)
        return float(token_loss(logits, first.tgt_out)[0]) / first.n_tokens

    before = eval_loss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for b in batches:
        forward_backward(model, b.src, b.src_lengths, b.tgt_in, b.tgt_out)
    for _ in range(3):  # a few steps on the first batch lower its loss
        forward_backward(model, first.src, first.src_lengths, first.tgt_in, first.tgt_out)
        optimizer.step()
    assert eval_loss() < before


@pytest.mark.parametrize("rows", [8, 64, None])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_loss_equals_cross_entropy_with_its_gradient(dtype, eps, rows):
    """The written-out smoothed cross-entropy, computed in pieces of `rows` (8: 7 uneven pieces; None: one piece,
    as on a GPU): F.cross_entropy's value and gradient, with and without autograd."""
    with imposed(replace(CPU.work, loss_rows=rows)):
        _check_token_loss(dtype, eps)


def _check_token_loss(dtype, eps):
    logits = (torch.randn(50, 30) * 3).to(dtype).requires_grad_()
    target = torch.randint(0, 30, (50,))
    target[::7] = PAD_ID
    loss, n = token_loss(logits, target, eps)
    loss.backward()
    ours = logits.grad.clone()
    logits.grad = None
    expected = nn.functional.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, reduction="sum", label_smoothing=eps
    )
    expected.backward()
    assert n == int((target != PAD_ID).sum())
    assert ours.dtype == dtype
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours.float(), logits.grad.float(), rtol=1e-2, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(token_loss(logits, target, eps)[0], expected.detach(), rtol=1e-5, atol=1e-4)


def test_attention_products_run_in_fp32_on_a_cpu_under_bf16_autocast():
    """nmt.device.step_dtype: keys and values are held in fp32 on a CPU and a step's products with them run in
    fp32 (no bf16 kernel per batch shape), in search's step and in training's loop alike."""
    model = make_model("luong", "current", {"score": "general"})
    src, lengths, tgt_in, tgt_out = make_batch([4, 7, 2], [3, 2, 5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc, keys, values, state = model.encode(src, lengths)
        assert (keys.dtype, values.dtype) == (torch.float32, torch.float32)
        query = torch.randn(3, 1, HIDDEN).bfloat16()
        context, weights = model.attention(query, keys, values, enc.mask)
        assert context.dtype == torch.float32
        logits, _ = model(src, lengths, tgt_in)
    torch.testing.assert_close(context, torch.bmm(weights, values))  # fp32 weights x fp32 values, autocast off
    token_loss(logits.float(), tgt_out)[0].backward()  # the loop's StepMatrix path
    assert all(p.grad is not None for p in model.parameters())
