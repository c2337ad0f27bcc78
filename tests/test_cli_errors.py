"""The commands as the user meets them: every bad input gets one clear line, odd text never crashes.

    the bad-input matrix   each case runs a command (nmt-prepare, nmt-train, nmt-evaluate, nmt-translate) in a
                           subprocess and checks the exit status, that the message names the file (and line)
                           and the fix, and that no Python traceback reaches the user
    a full disk            a file-size limit during nmt-train or nmt-prepare is one clear line
    odd text               Translator.translate on the workspace's checkpoint never raises, answers every input
    determinism            same seed, same CPU, threads=1: bitwise-identical weights and optimizer state;
                           the prepare cache follows the corpus file's content and the settings
    safe loading           a checkpoint whose pickle would run code is refused and runs nothing

(A kill during a checkpoint write: test_checkpoint.py; the tokenizer's round trip: test_tokenizer.py.)

The matrix's commands run concurrently (they mostly wait on imports), from one module-scoped workspace with
two tiny runs of the quick preset.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.checkpoint import load_checkpoint
from nmt.cli.common import compose_config, load_data
from nmt.errors import CheckpointError
from nmt.restore import model_from_checkpoint
from nmt.translator import Translator

BIN = Path(sys.executable).parent
# What the user runs: no debugging switches inherited from the developer's shell.
ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "NMT_DEBUG")}
LONG_LINE = ("ein haus " * 12_000)[:100_000]  # 100,000 characters of words: ~22,000 pieces


def run(
    cmd: list[str], cwd: Path, stdin: bytes | None = None, env: dict | None = None, fsize_kb: int | None = None
) -> subprocess.CompletedProcess:
    """Run one of the console scripts (or any command) as the user would; text output, bytes input."""
    argv = [str(BIN / cmd[0]) if (BIN / cmd[0]).exists() else cmd[0], *cmd[1:]]
    if fsize_kb is not None:  # no file may grow past fsize_kb: writes fail with EFBIG, like a full disk
        argv = ["bash", "-c", f'ulimit -f {fsize_kb} && exec "$@"', "bash", *argv]
    proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=300, cwd=cwd, env=env or ENV)
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The last non-empty line on stderr (where the one-line error goes)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------- the workspace
class Evil:
    """Unpickling this would create a marker file: a stand-in for a checkpoint that runs code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def pairs_tsv(n: int, seed: int = 0) -> str:
    """n distinct sentence pairs, one per line, source<TAB>target."""
    de = "ein zwei drei haus baum katze hund rot blau gross klein alt".split()
    en = "one two three house tree cat dog red blue big small old".split()
    lines = []
    for i in range(n):
        idx = [(i * 7 + j * (seed + 3)) % len(de) for j in range(2 + i % 5)] + [i % len(de)]
        lines.append(" ".join(de[k] for k in idx) + f" {i}\t" + " ".join(en[k] for k in idx) + f" {i}")
    return "\n".join(lines) + "\n"


def checkpoint_variants(last: Path, root: Path) -> None:
    """Broken copies of a real checkpoint, each the way a user might meet one."""
    good = last.read_bytes()
    write_bytes(root / "truncated.pt", good[: len(good) // 2])
    write_bytes(root / "empty.pt", b"")
    write_bytes(root / "notes.pt", b"these are my notes, not a checkpoint\n")
    middle = len(good) // 2  # 3 bytes flipped there (in the weights): torch.load alone would read them silently
    write_bytes(
        root / "flipped.pt", good[:middle] + bytes(b ^ 0xFF for b in good[middle : middle + 3]) + good[middle + 3 :]
    )
    payload = torch.load(last, weights_only=True)
    del payload["digest"]  # the edited copies below: files of another writer, with no digest to contradict them
    torch.save({**payload, "model_version": 99}, root / "future.pt")
    weights = dict(payload["model"])
    del weights["decoder.attention.key_proj.weight"]
    torch.save({**payload, "model": weights}, root / "missing_weight.pt")
    torch.save({k: v for k, v in payload.items() if k != "spm_src"}, root / "incomplete.pt")
    torch.save({**payload, "extra": Evil(root / "pwned")}, root / "evil.pt")  # a zip, like a real one
    with open(root / "evil.pkl", "wb") as f:
        pickle.dump({"format": "nmt-checkpoint", "x": Evil(root / "pwned")}, f)  # a bare pickle


class Workspace:
    """Input files, and two tiny runs of the quick preset that train in the background until `trained()`."""

    def __init__(self, root: Path):
        self.root, self.run, self.twin, self.data = root, root / "run", root / "twin", root / "run_data"
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        for name in ("run", "twin"):  # both at once: they share nothing but the seed
            with open(root / f"{name}.out", "w") as log:
                cmd = [
                    str(BIN / "nmt-train"),
                    *TINY,
                    f"hydra.run.dir={root / name}",
                    f"paths.data_dir={root / (name + '_data')}",
                ]
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=ENV)
                self._procs.append(proc)
        self._done = False

    @property
    def ckpt(self) -> Path:
        return self.run / "checkpoints" / "last.pt"

    def fmt(self, text: str) -> str:
        return text.format(root=self.root, run=self.run, ckpt=self.ckpt, data=self.data)

    def trained(self) -> Workspace:
        """Wait for both runs (once), then write the broken checkpoint copies."""
        with self._lock:
            if not self._done:
                for name, proc in zip(("run", "twin"), self._procs, strict=True):
                    proc.wait(timeout=600)
                    assert proc.returncode == 0, (self.root / f"{name}.out").read_text()[-3000:]
                checkpoint_variants(self.ckpt, self.root)
                self._done = True
        return self

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    workspace = Workspace(root)
    write_bytes(root / "m.src", b"eins\nzwei\ndrei\n")
    write_bytes(root / "m.tgt", b"one\ntwo\n")
    write_bytes(root / "latin1.tsv", "Haus\thouse\nCaf\u00e9\tcoffee\n".encode("latin-1"))
    write_bytes(root / "empty.tsv", b"")
    write_bytes(root / "e.src", b"")
    write_bytes(root / "e.tgt", b"")
    write_bytes(root / "cols.tsv", b"a\tb\nc\td\ne\tf\tg\n")
    write_bytes(root / "tiny.tsv", b"ein haus\ta house\nzwei\ttwo\n")
    clean = pairs_tsv(200)
    write_bytes(root / "clean.tsv", clean.encode())
    write_bytes(root / "bom_crlf.tsv", b"\xef\xbb\xbf" + clean.replace("\n", "\r\n").encode())
    write_bytes(root / "dev.tsv", pairs_tsv(5, seed=1).encode())
    write_bytes(root / "long.tsv", (pairs_tsv(40) + f"{LONG_LINE}\ta long line\n").encode())
    yield workspace
    workspace.close()


# ------------------------------------------------------------------------------------------- the matrix
@dataclass(frozen=True)
class Case:
    id: str
    cmd: tuple[str, ...]  # a console script and its arguments; {root} {run} {ckpt} {data} are filled in
    code: int  # the exit status: 2 for our errors (Hydra's override errors included: nmt.cli.strict), 0 accepted
    says: tuple[str, ...]  # what the message (or, for accepted input, the output) must contain
    stdin: bytes | None = None


PREPARE = ("nmt-prepare", "data=files", "paths.data_dir={root}/pdata")
BIBLE = ("nmt-prepare", "paths.data_dir={root}/pdata")
TRAIN = (
    "nmt-train",
    "experiment=quick",
    "trainer.max_steps=2",
    "trainer.threads=1",
    "trainer.progress=false",
    "paths.data_dir={data}",
)
SHORT = ("--max-len-ratio", "0.3")  # outputs of at most 0.3 x source + 10 pieces: quicker, as robust
ODD_STDIN = (
    (
        "\ufeffbom at the start\r\n"  # a BOM and CRLF line endings
        "caf\xe9 latin-1 byte\n"  # made an invalid UTF-8 byte below
        "\x00\x07\x1b[31m control characters\n"
        "\u202eright-to-left override \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627\n"
        "e\u0301\u0302\u0303 combining marks \U0001f600\U0001f44d\U0001f3fd\u200d\n"
        "\n"
        "   \t  \n" + "x" * 5000 + "\n"
    )
    .encode()
    .replace("caf\xe9".encode(), b"caf\xe9")
)

MATRIX = [
    # nmt-prepare: the corpus files
    Case(
        "mismatched-line-counts",
        (*PREPARE, "data.train=[{root}/m.src,{root}/m.tgt]"),
        2,
        ("{root}/m.src has 3 lines but {root}/m.tgt has 2", "one sentence per line on both sides"),
    ),
    Case(
        "invalid-utf8",
        (*PREPARE, "data.train={root}/latin1.tsv"),
        2,
        ("{root}/latin1.tsv, line 2: not valid UTF-8 (byte 0xe9 at column 4)", "iconv -f latin1 -t utf-8"),
    ),
    Case(
        "empty-tsv", (*PREPARE, "data.train={root}/empty.tsv"), 2, ("{root}/empty.tsv: empty file", "source<TAB>target")
    ),
    Case(
        "empty-parallel-files",
        (*PREPARE, "data.train=[{root}/e.src,{root}/e.tgt]"),
        2,
        ("{root}/e.src and {root}/e.tgt: both files are empty", "one sentence per line"),
    ),
    Case(
        "tsv-wrong-columns",
        (*PREPARE, "data.train={root}/cols.tsv"),
        2,
        ("{root}/cols.tsv, line 3: found 3 tab-separated columns, expected 2", "remove stray tabs"),
    ),
    Case(
        "missing-file",
        (*PREPARE, "data.train={root}/nowhere.tsv"),
        2,
        ("{root}/nowhere.tsv: no such file", "check data.* paths"),
    ),
    Case("train-file-not-given", PREPARE, 2, ("data.train is required", "data.train=FILE")),
    Case(
        "no-validation-pairs",
        (*PREPARE, "data.train={root}/tiny.tsv"),
        2,
        ("corpus files has no validation pairs (train 2, valid 0, test 0)", "data.valid=FILE"),
    ),
    Case(
        "unknown-data-key-added",
        (*PREPARE, "data.train={root}/clean.tsv", "+data.trian=x"),
        2,
        ("unknown key 'data.trian' in +data.trian=x (a + adds a key that nothing reads)", "did you mean data.train=x?"),
    ),
    Case(
        "wrong-type-data",
        (*PREPARE, "data.train={root}/clean.tsv", "data.valid_percent=abc"),
        2,
        ("data.valid_percent=abc: Value 'abc' of type 'str' could not be converted to Float", "fix the value"),
    ),
    Case(
        "bad-choice-tokenizer",
        (*PREPARE, "data.train={root}/clean.tsv", "tokenizer.type=bpee"),
        2,
        ("tokenizer.type=bpee: Invalid value 'bpee', expected one of [unigram, bpe, char, word]",),
    ),
    Case(
        "unknown-key-prepare",
        (*PREPARE, "data.train={root}/clean.tsv", "tokenizer.vocab_sise=3"),
        2,
        ("unknown key 'tokenizer.vocab_sise'", "did you mean tokenizer.vocab_size=3?", "nmt-prepare --cfg job"),
    ),
    Case(
        "line-of-100k-characters",
        (
            *PREPARE,
            "data.train={root}/long.tsv",
            "data.valid={root}/dev.tsv",
            "data.test={root}/dev.tsv",
            "tokenizer.vocab_size=60",
        ),
        0,
        ("longer than 100 pieces (train only)",),
    ),
    Case("bom-and-crlf", (*PREPARE, "data.train={root}/bom_crlf.tsv", "tokenizer.vocab_size=60"), 0, ("cache: ",)),
    # nmt-prepare: the Bible codes (refused before the database is read)
    Case(
        "unknown-bible-code",
        (*BIBLE, "data.source_translation=q"),
        2,
        ("unknown Bible translation 'q'", "use one of: k (en King James Version 1611)"),
    ),
    Case(
        "copyrighted-bible-code",
        (*BIBLE, "data.target_translation=2"),
        2,
        ("Bible translation '2' is copyrighted", "use one of: k (en King James Version 1611)"),
    ),
    # nmt-train: the config
    Case(
        "unknown-key-train",
        (*TRAIN, "trainer.max_stpes=2"),
        2,
        ("unknown key 'trainer.max_stpes' in trainer.max_stpes=2; did you mean trainer.max_steps=2?",),
    ),
    Case(  # the hint is attention=, not Hydra's +atention=bahdanau (which trains the default model, exit 0)
        "misspelt-group",
        (*TRAIN, "atention=bahdanau"),
        2,
        ("unknown key 'atention' in atention=bahdanau; did you mean attention=bahdanau?", "nmt-train --cfg job"),
    ),
    Case(
        "misspelt-group-added",
        (*TRAIN, "+atention=bahdanau"),
        2,
        ("unknown key 'atention' in +atention=bahdanau (a + adds", "did you mean attention=bahdanau?"),
    ),
    Case(
        "misspelt-key-force-added",
        (*TRAIN, "++trainer.max_stpes=2"),
        2,
        ("unknown key 'trainer.max_stpes' in ++trainer.max_stpes=2", "did you mean trainer.max_steps=2?"),
    ),
    Case("plus-on-a-known-key", (*TRAIN, "+seed=3"), 2, ("+seed=3: seed is already a key; drop the + (seed=3)",)),
    Case(
        "wrong-type-train",
        (*TRAIN, "trainer.max_steps=abc", "hydra.run.dir={root}/bad/type"),
        2,
        ("trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted to Integer",),
    ),
    Case(
        "bad-choice-train",
        (*TRAIN, "trainer.amp=bf17", "hydra.run.dir={root}/bad/amp"),
        2,
        ("trainer.amp=bf17: Invalid value 'bf17', expected one of [auto, bf16, off]",),
    ),
    Case(
        "average-decay-out-of-range",
        (*TRAIN, "trainer.average_decay=1.0", "hydra.run.dir={root}/bad/average"),
        2,
        ("trainer.average_decay=1.0: a decay lies between 0 and 1 (0.998, say; null: none)",),
    ),
    Case(
        "unknown-attention-name",
        (*TRAIN, "attention.name=foo", "hydra.run.dir={root}/bad/attention"),
        2,
        ("unknown attention.name='foo'", "choose one of: ", "bahdanau"),
    ),
    Case(
        "unknown-attention-group",
        (*TRAIN, "attention=foo"),
        2,
        ("attention=foo: no such attention; choose one of bahdanau, local, luong, multihead, none",),
    ),
    # nmt-evaluate and nmt-translate: the checkpoint (both use load_checkpoint and model_from_checkpoint)
    Case(
        "checkpoint-is-a-directory",
        ("nmt-evaluate", "checkpoint={run}"),
        2,
        ("{run}: is a directory, not a checkpoint", "pass a .pt file such as {run}/checkpoints/best.pt"),
    ),
    Case(
        "incompatible-model-version",
        ("nmt-evaluate", "checkpoint={root}/future.pt"),
        2,
        ("{root}/future.pt: written by an incompatible version (model version 99, this is 1)", "or retrain"),
    ),
    Case(
        "unknown-key-evaluate",
        ("nmt-evaluate", "checkpoint={ckpt}", "splitt=valid"),
        2,
        ("unknown key 'splitt' in splitt=valid; did you mean split=valid?", "nmt-evaluate --cfg job"),
    ),
    Case(
        "truncated-checkpoint",
        ("nmt-translate", "{root}/truncated.pt", "hallo"),
        2,
        ("{root}/truncated.pt: truncated or corrupt checkpoint", "use another checkpoint"),
    ),
    Case(
        "flipped-bytes-checkpoint",
        ("nmt-translate", "{root}/flipped.pt", "hallo"),
        2,
        ("{root}/flipped.pt: corrupt checkpoint (its contents do not match the digest written with it", "copy it"),
    ),
    Case(
        "not-a-checkpoint",
        ("nmt-translate", "{root}/notes.pt", "hallo"),
        2,
        ("{root}/notes.pt: not an nmt checkpoint", "pass a checkpoint written by nmt-train"),
    ),
    Case(
        "weights-do-not-fit",
        ("nmt-translate", "{root}/missing_weight.pt", "hallo"),
        2,
        (
            "{root}/missing_weight.pt: its weights do not fit the model it describes",
            "decoder.attention.key_proj.weight",
            "or retrain",
        ),
    ),
    # nmt-translate: odd text is translated, one line out per line in
    Case("translate-odd-text", ("nmt-translate", "{ckpt}", *SHORT), 0, (), stdin=ODD_STDIN),
    Case(
        "translate-100k-line-and-undecodable-argument",
        ("nmt-translate", "{ckpt}", *SHORT, "caf\udce9 au lait", LONG_LINE, "zwei"),
        0,
        ("line 2: ", "over max_src_pieces=250; translating its first 249"),
    ),
]
NEEDS_RUN = ("nmt-evaluate", "nmt-translate")  # the others fail (or succeed) without a checkpoint


def cache_dir(proc: subprocess.CompletedProcess) -> Path:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Path(re.search(r"^cache: (.+)$", proc.stdout, re.M)[1])


def prepare_files(train: Path, data_dir: Path, vocab_size: int = 60) -> Path:
    """nmt-prepare data=files data.train=TRAIN tokenizer.vocab_size=N, in this process: its cache folder."""
    cfg = compose_config(
        ["data=files", f"data.train={train}", f"paths.data_dir={data_dir}", f"tokenizer.vocab_size={vocab_size}"]
    )
    return load_data(cfg).cache_dir


def full_disk_train(ws: Workspace) -> tuple[subprocess.CompletedProcess, Path, bytes]:
    """Resume a copy of the finished run for two more steps while no file may grow past 1 MB."""
    run_dir = ws.root / "full" / "run"
    shutil.copytree(ws.trained().run, run_dir)
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()  # 4.4 MB: the next save cannot succeed
    proc = run(
        ["nmt-train", *TINY, "trainer.max_steps=8", f"hydra.run.dir={run_dir}", f"paths.data_dir={ws.data}"],
        cwd=run_dir.parent,
        fsize_kb=1024,
    )
    return proc, run_dir, before


EXTRA = {  # more commands for the same pool, checked by the tests below the matrix
    "debug": lambda ws: run(
        [ws.fmt(a) for a in (*PREPARE, "data.train=[{root}/m.src,{root}/m.tgt]")],
        cwd=ws.root,
        env={**ENV, "HYDRA_FULL_ERROR": "1"},
    ),
    "full-disk-prepare": lambda ws: run(
        ["nmt-prepare", "experiment=quick", "data.train_size=300", f"paths.data_dir={ws.root / 'full' / 'data'}"],
        cwd=ws.root,
        fsize_kb=100,
    ),  # a sentencepiece model is ~240 KB
    "full-disk-train": full_disk_train,
}


@pytest.fixture(scope="module")
def outcomes(ws) -> dict[str, Future]:
    """Every command of the matrix and EXTRA, four at a time; those without a checkpoint first."""

    def one(case: Case) -> subprocess.CompletedProcess:
        if case.cmd[0] in NEEDS_RUN:
            ws.trained()
        return run([ws.fmt(arg) for arg in case.cmd], cwd=ws.root, stdin=case.stdin)

    pool = ThreadPoolExecutor(max_workers=4)
    futures = {}
    for case in sorted(MATRIX, key=lambda c: c.cmd[0] in NEEDS_RUN):
        futures[case.id] = pool.submit(one, case)
        if case.id == "unknown-attention-group":
            futures.update({name: pool.submit(job, ws) for name, job in EXTRA.items()})
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_bad_input_matrix(case, ws, outcomes):
    proc = outcomes[case.id].result()
    shown = proc.stdout + proc.stderr
    assert "Traceback" not in shown, shown[-3000:]
    assert proc.returncode == case.code, shown[-3000:]
    for text in case.says:
        assert ws.fmt(text) in shown, f"{ws.fmt(text)!r} not in {shown[-2000:]!r}"
    if case.code == 2:  # exactly one line: "error: <file>[, line N]: <what>; <fix>"
        assert proc.stderr.strip().count("\n") == 0, proc.stderr
        assert re.match(r"(nmt-translate: )?error: ", proc.stderr)
    if case.cmd[0] == "nmt-train" and case.code == 2:  # a refused run leaves no run directory behind
        named = [ws.fmt(a).split("=", 1)[1] for a in case.cmd if a.startswith("hydra.run.dir=")]
        assert not any(Path(d).exists() for d in named) and not (ws.root / "outputs").exists()
    if case.cmd[0] == "nmt-translate" and case.code == 0:  # one output line per input line
        lines_in = case.stdin.count(b"\n") if case.stdin else len(case.cmd) - 2 - len(SHORT)
        assert proc.stdout.count("\n") == lines_in


def test_the_100k_character_line_is_read_and_dropped_from_training(outcomes):
    # valid and test are given, so all 41 lines of long.tsv are training pairs: 40 kept, the long one dropped
    out = outcomes["line-of-100k-characters"].result().stdout
    assert re.search(r"^  train +40 pairs$", out, re.M), out
    assert re.search(r"^  longer than 100 pieces \(train only\) +1$", out, re.M), out


def test_odd_stdin_keeps_blank_lines_blank(outcomes):
    lines = outcomes["translate-odd-text"].result().stdout.split("\n")
    assert len(lines) == 9 and lines[5] == lines[6] == lines[8] == ""  # (a tiny model may say nothing)


def test_bom_and_crlf_are_read_like_the_clean_file(ws, outcomes):
    # the cache key hashes every sentence: equal keys, equal text
    bom_crlf = cache_dir(outcomes["bom-and-crlf"].result())
    assert prepare_files(ws.root / "clean.tsv", ws.root / "pdata") == bom_crlf


def test_debug_switch_shows_the_traceback(outcomes):
    proc = outcomes["debug"].result()
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "DataError" in proc.stderr


def test_code_in_a_checkpoint_never_runs(ws):
    ws.trained()
    with pytest.raises(CheckpointError) as err:  # a zip written by torch.save, like a real checkpoint
        load_checkpoint(ws.root / "evil.pt")
    assert str(err.value) == (
        f"{ws.root}/evil.pt: not an nmt checkpoint (it holds objects other than "
        "tensors and plain values, which are never loaded); pass a checkpoint written "
        "by nmt-train"
    )
    with pytest.raises(CheckpointError, match="evil.pkl: not an nmt checkpoint"):  # a bare pickle
        load_checkpoint(ws.root / "evil.pkl")
    assert not (ws.root / "pwned").exists()


@pytest.mark.parametrize(
    "name, says",
    [
        ("empty.pt", "empty.pt: empty file (0 bytes), not a checkpoint; use another checkpoint"),
        ("incomplete.pt", "incomplete.pt: incomplete checkpoint, it lacks spm_src; pass a checkpoint written by"),
    ],
)
def test_more_broken_checkpoints(ws, name, says):
    path = ws.trained().root / name
    with pytest.raises(CheckpointError) as err:
        model_from_checkpoint(load_checkpoint(path), path=path)
    assert says in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------- a full disk
def test_a_full_disk_during_training_is_one_line_and_keeps_last_pt(outcomes):
    proc, run_dir, before = outcomes["full-disk-train"].result()
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith(f"error: {run_dir / 'checkpoints'}/") and "could not write the checkpoint" in line
    assert "(the previous checkpoint there is intact); free disk space" in line
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == before
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 6


def test_a_full_disk_during_prepare_is_one_line(ws, outcomes):
    proc = outcomes["full-disk-prepare"].result()
    assert "Traceback" not in proc.stdout + proc.stderr and proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith(f"error: {ws.root / 'full' / 'data' / 'cache'}: cannot write the prepared data")
    assert "free disk space" in line


# ------------------------------------------------------------------------------------------- determinism
def test_same_seed_same_cpu_gives_identical_checkpoints(ws):
    a = load_checkpoint(ws.trained().ckpt)
    b = load_checkpoint(ws.twin / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 6
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert equal_states(a["model"][key], b["model"][key]), key
    assert equal_states(a["optimizer"], b["optimizer"])
    assert equal_states(a["rng"], b["rng"]) and a["spm_src"] == b["spm_src"]


def equal_states(x, y) -> bool:
    """Bitwise equality of nested dicts/lists of tensors and plain values."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(equal_states(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(equal_states, x, y))
    return x == y


def test_prepare_cache_follows_the_file_and_the_settings(tmp_path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text(pairs_tsv(200))
    first = prepare_files(corpus, tmp_path / "data")
    stamp = (first / "encoded.pt").stat().st_mtime_ns
    lines = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[:10] + ["ein neuer satz\ta new sentence\n"] + lines[11:]))
    edited = prepare_files(corpus, tmp_path / "data")
    assert edited != first  # one line of the file edited: a new cache entry
    corpus.write_text("".join(lines))
    assert prepare_files(corpus, tmp_path / "data") == first  # the same text and settings: the same entry,
    assert (first / "encoded.pt").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert prepare_files(corpus, tmp_path / "data", vocab_size=70) not in (first, edited)  # a setting changed


# ------------------------------------------------------------------------------------------- fuzzing
@pytest.fixture(scope="module")
def translators(ws) -> list[Translator]:
    torch.set_num_threads(1)
    ws.trained()
    short = {"max_len_ratio": 0.3, "max_len_extra": 4}  # the property does not depend on the output length
    return [
        Translator.from_checkpoint(ws.ckpt, "cpu", **short),
        Translator.from_checkpoint(ws.ckpt, "cpu", beam_size=2, nbest=2, **short),
    ]


ODD_TEXT = st.sampled_from(
    [
        "\u202eevil\u202c",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0645\u0631\u062d\u0628\u0627",
        "e\u0301\u0302\u0303" * 20,
        "\U0001f600\U0001f44d\U0001f3fd\U0001f468\u200d\U0001f469\u200d\U0001f467",
        "\x00\x01\x07\x1b[31m",
        "\ufeffbom",
        "a\u200bb\u200dc",
        "\U0010ffff\ue000",
        "x" * 3000,
        "ab" * 400 + " " + "cd" * 400,
        "\u3000\u00a0\u2028\u2029\x85",
        "\t\r\n\x0b\x0c",
    ]
)
# Any Unicode scalar value (surrogates are not text), odd text, and mixtures of both.
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
MIXED = st.lists(st.one_of(ANY_TEXT, ODD_TEXT), max_size=4).map(" ".join)
LINES = st.lists(st.one_of(ANY_TEXT, ODD_TEXT, MIXED), min_size=1, max_size=5)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=LINES)
def test_translate_never_raises_and_answers_every_line(translators, texts):
    for translator in translators:
        results = translator.translate(texts)
        assert len(results) == len(texts)
        for text, hyps in zip(texts, results, strict=True):
            assert 1 <= len(hyps) <= translator.decoding.nbest and all(isinstance(h.text, str) for h in hyps)
            if not text.strip():
                assert [h.text for h in hyps] == [""]
