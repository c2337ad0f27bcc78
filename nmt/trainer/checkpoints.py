"""What a training checkpoint holds, writing it, and resuming from one exactly.

    save(trainer, "last.pt", best=True)   # at every validation (best: also copied to best.pt) and on a signal
    restore(trainer, path)                # trainer.resume: continue where the checkpoint left off

A checkpoint holds the model (and its weight average), the optimizer, the learning rate's state, the progress
(step, epoch, position in the epoch's batch order, elapsed time, best, history, the log window) and every rank's
random state, so a resume replays what an uninterrupted run would have done. It also records what exactness
depends on (`facts`: settings, corpus and tokenizer fingerprints, world size, torch, device, precision, kernels,
threads); a resume whose run differs in any of these is refused or, with trainer.resume_changes=allow, recorded
(nmt.resume).
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from nmt.averaging import WeightAverage
from nmt.checkpoint import save_checkpoint
from nmt.choices import ResumeChanges
from nmt.data import PreparedData, tokenizer_fingerprints
from nmt.resume import Kind, check, compare, describe, flatten, rank_seeds, resumable
from nmt.rundir import keep_best
from nmt.tokenizer import Tokenizer
from nmt.trainer.run import Run

log = logging.getLogger(__name__)


def facts(t: Run, data: PreparedData | None = None) -> dict[str, object]:
    """What an exact resume depends on, as dotted keys (nmt.resume): the settings (trainer, optim, seed, the
    run config's other sections; model and attention as the model's config), the vocabulary sizes, world
    size, torch, device kind, precision and kernels, and the fingerprints of `data` (default: the run's)."""
    covered = ("trainer", "optim", "seed", "model", "attention")  # by the typed values below
    tree = {
        **{k: v for k, v in t.run_config.items() if k not in covered},
        "trainer": {k: v for k, v in asdict(t.cfg).items() if k != "resume"},  # where from: t.resumes
        "optim": asdict(t.optim_cfg),
        "seed": t.seed,
        "model": t.module.config.to_dict(),
        "src_vocab": t.module.src_vocab,
        "tgt_vocab": t.module.tgt_vocab,
        "world_size": t.world_size,
        "torch": str(torch.__version__),
        "device_kind": t.device.type,
        "precision": t.amp,
        "kernels": t.stepper.kernels,
        "threads": t.threads.count,  # the numbers depend on it (nmt.threads)
    }
    if data is None or data is t.data:
        if t.fingerprints is None:
            t.fingerprints = t.data.fingerprints()
        fingerprints = t.fingerprints
    else:
        fingerprints = data.fingerprints()
    return {**flatten(tree), **fingerprints}


def state(t: Run) -> dict:
    """Everything a checkpoint holds (this rank's random state)."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return {
        "model": t.module.state_dict(),
        "model_config": t.module.config.to_dict(),
        "src_vocab": t.module.src_vocab,
        "tgt_vocab": t.module.tgt_vocab,
        "config": t.run_config,
        "provenance": t.provenance,
        "spm_src": t.data.tokenizer.src_model,
        "spm_tgt": t.data.tokenizer.tgt_model,
        "optimizer": t.optimizer.state_dict(),
        **({"average": t.average.state(t.module)} if t.average else {}),
        **t.rate.state(),  # scheduler, base_lr
        "step": t.step,
        "epoch": t.epoch,
        "batch_pos": t.batch_pos,
        "elapsed": t.elapsed,
        "best": t.best,
        "bad_validations": t.bad_validations,
        "history": t.history,
        "rng": rng,
        "world_size": t.world_size,
        "window": {k: float(v) if k == "loss" else v for k, v in t.window.items() if k != "time"},
        "exactness": facts(t),
        "resumes": t.resumes,
        "resumed_with_changes": t.resumed_with_changes,
        "threads": t.threads.record(),
    }


def save(t: Run, name: str, best: bool = False) -> Path | None:
    """Write checkpoints/<name> from rank 0, and with `best` copy it to best.pt after (nmt.rundir: the order
    a kill at any instant leaves repairable); under DDP every rank calls this (it gathers RNG states)."""
    payload = state(t)
    if t.world_size > 1:  # each rank drew its own dropout masks: keep every rank's generator
        ranks: list = [None] * t.world_size
        dist.all_gather_object(ranks, payload["rng"])
        payload["rng_ranks"] = ranks
    if not t.is_main:
        return None
    path = t.ckpt_dir / name
    save_checkpoint(path, payload)
    if best:
        keep_best(t.run_dir)
    return path


def restore(t: Run, path: str | Path) -> None:
    """Continue from checkpoint `path`: refused (a CheckpointError naming every difference) when this run
    differs from the one that wrote it in a way that breaks exactness, unless trainer.resume_changes=allow."""
    path, data = resumable(path, t.cfg.resume_fallback)  # verified; trainer.resume_fallback: maybe another
    t.threads.resume(data)  # auto keeps the checkpoint's thread count: the numbers depend on it
    t.stepper.run_plan.put("threads", str(t.threads.count), t.threads.why)
    if t.provenance:  # the count this run computes with from here on
        t.provenance["threads"] = t.threads.count
        t.provenance["plan"] = t.stepper.run_plan.record()
    prepared = _encoded_with_tokenizer_of(t.data, data)
    ours = t.data.tokenizer  # the facts of this run as it was asked for: the tokenizer on disk
    now = {**facts(t, prepared), **tokenizer_fingerprints(ours.src_model, ours.tgt_model)}
    changes = compare(_saved_facts(path, data), now)
    check(changes, t.cfg.resume_changes == ResumeChanges.allow, path)
    breaks = [c.key for c in changes if c.kind is Kind.breaks]
    if breaks:
        log.warning(
            "resuming with trainer.resume_changes=allow (recorded); this run differs from the checkpoint's "
            "(checkpoint -> now) in %s",
            describe(changes),
        )
    elif changes:
        log.info("resuming; this run differs from the checkpoint's (checkpoint -> now) in %s", describe(changes))
    if prepared is not t.data:
        log.warning("the tokenizer on disk differs from the checkpoint's: training goes on with the checkpoint's")
        t.data, t.fingerprints = prepared, None
        t.use_epoch(data["epoch"], again=True)
    t.module.load_state_dict(data["model"])
    if t.average and data.get("average"):
        t.average.load(data["average"])
    elif t.average:  # averaging from this resume on: the average starts at the checkpoint's weights
        t.average = WeightAverage(t.module, t.average.decay)
    t.optimizer.load_state_dict(data["optimizer"])
    t.rate.load(data)
    t.step, t.epoch, t.batch_pos = data["step"], data["epoch"], data["batch_pos"]
    t.elapsed, t.best = data["elapsed"], data["best"]
    t.bad_validations, t.history = data["bad_validations"], data["history"]
    t.window.update(data["window"])
    seeds = restore_random_state(data, t.seed, t.rank, t.world_size)
    t.resumed_with_changes = sorted({*data.get("resumed_with_changes", []), *breaks})
    t.resumes = [
        *data.get("resumes", []),
        {
            "step": t.step,
            "checkpoint": str(path),
            "changes": {c.key: [c.old, c.new] for c in changes},
            "breaks": breaks,
            "rank_seeds": seeds,
        },
    ]
    t.last_resume_changes = changes
    log.info("resumed from %s at step %d (epoch %d, batch %d)", path, t.step, t.epoch, t.batch_pos)


def resume_text(t: Run) -> str:
    """The last resume's changes as a Markdown table, for TensorBoard's text tab."""
    resume = t.resumes[-1]
    rows = [f"| `{c.key}` | `{c.old}` | `{c.new}` | {c.kind.value} |" for c in t.last_resume_changes]
    head = f"resumed at step {resume['step']} from `{resume['checkpoint']}`"
    if resume["breaks"]:
        head += f", with changes that break exactness (trainer.resume_changes=allow): {', '.join(resume['breaks'])}"
    if resume["rank_seeds"]:
        head += f"; each rank seeded afresh: {resume['rank_seeds']}"
    return "\n".join([head, "", "| key | checkpoint | now | kind |", "|---|---|---|---|", *rows])


def restore_random_state(data: dict, seed: int, rank: int, world_size: int) -> list[int] | None:
    """This rank's saved random state; on another number of processes than the checkpoint's (allowed by
    then), a fresh seed for every rank instead (nmt.resume.rank_seeds), returned to be recorded."""
    if data.get("world_size", 1) != world_size:
        seeds = rank_seeds(seed, data["step"], world_size)
        torch.manual_seed(seeds[rank])  # the CPU's and every GPU's generator
        random.seed(seeds[rank])
        log.warning(
            "%d process(es) now, %d in the checkpoint: each rank seeded afresh (seeds %s, recorded)",
            world_size,
            data.get("world_size", 1),
            seeds,
        )
        return seeds
    ranks = data.get("rng_ranks") or [data["rng"]]
    rng = ranks[rank] if len(ranks) == world_size else data["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return None


def _saved_facts(path: str | Path, data: dict) -> dict[str, object]:
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


def _encoded_with_tokenizer_of(prepared: PreparedData, data: dict) -> PreparedData:
    """`prepared` (the run's data), encoded with checkpoint `data`'s tokenizer where the one on disk differs from
    it: the checkpoint's tokenizer always wins (whether the difference may be resumed at all is nmt.resume's call).
    Tokenizers of other vocabulary sizes do not fit the model: the data then stays as it is."""
    ours = prepared.tokenizer
    if (data["spm_src"], data["spm_tgt"]) == (ours.src_model, ours.tgt_model):
        return prepared
    theirs = Tokenizer(data["spm_src"], data["spm_tgt"])
    if (theirs.src_vocab_size, theirs.tgt_vocab_size) != (ours.src_vocab_size, ours.tgt_vocab_size):
        return prepared
    log.info("the tokenizer on disk is not the checkpoint's: encoding the corpus with the checkpoint's")
    return prepared.with_tokenizer(theirs)
