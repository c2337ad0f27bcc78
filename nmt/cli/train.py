"""nmt-train: train an encoder-decoder with the composed Hydra config.

    nmt-train                                        # Bible de->en, Luong attention, default model
    nmt-train experiment=quick                       # the synthetic task, about a minute on a CPU
    nmt-train attention=bahdanau model.hidden_size=256 trainer.max_minutes=30
    nmt-train -m attention=none,bahdanau,luong       # one run directory per job
    torchrun --nproc_per_node=2 -m nmt.cli.train experiment=quick   # DistributedDataParallel

The run directory (hydra.run.dir, default outputs/<date>/<time>) receives .hydra/, train.log, tensorboard/,
checkpoints/{last,best}.pt, valid/*.hyp and metrics.json. Running again in the same directory
(trainer.resume=auto, the default), or with trainer.resume=<run dir or checkpoint>, continues where the last
checkpoint left off, exactly or not at all (nmt.resume; trainer.resume_changes=allow goes on anyway, recorded).
A run directory that holds checkpoints is never overwritten by a fresh run, or by another run resumed there,
unless trainer.overwrite=true. One trainer at a time holds a run directory (nmt.rundir.claim: a lock naming its
pid, taken before Hydra writes there by nmt.cli.callbacks); at start it repairs what a killed run left (rundir.tidy).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.cli.common import CONFIG_DIR, build_model_config, build_run, load_data, typed, user_errors
from nmt.cli.rerun import continue_interrupted, done_message, no_empty_run_dir, this_command
from nmt.cli.strict import strict_keys
from nmt.device import resolve_device
from nmt.errors import ConfigError
from nmt.resume import last_checkpoint
from nmt.rundir import claim, tidy
from nmt.threads import parse as parse_threads

log = logging.getLogger("nmt.train")


def resume_plan(value: str | None, run_dir: Path, overwrite: bool = False) -> tuple[str | None, list[Path]]:
    """(the checkpoint to resume from, or None for a fresh run; what trainer.overwrite deletes first).

    trainer.resume is auto (or null: the same), never, a run directory (its checkpoints/last.pt) or a checkpoint.
    auto continues this run directory's checkpoints/last.pt where there is one; never starts afresh. A fresh run,
    or a resume from another run's checkpoint, in a run directory that already holds checkpoints would overwrite
    them: refused, unless `overwrite`, which deletes this run directory's checkpoints, metrics.json, valid/ and
    tensorboard/ first.
    """
    source = None
    if value not in (None, "auto", "never"):
        p = Path(value)
        source = value
        if p.is_dir():
            candidate = p / "checkpoints" / "last.pt"
            if not candidate.exists():
                raise ConfigError(
                    f"trainer.resume={value}: no checkpoints/last.pt in that directory; "
                    "pass a run directory of nmt-train, a .pt file, or auto (this run directory's last checkpoint)"
                )
            source = str(candidate)
    elif value != "never" and not overwrite and last_checkpoint(run_dir):
        return str(last_checkpoint(run_dir)), []
    held = sorted((run_dir / "checkpoints").glob("*.pt"))
    if not held or (source is not None and run_dir.resolve() in Path(source).resolve().parents):
        return source, []  # nothing to overwrite, or a checkpoint of this run directory's own run
    names = ", ".join(p.name for p in held)
    if not overwrite:
        if source is None:
            raise ConfigError(
                f"{run_dir} holds checkpoints ({names}){'' if value == 'never' else ' but no checkpoints/last.pt'}, "
                "which a fresh run would overwrite; continue from one with trainer.resume=<its path>, train in a fresh "
                "directory (hydra.run.dir=...), or pass trainer.overwrite=true to delete them and start afresh"
            )
        raise ConfigError(
            f"{run_dir} already holds checkpoints of its own run ({names}), which resuming {source} there would "
            "overwrite; continue that run with trainer.resume=auto, resume the other one in a fresh directory "
            "(hydra.run.dir=...), or pass trainer.overwrite=true to delete them first"
        )
    stale = [*held, run_dir / "metrics.json", run_dir / "valid", run_dir / "tensorboard"]
    return source, [p for p in stale if p.exists()]


def delete(paths: list[Path]) -> None:
    """trainer.overwrite=true: remove a previous run's files (checkpoints, metrics.json, valid/, tensorboard/)."""
    if paths:
        log.warning("trainer.overwrite=true: deleting the previous run's %s", ", ".join(map(str, paths)))
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def init_distributed(device: str) -> tuple[int, int, int]:
    """(rank, world size, local rank) under torchrun; (0, 1, 0) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))


def shared_run_dir(run_dir: Path, rank: int, world: int) -> Path:
    """Rank 0's run directory, on every rank: each process resolves `${now:...}` itself, maybe a second apart.

    A different directory Hydra made for another rank (holding only .hydra/ and its log) is removed.
    """
    if world <= 1:
        return run_dir
    import torch.distributed as dist

    shared = [str(run_dir)]
    dist.broadcast_object_list(shared, src=0)
    main_dir = Path(shared[0])
    if rank != 0 and main_dir.resolve() != run_dir.resolve():
        if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", "train.log"}:
            shutil.rmtree(run_dir, ignore_errors=True)
    return main_dir


def train(cfg: DictConfig, run_dir: Path) -> dict:
    import torch

    from nmt.averaging import check_decay
    from nmt.trainer import TrainerConfig

    tcfg = typed(TrainerConfig, cfg.trainer, "trainer")  # checked before any process group or data
    check_decay(tcfg.average_decay)
    build_model_config(cfg.model, cfg.attention)
    device = resolve_device(cfg.device)
    rank, world, local_rank = init_distributed(device)
    if device == "cuda" and world > 1:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    run_dir = shared_run_dir(run_dir, rank, world)
    if rank == 0:
        claim(run_dir)  # held until this process exits (a no-op where nmt.cli.callbacks claimed it first)
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    parse_threads(tcfg.threads)  # checked now; the Trainer chooses the count (nmt.threads)
    if world > 1 and rank != 0:
        torch.distributed.barrier()  # rank 0 fills the cache first; the others then read it
    data = load_data(cfg)
    if world > 1 and rank == 0:
        torch.distributed.barrier()
    resume, stale = resume_plan(tcfg.resume, run_dir, tcfg.overwrite)
    if rank == 0:
        delete(stale)
        tidy(run_dir)
    trainer = build_run(cfg, run_dir, device, data, resume, rank, world)
    mcfg = trainer.module.config
    log.info("corpus %s: %s", data.corpus.name, ", ".join(f"{k} {len(v):,}" for k, v in data.encoded.items()))
    log.info(
        "model: %s attention (query %s), %s parameters, device %s, %d thread(s)%s",
        mcfg.attention,
        mcfg.attention_query,
        f"{trainer.module.num_parameters():,}",
        device,
        torch.get_num_threads(),
        f", {world} processes" if world > 1 else "",
    )
    if resume:
        log.info("resuming from %s", resume)
    summary = trainer.train()
    if rank == 0:  # an interrupted run: and the command that continues it
        interrupted = summary["stopped_by"] == "interrupted"
        print(done_message(summary, this_command(run_dir, world) if interrupted else None))
    if world > 1:  # leave together: a rank that tears gloo down while another still runs can abort at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


# a misspelt key: one line (nmt.cli.strict); the same command again continues an interrupted run (nmt.cli.rerun)
@strict_keys("train", then=continue_interrupted)
@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    OmegaConf.set_readonly(cfg, True)
    logging.raiseExceptions = False  # a log line train.log cannot take (a full disk) is dropped, not a traceback;
    # the run's next write (TensorBoard, a checkpoint) then says what is wrong, in one line (nmt.rundir)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with user_errors(), no_empty_run_dir(run_dir):  # a refused run leaves no directory behind
        train(cfg, run_dir)


if __name__ == "__main__":
    main()
