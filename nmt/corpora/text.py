"""Plain text files: one sentence a line (gzip too), TSV pairs; invalid UTF-8 and mismatches named by line."""

from __future__ import annotations

import gzip
from pathlib import Path

from nmt.corpora.corpus import Pair, PathLike
from nmt.errors import DataError

_ICONV_HINT = "re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 IN > OUT`"


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if it ends in .gz), without BOM, '\\r' or '\\n'."""
    raw = _read_bytes(Path(path))
    chunks = raw.split(b"\n")
    if chunks[-1] == b"":  # a final newline ends the last line; it does not start a new one
        chunks.pop()
    if chunks and chunks[0].startswith(b"\xef\xbb\xbf"):
        chunks[0] = chunks[0][3:]
    lines = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            lines.append(chunk.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}, line {number}: not valid UTF-8 (byte 0x{chunk[err.start]:02x} at column "
                f"{err.start + 1}); {_ICONV_HINT}"
            ) from None
    return lines


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file; point the data.* path at a file")
    if not path.exists():
        raise DataError(f"{path}: no such file; check data.* paths (relative paths start where you run)")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:  # includes gzip.BadGzipFile and truncated archives
        raise DataError(f"{path}: cannot be read ({err}); check the file or recompress it with gzip") from None


def squash(text: str) -> str:
    """Strip both ends and collapse internal whitespace runs to one space."""
    return " ".join(text.split())


def read_parallel(src_path: PathLike, tgt_path: PathLike) -> tuple[list[Pair], int]:
    """Pairs from two line-aligned files, and how many pairs were dropped for an empty side."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if not src_lines and not tgt_lines:
        raise DataError(
            f"{src_path} and {tgt_path}: both files are empty; put one sentence per line in each, line-aligned"
        )
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
            "parallel files must have one sentence per line on both sides"
        )
    return _keep_nonempty(zip(src_lines, tgt_lines, strict=True))


def _keep_nonempty(raw_pairs) -> tuple[list[Pair], int]:
    pairs = [(squash(src), squash(tgt)) for src, tgt in raw_pairs]
    kept = [pair for pair in pairs if pair[0] and pair[1]]
    return kept, len(pairs) - len(kept)


def read_tsv(path: PathLike, swap: bool = False) -> tuple[list[Pair], int]:
    """Pairs from `source<TAB>target` lines (or target<TAB>source with swap), and the empty ones dropped."""
    raw_pairs = []
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: empty file, no sentence pairs found; expected lines of the form source<TAB>target")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raw_pairs.append(("", ""))  # counted as dropped below
            continue
        columns = line.split("\t")
        if len(columns) != 2:
            raise DataError(
                f"{path}, line {number}: found {len(columns)} tab-separated columns, expected 2 "
                "(source<TAB>target); remove stray tabs or give two line-aligned files instead"
            )
        raw_pairs.append((columns[1], columns[0]) if swap else (columns[0], columns[1]))
    pairs, n_dropped = _keep_nonempty(raw_pairs)
    if not pairs:
        raise DataError(
            f"{path}: no sentence pairs found (every line has an empty side); "
            "expected lines of the form source<TAB>target"
        )
    return pairs, n_dropped
