"""Rebuilding the model and tokenizer a checkpoint describes, above both the model and the file reader.

    payload = load_checkpoint(path)                                        # nmt.checkpoint: the file only
    model, tokenizer = model_from_checkpoint(payload, device, path=path)   # in eval mode

Any problem (a missing key, a config this version cannot build, weights that do not fit) is a CheckpointError
that names the file and says what to do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nmt.errors import CheckpointError, first_line
from nmt.model import ModelConfig, Seq2Seq
from nmt.tokenizer import Tokenizer

MODEL_KEYS = ("model", "model_config", "src_vocab", "tgt_vocab", "spm_src", "spm_tgt")


def model_from_checkpoint(
    data: dict, device: str | torch.device = "cpu", path: str | Path | None = None, averaged: bool = True
) -> tuple[Seq2Seq, Tokenizer]:
    """Rebuild the model (in eval mode) and tokenizer a checkpoint describes; CheckpointError if it cannot.
    The weights are the average over the training steps where the run kept one (trainer.average_decay,
    nmt.averaging) and `averaged`, else the weights training stepped from.

    `path` only names the file in the error messages.
    """
    where = str(path) if path else "checkpoint"
    retrain = "evaluate it with the nmt version that trained it, or retrain"
    missing = [key for key in MODEL_KEYS if key not in data]
    if missing:
        raise CheckpointError(
            f"{where}: incomplete checkpoint, it lacks {', '.join(missing)}; pass a checkpoint written by nmt-train"
        )
    try:
        tokenizer = Tokenizer(data["spm_src"], data["spm_tgt"])
    except Exception as e:  # sentencepiece: RuntimeError or TypeError on anything but a model proto
        raise CheckpointError(
            f"{where}: its sentencepiece models cannot be read ({first_line(e)}); {retrain}"
        ) from None
    try:
        model = Seq2Seq(ModelConfig(**data["model_config"]), int(data["src_vocab"]), int(data["tgt_vocab"]))
    except Exception as e:  # an unknown field, a wrong type, an unknown attention, ...
        raise CheckpointError(
            f"{where}: its model_config does not describe a model this version can build ({first_line(e)}); {retrain}"
        ) from None
    try:
        model.load_state_dict(data["average"]["model"] if averaged and data.get("average") else data["model"])
    except Exception as e:  # RuntimeError listing missing/unexpected keys and size mismatches
        lines = [line.strip() for line in str(e).splitlines()[1:] if line.strip()] or [first_line(e)]
        problem = lines[0].replace("torch.Size(", "").replace("])", "]")[:200]
        raise CheckpointError(
            f"{where}: its weights do not fit the model it describes ({problem}); {retrain}"
        ) from None
    return model.to(device).eval(), tokenizer
