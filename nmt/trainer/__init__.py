"""Training: token-normalised steps, validation with BLEU, TensorBoard, checkpoints, exact resume.

    trainer = Trainer(model, data, TrainerConfig(...), OptimConfig(...), run_dir, device="cpu", seed=1234)
    summary = trainer.train()

The Trainer holds a run's state (the model, optimizer, progress and data) and its parts are modules, each one
concept, read top to bottom:

    config.py       TrainerConfig (trainer.*) and OptimConfig (optim.*), one comment per key; their check
    optimizer.py    Adam(W) and the learning rate of every step: warmup, the plateau schedule's cuts
    step.py         one optimizer step: forward, loss, backward, clipping, update; what runs where on the device
                    (precision, kernels, the device plan), chosen once
    loop.py         epochs of steps, the budgets, early stopping and signals; the log lines; the run's summary
    validate.py     validation every valid_every steps: the best checkpoint, the plateau, early stopping
    checkpoints.py  what a checkpoint holds, writing it, and resuming from it exactly

Tools that measure a run (scripts/benchmark.py, scripts/memory_trace.py) pass `hooks`: TrainerHook objects
told after every optimizer step and every validation, so they observe the loop without changing it.

Resuming from `last.pt` replays exactly what an uninterrupted run would have done on the same CPU:
the checkpoint holds the step, the epoch and the position in that epoch's batch order (which is a pure
function of seed and epoch), and the optimizer, scheduler and RNG states. It also records what exactness
depends on (Trainer.facts: settings, corpus and tokenizer fingerprints, world size, torch, device); a resume
whose run differs in any of these is refused or, with trainer.resume_changes=allow, recorded (nmt.resume).
Ctrl-C / SIGTERM finish the current step, save `last.pt` and exit. Under DistributedDataParallel every rank
trains on its share of each global batch; all ranks validate (identically) and only rank 0 writes files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from nmt.averaging import weight_average
from nmt.data import Batch, PreparedData
from nmt.device_plan import DevicePlan
from nmt.model import Seq2Seq
from nmt.provenance import provenance
from nmt.resume import Change, last_checkpoint
from nmt.rundir import TensorBoard
from nmt.sampler import TokenBatchSampler
from nmt.step_numbers import StepNumbers
from nmt.threads import Threads
from nmt.trainer import checkpoints, loop
from nmt.trainer.config import OptimConfig, TrainerConfig, checked
from nmt.trainer.optimizer import LearningRate, build_optimizer
from nmt.trainer.run import TrainerHook
from nmt.trainer.step import TrainingStep

__all__ = ["OptimConfig", "Trainer", "TrainerConfig", "TrainerHook"]


class Trainer:
    """A training run (nmt.trainer.run.Run: what it holds); its parts are this package's modules."""

    def __init__(
        self,
        model: Seq2Seq,
        data: PreparedData,
        config: TrainerConfig,
        optim: OptimConfig,
        run_dir: str | Path,
        device: str | torch.device = "cpu",
        seed: int = 1234,
        run_config: dict | None = None,
        rank: int = 0,
        world_size: int = 1,
        hooks: Sequence[TrainerHook] = (),
    ):
        config, optim = checked(config, optim)
        self.cfg, self.optim_cfg, self.data, self.seed = config, optim, data, seed
        self.run_dir, self.device = Path(run_dir), torch.device(device)
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.run_config = run_config or {}
        self.threads = Threads(config.threads)  # chosen and set now; kept on resume
        self.provenance = provenance(self.threads.count) if rank == 0 else {}  # commit, CPU, torch
        self.hooks = list(hooks)
        self.model = model.to(self.device)
        self.module = model  # the bare model (not the DDP wrapper): checkpoints and decoding use it
        if world_size > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(model)
        self.optimizer = build_optimizer(self.module, optim, self.device)
        self.average = weight_average(self.module, config.average_decay)
        self.rate = LearningRate(self.optimizer, optim, config.best_metric)
        self.use_epoch(0, again=True)
        self.stepper = TrainingStep(
            self.model, self.module, self.optimizer, self.device, world_size, config, self.threads
        )
        if self.provenance:
            self.provenance["plan"] = self.stepper.run_plan.record()  # in every checkpoint (nmt.plan)
        self._start_progress()

    def _start_progress(self) -> None:
        """The run's progress before its first step (all of it goes into checkpoints), and what it writes to."""
        self._epoch_groups: list[list[list[int]]] = []  # this epoch's groups (_groups): what is prepared ahead
        self.step = self.epoch = self.batch_pos = 0
        self.elapsed = 0.0
        self.best: dict = {}
        self.bad_validations = 0
        self.history: list[dict] = []
        # the loss accumulated since the last log line: checkpointed, so a resumed run logs the same averages
        self.window = {"loss": 0.0, "tokens": 0, "sentences": 0, "time": 0.0}
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.writer: TensorBoard | None = None
        self.interrupted = False  # a signal asked to stop (loop.stop_on_signals)
        self.fingerprints: dict | None = None  # self.data's (nmt.data.PreparedData.fingerprints), once computed
        # every resume of this run: {step, checkpoint, changes {key: [old, new]}, breaks [keys], rank_seeds}
        self.resumes: list[dict] = []
        self.resumed_with_changes: list[str] = []  # the keys that broke exactness, allowed at some resume
        self.last_resume_changes: list[Change] = []  # this process's resume's, for TensorBoard

    # ------------------------------------------------------------------------------ the step's choices
    @property
    def amp(self) -> str:
        """The precision trainer.amp resolved to: "bf16" (autocast) or "off"."""
        return self.stepper.amp

    @property
    def plan(self) -> DevicePlan:
        return self.stepper.plan

    @property
    def numbers(self) -> StepNumbers:
        return self.stepper.numbers

    @property
    def output_in_loss(self) -> bool:
        return self.stepper.output_in_loss

    def use_plan(self, plan: DevicePlan) -> None:
        """Train with `plan` (nmt.device_plan) instead of the device's own."""
        self.stepper.use_plan(plan)

    # ------------------------------------------------------------------------------------------ the run
    def train(self) -> dict:
        """Resume (trainer.resume), train until a stopping condition, validate the last step; the summary."""
        self.rate.start()
        resume = {"auto": last_checkpoint(self.run_dir), "never": None}.get(self.cfg.resume, self.cfg.resume)
        if resume:
            self.restore(resume)
        if self.is_main:
            self.writer = TensorBoard(self.run_dir / "tensorboard")
            if self.last_resume_changes:
                self.writer.add_text("resume", checkpoints.resume_text(self), self.step)
        with loop.stop_on_signals(self):
            reason = loop.run(self)
        summary = loop.finish(self, reason)
        if self.writer:
            self.writer.close()
        return summary

    def use_epoch(self, epoch: int, again: bool = False) -> None:
        """Set the training examples (new verse windows each epoch, else always the same) and their sampler;
        `again`: whatever was set before (the data changed)."""
        if not again and (self.data.corpus.window <= 1 or self._split_epoch == epoch):
            return
        self.train_split, self._split_epoch = self.data.train_split(epoch, self.seed), epoch
        self.sampler = TokenBatchSampler(
            self.train_split.src_lengths,
            self.train_split.tgt_lengths,
            self.cfg.batch_tokens,
            self.seed,
            True,
            self.rank,
            self.world_size,
            bucketing=self.cfg.bucketing,
        )

    def _groups(self, epoch: int) -> list[list[list[int]]]:
        """This rank's batches of `epoch`, grouped `accumulate` at a time, with each group's global target tokens."""
        self.use_epoch(epoch)
        local = self.sampler.batches(epoch)
        glob = self.sampler.global_batches(epoch) if self.world_size > 1 else local
        n = self.cfg.accumulate
        self._group_tokens = [
            int(sum(int(self.train_split.tgt_lengths[b].sum()) for b in glob[i : i + n]))
            for i in range(0, len(glob), n)
        ]
        self._epoch_groups = [local[i : i + n] for i in range(0, len(local), n)]
        return self._epoch_groups

    def _train_step(self, group: list[list[int]]) -> tuple[float | torch.Tensor | None, int, int]:
        """One optimizer step over `group`, the group at batch_pos of this epoch (nmt.trainer.step)."""
        self.rate.set(self.step)
        pos, ahead = self.batch_pos, self.stepper.plan.prefetch
        upcoming = self._epoch_groups[pos + 1 : pos + 1 + ahead]
        return self.stepper(self.train_split, group, upcoming, self._group_tokens[pos], self.step)

    def batch_loss(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """One batch's summed loss over its loss rows (N,), as a training step takes it."""
        return self.stepper.batch_loss(batch, rows)

    # ------------------------------------------------------------------------------------ checkpoints
    def facts(self, data: PreparedData | None = None) -> dict[str, object]:
        """What an exact resume depends on (nmt.trainer.checkpoints.facts)."""
        return checkpoints.facts(self, data)

    def state(self) -> dict:
        return checkpoints.state(self)

    def save(self, name: str, best: bool = False) -> Path | None:
        """checkpoints/<name> (and best.pt with `best`) from rank 0; every rank calls it under DDP."""
        return checkpoints.save(self, name, best)

    def restore(self, path: str | Path) -> None:
        """Continue from checkpoint `path`, or refuse (nmt.trainer.checkpoints.restore)."""
        checkpoints.restore(self, path)

    def _restore_random_state(self, data: dict) -> list[int] | None:
        return checkpoints.restore_random_state(data, self.seed, self.rank, self.world_size)
