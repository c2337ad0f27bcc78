"""The Trainer's settings (`trainer.*`: TrainerConfig, `optim.*`: OptimConfig), one comment per key, and their
check before anything is built (`checked`). docs/usage.md describes each in context."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nmt.choices import Amp, Bucketing, Kernels, Metric, Optimizer, ResumeChanges, Schedule, choice
from nmt.metrics import DEFAULT_EDGES, check_edges


@dataclass
class TrainerConfig:
    batch_tokens: int = 4096  # padded tokens per batch (max of source/target length x sentences)
    bucketing: Bucketing = Bucketing.exact  # exact (each batch's sources share one length: no encoder padding) | sorted
    accumulate: int = 1  # batches per optimizer step
    max_steps: int | None = None  # optimizer steps before stopping (null: no limit)
    max_epochs: int | None = 10  # passes over the training data before stopping (null: no limit)
    max_minutes: float | None = None  # wall-clock training budget, summed over resumes
    clip_norm: float = 1.0  # the gradients' global norm is clipped to this before each update
    label_smoothing: float = 0.1  # the probability spread over the vocabulary in the loss's target
    # an exponential moving average of the weights, what validation scores and checkpoints translate with
    # (nmt.averaging): its decay, 0.998 say; null: none
    average_decay: float | None = None
    valid_every: int = 500  # steps; validation also runs at the end
    valid_batch_tokens: int = 4000  # padded tokens per validation batch
    valid_max_sentences: int | None = None  # validate on N sentences spread over the split (None: all)
    patience: int = 8  # validations without improvement before stopping (0: never stop early)
    best_metric: Metric = Metric.bleu  # bleu | chrf | loss | ppl
    log_every: int = 50  # steps between log lines and TensorBoard's training scalars
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
    length_buckets: list[int] = field(default_factory=lambda: list(DEFAULT_EDGES))  # edges of BLEU by source length
    max_bad_steps: int = 5  # consecutive non-finite losses before giving up
    amp: Amp = Amp.auto  # auto (bf16 where the hardware has it: CUDA, CPUs with AVX-512 BF16/AMX) | bf16 | off
    # auto | eager (nmt.plan: each component's kernel where the plan finds it right; compiled: every one, insisted
    # on); nmt-train sets it from the top-level `kernels`, shared with decoding
    kernels: Kernels = Kernels.eager
    kernels_off: list[str] = field(
        default_factory=list
    )  # kernels turned off for measurement (nmt.plan.KERNEL_COMPONENTS)
    progress: bool = True  # the progress bar on the terminal (rank 0; off: the log lines only)


@dataclass
class OptimConfig:
    name: Optimizer = Optimizer.adam  # adam | adamw
    lr: float = 1e-3  # the learning rate (after warmup; the plateau schedule cuts it)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam's moment decays
    weight_decay: float = 0.0  # L2 (adam) or decoupled (adamw) weight decay
    schedule: Schedule = Schedule.constant  # constant | warmup | plateau
    warmup_steps: int = 0  # linear warmup (any schedule)
    plateau_factor: float = 0.5  # plateau: the rate is multiplied by this at a cut
    plateau_patience: int = 2  # plateau: validations without improvement before a cut
    min_lr: float = 1e-5  # plateau: the rate is never cut below this


def checked(config: TrainerConfig, optim: OptimConfig) -> tuple[TrainerConfig, OptimConfig]:
    """`config` and `optim` with their choices checked (a ConfigError naming the key) and kept as plain str: they
    go into checkpoints (read with weights_only=True). The length buckets fail now, not at the first validation."""
    check_edges(config.length_buckets, "trainer.length_buckets")
    config = replace(
        config,
        best_metric=choice(Metric, config.best_metric, "trainer.best_metric").value,
        bucketing=choice(Bucketing, config.bucketing, "trainer.bucketing").value,
        amp=choice(Amp, config.amp, "trainer.amp").value,
        kernels=choice(Kernels, config.kernels, "kernels").value,
        resume_changes=choice(ResumeChanges, config.resume_changes, "trainer.resume_changes").value,
    )
    optim = replace(
        optim,
        name=choice(Optimizer, optim.name, "optim.name").value,
        schedule=choice(Schedule, optim.schedule, "optim.schedule").value,
    )
    return config, optim
