"""The README stays short, true and current: its results table, its first run, the suite's time and the study's
tables (in the README and docs/study.md, both language pairs side by side), and docs/performance.md's tables, are
what scripts/readme_tables.py writes from the committed JSON files; the README shows nmt in fp32 against
OpenNMT-py in fp32 beside nmt in bf16 against it, and says so in the rows; a newcomer finds their own data, a GPU
and the thread settings in it; its install and test commands are the ones .ci/run runs, it cites no commit and
no machine's paths, and the docs paths it and the handbook cite exist.

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
# written by nmt-study into their own folders; until a folder is committed its paths are pending
PENDING = ("docs/study/caption_windows", "docs/study/caption_windows_fr")
PERFORMANCE = ROOT / "docs" / "performance.md"


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
    assert tables.main(["--check"]) == 0  # the README's other blocks, docs/study.md's and performance.md's too
    for page in (README, ROOT / "docs" / "study.md"):  # both pages hold the study tables
        page_text = page.read_text(encoding="utf-8")
        assert page_text.count(tables.STUDY_BEGIN) == page_text.count(tables.STUDY_END) == 1, page.name


def test_a_figure_edited_by_hand_fails_the_check(tmp_path, capsys):
    tables = _tables()
    copy = tmp_path / "README.md"
    shutil.copy(README, copy)
    text = copy.read_text(encoding="utf-8")
    block = text[text.index(tables.BEGIN) : text.index(tables.END)]
    figure = json.loads(tables.BENCHMARKS[1].read_text())["figures"]["bleu_beam5"]
    assert f"{figure:.2f}" in block  # the beam-5 BLEU of the side-by-side run is in the table ...
    copy.write_text(text.replace(block, block.replace(f"{figure:.2f}", f"{figure + 1:.2f}")), encoding="utf-8")
    assert tables.main(["--check", "--readme", str(copy)]) == 1  # ... and a hand-made change to it is caught
    assert "differs" in capsys.readouterr().out
    assert tables.main(["--readme", str(copy)]) == 0  # rewriting restores it
    assert copy.read_text(encoding="utf-8") == text


def test_the_table_names_command_machine_and_date_and_skips_a_missing_study(tmp_path):
    tables = _tables()
    block = tables.render(studies={"de -> en": (tmp_path / "absent.json", "nmt-study x")})
    assert "bottleneck study" not in block and "interaction" not in block
    assert "No study has been committed yet" in tables.render_study({"de -> en": (tmp_path / "absent.json", "")})
    for path in tables.BENCHMARKS:
        bench = json.loads(path.read_text())
        assert tables.command_text(bench["command"], path) in block
        assert bench["machine"]["cpu_model"] in block and bench["date"][:10] in block


def test_the_readme_compares_fp32_with_fp32_beside_bf16_with_fp32_and_says_so():
    """A ratio of nmt in bf16 against OpenNMT-py in fp32 is partly the precision: each training row names both
    sides' precision, and the README has the like-for-like fp32 row beside the bf16 one."""
    tables = _tables()
    block = tables.render()
    rows = [line for line in block.splitlines() if line.startswith("| training on")]
    assert len(rows) == 2
    assert "**nmt in fp32 against OpenNMT-py in fp32**" in rows[0]
    assert "**nmt in bf16 against OpenNMT-py in fp32**" in rows[1]
    precisions = [tables.perf_tables.precision(json.loads(p.read_text())) for p in tables.BENCHMARKS]
    assert precisions == ["fp32", "bf16"]


def test_the_table_names_no_machines_paths_and_says_which_malloc():
    """The table's commands show no machine's absolute paths (the README says ../shared), and its machine cell names
    the malloc, so a peak memory that differs from the first run's says why (another CPU, another malloc)."""
    tables = _tables()
    block = tables.render()
    committed = tables.BENCHMARKS[1]
    name = f"docs/benchmark/{committed.name}"
    assert "/work/" not in block and "/tmp/" not in block
    assert "--data ../shared/data/multi30k --peer-dir ../shared/peers" in block
    assert f"--out {name}" in block  # the file as committed, not where it was written
    recorded = "python x.py --data /srv/shared/data/m --out /tmp/a.json"
    assert tables.command_text(recorded, committed) == f"python x.py --data ../shared/data/m --out {name}"
    from_worktree = "/venv/bin/python /srv/wt/scripts/benchmark.py --data /srv/shared/data/m --out /tmp/a.json"
    assert tables.command_text(from_worktree, committed) == (
        f"python scripts/benchmark.py --data ../shared/data/m --out {name}"
    )
    assert "malloc not recorded" in tables.machine_text({"cpu_model": "X"})
    assert "glibc malloc" in tables.machine_text({"cpu_model": "X", "malloc": "glibc"})


def _study(corpus: str, shift: float, seeds: int) -> dict:
    """A study.json of two models and k = 1, 2, 5 (k=5 untrained), greedy; `shift` moves every BLEU."""
    sets = [{"k": k, "trained": k <= 4} for k in (1, 2, 5)]

    def row(k: int, bleu: float) -> dict:
        return {"k": k, "bleu": bleu + shift, "low": bleu + shift - 1, "high": bleu + shift + 1, "seeds": seeds}

    def model(label: str, by_k: dict, ratio: float | None) -> dict:
        return {
            "label": label,
            "seeds": seeds,
            "bleu_by_k": {str(k): b + shift for k, b in by_k.items()},
            "by_k": [row(k, b) for k, b in by_k.items()],
            "train_minutes": 30.2,
            **({"ratio": ratio, "ratio_k": 4} if ratio else {}),
        }

    cell = {"p_holm": 10 / 1001, "significant": True, "deltas": [17.3] * seeds}
    return {
        "corpus": corpus,
        "trained_k": 4,
        "headline": "greedy",
        "bootstrap": 1000,
        "sets": sets,
        "results": {
            "greedy": {
                "models": {
                    "none": model("none (RNNencdec: context into every step)", {1: 13.3, 2: 11.1, 5: 8.7}, 0.662),
                    "bahdanau": model("bahdanau (RNNsearch order)", {1: 30.6, 2: 33.1, 5: 30.0}, None),
                },
                "paired": {"bahdanau": {"1": cell, "2": cell, "5": cell}},
                "interaction": {
                    "bahdanau": {
                        "difference": 0.471,
                        "ci_seeds": [0.3, 0.6],
                        "ci_test": [0.402, 0.55],
                        "k": 4,
                        "seeds": seeds,
                    }
                },
            }
        },
        "runs": [
            {
                "name": "none_seed1",
                "attention": "none",
                "cpu": "AMD EPYC",
                "trained_at": "2026-12-05T10:00Z",
                "steps": 1200,
                "epochs": 9,
                "train_minutes": 10.0,
                "stopped_by": "early_stopping",
            },
            {
                "name": "bahdanau_seed1",
                "attention": "bahdanau",
                "trained_at": "2026-12-05T11:00Z",
                "steps": 1400,
                "epochs": 10,
                "train_minutes": 12.5,
                "cpu": "AMD EPYC (recorded there; training's not stored)",
            },
        ],
    }


def test_study_rows_from_a_study_summary(tmp_path):
    tables = _tables()
    path = tmp_path / "study.json"
    path.write_text(json.dumps(_study("multi30k-de-en", 0.0, 3)))
    block = tables.render(studies={"de -> en": (path, "/venv/bin/python -m nmt.cli.study multirun/x --output d")})
    assert "13.3 / 11.1 / 8.7 (k=5: longer than any training example); keeps 0.66 of its k=1 BLEU at k=4" in block
    assert "30.6 / 33.1" in block and "+0.471 (seeds [+0.300, +0.600]; test set [+0.402, +0.550])" in block
    assert "bottleneck study, Multi30k de -> en, greedy, none" in block and "(3 seeds, 30 min" in block
    assert "python -m nmt.cli.study multirun/x" in block and "AMD EPYC" in block and "2026-12-05" in block
    assert block.count("2026-12-05") == 1  # named once, in the study's first row
    assert "AMD EPYC, 1 thread a run" in block and "recorded there" not in block  # one machine, however recorded


def test_study_tables_show_both_language_pairs_side_by_side(tmp_path):
    """Each model's de -> en row is followed by its fr -> en row, with the figures and seeds of its JSON; the
    findings give each pair's interaction and its largest Holm p, rounded up; an edited figure fails --check."""
    tables = _tables()
    studies = {}
    for pair, corpus, shift, seeds in (("de -> en", "multi30k-de-en", 0.0, 5), ("fr -> en", "multi30k-fr-en", 2.0, 3)):
        path = tmp_path / f"{corpus}.json"
        path.write_text(json.dumps(_study(corpus, shift, seeds)))
        studies[pair] = (path, f"nmt-study {corpus}")
    block = tables.render_study(studies)
    rows = [line for line in block.splitlines() if line.startswith("| RNN")]
    assert [r.split(" | ")[1] for r in rows] == ["de -> en", "fr -> en"] * 2
    assert rows[0].startswith("| RNNencdec (`none`) | de -> en | greedy | 5 | 13.3 [12.3, 14.3] | 11.1")
    assert rows[1].startswith("| RNNencdec (`none`) | fr -> en | greedy | 3 | 15.3 [14.3, 16.3] | 13.1")
    assert (
        "| de -> en | greedy | bahdanau | 5 | +0.471 | [+0.300, +0.600] | [+0.402, +0.550] | 0.010; 3 of 3 k |" in block
    )
    assert "| fr -> en | greedy | bahdanau | 3 |" in block
    doc = tmp_path / "study.md"
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text(encoding="utf-8"), encoding="utf-8")
    doc.write_text(f"# x\n\n{tables.STUDY_BEGIN}\n{tables.STUDY_END}\n", encoding="utf-8")
    readme_text, doc_text = tables.rewritten(readme.read_text(), doc.read_text(), tables.BENCHMARKS, studies)
    assert block in readme_text and tables.render_study(studies, every_decoding=True) in doc_text
    assert "15.3 [14.3, 16.3]" in doc_text
    assert "| de -> en | none | 1 | 1200 | 9 | 10.00 | early_stopping 1 of 1 |" in doc_text  # how they trained
    assert "| de -> en | bahdanau | 1 | 1400 | 10 | 12.50 | not recorded 1 of 1 |" in doc_text
    doc.write_text(doc_text.replace("15.3 [14.3, 16.3]", "15.4 [14.3, 16.3]"), encoding="utf-8")
    assert tables.main(["--check", "--study-doc", str(doc)]) == 1  # a hand-made change is caught ...


def test_readme_is_short_and_cites_no_commit():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes in the README: {hashes}"


def test_readme_install_and_test_commands_are_those_of_ci():
    readme = _code_lines(README.read_text(encoding="utf-8"))
    (install,) = _ci_block("install command")
    assert install in readme  # CI installs exactly as the README says
    # a CPU build on any Linux machine: PyTorch's CPU index, whose 2.13.0+cpu pip prefers to PyPI's CUDA build;
    # an index that cannot be reached (CI's offline mirror) costs one retry, not minutes
    assert install.startswith('pip install "torch==2.13.0" -e ".[dev]" ')
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install and "--retries 1" in install
    text = README.read_text(encoding="utf-8")
    assert "download.pytorch.org/whl/cu" in text and "torchtext" in text  # the CUDA build beside it; no torchtext
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
    pending = [folder for folder in PENDING if not (ROOT / folder).exists()]
    missing = [
        p
        for p in sorted(cited)
        if not (ROOT / p).exists() and not any(p == folder or p.startswith(folder + "/") for folder in pending)
    ]
    assert not missing, f"{page.name} cites paths that do not exist: {missing}"


def test_the_budget_block_sets_each_pairs_two_budgets_side_by_side(tmp_path):
    """docs/study.md's budget block: per pair and model, the 9-epoch study's figures -> the converged study's,
    from their study.json; a pair without a converged study is named, not invented."""
    tables = _tables()
    nine, converged = tmp_path / "nine.json", tmp_path / "converged.json"
    nine.write_text(json.dumps(_study("multi30k-de-en", 0.0, 5)))
    converged.write_text(json.dumps(_study("multi30k-de-en", 2.0, 3)))
    block = tables.render_budget({"de -> en": (nine, converged), "fr -> en": (nine, tmp_path / "absent.json")})
    none = next(line for line in block.splitlines() if line.startswith("| de -> en | none |"))
    assert "| 5 -> 3 | 13.3 -> 15.3 |" in none
    assert "No converged study yet for fr -> en" in block and "| fr -> en |" not in block
    assert block.startswith(tables.BUDGET_BEGIN) and block.endswith(tables.BUDGET_END)
