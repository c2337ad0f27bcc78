"""scripts/kernel_ablation.py's bookkeeping (no run, no timing): the run order of each repeat, with the A/A pair
around every kernel turned off, and the verdicts from the rates."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kernel_ablation.py"


def script():
    spec = importlib.util.spec_from_file_location("kernel_ablation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_repeat_runs_a_then_every_kernel_off_rotated_then_a_again():
    runs = script().schedule(["encoder", "output_loss", "dropout_mask"], 3)
    assert len(runs) == 3 * 5
    for r in range(3):
        names = [name for repeat, name, _ in runs if repeat == r]
        assert names[0] == "A" and names[-1] == "A_again"
        assert sorted(names[1:-1]) == ["off_dropout_mask", "off_encoder", "off_output_loss"]
    firsts = [next(name for repeat, name, _ in runs if repeat == r and name.startswith("off_")) for r in range(3)]
    assert len(set(firsts)) == 3  # rotated: no kernel always right after A
    assert all(off == ([] if name.startswith("A") else [name.removeprefix("off_")]) for _, name, off in runs)


def test_a_kernel_pays_where_its_cost_exceeds_the_aa_noise_or_two_percent():
    module = script()
    runs = []
    for repeat, (a, a2, enc, drop) in enumerate([(100, 104, 80, 101), (102, 100, 82, 99), (101, 101, 79, 100)]):
        for name, rate in (("A", a), ("A_again", a2), ("off_encoder", enc), ("off_dropout_mask", drop)):
            runs.append({"repeat": repeat, "name": name, "target_tokens_per_s": rate})
    v = module.verdicts(runs, ["encoder", "dropout_mask"])
    assert v["aa_spread"] == [round(4 / 102, 4), round(2 / 101, 4), 0.0]
    assert v["threshold"] == round(4 / 102, 4)  # the largest A/A spread, over 2%
    assert v["kernels"]["encoder"]["pays"] and v["kernels"]["encoder"]["median_cost"] == round(1 - 80 / 102, 4)
    assert not v["kernels"]["dropout_mask"]["pays"]  # within the noise
    quiet = [dict(r, target_tokens_per_s=100) if r["name"].startswith("A") else r for r in runs]
    assert module.verdicts(quiet, ["encoder"])["threshold"] == 0.02  # no A/A spread: the 2% floor
