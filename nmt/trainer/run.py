"""A training run as the Trainer's parts see it (loop, validate, checkpoints take a `Run`; nmt.trainer.Trainer
is one), and TrainerHook, which observes it.

What a run holds is its settings, its parts (the model, optimizer, learning rate, the step), its data for the
current epoch and its progress; all of the progress goes into checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from nmt.averaging import WeightAverage
    from nmt.data import EncodedSplit, PreparedData
    from nmt.resume import Change
    from nmt.rundir import TensorBoard
    from nmt.sampler import TokenBatchSampler
    from nmt.threads import Threads
    from nmt.trainer.config import OptimConfig, TrainerConfig
    from nmt.trainer.optimizer import LearningRate
    from nmt.trainer.step import TrainingStep


class Run(Protocol):
    # the settings
    cfg: TrainerConfig
    optim_cfg: OptimConfig
    seed: int
    run_config: dict  # the whole run's config (every section), as checkpoints record it
    run_dir: Path
    ckpt_dir: Path  # run_dir / "checkpoints"
    device: torch.device
    rank: int
    world_size: int
    is_main: bool  # rank 0: the one that writes files
    threads: Threads
    provenance: dict  # commit, CPU, torch (rank 0; empty elsewhere)
    hooks: list[TrainerHook]
    # the parts
    model: torch.nn.Module  # what computes: the DDP wrapper under several processes
    module: torch.nn.Module  # the bare model: checkpoints and decoding use it
    optimizer: torch.optim.Optimizer
    average: WeightAverage | None  # trainer.average_decay
    rate: LearningRate
    stepper: TrainingStep
    writer: TensorBoard | None  # rank 0, while training
    # the data
    data: PreparedData
    fingerprints: dict | None  # data's (PreparedData.fingerprints), once computed
    train_split: EncodedSplit  # what the current epoch trains on
    sampler: TokenBatchSampler  # its batches
    # the progress
    step: int  # optimizer steps taken
    epoch: int
    batch_pos: int  # the next group of the epoch
    elapsed: float  # seconds of training, summed over resumes
    best: dict  # the best validation so far
    bad_validations: int  # in a row without improvement
    history: list[dict]  # every log line's and validation's numbers
    window: dict  # the loss, tokens and sentences since the last log line (its start: time)
    interrupted: bool  # a signal asked to stop
    resumes: list[dict]  # every resume: {step, checkpoint, changes {key: [old, new]}, breaks [keys], rank_seeds}
    resumed_with_changes: list[str]  # the keys that broke exactness, allowed at some resume
    last_resume_changes: list[Change]  # this process's resume's, for TensorBoard

    @property
    def amp(self) -> str: ...

    def use_epoch(self, epoch: int, again: bool = False) -> None: ...

    def _groups(self, epoch: int) -> list[list[list[int]]]: ...

    def _train_step(self, group: list[list[int]]) -> tuple[float | torch.Tensor | None, int, int]: ...

    def save(self, name: str, best: bool = False) -> Path | None: ...


class TrainerHook:
    """Observes a Trainer: override what you need. `seconds` is the wall clock of that step or validation."""

    def on_step(self, trainer: Run, seconds: float, sentences: int, tokens: int, skipped: bool) -> None:
        """After each optimizer step (`skipped`: its loss was not finite, so no update was made)."""

    def on_validation(self, trainer: Run, seconds: float) -> None:
        """After each validation (the periodic ones and the final one)."""
