"""The README stays short, true and current: its results table is what scripts/readme_tables.py writes from the
committed JSON files, its install and test commands are the ones .ci/run runs, it cites no commit, and the docs
paths it and the handbook cite exist.

    python -m pytest -q tests/test_readme.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"
HANDBOOK = sorted((ROOT / "docs").glob("*.md"))
# written by nmt-study into its own folder; until that folder is committed its paths are pending
PENDING = "docs/study/caption_windows"


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_lines(text: str) -> list[str]:
    """Every line inside the ```bash blocks of a markdown text, comments after the command removed."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def _ci_block(title: str) -> list[str]:
    """The commands of .ci/run under its comment line `# --- <title> ---`, up to the next such line."""
    lines, inside = [], False
    for line in CI.read_text(encoding="utf-8").splitlines():
        if line.startswith("# ---"):
            inside = title in line
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    assert lines, f".ci/run has no block '{title}'"
    return lines


def test_the_results_table_is_what_the_script_writes():
    tables = _tables()
    text = README.read_text(encoding="utf-8")
    assert tables.replace_block(text, tables.render()) == text, "run python scripts/readme_tables.py"
    assert tables.main(["--check"]) == 0


def test_a_figure_edited_by_hand_fails_the_check(tmp_path, capsys):
    tables = _tables()
    copy = tmp_path / "README.md"
    shutil.copy(README, copy)
    text = copy.read_text(encoding="utf-8")
    block = text[text.index(tables.BEGIN) : text.index(tables.END)]
    figure = json.loads((ROOT / "docs" / "benchmark" / "benchmark.json").read_text())["figures"]["bleu_beam5"]
    assert f"{figure:.2f}" in block  # the beam-5 BLEU of the side-by-side run is in the table ...
    copy.write_text(text.replace(block, block.replace(f"{figure:.2f}", f"{figure + 1:.2f}")), encoding="utf-8")
    assert tables.main(["--check", "--readme", str(copy)]) == 1  # ... and a hand-made change to it is caught
    assert "differs" in capsys.readouterr().out
    assert tables.main(["--readme", str(copy)]) == 0  # rewriting restores it
    assert copy.read_text(encoding="utf-8") == text


def test_the_table_names_command_machine_and_date_and_skips_a_missing_study(tmp_path):
    tables = _tables()
    bench = json.loads((ROOT / "docs" / "benchmark" / "benchmark.json").read_text())
    block = tables.render(study=tmp_path / "absent.json")
    assert "bottleneck study" not in block and "interaction" not in block
    assert tables.command_text(bench["command"]) in block
    assert bench["machine"]["cpu_model"] in block and bench["date"][:10] in block


def test_study_rows_from_a_study_summary(tmp_path):
    tables = _tables()
    study = {
        "command": "/venv/bin/python -m nmt.cli.study multirun/x --output docs/study/caption_windows",
        "trained_k": 4,
        "models": {
            "none": {
                "label": "none (RNNencdec)",
                "seeds": 3,
                "bleu_by_k": {"1": 13.3, "2": 11.1, "5": 8.7},
                "ratio": 0.662,
                "ratio_k": 4,
                "train_minutes": 30.2,
            },
            "bahdanau": {"label": "bahdanau (RNNsearch order)", "seeds": 3, "bleu_by_k": {"1": 30.6, "2": 33.1}},
        },
        "interaction": {"bahdanau": {"difference": 0.471, "ci95": [0.402, 0.55], "k": 4}},
        "runs": [
            {"cpu": "AMD EPYC", "trained_at": "2026-12-05T10:00Z"},
            {"cpu": "AMD EPYC (recorded there; training's not stored)", "trained_at": "2026-12-05T11:00Z"},
        ],
    }
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    block = tables.render(study=path)
    assert "13.3 / 11.1 / 8.7 (k=5: longer than any training example); keeps 0.66 of its k=1 BLEU at k=4" in block
    assert "30.6 / 33.1" in block and "+0.471 [+0.402, +0.550]" in block
    assert "python -m nmt.cli.study multirun/x" in block and "AMD EPYC" in block and "2026-12-05" in block
    assert block.count("2026-12-05") == 1  # named once, in the study's first row
    assert "AMD EPYC, 1 thread a run" in block and "recorded there" not in block  # one machine, however recorded


def test_readme_is_short_and_cites_no_commit():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes in the README: {hashes}"


def test_readme_install_and_test_commands_are_those_of_ci():
    readme = _code_lines(README.read_text(encoding="utf-8"))
    (install,) = _ci_block("install command")
    assert install == 'pip install "torch==2.13.0" -e ".[dev]"'
    assert install in readme
    checks = _ci_block("lint, format and test commands")
    assert "python -m pytest -q" in checks
    blocks = [_code_lines(f"```bash\n{b}```") for b in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)]
    assert checks in blocks, f"the README has no block of exactly CI's lint, format and test commands: {checks}"


def _expand(path: str) -> list[str]:
    """`a_{x,y}.json` -> [a_x.json, a_y.json] (the handbook names related files so)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [q for part in match[1].split(",") for q in _expand(path[: match.start()] + part + path[match.end() :])]


@pytest.mark.parametrize("page", [README, *HANDBOOK], ids=lambda p: p.name)
def test_cited_docs_paths_exist(page):
    text = page.read_text(encoding="utf-8")
    cited = {q for path in re.findall(r"(?<![\w/.])(docs/[\w./{},-]*\w)", text) for q in _expand(path)}
    for link in re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", text):
        target = (page.parent / link).resolve()
        if target.is_relative_to(ROOT):
            cited.add(target.relative_to(ROOT).as_posix())
    pending = not (ROOT / PENDING).exists()
    missing = [
        p
        for p in sorted(cited)
        if not (ROOT / p).exists() and not (pending and (p == PENDING or p.startswith(PENDING + "/")))
    ]
    assert not missing, f"{page.name} cites paths that do not exist: {missing}"
