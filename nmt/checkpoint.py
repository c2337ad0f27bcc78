"""Self-describing checkpoints, written atomically and read safely.

A checkpoint holds plain tensors and primitives only: model weights, the model config, the resolved
run config, both SentencePiece models (bytes), step/epoch/sampler position, optimizer, scheduler and
RNG states. It is written to a temporary file and renamed, so a kill during a save never leaves a broken
file, and read with `torch.load(weights_only=True)`, so nothing in it is ever executed.

    save_checkpoint(path, payload)
    payload = load_checkpoint(path)           # CheckpointError with a clear message on any problem
    model, tokenizer = model_from_checkpoint(payload)
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from nmt.errors import CheckpointError
from nmt.model import MODEL_VERSION, ModelConfig, Seq2Seq
from nmt.tokenizer import Tokenizer

FORMAT = "nmt-checkpoint"
FORMAT_VERSION = 1


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` (plus format markers) to `path` atomically: temp file, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = {"format": FORMAT, "format_version": FORMAT_VERSION, "model_version": MODEL_VERSION, **payload}
    try:
        with open(tmp, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = " (the previous checkpoint there is intact)" if path.exists() else ""
        raise CheckpointError(f"{path}: could not write the checkpoint: {e.strerror or e}{kept}; free disk space "
                              "or choose another run directory with hydra.run.dir=...") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by `save_checkpoint`; any other file gets a CheckpointError saying why."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint; pass the path of a .pt file, e.g. "
                              "outputs/<date>/<time>/checkpoints/best.pt")
    if path.is_dir():
        found = sorted(str(p) for p in path.glob("**/*.pt"))[:3]
        hint = f" such as {', '.join(found)}" if found else ""
        raise CheckpointError(f"{path}: is a directory, not a checkpoint; pass a .pt file{hint}")
    try:
        data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: not an nmt checkpoint (unreadable, or holding objects other than tensors "
                              "and plain values, which are never loaded); pass a checkpoint written by nmt-train") from None
    except Exception as e:  # torch reports a cut-off zip, a foreign pickle or random bytes in many ways
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint, or not a checkpoint at all "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else 'unreadable'}); "
                              "use another checkpoint, e.g. checkpoints/best.pt or last.pt") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an nmt checkpoint; pass a checkpoint written by nmt-train")
    if data.get("model_version") != MODEL_VERSION or data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by an incompatible version (model version {data.get('model_version')}, this is "
            f"{MODEL_VERSION}); evaluate it with the nmt version that trained it, or retrain"
        )
    return data


def model_from_checkpoint(data: dict, device: str | torch.device = "cpu") -> tuple[Seq2Seq, Tokenizer]:
    """Rebuild the model (in eval mode) and tokenizer a checkpoint describes."""
    tokenizer = Tokenizer(data["spm_src"], data["spm_tgt"])
    model = Seq2Seq(ModelConfig(**data["model_config"]), data["src_vocab"], data["tgt_vocab"])
    try:
        model.load_state_dict(data["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not fit the model they describe: {str(e)[:200]}") from None
    return model.to(device).eval(), tokenizer
