"""The prepared data's cache, verified like checkpoints: <data_dir>/cache/<corpus>-<key>/ holds both SentencePiece
models (spm.src.model, spm.tgt.model) and encoded.pt, the encoded splits with a digest (nmt.checkpoint.digest) of
everything the folder holds, both models' bytes included.

    write(cache_dir, src_model, tgt_model, blob)      # atomically: a kill leaves the previous files or none
    found = read(cache_dir)                           # (src_model, tgt_model, blob), or None: prepare it again

`read` returns None where the cache is missing, and where it is damaged (cut off, replaced by another file, a
pickle of other objects, bytes that do not match the digest, or written without a digest) after one warning line
naming the file and saying it is rebuilt. It reads with torch.load(weights_only=True) only: nothing in the folder is
ever executed, and torch's own advice for files it refuses (weights_only=False) is never passed on.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from nmt.atomic import atomic_path
from nmt.checkpoint import digest
from nmt.errors import first_line

log = logging.getLogger(__name__)
FORMAT = "nmt-data-cache"
FILES = ("spm.src.model", "spm.tgt.model", "encoded.pt")


def write(cache_dir: Path, src_model: bytes, tgt_model: bytes, blob: dict) -> None:
    """Write the cache's three files, encoded.pt last (with the digest of all three): it is what `read` looks for."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name, model in zip(FILES[:2], (src_model, tgt_model), strict=True):
        with atomic_path(cache_dir / name) as tmp:
            tmp.write_bytes(model)
    data = {"format": FORMAT, **blob}
    data["digest"] = digest({**data, "spm_src": src_model, "spm_tgt": tgt_model})
    with atomic_path(cache_dir / FILES[2]) as tmp:
        torch.save(data, tmp)


def read(cache_dir: Path) -> tuple[bytes, bytes, dict] | None:
    """(the source and target SentencePiece models, the encoded splits' blob), verified; None where the cache is
    missing or damaged (after a warning line naming the file)."""
    paths = [cache_dir / name for name in FILES]
    if not all(p.exists() for p in paths):
        return None
    try:
        src_model, tgt_model = paths[0].read_bytes(), paths[1].read_bytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's remarks on a damaged file: the warning below says it
            data = torch.load(paths[2], map_location="cpu", weights_only=True)
    except Exception as e:  # cut off, not a zip, a pickle of other objects, unreadable: all rebuilt the same way
        return _damaged(paths[2], f"unreadable: {type(e).__name__}")
    if not isinstance(data, dict) or data.get("format") != FORMAT or "digest" not in data:
        return _damaged(paths[2], "not a cache file with a digest")
    expected = data.pop("digest")
    if digest({**data, "spm_src": src_model, "spm_tgt": tgt_model}) != expected:
        return _damaged(paths[2], "its files do not match the digest written with them")
    del data["format"]
    return src_model, tgt_model, data


def _damaged(path: Path, why: str) -> None:
    log.warning("%s: damaged prepared data (%s); preparing it again", path, first_line(why))
    return None
