"""Resuming a run exactly, or saying why not.

A checkpoint records the facts an exact resume depends on, as one flat dict of dotted keys and plain values
(nmt.trainer.Trainer.facts): the run's settings (`trainer.*`, `optim.*`, `seed`, `data.*`, `tokenizer.*`,
`paths.*`, `model.*`), a fingerprint of each prepared split and of both SentencePiece models (`corpus.*`,
`tokenizer.src_model`, `tokenizer.tgt_model`: nmt.data.PreparedData.fingerprints), the windowing, the world
size, torch's version, the device kind, the precision, the kernels and the thread count (`threads`: a sum split
over more threads rounds differently; trainer.threads=auto keeps the checkpoint's count, nmt.threads). Resuming
compares the checkpoint's facts with this run's, and sorts every difference into one of three kinds:

    incompatible  the checkpoint's weights do not fit this run's model (model.*, the vocabulary sizes): refused
    breaks        the run would not continue as the uninterrupted one would have (the corpus and tokenizer
                  fingerprints, batching, windowing, seed, world size, optimiser and schedule, precision, torch,
                  device, the thread count): refused unless trainer.resume_changes=allow; then recorded in the
                  checkpoint and TensorBoard
    harmless      paths, logging and validation frequency, budgets and patience, the trainer.threads setting
                  (the count it gives is `threads`), progress: logged

    changes = compare(saved_facts, facts_now)
    check(changes, allow, "run/checkpoints/last.pt")   # a CheckpointError naming every change, in one message

A corrupt checkpoint (cut off, or not matching its digest: nmt.checkpoint) is refused; with
trainer.resume_fallback=true the run resumes from the newest intact checkpoint beside it instead, and says so:

    path, payload = resumable("run/checkpoints/last.pt", fallback)

A key recorded on one side only (a checkpoint of an older or newer nmt) is not compared. A run resumed on a
different number of processes cannot give each rank its saved random state: every rank is seeded afresh
(rank_seeds), and the seeds are recorded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from nmt.checkpoint import load_checkpoint
from nmt.errors import CheckpointError, CorruptCheckpoint

log = logging.getLogger(__name__)


class Kind(Enum):
    incompatible = "does not fit this run's model"
    breaks = "breaks exactness"
    harmless = "harmless"


# A key under one of these (itself, or a dotted key below it: "model" covers "model.hidden_size") is of that
# kind; the corpus fingerprints are sorted by CORPUS_FACTS; every other key breaks exactness, the safe side.
INCOMPATIBLE = ("model", "src_vocab", "tgt_vocab")
HARMLESS = (
    # where things are: the files' contents are fingerprinted (corpus.*)
    "paths",
    "device",  # the setting (auto, cuda:1, ...); the device kind is `device_kind`
    "data.db_path",
    "data.root",
    "data.train",
    "data.valid",
    "data.test",
    # how the run is resumed (trainer.resume, where from, is not a fact: the checkpoint's `resumes` list it)
    "trainer.resume",
    "trainer.resume_changes",
    "trainer.resume_fallback",
    "trainer.overwrite",
    # what is logged and how often validation runs
    "trainer.log_every",
    "trainer.valid_every",
    "trainer.valid_batch_tokens",
    "trainer.heatmaps",
    "trainer.length_buckets",
    "trainer.average_decay",  # what validation scores: training steps from the weights, not from their average
    "trainer.progress",
    # budgets: extending a run is the common case
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_minutes",
    "trainer.patience",
    "trainer.max_bad_steps",
    # how the thread count is chosen: the count itself (`threads`) breaks exactness, and auto keeps the checkpoint's
    "trainer.threads",
)
# what training reads of the corpus; the other splits (corpus.test, corpus.test_k2, ...) only evaluation does
CORPUS_FACTS = ("corpus.train", "corpus.valid", "corpus.window", "corpus.train_chapters")


@dataclass(frozen=True)
class Change:
    key: str
    old: object
    new: object
    kind: Kind

    def __str__(self) -> str:
        return f"{self.key} {show(self.old)} -> {show(self.new)}"


def show(value: object) -> str:
    """A value as the command line spells it (null, true, [1, 2]); long ones cut to 40 characters."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def flatten(tree: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested dicts as one dict of dotted keys ({"trainer": {"seed": 1}} -> {"trainer.seed": 1}); lists stay values."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def classify(key: str) -> Kind:
    """What a difference in `key` means for resuming (the module's docstring lists the kinds)."""
    if any(_under(key, p) for p in INCOMPATIBLE):
        return Kind.incompatible
    if any(_under(key, p) for p in HARMLESS):
        return Kind.harmless
    if key.startswith("corpus.") and key not in CORPUS_FACTS:
        return Kind.harmless
    return Kind.breaks


def compare(old: Mapping[str, object], new: Mapping[str, object]) -> list[Change]:
    """Every key recorded on both sides whose value differs, classified, in key order."""
    return [Change(k, old[k], new[k], classify(k)) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def describe(changes: list[Change]) -> str:
    """The changes grouped by kind: "breaks exactness: seed 1 -> 2; harmless: trainer.max_steps 20 -> 40"."""
    groups = []
    for kind in Kind:
        named = [str(c) for c in changes if c.kind is kind]
        if named:
            groups.append(f"{kind.value}: {', '.join(named)}")
    return "; ".join(groups)


def check(changes: list[Change], allow: bool, checkpoint: str | Path) -> None:
    """Refuse to resume from `checkpoint` (a CheckpointError naming every change, old and new value) when a
    change makes the checkpoint unfit for this run's model, or breaks exactness and `allow` is not given."""
    unfit = any(c.kind is Kind.incompatible for c in changes)
    breaks = [c for c in changes if c.kind is Kind.breaks]
    if not unfit and (allow or not breaks):
        return
    if unfit:
        fix = "resume with the settings it was trained with (its run's .hydra/config.yaml) or use a new run directory"
    else:
        tokenizer = any(c.key.startswith("tokenizer.") for c in breaks)
        fix = (
            "resume with the settings and data it was trained with (its run's .hydra/config.yaml), start afresh in "
            "a new run directory (hydra.run.dir=...), or pass trainer.resume_changes=allow to continue anyway (the "
            "checkpoint and TensorBoard then record the changed keys"
            + ("; the checkpoint's tokenizer is kept and the corpus encoded with it" if tokenizer else "")
            + ")"
        )
    raise CheckpointError(
        f"{checkpoint}: cannot resume: this run differs from the one that wrote it (checkpoint -> now) in "
        f"{describe(changes)}; {fix}"
    )


def rank_seeds(seed: int, step: int, world_size: int) -> list[int]:
    """A fresh random seed for each rank of a run resumed on another number of processes (the saved per-rank
    states do not map onto the new ranks): distinct, and a pure function of the run's seed, the step and the rank."""
    return [
        int.from_bytes(hashlib.sha256(f"nmt-resume/{seed}/{step}/{rank}".encode()).digest()[:8], "little") >> 1
        for rank in range(world_size)
    ]


def last_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint trainer.resume=auto continues from: `run_dir`/checkpoints/last.pt, where it exists."""
    last = Path(run_dir) / "checkpoints" / "last.pt"
    return last if last.is_file() else None


def resumable(path: str | Path, fallback: bool) -> tuple[Path, dict]:
    """(the checkpoint to resume from, its payload): `path`, read and verified. A corrupt one (cut off, or not
    matching its digest) is refused, a CheckpointError naming it; with `fallback` (trainer.resume_fallback) the
    newest intact checkpoint beside it (the most steps) is read instead, with a warning."""
    path = Path(path)
    try:
        return path, load_checkpoint(path)
    except CorruptCheckpoint as e:
        if not fallback:
            raise CorruptCheckpoint(
                e.what,
                "copy it again, or resume from the newest intact checkpoint beside it with "
                "trainer.resume_fallback=true",
            ) from None
        problem = e.what
    intact = []
    for other in sorted(path.parent.glob("*.pt")):
        if other.name != path.name:
            try:
                intact.append((other, load_checkpoint(other)))
            except CheckpointError as e:
                log.warning("not resuming from %s either: %s", other, e)
    if not intact:
        raise CorruptCheckpoint(problem, "no intact checkpoint beside it either: start afresh in a new run directory")
    other, data = max(intact, key=lambda found: found[1].get("step", -1))
    log.warning(
        "%s; resuming from %s (step %s) instead, as trainer.resume_fallback=true asks", problem, other, data.get("step")
    )
    return other, data
