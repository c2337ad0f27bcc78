"""Resume is exact or refuses (nmt.resume): every setting exactness depends on is recorded in the checkpoint; a
resume that changes one is refused with a message naming it (trainer.resume_changes=allow goes on and records it);
harmless changes (a longer budget) resume and stay bitwise exact; old checkpoints resume with a warning; a run
directory's checkpoints are never overwritten by a fresh run unasked.

The runs are tiny (a 16/32-unit model, a few steps on 240 pairs of the synthetic task written as TSV files, so that
data=files gives windows and an editable corpus), built in process as nmt-train builds them (nmt.cli.common.build_run),
fp32 on one thread. One checkpoint is trained per module and copied for each test.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.cli.common import build_run, compose_config
from nmt.cli.train import delete, resume_plan
from nmt.errors import CheckpointError, ConfigError
from nmt.resume import Kind, classify, compare, rank_seeds

ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
STEPS = 6  # the module's checkpoint: step 6, validated (and saved) at steps 3 and 6


def write_tsv(path: Path, pairs) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    from nmt.corpora import load_synthetic

    corpus = load_synthetic(seed=5, train_size=240, valid_size=20, test_size=10, max_len=8, test_max_len=8)
    root = tmp_path_factory.mktemp("corpus")
    for split, pairs in corpus.splits.items():
        write_tsv(root / f"{split}.tsv", pairs)
    return root


@pytest.fixture(scope="module")
def base(corpus_dir, tmp_path_factory) -> list[str]:
    return [
        "data=files",
        f"data.train={corpus_dir / 'train.tsv'}",
        f"data.valid={corpus_dir / 'valid.tsv'}",
        f"data.test={corpus_dir / 'test.tsv'}",
        "tokenizer.vocab_size=60",
        "model=small",
        "model.embed_size=16",
        "model.encoder_hidden_size=16",
        "model.hidden_size=32",
        "model.dropout=0.1",  # the random state matters
        "trainer.batch_tokens=300",
        f"trainer.max_steps={STEPS}",
        "trainer.max_epochs=null",
        "trainer.valid_every=3",
        "trainer.log_every=3",
        "trainer.heatmaps=0",
        "trainer.progress=false",
        "trainer.amp=off",  # fp32: bitwise comparisons
        "trainer.threads=1",
        f"paths.data_dir={tmp_path_factory.mktemp('data')}",
    ]


def train(base: list[str], run_dir: Path, *overrides: str, resume: Path | None = None):
    """The Trainer nmt-train would build for these overrides, trained; `resume`: the checkpoint to continue."""
    cfg = compose_config([*base, *overrides])
    trainer = build_run(cfg, run_dir, "cpu", resume=str(resume) if resume else None)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory, one_thread) -> Path:
    """A run directory of STEPS steps (shared: tests take a copy)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train(base, run_dir)
    return run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """This test's copy of the trained run directory."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def last(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.pt"


def train_losses(ckpt: Path) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in load_checkpoint(ckpt)["history"] if h["kind"] == "train"}


# ------------------------------------------------------------------------------------ what a checkpoint records
def test_the_checkpoint_records_what_exactness_depends_on(trained):
    facts = load_checkpoint(last(trained))["exactness"]
    for key in (
        "corpus.train",
        "corpus.valid",
        "corpus.test",
        "corpus.window",
        "tokenizer.src_model",
        "tokenizer.tgt_model",
        "trainer.batch_tokens",
        "trainer.bucketing",
        "trainer.accumulate",
        "optim.lr",
        "optim.schedule",
        "seed",
        "world_size",
        "torch",
        "device_kind",
        "precision",
        "data.window",
        "model.hidden_size",
    ):
        assert key in facts, key
    assert facts["world_size"] == 1 and facts["device_kind"] == "cpu" and facts["torch"] == str(torch.__version__)
    assert re.fullmatch(r"[0-9a-f]{16}", facts["corpus.train"]) and facts["corpus.train"] != facts["corpus.valid"]
    assert load_checkpoint(last(trained))["resumed_with_changes"] == []


def test_the_kinds_of_change():
    assert [classify(k) for k in ("model.hidden_size", "src_vocab")] == [Kind.incompatible] * 2
    harmless = ("paths.data_dir", "trainer.max_epochs", "trainer.valid_every", "trainer.threads", "data.train.src")
    assert all(classify(k) is Kind.harmless for k in harmless)
    assert classify("corpus.test_k2") is Kind.harmless  # a split only evaluation reads
    breaks = ("corpus.train", "corpus.valid", "corpus.window", "tokenizer.src_model", "data.train_size", "seed")
    assert all(classify(k) is Kind.breaks for k in breaks)
    assert classify("trainer.some_future_key") is Kind.breaks  # unknown: the safe side
    assert classify("threads") is Kind.breaks  # the count; the setting trainer.threads (auto keeps it) is harmless
    assert compare({"seed": 1, "old": 1}, {"seed": 2, "new": 1})[0].key == "seed"  # one-sided keys: not compared


# ----------------------------------------------------------------------------------------- refused, each named
REFUSED = [
    ("trainer.batch_tokens=250", "trainer.batch_tokens 300 -> 250"),
    ("trainer.bucketing=sorted", "trainer.bucketing exact -> sorted"),
    ("trainer.accumulate=2", "trainer.accumulate 1 -> 2"),
    ("data.window=2", "corpus.window 1 -> 2"),
    ("seed=7", "seed 1234 -> 7"),
    ("optim.lr=0.002", "optim.lr 0.001 -> 0.002"),
    ("optim.schedule=warmup", "optim.schedule constant -> warmup"),
    ("trainer.clip_norm=0.5", "trainer.clip_norm 1.0 -> 0.5"),
    ("trainer.amp=bf16", "trainer.amp off -> bf16"),
    ("trainer.threads=2", "threads 1 -> 2"),  # another thread count rounds differently
    ("tokenizer.character_coverage=0.9999", "tokenizer.src_model "),  # retrained: other bytes, same pieces
]


@pytest.mark.parametrize(("override", "named"), REFUSED, ids=[o.split("=")[0] for o, _ in REFUSED])
def test_a_change_that_breaks_exactness_is_refused_naming_it(base, run, override, named, one_thread):
    before = last(run).read_bytes()
    with pytest.raises(CheckpointError) as refused:
        train(base, run, override, "trainer.max_steps=9", resume=last(run))
    message = str(refused.value)
    assert named in message and "breaks exactness" in message and "trainer.resume_changes=allow" in message
    assert "harmless: " in message and "trainer.max_steps 6 -> 9" in message  # every difference, in one message
    assert last(run).read_bytes() == before


def test_allowed_changes_are_recorded_in_the_checkpoint_and_tensorboard(base, run, one_thread):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = train(base, run, "seed=7", "trainer.max_steps=9", "trainer.resume_changes=allow", resume=last(run))
    data = load_checkpoint(last(run))
    assert trainer.step == data["step"] == 9
    assert data["resumed_with_changes"] == ["seed"] and data["exactness"]["seed"] == 7
    resume = data["resumes"][-1]
    assert resume["step"] == STEPS and resume["breaks"] == ["seed"]
    assert resume["changes"]["seed"] == [1234, 7] and resume["changes"]["trainer.max_steps"] == [STEPS, 9]
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    text = events.Tensors("resume/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "breaks exactness" in text and "`seed`" in text


def test_the_checkpoints_tokenizer_wins_over_one_trained_again(base, run, one_thread):
    """A tokenizer trained again (other bytes, same pieces) is refused; with allow, training goes on with the
    checkpoint's tokenizer (the corpus encoded with it), so nothing else differs."""
    spm = load_checkpoint(last(run))["spm_src"]
    allow = ["tokenizer.character_coverage=0.9999", "trainer.resume_changes=allow", "trainer.max_steps=8"]
    trainer = train(base, run, *allow, resume=last(run))
    data = load_checkpoint(last(run))
    assert trainer.step == data["step"] == 8
    assert trainer.data.tokenizer.src_model == data["spm_src"] == spm
    changed = ["tokenizer.character_coverage", "tokenizer.src_model", "tokenizer.tgt_model"]
    assert data["resumed_with_changes"] == changed
    assert not any(k.startswith("corpus.") for k in data["resumes"][-1]["changes"])  # the same encoded corpus


def test_one_edited_line_of_the_corpus_is_caught_by_its_fingerprint(base, run, corpus_dir, tmp_path, one_thread):
    lines = (corpus_dir / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    source, target = lines[10].rstrip("\n").split("\t")
    lines[10] = f"{' '.join(reversed(source.split()))}\t{target}\n"  # the same words, the same number of lines
    edited = tmp_path / "train.tsv"
    edited.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(CheckpointError) as refused:
        train(base, run, f"data.train={edited}", resume=last(run))
    message = str(refused.value)
    assert re.search(r"corpus\.train [0-9a-f]{16} -> [0-9a-f]{16}", message)
    assert "corpus.valid" not in message and "data.train" in message.split("harmless: ")[1]  # the path: harmless


# ------------------------------------------------------------------------------------ harmless: exact, and logged
@pytest.mark.parametrize("layers", [0, 1], ids=["plain", "selfattention"])
def test_extending_max_epochs_resumes_bitwise_like_an_uninterrupted_run(base, tmp_path, caplog, one_thread, layers):
    epochs = ["trainer.max_steps=null", "trainer.valid_every=1000", f"model.self_attention_layers={layers}"]
    whole = train(base, tmp_path / "whole", *epochs, "trainer.max_epochs=2")
    train(base, tmp_path / "split", *epochs, "trainer.max_epochs=1")
    with caplog.at_level(logging.INFO, logger="nmt.trainer"):
        resumed = train(base, tmp_path / "split", *epochs, "trainer.max_epochs=2", resume=last(tmp_path / "split"))
    assert "harmless: trainer.max_epochs 1 -> 2" in caplog.text
    assert resumed.step == whole.step > 0 and resumed.epoch == whole.epoch == 2
    assert train_losses(last(tmp_path / "split")) == train_losses(last(tmp_path / "whole"))
    ours, theirs = resumed.module.state_dict(), whole.module.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert load_checkpoint(last(tmp_path / "split"))["resumed_with_changes"] == []


def test_auto_keeps_the_checkpoints_thread_count_and_resumes_bitwise(base, run, tmp_path, one_thread):
    """The module's run (one thread) resumed with trainer.threads=auto where torch would use two: whatever auto
    would choose on this machine now, the run goes on at the checkpoint's count, bit for bit as if uninterrupted."""
    whole = train(base, tmp_path / "whole", "trainer.max_steps=9")
    torch.set_num_threads(2)
    resumed = train(base, run, "trainer.threads=auto", "trainer.max_steps=9", resume=last(run))
    assert resumed.threads.count == torch.get_num_threads() == 1
    assert load_checkpoint(last(run))["exactness"]["threads"] == 1
    assert train_losses(last(run)) == train_losses(last(tmp_path / "whole"))
    ours, theirs = resumed.module.state_dict(), whole.module.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert load_checkpoint(last(run))["resumed_with_changes"] == []


def as_if_at_two_threads(ckpt: Path) -> None:
    """Make `ckpt` say it was trained at two threads."""
    data = load_checkpoint(ckpt)
    data["exactness"]["threads"] = data["threads"]["count"] = 2
    save_checkpoint(ckpt, {k: v for k, v in data.items() if not k.endswith("version") and k != "format"})


def test_another_thread_count_is_allowed_only_when_asked_and_recorded(base, run, one_thread):
    as_if_at_two_threads(last(run))
    with pytest.raises(CheckpointError, match=r"breaks exactness: threads 2 -> 1"):
        train(base, run, "trainer.max_steps=7", resume=last(run))  # trainer.threads=1, as the base says
    trainer = train(base, run, "trainer.max_steps=7", "trainer.resume_changes=allow", resume=last(run))
    data = load_checkpoint(last(run))
    assert trainer.step == 7 and data["resumed_with_changes"] == ["threads"]
    assert data["resumes"][-1]["changes"]["threads"] == [2, 1] and data["threads"]["count"] == 1


def test_an_old_checkpoint_resumes_with_a_warning(base, run, caplog, one_thread):
    data = load_checkpoint(last(run))
    for key in ("exactness", "resumes", "resumed_with_changes"):
        del data[key]
    save_checkpoint(last(run), {k: v for k, v in data.items() if not k.endswith("version") and k != "format"})
    with caplog.at_level(logging.WARNING, logger="nmt.trainer"):
        trainer = train(base, run, "trainer.max_steps=8", resume=last(run))
    assert "exactness cannot be checked" in caplog.text
    assert trainer.step == 8 and "exactness" in load_checkpoint(last(run))


# ---------------------------------------------------------------------------------------------------- world size
def as_if_written_by(ckpt: Path, world_size: int) -> None:
    """Make `ckpt` say `world_size` processes wrote it (each rank's random state kept, as Trainer.save does)."""
    data = load_checkpoint(ckpt)
    data["world_size"] = data["exactness"]["world_size"] = world_size
    data["rng_ranks"] = [data["rng"]] * world_size
    save_checkpoint(ckpt, {k: v for k, v in data.items() if not k.endswith("version") and k != "format"})


def test_another_world_size_is_refused_and_allowed_seeds_every_rank_afresh(base, run, one_thread):
    as_if_written_by(last(run), 2)
    with pytest.raises(CheckpointError, match=r"breaks exactness: world_size 2 -> 1"):
        train(base, run, resume=last(run))

    cfg = compose_config([*base, "trainer.resume_changes=allow"])
    trainer = build_run(cfg, run, "cpu", resume=str(last(run)))
    payload = load_checkpoint(last(run))
    trainer.restore(last(run))
    seeds = trainer.resumes[-1]["rank_seeds"]
    assert seeds == rank_seeds(1234, STEPS, 1) and trainer.resumed_with_changes == ["world_size"]
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(seeds[0]).get_state())
    assert random.getstate() == random.Random(seeds[0]).getstate()

    payload["world_size"] = 1  # written by one process, resumed by two: what each rank gets (Trainer.restore)
    draws = []
    for rank in range(2):
        trainer.rank, trainer.world_size = rank, 2
        assert trainer._restore_random_state(payload) == rank_seeds(1234, STEPS, 2)  # every rank records all
        draws.append(torch.rand(8))
    assert not torch.equal(draws[0], draws[1])
    assert len(set(rank_seeds(1234, STEPS, 64))) == 64 and rank_seeds(1234, STEPS, 3) != rank_seeds(1234, 7, 3)


# --------------------------------------------------------------------------------- run directories (nmt-train)
def test_auto_and_the_existing_spellings_find_the_checkpoint(trained, tmp_path):
    assert resume_plan(None, trained) == resume_plan("auto", trained) == (str(last(trained)), [])
    assert resume_plan(str(trained), tmp_path / "new") == (str(last(trained)), [])  # a run directory
    assert resume_plan(str(last(trained)), tmp_path / "new") == (str(last(trained)), [])  # a checkpoint
    assert resume_plan("auto", tmp_path / "new") == (None, [])  # nothing to resume: a fresh run
    best = str(trained / "checkpoints" / "best.pt")
    assert resume_plan(best, trained) == (best, [])  # a checkpoint of this directory's own run


def test_a_run_directory_with_checkpoints_is_never_overwritten_unasked(run, trained, tmp_path):
    other = shutil.copytree(trained, tmp_path / "other")
    with pytest.raises(ConfigError, match=r"already holds checkpoints.*trainer\.resume=auto.*hydra\.run\.dir"):
        resume_plan(str(other), run)  # another run resumed here would overwrite this one's
    last(run).unlink()  # best.pt alone: auto finds nothing to continue, and a fresh run would overwrite it
    with pytest.raises(ConfigError, match=r"no checkpoints/last\.pt.*trainer\.overwrite=true"):
        resume_plan("auto", run)
    source, stale = resume_plan("auto", run, overwrite=True)
    assert source is None and {p.name for p in stale} == {"best.pt", "metrics.json", "valid", "tensorboard"}
    delete(stale)
    assert not list((run / "checkpoints").iterdir()) and not (run / "metrics.json").exists()
    assert resume_plan("auto", run) == (None, [])


def test_unknown_keys_still_fail_and_the_new_ones_are_typed(base):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_config([*base, "trainer.resume_chagnes=allow"])
    with pytest.raises(ConfigCompositionException):
        compose_config([*base, "trainer.resume_changes=sometimes"])
    cfg = compose_config([*base, "trainer.resume_changes=allow", "trainer.overwrite=true", "trainer.resume=auto"])
    assert (cfg.trainer.resume_changes, cfg.trainer.overwrite, cfg.trainer.resume) == ("allow", True, "auto")


def test_nmt_train_refuses_in_one_line_naming_the_key(base, run):
    cmd = [sys.executable, "-m", "nmt.cli.train", *base, f"hydra.run.dir={run}", "seed=7"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: {last(run)}: cannot resume: ") and "seed 1234 -> 7" in error
