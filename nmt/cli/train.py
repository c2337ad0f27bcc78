"""nmt-train: train an encoder-decoder with the composed Hydra config.

    nmt-train                                        # Bible de->en, Luong attention, default model
    nmt-train experiment=quick                       # the synthetic task, about a minute on a CPU
    nmt-train attention=bahdanau model.hidden_size=256 trainer.max_minutes=30
    nmt-train -m attention=none,bahdanau,luong       # one run directory per job
    torchrun --nproc_per_node=2 -m nmt.cli.train experiment=quick   # DistributedDataParallel

The run directory (hydra.run.dir, default outputs/<date>/<time>) receives .hydra/, train.log, tensorboard/,
checkpoints/{last,best}.pt, valid/*.hyp and metrics.json. Running again in the same directory, or with
trainer.resume=<run dir or checkpoint>, continues where the last checkpoint left off.
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
from nmt.device import resolve_device
from nmt.errors import ConfigError

log = logging.getLogger("nmt.train")


def resume_path(value: str | None, run_dir: Path) -> str | None:
    """The checkpoint to resume from: trainer.resume (a checkpoint or a run dir), else this run dir's last.pt."""
    if value:
        p = Path(value)
        if p.is_dir():
            candidate = p / "checkpoints" / "last.pt"
            if not candidate.exists():
                raise ConfigError(
                    f"trainer.resume={value}: no checkpoints/last.pt in that directory; "
                    "pass a run directory of nmt-train or a .pt file"
                )
            return str(candidate)
        return value
    last = run_dir / "checkpoints" / "last.pt"
    return str(last) if last.exists() else None


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

    from nmt.trainer import TrainerConfig

    tcfg = typed(TrainerConfig, cfg.trainer, "trainer")  # checked before any process group or data
    build_model_config(cfg.model, cfg.attention)
    device = resolve_device(cfg.device)
    rank, world, local_rank = init_distributed(device)
    if device == "cuda" and world > 1:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    run_dir = shared_run_dir(run_dir, rank, world)
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    if world > 1 and rank != 0:
        torch.distributed.barrier()  # rank 0 fills the cache first; the others then read it
    data = load_data(cfg)
    if world > 1 and rank == 0:
        torch.distributed.barrier()
    resume = resume_path(tcfg.resume, run_dir)
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
    if rank == 0:
        best = summary["best"]
        print(
            f"done ({summary['stopped_by']}) after {summary['step']} steps, {summary['epoch']} epochs, "
            f"{summary['train_minutes']} min; best {best.get('metric')} at step {best.get('step')}: "
            f"BLEU {best.get('bleu')} chrF {best.get('chrf')} ppl {best.get('ppl')} -> {summary['best_checkpoint']}"
        )
    if world > 1:  # leave together: a rank that tears gloo down while another still runs can abort at exit
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    OmegaConf.set_readonly(cfg, True)
    with user_errors():
        train(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
