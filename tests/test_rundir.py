"""A run directory under attack (issue 51): checkpoints verified on load by every reader, and resumed from only
when intact (or, asked to, from the newest intact one beside a corrupt one).

The run is tiny (the quick preset on 300 pairs, best by validation loss so that each validation improves), trained
in this process.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.cli.common import build_run, compose_config
from nmt.errors import CheckpointError, CorruptCheckpoint

TINY = (  # the quick preset, tiny; best by validation loss, so that each validation improves and copies best.pt
    "experiment=quick data.train_size=300 data.valid_size=20 data.test_size=20 trainer.valid_every=3 "
    "trainer.best_metric=loss trainer.heatmaps=1 trainer.threads=1 trainer.progress=false"
).split()


def flip(path: Path, n: int = 3) -> None:
    """Flip `n` bytes in the middle of a file (its tensors' bytes, in a checkpoint), as the review did."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + n] = bytes(b ^ 0xFF for b in raw[middle : middle + n])
    path.write_bytes(bytes(raw))


def ckpt(run_dir: Path, name: str = "last.pt") -> Path:
    return run_dir / "checkpoints" / name


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def killed(data_dir, tmp_path_factory, one_thread) -> tuple[Path, dict]:
    """A run stopped at step 3, then extended to step 6 (best at 6) and killed between its writes of last.pt and
    best.pt: the files that leaves (best.pt and metrics.json of step 3), and the step-6 ones, to compare."""
    run, kept = tmp_path_factory.mktemp("killed") / "run", {}
    for steps, resume in ((3, None), (6, str(ckpt(run)))):
        cfg = compose_config([*TINY, f"trainer.max_steps={steps}", f"paths.data_dir={data_dir}"])
        build_run(cfg, run, resume=resume).train()
        kept[steps] = {p: (run / p).read_bytes() for p in ("checkpoints/best.pt", "metrics.json")}
    assert json.loads(kept[6]["metrics.json"])["best"]["step"] == 6  # the precondition: step 6 improved
    for p, content in kept[3].items():
        (run / p).write_bytes(content)
    return run, kept


@pytest.fixture
def run(killed, tmp_path) -> Path:
    """This test's copy of the killed run, its best.pt made consistent (as if the kill had come earlier)."""
    copy = Path(shutil.copytree(killed[0], tmp_path / "run"))
    for p, content in killed[1][6].items():
        (copy / p).write_bytes(content)
    return copy


# ------------------------------------------------------------------------------------------ digests (finding 2)
def test_flipped_bytes_are_refused_by_every_reader(run):
    from nmt.serve.models import load_models
    from nmt.study.runs import read_run_dir
    from nmt.translator import Translator

    flip(ckpt(run, "best.pt"))
    assert torch.load(ckpt(run, "best.pt"), weights_only=True)["step"] == 6  # torch alone loads it silently
    with pytest.raises(CorruptCheckpoint) as err:
        load_checkpoint(ckpt(run, "best.pt"))
    assert str(err.value).startswith(f"{ckpt(run, 'best.pt')}: corrupt checkpoint (its contents do not match the")
    assert "copy it again" in str(err.value) and "\n" not in str(err.value)
    for reader in (Translator.from_checkpoint, lambda p: load_models([str(p)]), lambda p: read_run_dir(run)):
        with pytest.raises(CheckpointError, match="corrupt checkpoint"):
            reader(ckpt(run, "best.pt"))


def test_a_checkpoint_without_a_digest_loads_as_before(run, caplog):
    """Checkpoints written before digests existed (a study's runs in progress) load, with a log line."""
    payload = torch.load(ckpt(run), weights_only=True)
    del payload["digest"]
    torch.save(payload, ckpt(run))
    with caplog.at_level(logging.INFO, logger="nmt.checkpoint"):
        assert load_checkpoint(ckpt(run))["step"] == 6
    assert "not verified" in caplog.text


def test_a_corrupt_checkpoint_is_not_resumed_unless_falling_back_is_asked(run, data_dir, caplog, one_thread):
    flip(ckpt(run))
    settings = [*TINY, "trainer.max_steps=9", f"paths.data_dir={data_dir}"]
    with pytest.raises(CorruptCheckpoint, match=r"corrupt checkpoint .*trainer\.resume_fallback=true"):
        build_run(compose_config(settings), run, resume=str(ckpt(run))).train()
    trainer = build_run(compose_config([*settings, "trainer.resume_fallback=true"]), run, resume=str(ckpt(run)))
    with caplog.at_level(logging.WARNING, logger="nmt.resume"):
        trainer.restore(ckpt(run))
    assert trainer.step == 6 and trainer.resumes[-1]["checkpoint"] == str(ckpt(run, "best.pt"))
    assert f"{ckpt(run)}: corrupt checkpoint" in caplog.text and f"resuming from {ckpt(run, 'best.pt')}" in caplog.text
