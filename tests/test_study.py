"""Tests for the bottleneck study: the presets' sweeps, bucket edges, config differences, seed grouping,
and `nmt-study` end to end on a tiny multirun (2 attention types x 2 seeds, trained once per module).

    python -m pytest -q tests/test_study.py
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from nmt.metrics import bucket_labels
from nmt.study import (
    CANDIDATE_EDGES,
    Run,
    StudySettings,
    add_intervals,
    bucket_counts,
    choose_edges,
    config_notes,
    find_runs,
    group_runs,
    long_sentence,
    run_study,
)
from nmt.study_report import table_markdown

BIN = Path(sys.executable).parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["trainer.max_steps=20", "trainer.valid_every=10", "data.train_size=300", "data.valid_size=40",
        "data.test_size=60", "model.embed_size=16", "model.encoder_hidden_size=16", "model.hidden_size=32",
        "trainer.progress=false", "trainer.heatmaps=0", "trainer.threads=1"]
FIGURES = ("bleu_by_length.png", "learning_curves.png", "attention_long_sentence.png")


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """`experiment=bottleneck_synthetic` shrunk to seconds, swept over attention=none,luong x seed=1,2."""
    root = tmp_path_factory.mktemp("study")
    cmd = [sys.executable, "-m", "nmt.cli.train", "-m", "experiment=bottleneck_synthetic",
           "attention=none,luong", "seed=1,2", *TINY, f"paths.data_dir={root / 'data'}",
           f"hydra.sweep.dir={root / 'sweep'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "sweep"


@pytest.fixture(scope="module")
def study(sweep) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [str(BIN / "nmt-study"), str(sweep), "--min-bucket", "10", "--bootstrap", "200", "--heatmaps", "1",
           "--threads", "1", "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads((sweep / "study.json").read_text())


def fake_run(name: str, attention: str, seed: int, **trainer) -> Run:
    config = {"seed": seed, "device": "cpu", "paths": {"data_dir": name}, "data": {"name": "synthetic"},
              "attention": {"name": attention, "query": "current"}, "trainer": {"max_steps": 100, **trainer}}
    return Run(Path(name), config, [], 100, 1, 1.0, True)


# --------------------------------------------------------------------------------------------- presets
def sweep_size(experiment: str) -> tuple[dict, int]:
    """The composed preset's sweeper params and the number of jobs they make."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from nmt.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return params, math.prod(len(list(o.sweep_iterator())) if o.is_sweep_override() else 1 for o in overrides)


@pytest.mark.parametrize("experiment", ["bottleneck", "bottleneck_synthetic"])
def test_bottleneck_presets_sweep_the_three_attentions(experiment):
    params, jobs = sweep_size(experiment)
    assert params == {"attention": "none,bahdanau,luong"} and jobs == 3


# --------------------------------------------------------------------------------------------- buckets
def test_bucket_edges_are_inclusive_below_and_exclusive_above():
    pairs = [(" ".join(["w"] * n), "x") for n in (1, 9, 10, 19, 20, 99)]
    rows = [{"bucket": b} for b in bucket_labels([0, 10, 20])]
    add_intervals(rows, pairs, ["x"] * len(pairs), [0, 10, 20], samples=0)
    assert bucket_counts([1, 9, 10, 19, 20, 99], [0, 10, 20]) == [2, 2, 2]
    assert bucket_counts([14, 15, 24, 25, 34, 35], [0, 15, 25, 35]) == [1, 2, 2, 1]
    assert all(r["low"] is None and r["high"] is None for r in rows)  # no resamples, no interval


def test_automatic_edges_are_the_finest_with_enough_sentences():
    uniform = [n for n in range(3, 41) for _ in range(16)]  # like the synthetic test split: 3-40 words
    assert choose_edges(uniform, 80) == ([0, 10, 20, 30], True)  # 40+ holds only 16: the 5-bucket sets fail
    bible_like = [5] * 40 + [12] * 200 + [22] * 300 + [32] * 200 + [45] * 90
    assert choose_edges(bible_like, 80) == ([0, 15, 25, 35], True)  # 40 under 10 words rules out 0,10,...
    assert choose_edges(bible_like, 30)[0] == CANDIDATE_EDGES[0][:5]  # [0,10,20,30,40]: 50+ is empty
    few = [5] * 10 + [25] * 10 + [35] * 10  # nothing qualifies: the set whose smallest bucket is largest
    assert choose_edges(few, 80) == ([0, 20, 30], False) and bucket_counts(few, [0, 20, 30]) == [10, 10, 10]


def test_long_sentence_is_the_longest_within_the_limit():
    pairs = [(" ".join(["w"] * n), "x") for n in (12, 45, 40, 40, 3)]
    assert long_sentence(pairs, 40) == 2
    assert long_sentence(pairs[:2], 10) == 0  # none within the limit: the shortest above it


# ------------------------------------------------------------------------------------ config differences
def test_runs_differing_only_by_seed_are_one_group():
    runs = [fake_run("a", "none", 1), fake_run("b", "none", 2, threads=1), fake_run("c", "luong", 1),
            fake_run("d", "luong", 2)]
    groups = group_runs(runs)
    assert [(label, [r.path.name for r in members]) for label, members in groups] == [
        ("none", ["a", "b"]), ("luong", ["c", "d"])]  # trainer.threads and paths.* do not matter
    diff, notes = config_notes(groups)
    assert diff == {} and notes == ["The runs differ only in the attention and the seed."]


def test_runs_trained_differently_are_flagged_with_the_keys():
    runs = [fake_run("a", "none", 1, max_steps=50), fake_run("b", "luong", 7),
            fake_run("c", "luong", 7, lr=1)]
    groups = group_runs(runs)
    assert [label for label, _ in groups] == ["none", "luong (trainer.lr=None)", "luong (trainer.lr=1)"]
    diff, notes = config_notes(groups)
    assert set(diff) == {"trainer.lr", "trainer.max_steps"}
    assert diff["trainer.max_steps"]["none"] == 50
    assert "differ in more than the attention" in notes[0] and "`trainer.max_steps`" in notes[0]
    assert "Seeds differ" in notes[1]


# ------------------------------------------------------------------------------------------ nmt-study
def test_study_writes_table_figures_and_json(sweep, study):
    proc, summary = study
    for name in (*FIGURES, "study.md", "study.json"):
        assert (sweep / name).is_file(), name
    for name in FIGURES:
        assert (sweep / name).read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(sweep / name).shape[2] in (3, 4)
    md, table = (sweep / "study.md").read_text(), table_markdown(summary)
    assert table in md and table in proc.stdout and "(bleu_by_length.png)" in md
    first_bucket = summary["groups"][0]["by_length"][0]
    assert f"| {first_bucket['bucket']} words (n={first_bucket['n']}) |" in table
    assert "| none | 2 |" in table and "| luong | 2 |" in table  # a row per attention, two seeds each
    for run in summary["runs"]:  # nmt-evaluate's files, and a learning curve from the validation history
        for key in ("hyp", "json", "md", "bleu_by_length"):
            assert Path(run["files"][key]).is_file()
        assert len(run["learning_curve"]["shortest"]["points"]) == 2  # validations at steps 10 and 20
    assert set(summary["long_sentence"]["outputs"]) == {"none", "luong"}


def test_study_numbers_agree_with_nmt_evaluation(sweep, study):
    from nmt.checkpoint import load_checkpoint
    from nmt.evaluation import evaluate
    from nmt.translator import Translator

    _, summary = study
    edges = summary["buckets"]["edges"]
    assert sum(summary["buckets"]["counts"]) == summary["sentences"] == 60
    for run in summary["runs"]:
        by_eval = json.loads(Path(run["files"]["json"]).read_text())
        assert run["bleu"] == by_eval["bleu"] and run["chrf"] == by_eval["chrf"]
        assert [r["bleu"] for r in run["by_length"]] == [r["bleu"] for r in by_eval["by_length"]]
        assert sum(r["n"] for r in run["by_length"]) == run["sentences"] == 60
        for r in run["by_length"]:
            assert r["low"] <= r["bleu"] <= r["high"]
    first = summary["runs"][0]  # evaluated again here, with nmt.evaluation directly
    best = Path(first["path"]) / "checkpoints" / "best.pt"
    pairs = _load_corpus(load_checkpoint(best)["config"]).splits["test"]
    direct = evaluate(Translator.from_checkpoint(best), pairs, edges, heatmaps=0)
    assert direct["bleu"] == first["bleu"] and direct["by_length"][0]["n"] == first["by_length"][0]["n"]
    for group in summary["groups"]:  # a group's numbers are its seeds' means
        runs = [r for r in summary["runs"] if r["path"] in group["runs"]]
        assert group["seeds"] == [1, 2] and len(runs) == 2
        assert group["bleu"] == pytest.approx(sum(r["bleu"] for r in runs) / 2, abs=0.006)
        for k, row in enumerate(group["by_length"]):
            assert row["seed_bleu"] == [r["by_length"][k]["bleu"] for r in runs]
            assert row["low"] == min(r["by_length"][k]["low"] for r in runs)


def test_study_of_run_directories_on_valid_plus_test(sweep, study, tmp_path):
    """Explicit run directories, splits concatenated, edges given, no bootstrap: the library directly."""
    runs = [sweep / "0_none_seed1", sweep / "2_luong_seed1"]
    summary = run_study(runs, _load_corpus, tmp_path / "out",
                        StudySettings(splits=["valid", "test"], edges=[0, 10, 20], bootstrap=0, heatmaps=0),
                        progress=False)
    assert summary["split"] == "valid+test" and summary["sentences"] == 100
    assert [r["n"] for r in summary["groups"][0]["by_length"]] == summary["buckets"]["counts"]
    assert sum(summary["buckets"]["counts"]) == 100 and summary["buckets"]["given"]
    assert all(r["low"] is None for g in summary["groups"] for r in g["by_length"])
    assert [g["seeds"] for g in summary["groups"]] == [[1], [1]]
    assert (runs[0] / "eval" / "valid+test.json").is_file()
    assert {p.name for p in (tmp_path / "out").iterdir()} == {*FIGURES, "study.md", "study.json"}


def _load_corpus(config: dict):
    from nmt.corpora import load_synthetic

    return load_synthetic(**{k: v for k, v in config["data"].items() if k not in ("name", "max_length")})


@pytest.mark.parametrize("args, message", [
    (["{empty}"], "no runs"),
    (["{empty}/missing"], "no such directory"),
    (["{sweep}", "--buckets", "0,x"], "--buckets"),
    (["{sweep}", "--buckets", "10,5"], "strictly increasing"),
    (["{sweep}", "--split", "nosuch"], "not a split"),
])
def test_user_errors_are_one_line(args, message, sweep, tmp_path, capsys):
    from nmt.cli.study import main

    with pytest.raises(SystemExit) as exit_info:
        main([a.format(empty=tmp_path, sweep=sweep) for a in args] + ["--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_find_runs_skips_unfinished_jobs(sweep, tmp_path):
    (tmp_path / "5_bahdanau_seed1" / ".hydra").mkdir(parents=True)  # a job without a checkpoint yet
    (tmp_path / "0_none_seed1").symlink_to(sweep / "0_none_seed1")
    runs, skipped = find_runs([tmp_path])
    assert [p.name for p in runs] == ["0_none_seed1"] and [p.name for p in skipped] == ["5_bahdanau_seed1"]
