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

import contextlib
import glob
import os
import pickle
from pathlib import Path

import torch

from nmt.atomic import atomic_path
from nmt.errors import CheckpointError
from nmt.model import MODEL_VERSION, ModelConfig, Seq2Seq
from nmt.tokenizer import Tokenizer

FORMAT = "nmt-checkpoint"
FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` (plus format markers) to `path` atomically: temp file, fsync, rename.

    A process killed during the write leaves the previous file at `path` untouched and a temporary
    `.<name>.tmp<pid>` next to it, which the next successful save of `path` removes.
    """
    path = Path(path)
    data = {"format": FORMAT, "format_version": FORMAT_VERSION, "model_version": MODEL_VERSION, **payload}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
    except (OSError, RuntimeError) as e:  # torch.save turns a failed write into a RuntimeError on closing
        kept = " (the previous checkpoint there is intact)" if path.is_file() else ""
        raise CheckpointError(
            f"{path}: could not write the checkpoint: {_write_error(e)}{kept}; "
            "free disk space or choose another run directory with hydra.run.dir=..."
        ) from None
    _remove_stale_temporaries(path)


def _write_error(e: BaseException) -> str:
    """The OSError behind a failed save (e.g. "No space left on device"), else the error's first line."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen.strerror or str(seen)
        seen = seen.__cause__ or seen.__context__
    return _first_line(e)


def _remove_stale_temporaries(path: Path) -> None:
    """Delete `.<name>.tmp<pid>` files left by killed processes (whose pid is no longer running)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


_ANOTHER = "use another checkpoint, e.g. checkpoints/best.pt or checkpoints/last.pt of the run"


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by `save_checkpoint`; any other file gets a CheckpointError saying why."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"{path}: no such checkpoint; pass the path of a .pt file, e.g. outputs/<date>/<time>/checkpoints/best.pt"
        )
    if path.is_dir():
        found = sorted(str(p) for p in path.glob("**/*.pt"))[:3]
        hint = f" such as {', '.join(found)}" if found else ""
        raise CheckpointError(f"{path}: is a directory, not a checkpoint; pass a .pt file{hint}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(
            f"{path}: cannot be read ({e.strerror or e}); check the path and its permissions"
        ) from None
    if not magic:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint; {_ANOTHER}")
    if magic != ZIP_MAGIC:  # torch.save writes a zip archive; nothing else is even unpickled
        raise CheckpointError(
            f"{path}: not an nmt checkpoint (not a file written by torch.save); pass a checkpoint written by nmt-train"
        )
    try:
        # torch's version string (a str subclass) is allowed: checkpoints of 2026-12-04 stored it unconverted
        with torch.serialization.safe_globals([torch.torch_version.TorchVersion]):
            data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: not an nmt checkpoint (it holds objects other than tensors and "
            "plain values, which are never loaded); pass a checkpoint written by nmt-train"
        ) from None
    except Exception as e:  # torch reports a cut-off zip in many ways (RuntimeError, OSError, EOFError, ...)
        detail = f"{type(e).__name__}: {_first_line(e).split('. ')[0][:100]}" if str(e) else type(e).__name__
        raise CheckpointError(
            f"{path}: truncated or corrupt checkpoint ({detail}); copy it again, or {_ANOTHER}"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an nmt checkpoint; pass a checkpoint written by nmt-train")
    if data.get("model_version") != MODEL_VERSION:
        raise CheckpointError(
            f"{path}: written by an incompatible version (model version {data.get('model_version')}, this is "
            f"{MODEL_VERSION}); evaluate it with the nmt version that trained it, or retrain"
        )
    if data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by an incompatible version (checkpoint format {data.get('format_version')}, "
            f"this reads {FORMAT_VERSION}); evaluate it with the nmt version that trained it, or retrain"
        )
    return data


MODEL_KEYS = ("model", "model_config", "src_vocab", "tgt_vocab", "spm_src", "spm_tgt")


def model_from_checkpoint(
    data: dict, device: str | torch.device = "cpu", path: str | Path | None = None
) -> tuple[Seq2Seq, Tokenizer]:
    """Rebuild the model (in eval mode) and tokenizer a checkpoint describes; CheckpointError if it cannot.

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
            f"{where}: its sentencepiece models cannot be read ({_first_line(e)}); {retrain}"
        ) from None
    try:
        model = Seq2Seq(ModelConfig(**data["model_config"]), int(data["src_vocab"]), int(data["tgt_vocab"]))
    except Exception as e:  # an unknown field, a wrong type, an unknown attention, ...
        raise CheckpointError(
            f"{where}: its model_config does not describe a model this version can build ({_first_line(e)}); {retrain}"
        ) from None
    try:
        model.load_state_dict(data["model"])
    except Exception as e:  # RuntimeError listing missing/unexpected keys and size mismatches
        lines = [line.strip() for line in str(e).splitlines()[1:] if line.strip()] or [_first_line(e)]
        problem = lines[0].replace("torch.Size(", "").replace("])", "]")[:200]
        raise CheckpointError(
            f"{where}: its weights do not fit the model it describes ({problem}); {retrain}"
        ) from None
    return model.to(device).eval(), tokenizer


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__
