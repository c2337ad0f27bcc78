"""The training loop: token-normalised steps, validation with BLEU, TensorBoard, checkpoints, exact resume.

    trainer = Trainer(model, data, TrainerConfig(...), OptimConfig(...), run_dir, device="cpu", seed=1234)
    summary = trainer.train()

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

import logging
import math
import random
import signal
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from nmt.averaging import WeightAverage
from nmt.checkpoint import save_checkpoint
from nmt.choices import Amp, Bucketing, Kernels, Metric, Optimizer, ResumeChanges, Schedule, choice
from nmt.data import Batch, PreparedData, TokenBatchSampler, padding_overhead, tokenizer_fingerprints
from nmt.device import precision_choice, provenance
from nmt.device_batches import DeviceBatches
from nmt.device_plan import DevicePlan, choose_plan, imposed
from nmt.errors import NMTError
from nmt.kernels.compiled import choose_kernels, set_kernels
from nmt.loss import loss_sum, output_loss_sum
from nmt.memory import tune_for_fp32_training
from nmt.metrics import DEFAULT_EDGES, check_edges
from nmt.model import Seq2Seq
from nmt.progress import TrainingBar
from nmt.resume import Change, Kind, check, compare, describe, flatten, last_checkpoint, rank_seeds, resumable
from nmt.rundir import TensorBoard, keep_best, write_summary, write_text
from nmt.step_numbers import StepNumbers
from nmt.threads import Threads
from nmt.tokenizer import Tokenizer
from nmt.validation import evaluate_split

log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    batch_tokens: int = 4096  # padded tokens per batch (max of source/target length x sentences)
    bucketing: Bucketing = Bucketing.exact  # exact (each batch's sources share one length: no encoder padding) | sorted
    accumulate: int = 1  # batches per optimizer step
    max_steps: int | None = None
    max_epochs: int | None = 10
    max_minutes: float | None = None  # wall-clock training budget, summed over resumes
    clip_norm: float = 1.0
    label_smoothing: float = 0.1
    # an exponential moving average of the weights, what validation scores and checkpoints translate with
    # (nmt.averaging): its decay, 0.998 say; null: none
    average_decay: float | None = None
    valid_every: int = 500  # steps; validation also runs at the end
    valid_batch_tokens: int = 4000
    valid_max_sentences: int | None = None  # validate on N sentences spread over the split (None: all)
    patience: int = 8  # validations without improvement before stopping (0: never stop early)
    best_metric: Metric = Metric.bleu  # bleu | chrf | loss | ppl
    log_every: int = 50
    threads: str | None = "auto"  # auto (the cores other processes leave free) | adaptive | N | null (nmt.threads)
    # a checkpoint, a run directory (its checkpoints/last.pt), auto (null too): this run directory's last.pt if any,
    # or never: start afresh
    resume: str | None = None
    # refuse | allow: resume although the run differs in a setting exactness depends on (nmt.resume; then recorded)
    resume_changes: ResumeChanges = ResumeChanges.refuse
    # a corrupt checkpoint to resume from (cut off, or not matching its digest): false refuses it, true resumes from
    # the newest intact checkpoint beside it (best.pt for last.pt), saying so
    resume_fallback: bool = False
    # nmt-train: start afresh in a run directory that holds checkpoints (deleting them) instead of refusing to
    overwrite: bool = False
    heatmaps: int = 3  # validation sentences drawn to TensorBoard at every validation
    length_buckets: list[int] = field(default_factory=lambda: list(DEFAULT_EDGES))
    max_bad_steps: int = 5  # consecutive non-finite losses before giving up
    amp: Amp = Amp.auto  # auto (bf16 where the hardware has it: CUDA, CPUs with AVX-512 BF16/AMX) | bf16 | off
    # eager | auto (the decoder step's kernels compiled on a CPU with a C++ compiler) | auto_fp32 (auto where the
    # step runs in fp32, eager under bf16) | compiled
    kernels: Kernels = Kernels.eager
    progress: bool = True


@dataclass
class OptimConfig:
    name: Optimizer = Optimizer.adam  # adam | adamw
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    schedule: Schedule = Schedule.constant  # constant | warmup | plateau
    warmup_steps: int = 0  # linear warmup (any schedule)
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    min_lr: float = 1e-5


class Stop(Exception):
    """Raised inside the loop when a stopping condition is met."""


class TrainerHook:
    """Observes a Trainer: override what you need. `seconds` is the wall clock of that step or validation."""

    def on_step(self, trainer: Trainer, seconds: float, sentences: int, tokens: int, skipped: bool) -> None:
        """After each optimizer step (`skipped`: its loss was not finite, so no update was made)."""

    def on_validation(self, trainer: Trainer, seconds: float) -> None:
        """After each validation (the periodic ones and the final one)."""


class Trainer:
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
        check_edges(config.length_buckets, "trainer.length_buckets")  # fail now, not at the first validation
        # the choices checked, and kept as plain str: they go into checkpoints (read with weights_only=True)
        config = replace(
            config,
            best_metric=choice(Metric, config.best_metric, "trainer.best_metric").value,
            bucketing=choice(Bucketing, config.bucketing, "trainer.bucketing").value,
            amp=choice(Amp, config.amp, "trainer.amp").value,
            kernels=choice(Kernels, config.kernels, "trainer.kernels").value,
            resume_changes=choice(ResumeChanges, config.resume_changes, "trainer.resume_changes").value,
        )
        optim = replace(
            optim,
            name=choice(Optimizer, optim.name, "optim.name").value,
            schedule=choice(Schedule, optim.schedule, "optim.schedule").value,
        )
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
        self.optimizer = self._build_optimizer()
        self.average = WeightAverage(self.module, config.average_decay) if config.average_decay else None
        if self.average:
            log.info(
                "weights averaged over the steps (trainer.average_decay=%g): validation, best.pt and translations "
                "use the average, training steps from the weights",
                config.average_decay,
            )
        self.plateau = None
        if optim.schedule == "plateau":
            mode = "min" if config.best_metric in ("loss", "ppl") else "max"
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer,
                mode=mode,
                factor=optim.plateau_factor,
                patience=optim.plateau_patience,
                min_lr=optim.min_lr,
            )
        self._split_epoch: int | None = None
        self.use_epoch(0)
        bf16, why = precision_choice(config.amp, self.device.type, "trainer.amp")
        self.amp = "bf16" if bf16 else "off"  # resolved
        log.info(
            "precision: %s (%s); batches of %d tokens, %s bucketing",
            "bf16 autocast" if bf16 else "fp32",
            why,
            config.batch_tokens,
            config.bucketing,
        )
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
        # fp32 on a CPU: the output layer runs inside the loss, a piece of rows at a time (nmt.loss.output_loss_sum),
        # and glibc maps tensors of 16 MiB and more on their own (nmt.memory.tune_for_fp32_training)
        self.output_in_loss = self.device.type == "cpu" and not bf16
        if self.output_in_loss and (malloc := tune_for_fp32_training()):
            sizes = (f"{k.removeprefix('fp32 training: malloc ')} {int(v) >> 20} MiB" for k, v in malloc.items())
            log.info("glibc malloc for fp32 training: %s", ", ".join(sizes))
        why = choose_kernels(config.kernels, self.device, bf16)[1]
        self.kernels = set_kernels(config.kernels, self.device, bf16).value  # resolved (nmt.kernels.compiled)
        log.info("kernels: %s (%s)", self.kernels, why)
        plan, why = choose_plan(self.device)
        log.info("device plan: %s", why)
        self.use_plan(plan)
        self._epoch_groups: list[list[list[int]]] = []  # this epoch's groups (_groups): what the feed prepares ahead
        # progress (all of it goes into checkpoints)
        self.step = self.epoch = self.batch_pos = 0
        self.elapsed = 0.0
        self.best: dict = {}
        self.bad_validations = 0
        self.history: list[dict] = []
        # the loss accumulated since the last log line: checkpointed, so a resumed run logs the same averages
        self.window = {"loss": 0.0, "tokens": 0, "sentences": 0, "time": 0.0}
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.writer = None
        self._interrupted = False
        self._fingerprints: dict | None = None  # self.data's (nmt.data.PreparedData.fingerprints), once computed
        # every resume of this run: {step, checkpoint, changes {key: [old, new]}, breaks [keys], rank_seeds}
        self.resumes: list[dict] = []
        self.resumed_with_changes: list[str] = []  # the keys that broke exactness, allowed at some resume
        self._resume_changes: list[Change] = []  # this process's resume's, for TensorBoard

    # ------------------------------------------------------------------------------------------ setup
    def use_plan(self, plan: DevicePlan) -> None:
        """Train with `plan` (nmt.device_plan): how a step's work is cut, how its batches are fed, and when its
        numbers are read."""
        self.plan, self.feed, self.numbers = plan, DeviceBatches(plan, self.device), StepNumbers(plan.deferred_checks)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        o = self.optim_cfg
        kind = {Optimizer.adam: torch.optim.Adam, Optimizer.adamw: torch.optim.AdamW}[o.name]
        fused = self.device.type in ("cpu", "cuda")  # one kernel over all parameters instead of a loop
        return kind(
            self.module.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=fused or None
        )

    def _lr_now(self) -> float:
        base = self.optimizer.param_groups[0].get("base_lr", self.optim_cfg.lr)
        if self.optim_cfg.warmup_steps and self.step < self.optim_cfg.warmup_steps:
            return base * (self.step + 1) / self.optim_cfg.warmup_steps
        return base

    def _set_lr(self) -> None:
        lr = self._lr_now()
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    # ------------------------------------------------------------------------------------ checkpoints
    def facts(self, data: PreparedData | None = None) -> dict[str, object]:
        """What an exact resume depends on, as dotted keys (nmt.resume): the settings (trainer, optim, seed, the
        run config's other sections; model and attention as the model's config), the vocabulary sizes, world
        size, torch, device kind, precision and kernels, and the fingerprints of `data` (default: this run's)."""
        covered = ("trainer", "optim", "seed", "model", "attention")  # by the typed values below
        tree = {
            **{k: v for k, v in self.run_config.items() if k not in covered},
            "trainer": {k: v for k, v in asdict(self.cfg).items() if k != "resume"},  # where from: self.resumes
            "optim": asdict(self.optim_cfg),
            "seed": self.seed,
            "model": self.module.config.to_dict(),
            "src_vocab": self.module.src_vocab,
            "tgt_vocab": self.module.tgt_vocab,
            "world_size": self.world_size,
            "torch": str(torch.__version__),
            "device_kind": self.device.type,
            "precision": self.amp,
            "kernels": self.kernels,
            "threads": self.threads.count,  # the numbers depend on it (nmt.threads)
        }
        if data is None or data is self.data:
            if self._fingerprints is None:
                self._fingerprints = self.data.fingerprints()
            fingerprints = self._fingerprints
        else:
            fingerprints = data.fingerprints()
        return {**flatten(tree), **fingerprints}

    def state(self) -> dict:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "model": self.module.state_dict(),
            "model_config": self.module.config.to_dict(),
            "src_vocab": self.module.src_vocab,
            "tgt_vocab": self.module.tgt_vocab,
            "config": self.run_config,
            "provenance": self.provenance,
            "spm_src": self.data.tokenizer.src_model,
            "spm_tgt": self.data.tokenizer.tgt_model,
            "optimizer": self.optimizer.state_dict(),
            **({"average": self.average.state(self.module)} if self.average else {}),
            "scheduler": self.plateau.state_dict() if self.plateau else {},
            "base_lr": [g.get("base_lr", self.optim_cfg.lr) for g in self.optimizer.param_groups],
            "step": self.step,
            "epoch": self.epoch,
            "batch_pos": self.batch_pos,
            "elapsed": self.elapsed,
            "best": self.best,
            "bad_validations": self.bad_validations,
            "history": self.history,
            "rng": rng,
            "world_size": self.world_size,
            "window": {k: float(v) if k == "loss" else v for k, v in self.window.items() if k != "time"},
            "exactness": self.facts(),
            "resumes": self.resumes,
            "resumed_with_changes": self.resumed_with_changes,
            "threads": self.threads.record(),
        }

    def save(self, name: str, best: bool = False) -> Path | None:
        """Write checkpoints/<name> from rank 0, and with `best` copy it to best.pt after (nmt.rundir: the order
        a kill at any instant leaves repairable); under DDP every rank calls this (it gathers RNG states)."""
        state = self.state()
        if self.world_size > 1:  # each rank drew its own dropout masks: keep every rank's generator
            ranks: list = [None] * self.world_size
            dist.all_gather_object(ranks, state["rng"])
            state["rng_ranks"] = ranks
        if not self.is_main:
            return None
        path = self.ckpt_dir / name
        save_checkpoint(path, state)
        if best:
            keep_best(self.run_dir)
        return path

    def restore(self, path: str | Path) -> None:
        """Continue from checkpoint `path`: refused (a CheckpointError naming every difference) when this run
        differs from the one that wrote it in a way that breaks exactness, unless trainer.resume_changes=allow."""
        path, data = resumable(path, self.cfg.resume_fallback)  # verified; trainer.resume_fallback: maybe another
        self.threads.resume(data)  # auto keeps the checkpoint's thread count: the numbers depend on it
        if self.provenance:  # the count this run computes with from here on
            self.provenance["threads"] = self.threads.count
        prepared = self._encoded_with_tokenizer_of(data)
        ours = self.data.tokenizer  # the facts of this run as it was asked for: the tokenizer on disk
        now = {**self.facts(prepared), **tokenizer_fingerprints(ours.src_model, ours.tgt_model)}
        changes = compare(self._saved_facts(path, data), now)
        check(changes, self.cfg.resume_changes == ResumeChanges.allow, path)
        breaks = [c.key for c in changes if c.kind is Kind.breaks]
        if breaks:
            log.warning(
                "resuming with trainer.resume_changes=allow (recorded); this run differs from the checkpoint's "
                "(checkpoint -> now) in %s",
                describe(changes),
            )
        elif changes:
            log.info("resuming; this run differs from the checkpoint's (checkpoint -> now) in %s", describe(changes))
        if prepared is not self.data:
            log.warning("the tokenizer on disk differs from the checkpoint's: training goes on with the checkpoint's")
            self.data, self._fingerprints, self._split_epoch = prepared, None, None
            self.use_epoch(data["epoch"])
        self.module.load_state_dict(data["model"])
        if self.average and data.get("average"):
            self.average.load(data["average"])
        elif self.average:  # averaging from this resume on: the average starts at the checkpoint's weights
            self.average = WeightAverage(self.module, self.average.decay)
        self.optimizer.load_state_dict(data["optimizer"])
        for g, base in zip(self.optimizer.param_groups, data["base_lr"], strict=True):
            g["base_lr"] = base
        if self.plateau and data["scheduler"]:
            self.plateau.load_state_dict(data["scheduler"])
        self.step, self.epoch, self.batch_pos = data["step"], data["epoch"], data["batch_pos"]
        self.elapsed, self.best = data["elapsed"], data["best"]
        self.bad_validations, self.history = data["bad_validations"], data["history"]
        self.window.update(data["window"])
        seeds = self._restore_random_state(data)
        self.resumed_with_changes = sorted({*data.get("resumed_with_changes", []), *breaks})
        self.resumes = [
            *data.get("resumes", []),
            {
                "step": self.step,
                "checkpoint": str(path),
                "changes": {c.key: [c.old, c.new] for c in changes},
                "breaks": breaks,
                "rank_seeds": seeds,
            },
        ]
        self._resume_changes = changes
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.step, self.epoch, self.batch_pos)

    def _saved_facts(self, path: str | Path, data: dict) -> dict[str, object]:
        """The facts checkpoint `data` recorded; for an older checkpoint, what it still tells (a warning)."""
        if "exactness" in data:
            return data["exactness"]
        log.warning(
            "%s: written before checkpoints recorded what an exact resume depends on (corpus fingerprints, "
            "batching, seed, ...): exactness cannot be checked; only the model, the tokenizer and the number of "
            "processes are compared",
            path,
        )
        return {
            **flatten({"model": data["model_config"]}),
            "src_vocab": data["src_vocab"],
            "tgt_vocab": data["tgt_vocab"],
            "world_size": data.get("world_size", 1),
            **tokenizer_fingerprints(data["spm_src"], data["spm_tgt"]),
        }

    def _encoded_with_tokenizer_of(self, data: dict) -> PreparedData:
        """This run's data, encoded with checkpoint `data`'s tokenizer where the one on disk differs from it: the
        checkpoint's tokenizer always wins (whether the difference may be resumed at all is nmt.resume's call).
        Tokenizers of other vocabulary sizes do not fit the model: the data then stays as it is."""
        ours = self.data.tokenizer
        if (data["spm_src"], data["spm_tgt"]) == (ours.src_model, ours.tgt_model):
            return self.data
        theirs = Tokenizer(data["spm_src"], data["spm_tgt"])
        if (theirs.src_vocab_size, theirs.tgt_vocab_size) != (ours.src_vocab_size, ours.tgt_vocab_size):
            return self.data
        log.info("the tokenizer on disk is not the checkpoint's: encoding the corpus with the checkpoint's")
        return self.data.with_tokenizer(theirs)

    def _restore_random_state(self, data: dict) -> list[int] | None:
        """This rank's saved random state; on another number of processes than the checkpoint's (allowed by
        then), a fresh seed for every rank instead (nmt.resume.rank_seeds), returned to be recorded."""
        if data.get("world_size", 1) != self.world_size:
            seeds = rank_seeds(self.seed, data["step"], self.world_size)
            torch.manual_seed(seeds[self.rank])  # the CPU's and every GPU's generator
            random.seed(seeds[self.rank])
            log.warning(
                "%d process(es) now, %d in the checkpoint: each rank seeded afresh (seeds %s, recorded)",
                self.world_size,
                data.get("world_size", 1),
                seeds,
            )
            return seeds
        ranks = data.get("rng_ranks") or [data["rng"]]
        rng = ranks[self.rank] if len(ranks) == self.world_size else data["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return None

    # ------------------------------------------------------------------------------------------ loop
    def train(self) -> dict:
        for g in self.optimizer.param_groups:
            g.setdefault("base_lr", g["lr"])
        resume = {"auto": last_checkpoint(self.run_dir), "never": None}.get(self.cfg.resume, self.cfg.resume)
        if resume:
            self.restore(resume)
        if self.is_main:
            self.writer = TensorBoard(self.run_dir / "tensorboard")
            if self._resume_changes:
                self.writer.add_text("resume", self._resume_text(), self.step)
        handlers = self._install_signal_handlers()
        try:
            reason = self._loop()
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)
        summary = self._finish(reason)
        if self.writer:
            self.writer.close()
        return summary

    def _resume_text(self) -> str:
        """This resume's changes as a Markdown table, for TensorBoard's text tab."""
        resume = self.resumes[-1]
        rows = [f"| `{c.key}` | `{c.old}` | `{c.new}` | {c.kind.value} |" for c in self._resume_changes]
        head = f"resumed at step {resume['step']} from `{resume['checkpoint']}`"
        if resume["breaks"]:
            head += f", with changes that break exactness (trainer.resume_changes=allow): {', '.join(resume['breaks'])}"
        if resume["rank_seeds"]:
            head += f"; each rank seeded afresh: {resume['rank_seeds']}"
        return "\n".join([head, "", "| key | checkpoint | now | kind |", "|---|---|---|---|", *rows])

    def _install_signal_handlers(self) -> dict:
        def handler(signum, frame):
            if self._interrupted:  # a second Ctrl-C: stop now (last.pt from the last save stays valid)
                raise KeyboardInterrupt
            self._interrupted = True
            log.warning("signal %d: finishing this step, saving last.pt, then stopping (again to abort)", signum)

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (e.g. tests): leave signals alone
                pass
        return old

    def _budget_left(self, started: float) -> bool:
        if self.cfg.max_minutes is None:
            return True
        return self.elapsed + (time.time() - started) < self.cfg.max_minutes * 60

    def _loop(self) -> str:
        c = self.cfg
        started = time.time()
        steps_per_epoch = math.ceil(len(self.sampler) / c.accumulate)
        total = c.max_steps or (steps_per_epoch * c.max_epochs if c.max_epochs else None)
        bar = TrainingBar(total, self.step, c.max_minutes, self.elapsed, self.is_main and c.progress)
        window = self.window
        window["time"] = time.time()
        reason = "max_epochs"
        real = padded = 0
        try:
            while c.max_epochs is None or self.epoch < c.max_epochs:
                groups = self._groups(self.epoch)
                r, p = padding_overhead(self.train_split, [b for g in groups for b in g])
                real, padded = real + r, padded + p
                while self.batch_pos < len(groups):
                    if c.max_steps is not None and self.step >= c.max_steps:
                        raise Stop("max_steps")
                    if self._any_rank(not self._budget_left(started)):
                        raise Stop("max_minutes")
                    step_start = time.perf_counter()
                    loss_sum, n_tok, n_sent = self._train_step(groups[self.batch_pos])
                    step_seconds = time.perf_counter() - step_start
                    self.batch_pos += 1
                    if loss_sum is not None:
                        self.step += 1
                        if self.average:
                            self.average.update(self.module, self.step)
                        window["loss"] += loss_sum
                        window["tokens"] += n_tok
                        window["sentences"] += n_sent
                        bar.advance(self.elapsed + time.time() - started)
                    for hook in self.hooks:  # trainer.step is the step just taken
                        hook.on_step(self, step_seconds, n_sent, n_tok, loss_sum is None)
                    if self.step % c.log_every == 0 and window["tokens"]:
                        self._log_train(window, bar)
                    if self.step % c.valid_every == 0 and loss_sum is not None:
                        self.elapsed += time.time() - started
                        started = time.time()
                        if self._validate():  # its time counts in the budget with the next update
                            raise Stop("early_stopping")
                    if self._any_rank(self._interrupted):
                        raise Stop("interrupted")
                self.epoch += 1
                self.batch_pos = 0
                if self.is_main:
                    log.info(
                        "epoch %d done at step %d; padding overhead %.3fx (padded/real tokens)",
                        self.epoch,
                        self.step,
                        padded / max(real, 1),
                    )
        except Stop as s:
            reason = str(s)
        finally:
            self.elapsed += time.time() - started
            bar.close()
        return reason

    def _any_rank(self, flag: bool) -> bool:
        """`flag` on any rank. Under DDP all ranks call this at the same point: they stop at the same step."""
        if self.world_size == 1:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t)
        return bool(t.item())

    def use_epoch(self, epoch: int) -> None:
        """Set the training examples (new verse windows each epoch, else always the same) and their sampler."""
        if self._split_epoch is not None and (self.data.corpus.window <= 1 or self._split_epoch == epoch):
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
        """One optimizer step over `group`; returns (summed loss, tokens, sentences) or (None, ...) if skipped.
        The loss is a float, or a 0-dim device tensor where the plan reads it only when logging (nmt.step_numbers).
        """
        self.model.train()
        total_tokens = self._group_tokens[self.batch_pos]
        self._set_lr()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, n_sent = torch.zeros((), device=self.device), 0
        upcoming = self._epoch_groups[self.batch_pos + 1 : self.batch_pos + 1 + self.plan.prefetch]
        with imposed(self.plan.work):  # the loss's and the energy's pieces (nmt.device_plan)
            # each batch on the device with its loss rows, the real target positions and a few padded ones: (N,)
            for batch, rows in self.feed.take(self.train_split, group, upcoming):
                loss = self.batch_loss(batch, rows)
                # DDP averages gradients over ranks; scaling by world_size makes that a sum over the global batch
                (loss * self.world_size / total_tokens).backward()
                loss_total += loss.detach()
                n_sent += len(batch.indices)
        if self.world_size > 1:
            dist.all_reduce(loss_total)
        grad_norm = self.numbers.clip(self.module.parameters(), self.cfg.clip_norm)  # clip_grad_norm_
        if not self.numbers.admit(self.optimizer, loss_total, grad_norm):
            self._bad_steps = getattr(self, "_bad_steps", 0) + 1
            log.warning("step %d: non-finite loss or gradient; skipped (%d in a row)", self.step + 1, self._bad_steps)
            self.optimizer.zero_grad(set_to_none=True)
            if self._bad_steps >= self.cfg.max_bad_steps:
                raise NMTError(
                    f"training diverged: {self._bad_steps} non-finite steps in a row at step {self.step}; "
                    "lower optim.lr or trainer.clip_norm, or resume from checkpoints/last.pt"
                )
            return None, 0, 0
        self._bad_steps = 0
        self.optimizer.step()
        self._last_grad_norm = self.numbers.value(grad_norm)
        return self.numbers.value(loss_total), total_tokens, n_sent * self.world_size

    def batch_loss(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """One batch's summed loss over its loss rows (N,) (nmt.loss.rows_of_lengths), as training takes it:
        under the run's autocast, and in fp32 on a CPU with the output layer inside the loss (`output_in_loss`)."""
        target, fused = batch.tgt_out.reshape(-1)[rows], self.output_in_loss  # (N,)
        with self.autocast():
            out, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in, rows, batch.tgt_lengths, not fused)
        if fused:  # out: the output layer's input (N, H)
            return output_loss_sum(out, self.module.decoder.output, target, self.cfg.label_smoothing)
        return loss_sum(out, target, self.cfg.label_smoothing)  # out: the logits (N, V)

    def _log_train(self, window: dict, bar: TrainingBar) -> None:
        self.numbers.check(self.cfg.max_bad_steps, self.step)  # a plan that reads the step's numbers only now
        window["loss"], self._last_grad_norm = float(window["loss"]), float(self._last_grad_norm)
        now = time.time()
        loss = window["loss"] / window["tokens"]
        tps = window["tokens"] / max(now - window["time"], 1e-9)
        sps = window["sentences"] / max(now - window["time"], 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:.0f}", lr=f"{lr:.2e}")
        entry = {
            "kind": "train",
            "step": self.step,
            "epoch": self.epoch,
            "loss": round(loss, 6),
            "lr": lr,
            "grad_norm": round(self._last_grad_norm, 4),
            "tokens_per_s": round(tps, 1),
            "sentences_per_s": round(sps, 2),
        }
        self.history.append(entry)
        if self.writer:
            for k in ("loss", "lr", "grad_norm", "tokens_per_s", "sentences_per_s"):
                self.writer.add_scalar(f"train/{k}", entry[k], self.step)
            log.info(
                "step %d epoch %d loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f",
                self.step,
                self.epoch,
                loss,
                lr,
                self._last_grad_norm,
                tps,
            )
        window.update(loss=0.0, tokens=0, sentences=0, time=now)
        self.threads.adapt(self.step)  # trainer.threads=adaptive only

    # ------------------------------------------------------------------------------------ validation
    def _validate(self) -> bool:
        """Validate, log, checkpoint (and tell the hooks); True when early stopping says stop."""
        start = time.perf_counter()
        try:
            return self._validate_once()
        finally:
            for hook in self.hooks:
                hook.on_validation(self, time.perf_counter() - start)

    def _validate_once(self) -> bool:
        with self.average.applied(self.module) if self.average else nullcontext():
            metrics = evaluate_split(
                self.module,
                self.data,
                "valid",
                self.device,
                self.cfg.valid_batch_tokens,
                self.cfg.length_buckets,
                self.cfg.valid_max_sentences,
                self.autocast,
                heatmaps=self.cfg.heatmaps if self.writer else 0,
            )
        if self.world_size > 1:  # GPU kernels need not agree to the last bit: rank 0's numbers decide for all
            shared = [{k: metrics[k] for k in ("loss", "ppl", "bleu", "chrf", "by_length")}]
            dist.broadcast_object_list(shared, src=0)
            metrics.update(shared[0])
        metric = metrics[self.cfg.best_metric]
        lower_better = self.cfg.best_metric in ("loss", "ppl")
        improved = not self.best or (metric < self.best["value"] if lower_better else metric > self.best["value"])
        entry = {
            "kind": "valid",
            "step": self.step,
            "epoch": self.epoch,
            "elapsed": round(self.elapsed, 1),
            **{k: metrics[k] for k in ("loss", "ppl", "bleu", "chrf")},
            "by_length": metrics["by_length"],
        }
        self.history.append(entry)
        if self.plateau:
            before = [g["lr"] for g in self.optimizer.param_groups]
            self.plateau.step(metric)
            for g, lr in zip(self.optimizer.param_groups, before, strict=True):
                if g["lr"] < lr:  # cut: cut the base rate alike (during warmup g["lr"] is only a part of it)
                    g["base_lr"] *= g["lr"] / lr
        if improved:
            self.bad_validations = 0
            self.best = {
                "metric": self.cfg.best_metric,
                "value": metric,
                "step": self.step,
                "epoch": self.epoch,
                **{k: metrics[k] for k in ("loss", "ppl", "bleu", "chrf")},
            }
        else:
            self.bad_validations += 1
        if self.is_main:
            self._report_validation(entry, metrics)
        self.save("last.pt", best=improved)
        return bool(self.cfg.patience) and self.bad_validations >= self.cfg.patience

    def _report_validation(self, entry: dict, metrics: dict) -> None:
        step = self.step
        log.info(
            "validation at step %d%s: loss %.4f ppl %.2f BLEU %.2f chrF %.2f%s",
            step,
            " (averaged weights)" if self.average else "",
            entry["loss"],
            entry["ppl"],
            entry["bleu"],
            entry["chrf"],
            " (new best)" if self.best.get("step") == step else "",
        )
        for k in ("loss", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{k}", entry[k], step)
        for row in entry["by_length"]:
            if row["bleu"] is not None:
                self.writer.add_scalar(f"valid_bleu_by_length/{row['bucket']}", row["bleu"], step)
        for i, fig in enumerate(metrics["figures"]):
            self.writer.add_figure(f"attention/valid_{i}", fig, step)
        for i, fig in enumerate(metrics.get("self_figures", [])):  # model.self_attention_layers > 0
            self.writer.add_figure(f"self_attention/valid_{i}", fig, step)
        write_text(self.run_dir / "valid" / f"step_{step:07d}.hyp", "".join(h + "\n" for h in metrics["hypotheses"]))
        self.writer.flush()

    def _finish(self, reason: str) -> dict:
        if reason != "early_stopping" and (
            not self.history or self.history[-1].get("kind") != "valid" or self.history[-1]["step"] != self.step
        ):
            if reason == "interrupted":
                self.save("last.pt")
            else:
                self._validate()
        summary = {
            "stopped_by": reason,
            "step": self.step,
            "epoch": self.epoch,
            "train_minutes": round(self.elapsed / 60, 2),
            "best": self.best,
            "final": next((h for h in reversed(self.history) if h["kind"] == "valid"), None),
            "best_checkpoint": str(self.ckpt_dir / "best.pt"),
            "last_checkpoint": str(self.ckpt_dir / "last.pt"),
            "parameters": self.module.num_parameters(),
            "threads": self.threads.record(),
        }
        if self.is_main:
            write_summary(self.run_dir, summary)
        return summary
