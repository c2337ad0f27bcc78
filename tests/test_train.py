"""nmt-train end to end: artifacts, TensorBoard contents, exact resume (after SIGINT, SIGKILL, or a planned
stop), rejected checkpoints, and multirun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import CheckpointError

TRAIN = [sys.executable, "-m", "nmt.cli.train"]
SMALL = [
    "experiment=quick",
    "data.train_size=1500",
    "data.valid_size=60",
    "data.test_size=60",
    "trainer.progress=false",
    "trainer.log_every=5",
    "trainer.heatmaps=1",
    "trainer.threads=1",
]


def run_train(run_dir: Path, data_dir: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = TRAIN + SMALL + [f"hydra.run.dir={run_dir}", f"paths.data_dir={data_dir}", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def train_losses(ckpt: Path) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in load_checkpoint(ckpt)["history"] if h["kind"] == "train"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir) -> Path:
    """An uninterrupted 40-step run, validating (and checkpointing) every 10 steps."""
    run = tmp_path_factory.mktemp("reference")
    run_train(run, data_dir, "trainer.max_steps=40", "trainer.valid_every=10")
    return run


def test_a_short_run_writes_every_artifact(reference):
    for rel in (".hydra/config.yaml", "train.log", "checkpoints/last.pt", "checkpoints/best.pt", "metrics.json"):
        assert (reference / rel).is_file(), rel
    assert list((reference / "tensorboard").glob("events.out.tfevents.*"))
    hyps = sorted((reference / "valid").glob("step_*.hyp"))
    assert len(hyps) == 4 and len(hyps[-1].read_text().splitlines()) == 60
    metrics = json.loads((reference / "metrics.json").read_text())
    assert metrics["step"] == 40 and metrics["best"]["bleu"] > 0
    assert "validation at step 40" in (reference / "train.log").read_text()


def test_tensorboard_has_scalars_and_attention_images(reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(reference / "tensorboard"), size_guidance={"images": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "valid/loss",
        "valid/ppl",
        "valid/bleu",
        "valid/chrf",
    ):
        assert tag in scalars, tag
    assert any(t.startswith("valid_bleu_by_length/") for t in scalars)
    images = events.Tags()["images"]
    assert images and len(events.Images(images[0])) == 4  # one heatmap per validation


def test_checkpoint_describes_itself(reference):
    data = load_checkpoint(reference / "checkpoints" / "last.pt")
    for key in (
        "model",
        "model_config",
        "config",
        "spm_src",
        "spm_tgt",
        "optimizer",
        "rng",
        "step",
        "epoch",
        "batch_pos",
    ):
        assert key in data, key
    assert isinstance(data["spm_src"], bytes) and data["config"]["data"]["name"] == "synthetic"


def test_resume_continues_the_same_loss_curve(tmp_path, reference, data_dir):
    run = tmp_path / "run"
    run_train(run, data_dir, "trainer.max_steps=20", "trainer.valid_every=10")
    # a second call with a larger budget in the same run directory resumes from last.pt
    run_train(run, data_dir, "trainer.max_steps=40", "trainer.valid_every=10")
    assert train_losses(run / "checkpoints" / "last.pt") == train_losses(reference / "checkpoints" / "last.pt")
    a = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(reference / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_run_resumes_to_the_same_result(tmp_path, reference, data_dir, sig):
    run = tmp_path / "run"
    cmd = (
        TRAIN
        + SMALL
        + [f"hydra.run.dir={run}", f"paths.data_dir={data_dir}", "trainer.max_steps=40", "trainer.valid_every=10"]
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = run / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # somewhere after the first checkpoint, mid-training
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert last.exists()
    stopped_at = load_checkpoint(last)["step"]
    if sig == signal.SIGINT and proc.returncode == 0:
        assert 0 < stopped_at <= 40  # SIGINT: the step in progress finished and last.pt was written
    run_train(run, data_dir, "trainer.max_steps=40", "trainer.valid_every=10")
    assert train_losses(last) == train_losses(reference / "checkpoints" / "last.pt")


def test_resume_from_an_explicit_run_dir(tmp_path, reference, data_dir):
    run = tmp_path / "other"
    proc = run_train(run, data_dir, "trainer.max_steps=50", "trainer.valid_every=10", f"trainer.resume={reference}")
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 50
    assert "resuming from" in (run / "train.log").read_text()
    assert proc.returncode == 0


def test_truncated_checkpoint_is_rejected_clearly(tmp_path, reference):
    good = (reference / "checkpoints" / "last.pt").read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(bad)
    (tmp_path / "foreign.pt").write_bytes(b"hello, not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "foreign.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not an nmt checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(reference)


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device.*intact"):
        save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind


def test_multirun_makes_one_run_per_attention(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    cmd = (
        TRAIN
        + ["-m"]
        + SMALL
        + [
            "attention=none,luong",
            "trainer.max_steps=10",
            "trainer.valid_every=10",
            f"paths.data_dir={data_dir}",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 2
    names = {load_checkpoint(r / "checkpoints" / "best.pt")["model_config"]["attention"] for r in runs}
    assert names == {"none", "luong"}


HYDRA_COMMANDS = ("nmt-train", "nmt-prepare", "nmt-evaluate")
# Each console script's entry point as its wrapper calls it (argv[0] the script's path, then --help), one after the
# other in one Python, each answer after a NUL line: one start of Python and torch for the three.
HELP_EACH = """import contextlib, io, sys
from importlib.metadata import entry_points
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1]
    sys.argv, out, code = [path, "--help"], io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            entry_points(group="console_scripts")[name].load()()
        except SystemExit as e:
            code = e.code or 0
    print(f"\\0{name} {code}")
    print(out.getvalue(), end="")
"""


def test_each_hydra_command_has_its_own_help():
    """--help describes the command asked for (nmt-prepare shares nmt-train's config, not its help)."""
    paths = [str(Path(sys.executable).parent / command) for command in HYDRA_COMMANDS]
    proc = subprocess.run([sys.executable, "-c", HELP_EACH, *paths], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = dict(part.split("\n", 1) for part in proc.stdout.split("\0")[1:])
    assert list(answers) == [f"{command} 0" for command in HYDRA_COMMANDS], proc.stdout[-2000:]
    for command in HYDRA_COMMANDS:
        text = answers[f"{command} 0"]
        assert text.startswith(f"{command}: "), text[:200]
        assert "Examples:" in text and f"  {command} " in text


# ------------------------------------------------------------------------- schedules and validation, in process
@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from nmt.corpora import load_synthetic
    from nmt.data import TokenizerSettings, prepare

    corpus = load_synthetic(
        seed=2,
        train_size=300,
        valid_size=40,
        test_size=10,
        min_len=3,
        max_len=8,
        test_min_len=3,
        test_max_len=8,
        vocab_words=20,
    )
    return prepare(corpus, TokenizerSettings(vocab_size=60), 60, tmp_path_factory.mktemp("tiny"))


def tiny_model(data):
    from nmt.model import ModelConfig, Seq2Seq

    config = ModelConfig(embed_size=8, encoder_hidden_size=8, hidden_size=16)
    return Seq2Seq(config, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size)


def rnnsearch_model(data):
    """tiny_model's sizes as the study's RNNsearch: additive attention from the previous state, no input feeding."""
    from nmt.model import ModelConfig, Seq2Seq

    config = ModelConfig(
        embed_size=8,
        encoder_hidden_size=8,
        hidden_size=16,
        input_feeding=False,
        attention="bahdanau",
        attention_query="previous",
    )
    return Seq2Seq(config, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size)


def test_a_plateau_cut_during_warmup_cuts_the_full_rate(tiny_data, tmp_path, monkeypatch):
    """Validations during warmup that do not improve cut the *base* rate by the plateau factor; the warmup
    keeps scaling it. (The partly warmed-up rate must not become the base rate for good.)"""
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig
    from nmt.trainer import validate as validate_module

    bleu = iter([10.0, 5.0, 5.0, 12.0])  # validations at steps 5, 10, 15, 20: better, worse, worse, better

    def fake_validation(model, data, split, *args, **kwargs):
        value = next(bleu)
        return {"loss": 1.0, "ppl": 2.7, "bleu": value, "chrf": value, "by_length": [], "hypotheses": [], "figures": []}

    monkeypatch.setattr(validate_module, "evaluate_split", fake_validation)
    torch.manual_seed(0)
    model = tiny_model(tiny_data)
    optim = OptimConfig(lr=0.01, schedule="plateau", warmup_steps=100, plateau_factor=0.5, plateau_patience=0)
    config = TrainerConfig(
        progress=False,
        max_steps=20,
        max_epochs=None,
        valid_every=5,
        batch_tokens=200,
        heatmaps=0,
        patience=0,
        log_every=5,
        amp="off",
    )
    trainer = Trainer(model, tiny_data, config, optim, tmp_path, device="cpu", seed=1)
    trainer.train()
    group = trainer.optimizer.param_groups[0]
    assert group["base_lr"] == pytest.approx(0.01 * 0.5**2)  # two cuts, each of the full rate
    lrs = {
        h["step"]: h["lr"]
        for h in load_checkpoint(tmp_path / "checkpoints" / "last.pt")["history"]
        if h["kind"] == "train"
    }
    assert lrs[20] == pytest.approx(0.01 * 0.5**2 * 20 / 100, rel=1e-3)  # still warming up, from the cut base


def test_a_capped_validation_spreads_over_the_split(tiny_data):
    """valid_max_sentences=N scores N sentences spread over the split, not its first N."""
    from nmt.validation import evaluate_split, spread

    assert spread(10, None) == spread(10, 10) == spread(10, 12) == list(range(10))
    assert spread(40, 4) == [0, 10, 20, 30] and len(set(spread(41, 7))) == 7
    model = tiny_model(tiny_data)
    metrics = evaluate_split(model, tiny_data, "valid", torch.device("cpu"), 400, [0, 5, 100], max_sentences=4)
    assert len(metrics["hypotheses"]) == 4 and sum(row["n"] for row in metrics["by_length"]) == 4
    sources = [s for s, _ in tiny_data.pairs("valid")]
    by_length = sorted(len(sources[i].split()) for i in spread(len(sources), 4))
    short = sum(n < 5 for n in by_length)
    assert [row["n"] for row in metrics["by_length"]] == [short, len(by_length) - short, 0]


@pytest.mark.parametrize("rnnsearch", [False, True], ids=["luong", "rnnsearch-compiled"])
def test_verse_windows_train_and_resume_exactly(tmp_path, dress_as_chapters, rnnsearch, torch_compiles):
    """With data.window > 1 every epoch trains on new windows; a run stopped after epoch 1 and resumed
    ends with the same weights and losses as one that was never stopped (fp32, one thread). Also for the
    study's RNNsearch (additive attention from the previous state, no input feeding) on the compiled kernels
    of trainer.kernels=compiled (nmt.kernels.compiled), where this machine compiles."""
    from nmt.corpora import load_synthetic
    from nmt.data import TokenizerSettings, prepare
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig

    if rnnsearch and not torch_compiles:
        pytest.skip("torch.compile does not work on this machine (no C++ compiler?)")

    corpus = load_synthetic(
        seed=3,
        train_size=240,
        valid_size=10,
        test_size=5,
        min_len=2,
        max_len=5,
        test_min_len=2,
        test_max_len=5,
        vocab_words=15,
    )
    corpus = dress_as_chapters(corpus, window=3, seed=1, shortest=2, longest=8)
    data = prepare(corpus, TokenizerSettings(vocab_size=40), 100, tmp_path / "data", progress=False)

    def run(run_dir, epochs, resume=None):
        torch.manual_seed(0)
        config = TrainerConfig(
            progress=False,
            max_steps=None,
            max_epochs=epochs,
            valid_every=1000,
            batch_tokens=150,
            heatmaps=0,
            patience=0,
            log_every=1,
            amp="off",
            resume=resume,
            threads=1,
            kernels="compiled" if rnnsearch else "eager",
        )
        model = rnnsearch_model(data) if rnnsearch else tiny_model(data)
        trainer = Trainer(model, data, config, OptimConfig(lr=0.01), run_dir, device="cpu", seed=2)
        trainer.train()
        return trainer

    whole = run(tmp_path / "whole", 2)
    assert len(whole.train_split) < len(data.encoded["train"])  # windows, not single verses
    run(tmp_path / "split", 1)
    resumed = run(tmp_path / "split", 2, resume=str(tmp_path / "split" / "checkpoints" / "last.pt"))
    assert train_losses(tmp_path / "split" / "checkpoints" / "last.pt") == train_losses(
        tmp_path / "whole" / "checkpoints" / "last.pt"
    )
    assert all(
        torch.equal(a, b)
        for a, b in zip(resumed.module.state_dict().values(), whole.module.state_dict().values(), strict=True)
    )


def test_hooks_see_every_step_and_every_validation(tiny_data, tmp_path):
    """A TrainerHook is told after each optimizer step (with its sentences and tokens) and each validation,
    the final one included; it observes without changing the run."""
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig, TrainerHook

    class Record(TrainerHook):
        def __init__(self):
            self.steps, self.validations = [], []

        def on_step(self, trainer, seconds, sentences, tokens, skipped):
            self.steps.append((trainer.step, sentences, tokens, skipped, seconds >= 0))

        def on_validation(self, trainer, seconds):
            self.validations.append(trainer.step)

    record = Record()
    config = TrainerConfig(
        progress=False,
        max_steps=7,
        max_epochs=None,
        valid_every=3,
        batch_tokens=200,
        heatmaps=0,
        patience=0,
        log_every=5,
        amp="off",
    )
    torch.manual_seed(0)
    trainer = Trainer(
        tiny_model(tiny_data), tiny_data, config, OptimConfig(lr=0.01), tmp_path, device="cpu", seed=1, hooks=[record]
    )
    trainer.train()
    assert [s[0] for s in record.steps] == list(range(1, 8)) and not any(s[3] for s in record.steps)
    assert all(s[1] > 0 and s[2] >= s[1] and s[4] for s in record.steps)
    assert record.validations == [3, 6, 7]


@pytest.mark.parametrize("native, expected", [(False, "fp32"), (True, "bf16 autocast")])
def test_the_log_says_which_precision_and_kernels_and_why(tiny_data, tmp_path, monkeypatch, caplog, native, expected):
    """trainer.amp=auto picks bf16 only where the CPU computes it natively, and the log line says what and why;
    the plan's table says every component's implementation and why. The CPU is pretended (no test depends on it)."""
    import nmt.cpu
    from nmt import precision
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig

    kind = "AMX" if native else "AVX2"
    flags = {**dict.fromkeys(nmt.cpu.CPU_FLAGS, False), "avx2": True, "amx_bf16": native, "amx_tile": native}
    monkeypatch.setattr(nmt.cpu, "cpu_flags", lambda: flags)
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: native)
    config = TrainerConfig(progress=False, max_steps=1, max_epochs=None, heatmaps=0, amp="auto", kernels="eager")
    with caplog.at_level("INFO"):
        trainer = Trainer(tiny_model(tiny_data), tiny_data, config, OptimConfig(), tmp_path, device="cpu", seed=1)
    why = "AMX computes bf16 natively" if native else f"this CPU has no native bf16 ({kind}, no AVX-512 BF16 or AMX)"
    assert f"precision         {expected}: trainer.amp=auto: {why}" in caplog.text
    assert trainer.amp == ("bf16" if native else "off")
    assert "encoder           nn.LSTM (oneDNN): kernels=eager" in caplog.text
