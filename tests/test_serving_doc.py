"""docs/serving.md's figures are written from the committed JSON files of scripts/serve_flood.py and
scripts/serve_latency.py by scripts/serve_tables.py (through scripts/readme_tables.py), never typed by hand:
its blocks are what the files say, an edited figure fails the check, every docs/serve_*.json is cited and every
cited one exists, and each run names the command that wrote it.

    python -m pytest -q tests/test_serving_doc.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "docs" / "serving.md"
FLOOD = ROOT / "docs" / "serve_flood.json"


def _module(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_blocks_are_what_the_json_files_say():
    tables = _module("readme_tables")
    text = SERVING.read_text(encoding="utf-8")
    for name, write in tables.SERVING_BLOCKS:
        assert tables.generated(name, write()) in text, f"{name}: run python scripts/readme_tables.py"


def test_an_edited_figure_in_serving_md_fails_the_check(tmp_path):
    tables = _module("readme_tables")
    copy = tmp_path / "serving.md"
    shutil.copy(SERVING, copy)
    text = copy.read_text(encoding="utf-8")
    latency = json.loads((ROOT / "docs" / "serve_latency.json").read_text(encoding="utf-8"))
    figure = f"{latency['startup_median_s']:.2f} s, median of"
    assert figure in text
    copy.write_text(text.replace(figure, "0.99 s, median of", 1), encoding="utf-8")
    assert tables.main(["--check", "--serving-doc", str(copy)]) == 1
    assert tables.main(["--serving-doc", str(copy)]) == 0 and copy.read_text(encoding="utf-8") == text


def test_every_serve_json_is_cited_and_every_cited_one_exists():
    text = SERVING.read_text(encoding="utf-8")
    cited = set(re.findall(r"\]\((serve_[\w]+\.json)\)", text))
    committed = {p.name for p in (ROOT / "docs").glob("serve_*.json")}
    assert cited == committed, (sorted(cited - committed), sorted(committed - cited))
    assert not re.search(r"\bissues?\s+\d+", text, re.I)


def test_a_table_follows_its_files(tmp_path):
    """A run's figures, its target's verdict and its command come from its file; a phase a run lacks is '-'."""
    serve = _module("serve_tables")
    report = json.loads(FLOOD.read_text(encoding="utf-8"))
    missing = {k: v for k, v in report.items() if k != "slow_reader_attack"} | {"checkpoints": ["a.pt"]}
    before = tmp_path / "before.json"
    before.write_text(json.dumps(missing), encoding="utf-8")
    during = report["slow_reader_attack"]["requests_during"]
    during.update(requests=1000, answered_200_within_1s=990, statuses={"200": 995, "503": 5}, max_ms=1500.0)
    report["command"] = "python scripts/serve_flood.py a.pt b.pt --out here.json"
    after = tmp_path / "after.json"
    after.write_text(json.dumps(report), encoding="utf-8")
    block = serve.flood_block((("before", before), ("after", after)))
    row = next(line for line in block.splitlines() if line.startswith("| POST /translate under 132"))
    assert row.endswith(
        "| - | 990 of 1,000 answered 200 within 1 s (995 answered 200, 5 answered 503); "
        f"median {serve.ms(during['median_ms'])}, slowest 1.5 s: target met |"
    )
    assert "`python scripts/serve_flood.py a.pt b.pt --out here.json`" in block  # the command the file records
    rebuilt = f"`python scripts/serve_flood.py a.pt --phases held,burst,pages,reconnect --out {before.as_posix()}`"
    assert rebuilt in block  # a file that records none: the command its checkpoints and phases say
    during["answered_200_within_1s"] = 989  # under 99%
    after.write_text(json.dumps(report), encoding="utf-8")
    assert "slowest 1.5 s: target not met" in serve.flood_block((("after", after),))


def test_the_scripts_record_their_command():
    """New runs record the command that wrote them, so the doc need not rebuild it."""
    latency = _module("serve_latency")
    argv = sys.argv
    sys.argv = ["/any/where/scripts/serve_latency.py", "a b.pt", "--out", "x.json"]
    try:
        assert latency.command_line() == "python scripts/serve_latency.py 'a b.pt' --out x.json"
    finally:
        sys.argv = argv
    assert "command_line()" in (ROOT / "scripts" / "serve_flood.py").read_text(encoding="utf-8")
