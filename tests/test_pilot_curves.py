"""scripts/pilot_curves.py: a pilot run's validations read from its train.log, and early stopping replayed on them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("pilot_curves", ROOT / "scripts" / "pilot_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """[t][nmt.trainer][INFO] - step 50 epoch 0 loss 6.4 lr 2.00e-03 grad_norm 0.5 tokens/s 1
[t][nmt.trainer][INFO] - step 100 epoch 0 loss 5.8 lr 2.00e-03 grad_norm 0.3 tokens/s 1
[t][nmt.trainer][INFO] - validation at step 100: loss 4.3 ppl 74.46 BLEU 10.00 chrF 17.71 (new best)
[t][nmt.trainer][INFO] - step 150 epoch 1 loss 5.0 lr 2.00e-03 grad_norm 0.2 tokens/s 1
[t][nmt.trainer][INFO] - validation at step 200: loss 4.0 ppl 50.0 BLEU 9.50 chrF 18.00
[t][nmt.trainer][INFO] - step 250 epoch 1 loss 4.9 lr 1.00e-03 grad_norm 0.2 tokens/s 1
[t][nmt.trainer][INFO] - validation at step 300: loss 3.9 ppl 49.0 BLEU 9.80 chrF 18.10
[t][nmt.trainer][INFO] - validation at step 300 (averaged weights): loss 3.9 ppl 49.0 BLEU 9.80 chrF 18.10
[t][nmt.trainer][INFO] - validation at step 400: loss 3.8 ppl 45.0 BLEU 11.00 chrF 19.00 (new best)
"""


def test_validations_and_early_stopping_replayed(tmp_path):
    pilot = _script()
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(LOG)
    curve = pilot.read_log(run / "train.log")
    assert [r["step"] for r in curve] == [100, 200, 300, 400]  # a validation logged twice is one
    assert curve[0] == {
        "step": 100,
        "loss": 4.3,
        "bleu": 10.0,
        "chrf": 17.71,
        "epoch": 0,
        "lr": 0.002,
        "train_loss": 6.1,
        "grad_norm": 0.4,
    }
    assert curve[2]["lr"] == 0.001
    assert pilot.replay(curve, 2) == {"stops_at": 300, "best_step": 100, "best_bleu": 10.0, "later_max": 11.0}
    assert pilot.replay(curve, 3)["stops_at"] is None  # never three bad validations in a row
    assert pilot.main([str(run), "--out", str(tmp_path / "p.json"), "--patience", "2"]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["run"]["replay"]["2"]["later_max"] == 11.0
