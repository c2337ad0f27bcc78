"""The project speaks of itself, its users and their machines, never of its own working periods: no tracked text
file says "session" (a test framework's or library's own API names aside: pytest's `scope="session"`,
subprocess's `start_new_session`), calls a measurement "paired" in the sense of a throwaway side-by-side script
(the statistical paired tests and paired bootstrap are fine), dates its code's history ("until 2026-12-06",
"since 2026-12-04"), names a date in code at all, or cites the issue tracker ("issue 51 found", "the issue's
floor") where it should state the fact or the target itself: docstrings and comments say what code does and why,
and git keeps when.

    python -m pytest -q tests/test_narration.py
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ".cpp", ".h", ".html", ".js", ".css"}
CODE = {".py", ".yaml", ".yml", ".toml", ".sh", ".cpp", ".h", ".js"}
# Files left out of the check (none: every tracked text file is checked)
PENDING: set[str] = set()
PENDING_FOLDERS: tuple[str, ...] = ()

API_NAMES = re.compile(r"""scope=["']session["']|start_new_session|\w+_session\b|\bsession_\w+""")
SESSION = re.compile(r"\bsessions?\b", re.I)
# "paired" as statistics says what is paired with what: paired tests, a paired bootstrap, seeds paired by ...
STATISTICAL = r"[\s#*/]+(?:tests?|bootstrap|by|t-tests?|p-values?|comparisons?|differences?|resamples?|draws)\b"
PAIRED = re.compile(rf"(?<!are )(?<![\"'])\bpaired\b(?!{STATISTICAL})", re.I)
THROWAWAY = re.compile(r"\bthrowaway\b|\bworking periods?\b", re.I)
# the tracker's issues by number ("issue 51", "issues 49 and 51"), not the verb ("the loop issues 3 launches")
ISSUE = re.compile(r"\bissue\s+#?\d+|\bissues\s+#?\d+\s*(?:,|and)\s*#?\d+|\bthe issue's\b", re.I)
HISTORY_DATE = re.compile(r"\b(?:since|until|before|after|as of|predates?|from|on)\s+(?:the\s+)?20\d\d-\d\d\b", re.I)
ANY_DATE = re.compile(r"(?<![/\w])20\d\d-[01]\d(?:-[0-3]\d)?\b")  # a run folder's outputs/<date>/ aside


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git ls-files did not run: not a git checkout")
    return [name for name in out.stdout.splitlines() if Path(name).suffix in TEXT]


def pending(name: str) -> bool:
    return name in PENDING or name.startswith(PENDING_FOLDERS)


def prose(text: str) -> str:
    """Python source with everything but its comments and string literals blanked (same lines and columns), so
    that a variable named `paired` is not prose; the text itself where it does not tokenize."""
    lines = text.splitlines(keepends=True)
    kept = [re.sub(r"[^\n]", " ", line) for line in lines]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    for token in tokens:
        if token.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            a = col if r == row else 0
            b = end_col if r == end_row else len(line.rstrip("\n"))
            kept[r - 1] = kept[r - 1][:a] + line[a:b] + kept[r - 1][b:]
    return "".join(kept)


def narration(name: str, text: str) -> list[str]:
    """'path:line: the line' for every line of `text` that narrates a working period (a phrase may run on to
    the next line: the text is searched with its line breaks as spaces; in Python, its comments and strings)."""
    suffix = Path(name).suffix
    searched = API_NAMES.sub(lambda m: " " * len(m[0]), text)
    plain = (prose(searched) if suffix == ".py" else searched).replace("\n", " ")
    patterns = [SESSION, PAIRED, THROWAWAY, HISTORY_DATE, ISSUE]
    if suffix in CODE and not name.startswith("tests/"):
        patterns.append(ANY_DATE)
    starts = {text.count("\n", 0, m.start()) for pattern in patterns for m in pattern.finditer(plain)}
    lines = text.splitlines()
    return [f"{name}:{n + 1}: {lines[n].strip()[:160]}" for n in sorted(starts)]


def test_the_patterns_tell_narration_from_statistics_and_api_names():
    said = [
        "measured in the fifth session",
        "1.028x a training step, paired per batch",
        "each change was measured the paired way",
        "throwaway /tmp scripts",
        "fp32 weights were packed until 2026-12-06",
        "the page was drawn whole (issue 69, 2)",
        "as issues 49 and 51 found",
        "Issue 51's floor: 99% answered 200 within 1 s",
        "compared with the issue's floors",
    ]
    assert all(narration("doc.md", line) for line in said)
    assert narration("nmt/x.py", "# checkpoints of 2026-12-04 stored it unconverted")
    fine = [
        "seeds with paired tests and the interaction",
        "sacrebleu's paired bootstrap at each k",
        "seeds are paired by the recorded seed",
        "their intervals are paired.",
        "with its intervals, and the paired\ntests against none",
        'cell = res["paired"]["bahdanau"]',
        "nmt-evaluate checkpoint=outputs/2024-05-01/12-00-00/checkpoints/best.pt",
        '@pytest.fixture(scope="session")',
        "subprocess.Popen(cmd, start_new_session=True)",
        "a checkpoint repaired from last.pt",
        "the target: 99% answered 200 within 1 s",
        "the kernel issues 3 launches a step",
    ]
    assert not any(narration("doc.md", line) for line in fine), [narration("doc.md", line) for line in fine]
    assert not narration("nmt/x.py", "paired = {}\nfor key in paired:\n    paired[key] = 1\n")  # a variable
    assert not narration("tests/test_x.py", 'trained_at = "2026-12-05T10:00Z"')  # a test's fixture data


def test_no_tracked_text_file_narrates_working_periods():
    names = [name for name in tracked() if not pending(name) and name != "tests/test_narration.py"]  # its patterns
    hits = [
        hit for name in names for hit in narration(name, (ROOT / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not hits, "narration of working periods (say what it does and why; git keeps when):\n" + "\n".join(hits)
