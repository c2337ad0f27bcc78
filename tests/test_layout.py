"""Each module holds one concept: none in nmt/ runs past 400 lines (docs/development.md, Style), and the Trainer,
whose parts are the modules of nmt/trainer/, stays a class under 300 lines with an __init__ under 40. Every
package of nmt is one that pyproject.toml installs (a wheel without it would fail only when it is imported).

    python -m pytest -q tests/test_layout.py
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nmt
from nmt.trainer import Trainer

PACKAGE = Path(nmt.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def test_no_module_in_nmt_runs_past_400_lines():
    lengths = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert len(lengths) > 50  # the whole package was read
    assert {name: n for name, n in lengths.items() if n > 400} == {}


def test_the_trainer_class_and_its_init_stay_small():
    assert len(inspect.getsourcelines(Trainer)[0]) < 300
    assert len(inspect.getsourcelines(Trainer.__init__)[0]) < 40


def test_every_package_of_nmt_is_installed():
    listed = re.search(r"^packages = \[(.*?)\]$", PYPROJECT.read_text(encoding="utf-8"), re.M | re.S)
    installed = set(re.findall(r'"([\w.]+)"', listed.group(1)))
    packages = {".".join(("nmt", *p.parent.relative_to(PACKAGE).parts)) for p in PACKAGE.rglob("__init__.py")}
    assert "nmt.trainer" in packages and packages <= installed, packages - installed
