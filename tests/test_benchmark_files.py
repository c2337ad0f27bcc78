"""docs/benchmark/ holds the measurements the docs cite and nothing else: every JSON file there is cited by a page
(README.md or docs/*.md), every file a page cites there exists, each is named by what it measures and where, and
none records a machine's own paths (its scratch folders, its checkouts, its home).

    python -m pytest -q tests/test_benchmark_files.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "benchmark"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what a file measures, then where: docs/benchmark/README.md lists the kinds
NAME = re.compile(
    r"(?:train_multi30k_(?:fp32|bf16)_[a-z0-9-]+(?:_run\d+)?|busy_machine_quick_[a-z0-9-]+"
    r"|memory_trace_malloc_[a-z0-9-]+|first_run_multi30k_(?:fp32|bf16)_[a-z0-9-]+|test_suite_[a-z0-9-]+)\.json"
)
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|Users|scratch|mnt|srv|var/tmp)/")


def _expand(path: str) -> list[str]:
    """`a_{x,y}.json` -> [a_x.json, a_y.json] (a page may name related files so)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [q for part in match[1].split(",") for q in _expand(path[: match.start()] + part + path[match.end() :])]


def cited() -> set[str]:
    """Every docs/benchmark/<file> a page names: as docs/benchmark/x.json in its text, or a link benchmark/x.json
    from docs/."""
    names = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"(?<![\w/.])((?:docs/)?benchmark/[\w.{},-]+\.json)", text):
            for name in _expand(path):
                full = (ROOT / name) if name.startswith("docs/") else (page.parent / name)
                names.add(full.resolve().relative_to(ROOT).as_posix())
    return names


def committed() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in FOLDER.glob("*.json")}


def test_every_cited_file_exists():
    missing = sorted(name for name in cited() if not (ROOT / name).exists())
    assert not missing, f"pages cite files that do not exist: {missing}"


def test_every_committed_file_is_cited():
    uncited = sorted(committed() - cited())
    assert not uncited, f"files under docs/benchmark/ that no page cites (remove them; git keeps them): {uncited}"


def test_files_are_named_by_what_they_measure_and_where():
    badly = sorted(p.name for p in FOLDER.glob("*.json") if not NAME.fullmatch(p.name))
    assert not badly, f"name these by what they measure and where (docs/benchmark/README.md): {badly}"
    assert (FOLDER / "README.md").exists()


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_no_file_records_a_machines_paths():
    """Commands and paths are relative (`../shared/...`, `scripts/...`) or the placeholder WORK for a run's scratch
    folder: another machine's absolute paths say nothing to a reader and mislead one who copies them. Every JSON
    file under docs/, the studies' aside (docs/study/: their records are being rebuilt; to be added here)."""
    files = [p for p in sorted((ROOT / "docs").rglob("*.json")) if "study" not in p.relative_to(ROOT).parts[1]]
    found = {
        p.relative_to(ROOT).as_posix(): hits
        for p in files
        if (hits := [s[:120] for s in _strings(json.loads(p.read_text(encoding="utf-8"))) if MACHINE_PATH.search(s)])
    }
    assert not found, f"a machine's own paths in committed files: {found}"
    assert MACHINE_PATH.search("python /tmp/x/scripts/benchmark.py") and not MACHINE_PATH.search("../shared/peers")


def test_the_cited_names_are_found_as_pages_write_them(tmp_path):
    assert _expand("benchmark/a_{x,y}.json") == ["benchmark/a_x.json", "benchmark/a_y.json"]
    assert "docs/benchmark/train_multi30k_fp32_avx2-epyc.json" in cited()  # named in performance.md's table


def test_relative_paths_rewrites_a_machines_record(tmp_path):
    """scripts/relative_paths.py makes a fresh report committable: what this test forbids, it rewrites."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("relative_paths", ROOT / "scripts" / "relative_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = {
        "command": "/srv/a/.venv/bin/python /work/wt/scripts/benchmark.py --data /data/shared/m --work /tmp/b1 "
        "--out /tmp/b1.json",
        "decode": {"checkpoint": "/tmp/b1/run/checkpoints/last.pt", "process": ["/home/u/.venv/bin/nmt-translate"]},
        "data": "/data/shared/m",
        "note": "an AMD EPYC, 2 threads",
    }
    path = tmp_path / "train_multi30k_fp32_x.json"
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    assert module.main([str(path), "--shared", "/data/shared"]) == 0
    out = json.loads(path.read_text(encoding="utf-8"))
    assert out["command"] == (
        "python scripts/benchmark.py --data ../shared/m --work WORK --out train_multi30k_fp32_x.json"
    )
    assert out["decode"] == {"checkpoint": "WORK/run/checkpoints/last.pt", "process": ["nmt-translate"]}
    assert out["data"] == "../shared/m" and out["note"] == report["note"]
    assert not [s for s in _strings(out) if MACHINE_PATH.search(s)]
