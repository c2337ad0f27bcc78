"""The device plans (nmt.device_plan), checked on a CPU: the CPU keeps its work sizes; under the GPU's plan a
training step dispatches about as many operators at 16,000 tokens as at 2,000 and reads nothing back from the
device, trains as the CPU's plan does, and skips a non-finite step on the device; the feed prepares what collate
gives. tests/test_cuda.py checks the same on a GPU, where there is one.

The steps are a Trainer's own (`_train_step`), at the multi30k_deen preset's structure (additive attention in
Luong's order, input feeding, a biLSTM encoder) with tiny widths: what is counted does not depend on the widths.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.data import EncodedSplit, TokenizerSettings, collate, prepare
from nmt.device_batches import DeviceBatches
from nmt.device_plan import CPU, CUDA, choose_plan, imposed, work_sizes
from nmt.dispatch import DispatchCount
from nmt.errors import NMTError
from nmt.loss import loss_rows, loss_sum, rows_of_lengths
from nmt.model import ModelConfig, Seq2Seq
from nmt.trainer import OptimConfig, Trainer, TrainerConfig

# the GPU's plan on this CPU: its work sizes, deferred checks and a feed thread; no pinned memory without CUDA
GPU_ON_CPU = replace(CUDA, device="cpu", pin_memory=False)
SOURCE, VOCAB = 30, 60  # every source 30 pieces, targets 5-30: every batch holds the whole spread of lengths


def test_the_cpu_keeps_its_work_sizes_and_a_gpu_takes_one_piece():
    assert choose_plan("cpu")[0] is CPU and work_sizes("cpu") == CPU.work
    assert (CPU.work.loss_rows, CPU.work.energy_elements, CPU.prefetch, CPU.deferred_checks) == (16, 1 << 18, 0, False)
    plan, why = choose_plan("cuda")
    assert plan is CUDA and plan.work.loss_rows is None and plan.deferred_checks and "in one call" in why
    with imposed(CUDA.work):
        assert work_sizes("cpu") == CUDA.work
    assert work_sizes("cpu") == CPU.work


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A prepared synthetic corpus whose training split is replaced by 1,600 pairs of SOURCE-piece sources."""
    from nmt.corpora import load_synthetic

    corpus = load_synthetic(seed=3, train_size=200, valid_size=10, test_size=10, max_len=8, vocab_words=20)
    prepared = prepare(corpus, TokenizerSettings(vocab_size=VOCAB), 60, tmp_path_factory.mktemp("plan"), False)
    g = torch.Generator().manual_seed(0)
    targets = [int(n) for n in torch.randint(5, SOURCE + 1, (1600,), generator=g)]
    src = [torch.randint(4, VOCAB, (SOURCE,), generator=g).tolist() for _ in targets]
    tgt = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in targets]
    prepared.encoded["train"] = EncodedSplit(src, tgt)
    return prepared


def trainer_of(
    data,
    run_dir,
    plan,
    batch_tokens: int = 2000,
    *,
    max_bad_steps: int = 5,
    device: str = "cpu",
    amp: str = "off",
    bucketing: str = "exact",
    dropout: float = 0.2,
) -> Trainer:
    """A Trainer of the preset's structure at tiny widths (the same weights for the same arguments), under `plan`."""
    torch.manual_seed(1)
    config = ModelConfig(embed_size=8, encoder_hidden_size=8, hidden_size=16, dropout=dropout, attention="bahdanau")
    model = Seq2Seq(config, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size)
    settings = TrainerConfig(
        batch_tokens=batch_tokens, amp=amp, bucketing=bucketing, progress=False, max_bad_steps=max_bad_steps
    )
    trainer = Trainer(model, data, settings, OptimConfig(), run_dir, device, seed=1)
    trainer.use_plan(plan)
    return trainer


def counted_step(trainer: Trainer) -> DispatchCount:
    """The operators of one step over the epoch's fullest group (after a step before it, so that under a
    prefetching plan its batches were prepared by the feed's thread, which the count does not see)."""
    groups = trainer._groups(0)
    pos = max(range(1, len(groups)), key=lambda i: sum(map(len, groups[i])))
    trainer.batch_pos = pos - 1
    trainer._train_step(groups[pos - 1])
    trainer.batch_pos = pos
    with DispatchCount() as count:
        trainer._train_step(groups[pos])
    return count


def test_a_step_under_the_gpu_plan_dispatches_as_many_operators_at_16000_tokens_as_at_2000(data, tmp_path):
    """The target, counted on a CPU: under the GPU's work sizes a step's operators that launch work are
    within 1.3x between 2,000 and 16,000 tokens and at most 4,000 at 16,000, and none of them reads the device's
    data back; under the CPU's (cache-sized pieces) they grow with the batch."""
    gpu = {tokens: counted_step(trainer_of(data, tmp_path, GPU_ON_CPU, tokens)) for tokens in (2000, 16000)}
    small, large = gpu[2000], gpu[16000]
    assert large.launches <= 4000, large.by_op.most_common(10)
    assert large.launches <= 1.3 * small.launches and large.total <= 1.3 * small.total, (small.total, large.total)
    assert small.reads == {} and large.reads == {}, "a step that reads the device's data makes a GPU's host wait"
    cpu = {tokens: counted_step(trainer_of(data, tmp_path, CPU, tokens)) for tokens in (2000, 16000)}
    assert cpu[16000].launches > 2 * cpu[2000].launches > 2 * small.launches


def test_the_gpu_plan_trains_as_the_cpu_plan(data, tmp_path):
    """The same steps under either plan: the same parameters (up to the order of fp32 sums) and logged loss."""
    runs = []
    for name, plan in (("cpu", CPU), ("gpu", GPU_ON_CPU)):
        trainer = trainer_of(data, tmp_path / name, plan)
        groups = trainer._groups(0)
        losses = []
        for pos in range(3):
            trainer.batch_pos = pos
            losses.append(float(trainer._train_step(groups[pos])[0]))
        runs.append((losses, [p.detach().clone() for p in trainer.module.parameters()]))
    (cpu_losses, cpu_params), (gpu_losses, gpu_params) = runs
    torch.testing.assert_close(gpu_losses, cpu_losses, rtol=1e-5, atol=1e-5)
    for a, b in zip(gpu_params, cpu_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_non_finite_step_is_skipped_on_the_device_and_stops_the_run_when_read(data, tmp_path):
    """Deferred checks: a step whose loss is not finite changes no parameter and no optimizer step count, reads
    nothing, and max_bad_steps of them in a row stop the run when the numbers are read (at the next log)."""
    trainer = trainer_of(data, tmp_path, GPU_ON_CPU, max_bad_steps=2)
    groups = trainer._groups(0)
    trainer._train_step(groups[0])  # one good step: the optimizer has state
    trainer.numbers.check(2, 1)
    with torch.no_grad():
        trainer.module.decoder.output.bias[5] = float("nan")  # every logit row: a non-finite loss
    before = [p.detach().clone() for p in trainer.module.parameters()]
    steps = [s["step"].clone() for s in trainer.optimizer.state.values()]
    for pos in (1, 2):
        trainer.batch_pos = pos
        with DispatchCount() as count:
            loss, _, _ = trainer._train_step(groups[pos])
        assert count.reads == {} and float(loss) == 0.0  # counted as 0 in the logged average
        trainer.numbers.check(3, pos + 1)  # not yet max_bad_steps
    for a, b in zip(trainer.module.parameters(), before, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0, equal_nan=True)
    assert all(torch.equal(s["step"], old) for s, old in zip(trainer.optimizer.state.values(), steps, strict=True))
    with pytest.raises(NMTError, match="2 non-finite steps in a row"):
        trainer.numbers.check(2, 3)


def short_run(trainer: Trainer, run_dir) -> None:
    """Four steps of the whole loop: logging reads the step's numbers (deferred or not), a checkpoint holds floats."""
    trainer.cfg = replace(trainer.cfg, max_steps=4, max_epochs=None, log_every=2, valid_every=4, heatmaps=0)
    assert trainer.train()["step"] == 4
    logged = [h for h in trainer.history if h["kind"] == "train"]
    assert len(logged) == 2 and all(isinstance(h["loss"], float) and h["grad_norm"] > 0 for h in logged)
    assert isinstance(load_checkpoint(run_dir / "checkpoints" / "last.pt")["window"]["loss"], float)


def test_a_short_run_under_the_gpu_plan_logs_and_checkpoints(data, tmp_path):
    short_run(trainer_of(data, tmp_path, GPU_ON_CPU), tmp_path)


def test_the_feed_gives_collates_batches_and_loss_rows_prepared_ahead_or_not(data):
    """Prefetching or not, the feed gives each group's collated batches with loss_rows' rows; groups that were
    not foreseen, and a new split, are prepared when asked for."""
    split = data.encoded["train"]
    groups = [[list(range(i, i + 7)), list(range(i + 7, i + 12))] for i in range(0, 120, 12)]
    other = EncodedSplit([split.source(i).tolist() for i in range(40)], [split.target(i).tolist() for i in range(40)])
    asked = [(split, groups[i], groups[i + 1 : i + 3]) for i in range(len(groups) - 1)]
    asked += [(split, groups[5], groups[:1]), (other, groups[0], []), (split, groups[0], [])]
    for plan in (CPU, GPU_ON_CPU):
        feed = DeviceBatches(plan, torch.device("cpu"))
        for s, group, upcoming in asked:
            taken = feed.take(s, group, upcoming)
            assert len(taken) == len(group)
            for (batch, rows, layout), indices in zip(taken, group, strict=True):
                assert layout is None  # the host is the device: the model lays the batch out itself
                expected = collate(s, indices)
                assert batch.indices.tolist() == indices
                for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
                    assert torch.equal(getattr(batch, name), getattr(expected, name)), name
                assert torch.equal(rows, loss_rows(expected.tgt_out))


def test_rows_of_lengths_are_loss_rows():
    g = torch.Generator().manual_seed(4)
    for B, T, multiple in ((1, 1, 64), (3, 5, 4), (17, 23, 64), (40, 9, 8)):
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        target = torch.where(torch.arange(T) < lengths[:, None], 7, 0)  # PAD_ID after each sentence
        assert torch.equal(rows_of_lengths(lengths, T, multiple), loss_rows(target, multiple))


@pytest.mark.parametrize(
    "attention, query, feeding, loops",
    [
        ("bahdanau", "current", True, True),
        ("bahdanau", "previous", False, True),
        ("luong", "current", False, False),
        ("none", "previous", False, False),
    ],
)
def test_the_training_pass_reads_nothing_from_the_device(attention, query, feeding, loops, monkeypatch):
    """On the meta device, whose tensors hold no data (any read of one fails), the model's training forward
    and backward and the loss run from the batch's host-side lengths (mixed source lengths: the packed
    encoder), under the GPU's work sizes. Autocast knows no meta device: it is left out."""
    import nmt.attention
    import nmt.decoder
    import nmt.device

    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    for module in (nmt.device, nmt.decoder, nmt.attention):
        monkeypatch.setattr(module, "autocast_dtype", lambda device_type: None)
    torch.manual_seed(0)
    config = ModelConfig(8, 8, hidden_size=16, input_feeding=feeding, attention=attention, attention_query=query)
    model = Seq2Seq(config, 50, 50).to("meta").train()
    src_lengths, tgt_lengths = torch.tensor([7, 7, 6, 5, 7, 3]), torch.tensor([9, 8, 8, 5, 3, 2])  # on the host
    src, tgt_in, tgt_out = (torch.empty(6, n, dtype=torch.long, device="meta") for n in (7, 9, 9))
    rows = rows_of_lengths(tgt_lengths, 9).to("meta")
    with imposed(CUDA.work):
        logits, _ = model(src, src_lengths, tgt_in, rows, tgt_lengths)
        loss_sum(logits, tgt_out.reshape(-1)[rows], 0.1).backward()
    assert logits.shape == (len(rows), 50)
    if loops:  # a decoder loop without the lengths counts them in tgt_in: a read
        with pytest.raises(NotImplementedError):
            model(src, src_lengths, tgt_in, rows)


def test_a_decoder_step_costs_a_bounded_number_of_operators_measured_as_a_slope_over_t():
    """The step's operators grow with T, the batch's longest target, by what one decoder step costs: counted
    over the forward and backward of the same batch at T=10 and T=20 (bf16 autocast, the eager step a GPU runs),
    the slope is that cost: 92.6 operators that launch work (this model, torch 2.13), bounded here at 100; the
    target on a GPU is 20, with fused step kernels."""
    torch.manual_seed(0)
    config = ModelConfig(16, 16, hidden_size=32, input_feeding=True, attention="bahdanau", attention_query="current")
    model = Seq2Seq(config, 60, 60).train()
    launches = {}
    for T in (10, 20):
        src, lengths, tgt_lengths = torch.randint(4, 60, (8, 9)), torch.full((8,), 9), torch.full((8,), T)
        tgt, rows = torch.randint(4, 60, (8, T)), rows_of_lengths(torch.full((8,), T), T)
        with DispatchCount() as count:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, _ = model(src, lengths, tgt, rows, tgt_lengths, weights=False)
                loss = loss_sum(out, tgt.reshape(-1)[rows], 0.1)
            loss.backward()
        launches[T] = count.launches
    per_step = (launches[20] - launches[10]) / 10
    assert 0 < per_step <= 100, f"{per_step} operators a decoder step, forward and backward ({launches})"
