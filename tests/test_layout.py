"""Each module holds one concept: none in nmt/ runs past 400 lines (docs/development.md, Style), and the Trainer,
whose parts are the modules of nmt/trainer/, stays a class under 300 lines with an __init__ under 40.

    python -m pytest -q tests/test_layout.py
"""

from __future__ import annotations

import inspect
from pathlib import Path

import nmt
from nmt.trainer import Trainer

PACKAGE = Path(nmt.__file__).parent


def test_no_module_in_nmt_runs_past_400_lines():
    lengths = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert len(lengths) > 50  # the whole package was read
    assert {name: n for name, n in lengths.items() if n > 400} == {}


def test_the_trainer_class_and_its_init_stay_small():
    assert len(inspect.getsourcelines(Trainer)[0]) < 300
    assert len(inspect.getsourcelines(Trainer.__init__)[0]) < 40
