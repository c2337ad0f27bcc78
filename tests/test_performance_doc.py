"""docs/performance.md is a reference a user reads, not a notebook: at most 300 lines, its tables written from the
committed JSON files (one row per CPU kind and precision, the newest run, the range over every run of the kind;
kinds not measured say so), and its claims about the AVX2 runs true of those files. The README's first run and
the suite's time come from their JSON files too, and the README shows a newcomer their own data, a GPU and the
thread settings.

    python -m pytest -q tests/test_performance_doc.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PERFORMANCE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
FOLDER = ROOT / "docs" / "benchmark"
AVX2 = FOLDER / "train_multi30k_fp32_avx2-epyc.json"
BF16 = FOLDER / "train_multi30k_bf16_avx512bf16-epyc.json"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(source: Path, folder: Path, name: str, date: str, ours: float, theirs: float, **machine) -> Path:
    """A copy of a committed side-by-side report with another date, training speeds and machine fields."""
    bench = json.loads(source.read_text(encoding="utf-8"))
    bench["date"] = date
    bench["figures"]["sentences_per_s"] = ours
    bench["peers"]["opennmt"]["figures"]["sentences_per_s"] = theirs
    bench["machine"].update(machine)
    path = folder / name
    path.write_text(json.dumps(bench), encoding="utf-8")
    return path


def test_performance_md_is_a_short_reference_with_its_sections():
    text = PERFORMANCE.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^##+ (.+)$", text, re.M)
    for heading in ("By kind of CPU", "On a GPU", "What the plan chooses", "A busy machine", "Memory"):
        assert heading in headings, heading
    assert "How to repeat the measurements" in headings and "What the figures do not show" in headings
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes in performance.md (history belongs in git): {hashes}"


def test_one_row_per_kind_and_precision_the_newest_run_and_the_range(tmp_path):
    perf = _module("perf_tables")
    old = _run(AVX2, tmp_path, "train_multi30k_fp32_avx2-a_run1.json", "2026-01-01T00:00:00", 120.0, 100.0)
    new = _run(AVX2, tmp_path, "train_multi30k_fp32_avx2-a.json", "2026-02-01T00:00:00", 150.0, 100.0)
    _run(BF16, tmp_path, "train_multi30k_bf16_bf16-b.json", "2026-01-15T00:00:00", 300.0, 100.0)
    _run(AVX2, tmp_path, "train_multi30k_fp32_emu.json", "2026-01-20T00:00:00", 170.0, 100.0, emulated="avx2")
    table = perf.by_kind_block(tmp_path)
    rows = {line.split(" | ")[0].strip("| ").split(" (")[0]: line for line in table.splitlines()[2:]}
    assert set(rows) == {"AVX2", "AVX512", "AVX512_BF16", "AMX", "CUDA", "AVX2, emulated on AVX2"}
    assert "150.0 / 100.0: **1.50x**" in rows["AVX2"] and "2 runs: 1.20-1.50x" in rows["AVX2"]
    assert perf.rel(old) in rows["AVX2"] and perf.rel(new) in rows["AVX2"]  # both files cited
    assert "| fp32 / fp32 (OpenNMT-py" in rows["AVX2"]
    assert "| bf16 / fp32 (OpenNMT-py" in rows["AVX512_BF16"] and "**3.00x**" in rows["AVX512_BF16"]
    assert "not measured" in rows["AVX512"] and "not measured" in rows["AMX"]
    assert "not a real machine of that kind" in rows["AVX2, emulated on AVX2"]
    assert "not measured" in rows["CUDA"]
    gpu = json.loads((tmp_path / "train_multi30k_bf16_bf16-b.json").read_text(encoding="utf-8"))
    gpu["device"] = "cuda"
    (tmp_path / "train_multi30k_bf16_gpu.json").write_text(json.dumps(gpu), encoding="utf-8")
    cuda = next(line for line in perf.by_kind_block(tmp_path).splitlines() if line.startswith("| CUDA"))
    assert "| bf16 / fp32" in cuda and "not measured" not in cuda  # a run on a GPU is the CUDA row, not its CPU's


def test_the_avx2_claims_hold_for_the_committed_runs():
    """The page says 1.6x OpenNMT-py's training speed was reached only under --emulate-avx2, never on the real
    AVX2 CPU: true of every committed run (a new run that changes it must change the page)."""
    perf = _module("perf_tables")
    groups = perf.side_by_side_runs()

    def ratios(key):
        return [b["figures"]["sentences_per_s"] / perf.peer_of(b)[1]["sentences_per_s"] for b, _ in groups[key]]

    real = ratios(("AVX2", "fp32"))
    emulated = [r for key in groups if key[0].startswith("AVX2, emulated") for r in ratios(key)]
    assert len(real) >= 2 and max(real) < 1.6
    assert emulated and min(emulated) >= 1.6
    text = PERFORMANCE.read_text(encoding="utf-8")
    assert "only under `--emulate-avx2`" in text and "never on the real AVX2 EPYC" in text


def test_an_edited_figure_in_performance_md_fails_the_check(tmp_path):
    tables = _module("readme_tables")
    copy = tmp_path / "performance.md"
    shutil.copy(PERFORMANCE, copy)
    bench = json.loads(AVX2.read_text(encoding="utf-8"))
    figure = f"{bench['figures']['sentences_per_s']:.1f} / "
    text = copy.read_text(encoding="utf-8")
    assert figure in text
    copy.write_text(text.replace(figure, "999.9 / ", 1), encoding="utf-8")
    assert tables.main(["--check", "--perf-doc", str(copy)]) == 1
    assert tables.main(["--perf-doc", str(copy)]) == 0 and copy.read_text(encoding="utf-8") == text


def test_first_run_and_suite_blocks_say_what_the_files_say(tmp_path):
    perf = _module("perf_tables")
    assert "No first run is committed yet" in perf.first_run_block(tmp_path)
    assert "not committed yet" in perf.suite_block(tmp_path)
    (committed,) = FOLDER.glob("first_run_*.json")
    run = json.loads(committed.read_text(encoding="utf-8"))
    for load, said in ((3.5, "a shared machine: load average up to 3.5"), (0.1, "a quiet machine")):
        run["load_average_before"] = run["load_average_after"] = [load, load, load]
        (tmp_path / "first_run_x.json").write_text(json.dumps(run), encoding="utf-8")
        block = perf.first_run_block(tmp_path)
        assert said in block and f"{run['steps']:,} steps" in block and run["translation"] in block
    suite = {
        "command": "python -m pytest -q",
        "date": "2026-01-01T00:00:00",
        "machine": run["machine"],
        "load_average_before": [0.2, 0.2, 0.2],
        "seconds": 300.0,
        "summary": "500 passed in 300.00s",
    }
    (tmp_path / "test_suite_x.json").write_text(json.dumps(suite), encoding="utf-8")
    assert "took 5.0 minutes (500 passed in 300.00s)" in perf.suite_block(tmp_path)


def test_the_readme_shows_a_newcomer_their_data_a_gpu_and_the_threads():
    text = README.read_text(encoding="utf-8")
    own = text[text.index("## Your own data") : text.index("## On a GPU")]
    (command,) = re.findall(r"```bash\n(.*?)\n```", own, re.S)
    assert command.startswith("nmt-train ") and "data=files data.train=[train.de,train.en]" in command
    gpu = text[text.index("## On a GPU") : text.index("## The full runs")]
    assert "device=cuda" in gpu and "experiment=multi30k_deen_gpu" in gpu and "No run on a GPU is committed" in gpu
    assert "trainer.threads=auto" in text and "trainer.threads=adaptive" in text
    first = text[text.index("## A first run") : text.index("## Your own data")]
    assert "first-run:begin" in first and not re.search(r"\b20\d\d-\d\d-\d\d\b", first.split("first-run:begin")[0])
    assert "/work/" not in text and "/tmp/" not in text


@pytest.mark.slow  # two nmt processes and a pytest: seconds on a quiet machine, minutes on a busy one
def test_first_run_and_suite_time_write_what_the_blocks_read(tmp_path):
    """scripts/first_run.py runs nmt-train and nmt-translate for real (here the quick preset for 3 steps) and
    scripts/suite_time.py runs pytest: each JSON has what perf_tables' block reads from it."""
    import subprocess
    import sys

    out = tmp_path / "first_run_quick.json"
    overrides = ["experiment=quick", "data.train_size=300", "trainer.max_steps=3", "trainer.progress=false"]
    cmd = [sys.executable, str(ROOT / "scripts" / "first_run.py"), "--out", str(out), "--work", str(tmp_path / "w")]
    done = subprocess.run([*cmd, "--sentence", "a b c", "--", *overrides], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text(encoding="utf-8"))
    assert run["command"] == "nmt-train " + " ".join(overrides) and run["steps"] == 3
    assert run["translation"] and run["peak_rss_gib"] > 0 and run["machine"]["cpu_kind"]
    assert run["threads"]["setting"] == "auto" and "/" not in run["command"]
    suite = tmp_path / "test_suite_here.json"
    args = ["-q", "-p", "no:xdist", "-o", "addopts=", "tests/test_narration.py", "-k", "patterns"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "suite_time.py"), "--out", str(suite), "--", *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in json.loads(suite.read_text(encoding="utf-8"))["summary"]
    perf = _module("perf_tables")
    assert "3 steps" in perf.first_run_block(tmp_path) and "1 passed" in perf.suite_block(tmp_path)
