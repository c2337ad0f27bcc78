"""Self-describing checkpoints, written atomically and read safely.

A checkpoint holds plain tensors and primitives only: model weights, the model config, the resolved
run config, both SentencePiece models (bytes), step/epoch/sampler position, optimizer, scheduler and
RNG states. It is written to a temporary file and renamed, so a kill during a save never leaves a broken
file, and read with `torch.load(weights_only=True)`, so nothing in it is ever executed. It carries a sha256
digest of its contents (`digest`: every value in order, tensors by dtype, shape and bytes), checked on every
load: torch does not check the zip's CRCs, so flipped bytes would otherwise load silently. A checkpoint
written before digests existed loads unchecked (a log line says so).

    save_checkpoint(path, payload)
    payload = load_checkpoint(path)           # CheckpointError with a clear message on any problem
    copy_checkpoint(path, other)              # the same bytes under another name, atomically (best.pt)

This module only reads and writes the file: it sits below the model and imports none of it (a contract in
pyproject.toml). Building the model and tokenizer a payload describes is nmt.restore.model_from_checkpoint.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import torch

from nmt.atomic import atomic_path
from nmt.errors import CheckpointError, CorruptCheckpoint, first_line, write_failure

log = logging.getLogger(__name__)

FORMAT = "nmt-checkpoint"
FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
MODEL_VERSION = 1  # bumped when a checkpoint's weights stop fitting the model's code (nmt.model)


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` (plus format markers and its digest) to `path` atomically: temp file, fsync, rename.

    A process killed during the write leaves the previous file at `path` untouched and a temporary
    `.<name>.tmp<pid>` next to it, which the next successful save of `path` removes.
    """
    path = Path(path)
    data = {"format": FORMAT, "format_version": FORMAT_VERSION, "model_version": MODEL_VERSION, **payload}
    data.pop("digest", None)  # a payload read from a checkpoint: its digest is computed afresh
    data["digest"] = digest(data)
    _write(path, lambda f: torch.save(data, f))


def copy_checkpoint(source: str | Path, path: str | Path) -> None:
    """Copy checkpoint file `source` to `path` as save_checkpoint writes one: atomically, the previous file at
    `path` intact until the copy is whole (best.pt from last.pt: the same bytes, not serialised again)."""
    with open(source, "rb") as src:
        _write(Path(path), lambda f: shutil.copyfileobj(src, f, 1 << 20))


def _write(path: Path, write) -> None:
    """Write `path` through `write(file)` into a temporary file, fsync it and rename it onto `path`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
    except (OSError, RuntimeError) as e:  # torch.save turns a failed write into a RuntimeError on closing
        kept = " (the previous checkpoint there is intact)" if path.is_file() else ""
        reason, fix = write_failure(e)
        raise CheckpointError(f"{path}: could not write the checkpoint: {reason}{kept}; {fix}") from None
    _remove_stale_temporaries(path)


def digest(payload: Mapping) -> str:
    """The sha256 of `payload`, "sha256:<hex>": every key and value in order, tensors by dtype, shape and bytes (a
    multi30k-sized checkpoint's 161 MB in 0.19-0.44 s on the 2-core Intel Xeon, idle to busy: sha256's own speed)."""
    h = hashlib.sha256()
    _feed(h, payload)
    return f"sha256:{h.hexdigest()}"


def _feed(h, value: object) -> None:
    """Add `value` to hash `h`, each kind with its own tag and length, so that no two values feed the same bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"t{t.dtype}{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, whatever the dtype
    elif isinstance(value, Mapping):
        h.update(b"d%d:" % len(value))
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, list | tuple):
        h.update(b"l%d:" % len(value))
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(raw) + raw)
    elif isinstance(value, bytes | bytearray):
        h.update(b"b%d:" % len(value) + bytes(value))
    elif value is None or isinstance(value, bool | int | float | complex | torch.dtype | torch.device):
        raw = repr(value).encode()
        h.update(b"v%d:" % len(raw) + raw)
    else:  # a set (no order), an arbitrary object (weights_only loading would refuse it anyway)
        raise TypeError(f"a checkpoint holds tensors and plain values only, not {type(value).__name__}")


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
_COPY = f"copy it again, or {_ANOTHER}"
_OLDER = "older"
_TORCH_MEMBERS = {"data.pkl", "version", ".format_version", "byteorder", "serialization_id", ".storage_alignment"}
_STORAGE = re.compile(r"/data/\d+$")  # a tensor storage's member in torch.save's archive


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
        raise CorruptCheckpoint(f"{path}: empty file (0 bytes), not a checkpoint", _ANOTHER)
    if magic != ZIP_MAGIC:  # torch.save writes a zip archive; nothing else is even unpickled
        _refuse(path, "not a file written by torch.save")
    try:
        # torch's version string (a str subclass) is allowed: older checkpoints stored it unconverted
        with torch.serialization.safe_globals([torch.torch_version.TorchVersion]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's remarks on a damaged pickle's protocol: the error says it
            data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        _refuse(path, "it holds objects other than tensors and plain values, which are never loaded")
    except Exception as e:  # torch reports a cut-off zip in many ways (RuntimeError, OSError, EOFError, ...)
        if _foreign_zip(path):
            _refuse(path, "a zip archive, but not one written by torch.save")
        detail = f"{type(e).__name__}: {first_line(e).split('. ')[0][:100]}" if str(e) else type(e).__name__
        raise CorruptCheckpoint(f"{path}: truncated or corrupt checkpoint ({detail})", _COPY) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        _refuse(path, "no nmt-checkpoint format marker")
    if data.get("model_version") != MODEL_VERSION:
        _refuse(path, f"model version {data.get('model_version')}, this is {MODEL_VERSION}", _OLDER)
    if data.get("format_version") != FORMAT_VERSION:
        _refuse(path, f"checkpoint format {data.get('format_version')}, this reads {FORMAT_VERSION}", _OLDER)
    verify(path, data)  # the values, tensors included
    damage = damaged_archive(path, storages=False)  # the rest of the file: a flipped bit that changed no value
    if damage:
        raise CorruptCheckpoint(f"{path}: corrupt checkpoint ({damage})", _COPY)
    return data


def _refuse(path: Path, why: str, kind: str = "not an nmt checkpoint") -> NoReturn:
    """Refuse `path`, which does not read as an nmt checkpoint (`why`): a CorruptCheckpoint where the file is one
    whose bytes are damaged (a zip archive whose members do not match their checksums: a flipped bit anywhere in
    what torch.save wrote), else a CheckpointError of `kind` (a foreign file, a pickle of other objects, another
    version)."""
    damage = damaged_archive(path)
    if damage:
        raise CorruptCheckpoint(f"{path}: corrupt checkpoint ({damage})", _COPY)
    if kind == _OLDER:
        raise CheckpointError(
            f"{path}: written by an incompatible version ({why}); evaluate it with the nmt version that trained it, "
            "or retrain"
        )
    raise CheckpointError(f"{path}: {kind} ({why}); pass a checkpoint written by nmt-train")


def damaged_archive(path: str | Path, storages: bool = True) -> str | None:
    """What is damaged in `path`, a zip archive as torch.save writes one (its members' CRC-32 checksums checked, the
    bytes torch itself does not check), or None where it reads back whole, or is no such archive at all. Without
    `storages` the tensors' bytes (<archive>/data/<n>, which the digest covers) are not read again."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:  # no zip at all (a foreign file), or one whose directory is damaged
        return None if "not a zip file" in str(e) else f"its archive cannot be read: {first_line(e)}"
    except Exception as e:
        return f"its archive cannot be read: {type(e).__name__}"
    with archive:
        if not _torch_archive(archive):
            return None  # another kind of zip: foreign, not damaged
        for info in archive.infolist():
            if storages or not _STORAGE.search(info.filename):
                try:
                    with archive.open(info) as member:  # read to its end: the CRC is checked there
                        while member.read(1 << 20):
                            pass
                except Exception as e:  # zipfile.BadZipFile (a CRC, a header), zlib.error, ...
                    return (
                        f"{info.filename} does not match its checksum"
                        if "CRC" in str(e)
                        else (f"{info.filename} cannot be read: {first_line(e)}")
                    )
    return None


def _foreign_zip(path: Path) -> bool:
    """Whether `path` is a whole zip archive of another kind than torch.save's."""
    try:
        with zipfile.ZipFile(path) as archive:
            return not _torch_archive(archive)
    except Exception:  # not a zip archive that reads: a cut-off checkpoint, typically
        return False


def _torch_archive(archive: zipfile.ZipFile) -> bool:
    """Whether `archive` has the members torch.save writes (any of them: a flipped bit may rename one)."""
    return any(name.rpartition("/")[2] in _TORCH_MEMBERS for name in archive.namelist())


def verify(path: Path, data: dict) -> None:
    """Check checkpoint `data` (read from `path`) against the digest written with it, and drop the digest; a
    checkpoint without one (written before digests existed) passes unchecked, with a log line."""
    expected = data.pop("digest", None)
    if expected is None:
        log.info("%s: written before checkpoints carried a digest; its contents are not verified", path)
        return
    if digest(data) != expected:
        raise CorruptCheckpoint(
            f"{path}: corrupt checkpoint (its contents do not match the digest written with it: changed on disk "
            "or in a copy)",
            _COPY,
        )


def peek_checkpoint(path: str | Path) -> dict | None:
    """Checkpoint `path`'s values without reading its tensors' bytes or checking its digest (a quick look, e.g.
    at its step); None where it is missing or unreadable."""
    try:
        with torch.serialization.safe_globals([torch.torch_version.TorchVersion]):
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # missing, cut off, foreign: whoever reads it for real says what is wrong
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None
