"""Tests for the bottleneck study: the presets' sweeps, bucket edges, config differences, seed grouping,
decoder labels, refusing the selection split, and `nmt-study` end to end on a tiny multirun (2 attention
types x 2 seeds, trained once per module), with and without verse windows (test_k1..test_k3).
The statistics alone (BLEU from statistics, bootstraps, paired tests) are in tests/test_study_stats.py.

    python -m pytest -q tests/test_study.py
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from nmt.corpora import Corpus, verse_windows
from nmt.errors import ConfigError
from nmt.metrics import bucket_labels
from nmt.study import (
    CANDIDATE_EDGES,
    StudySettings,
    add_intervals,
    bucket_counts,
    check_splits,
    choose_edges,
    long_sentence,
    run_study,
)
from nmt.study_report import table_markdown
from nmt.study_runs import Run, config_notes, decoder_label, find_runs, group_runs

BIN = Path(sys.executable).parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = [
    "trainer.max_steps=20",
    "trainer.valid_every=10",
    "data.train_size=300",
    "data.valid_size=40",
    "data.test_size=60",
    "model.embed_size=16",
    "model.encoder_hidden_size=16",
    "model.hidden_size=32",
    "trainer.progress=false",
    "trainer.heatmaps=0",
    "trainer.threads=1",
]
FIGURES = ("bleu_by_length.png", "learning_curves.png", "attention_long_sentence.png")
NONE, LUONG = "none (Luong order: context after each step)", "luong (Luong order)"  # fake_run's labels


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """`experiment=bottleneck_synthetic` shrunk to seconds, swept over attention=none,luong x seed=1,2."""
    root = tmp_path_factory.mktemp("study")
    cmd = [
        sys.executable,
        "-m",
        "nmt.cli.train",
        "-m",
        "experiment=bottleneck_synthetic",
        "attention=none,luong",
        "seed=1,2",
        *TINY,
        f"paths.data_dir={root / 'data'}",
        f"hydra.sweep.dir={root / 'sweep'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "sweep"


@pytest.fixture(scope="module")
def study(sweep) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [
        str(BIN / "nmt-study"),
        str(sweep),
        "--min-bucket",
        "10",
        "--bootstrap",
        "200",
        "--heatmaps",
        "1",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads((sweep / "study.json").read_text())


def fake_run(name: str, attention: str, seed: int, query: str = "current", **trainer) -> Run:
    config = {
        "seed": seed,
        "device": "cpu",
        "paths": {"data_dir": name},
        "data": {"name": "synthetic"},
        "attention": {"name": attention, "query": query},
        "trainer": {"max_steps": 100, **trainer},
    }
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


BOTTLENECK = sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "experiment").glob("bottleneck*.yaml"))


@pytest.mark.parametrize("experiment", BOTTLENECK)
def test_bottleneck_presets_sweep_the_three_attentions(experiment):
    """Every bottleneck preset sweeps the three attentions (and at most the seed besides)."""
    params, jobs = sweep_size(experiment)
    seeds = str(params.get("seed", "0")).split(",")
    assert params["attention"] == "none,bahdanau,luong" and set(params) <= {"attention", "seed"}
    assert jobs == 3 * len(seeds)


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


def test_splits_that_chose_best_pt_are_refused():
    for splits in (["valid"], ["valid", "test"], ["valid_k2"], ["test", "valid_k10"]):
        with pytest.raises(ConfigError, match="chose each run's best.pt.*use --split test"):
            check_splits(splits)
    assert check_splits(["test"]) == ["test"] and check_splits(["test_k2"]) == ["test_k2"]
    assert check_splits(["test", "validation_extra"]) == ["test", "validation_extra"]  # only valid, valid_k<k>


# ------------------------------------------------------------------------------------ config differences
@pytest.mark.parametrize(
    "attention, query, feeding, label",
    [
        ({"name": "none"}, "previous", False, "none (RNNencdec: context into every step)"),
        ({"name": "none"}, "current", True, "none (Luong order: context after each step, input feeding)"),
        ({"name": "bahdanau"}, "previous", False, "bahdanau (RNNsearch order)"),
        ({"name": "bahdanau"}, "current", True, "bahdanau (Luong order, input feeding)"),
        ({"name": "luong", "score": "general"}, "current", True, "luong general (Luong order, input feeding)"),
        ({"name": "luong", "score": "dot"}, "previous", True, "luong dot (RNNsearch order, input feeding)"),
    ],
)
def test_decoder_label_names_the_decoder_from_the_stored_config(attention, query, feeding, label):
    config = {"attention": {**attention, "query": query}, "model": {"input_feeding": feeding}}
    assert decoder_label(config) == label


def test_runs_differing_only_by_seed_are_one_group():
    runs = [
        fake_run("a", "none", 1),
        fake_run("b", "none", 2, threads=1),
        fake_run("c", "luong", 1),
        fake_run("d", "luong", 2),
    ]
    groups = group_runs(runs)
    assert [(label, [r.path.name for r in members]) for label, members in groups] == [
        (NONE, ["a", "b"]),
        (LUONG, ["c", "d"]),
    ]  # trainer.threads and paths.* do not matter
    diff, notes = config_notes(groups)
    assert diff == {} and notes == ["The runs differ only in the attention and the seed."]


def test_runs_trained_differently_are_flagged_with_the_keys():
    runs = [fake_run("a", "none", 1, max_steps=50), fake_run("b", "luong", 7), fake_run("c", "luong", 7, lr=1)]
    groups = group_runs(runs)
    assert [label for label, _ in groups] == [NONE, f"{LUONG} (trainer.lr=None)", f"{LUONG} (trainer.lr=1)"]
    diff, notes = config_notes(groups)
    assert set(diff) == {"trainer.lr", "trainer.max_steps"}
    assert diff["trainer.max_steps"][NONE] == 50
    assert "differ in more than the attention" in notes[0] and "`trainer.max_steps`" in notes[0]
    assert "Seeds differ" in notes[1]


def test_the_same_attention_in_two_orders_gets_two_labels_without_keys():
    groups = group_runs([fake_run("a", "bahdanau", 1, "previous"), fake_run("b", "bahdanau", 1, "current")])
    assert [label for label, _ in groups] == ["bahdanau (RNNsearch order)", "bahdanau (Luong order)"]


# ------------------------------------------------------------------------------------------ nmt-study
def test_study_writes_table_figures_and_json(sweep, study):
    from nmt.checkpoint import load_checkpoint

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
    none, luong = labels = [g["label"] for g in summary["groups"]]  # named by the decoders they are
    configs = [load_checkpoint(Path(g["runs"][0]) / "checkpoints" / "best.pt")["config"] for g in summary["groups"]]
    assert labels == [decoder_label(c) for c in configs] and none.startswith("none (") and luong.startswith("luong ")
    assert f"| {none} | 2 |" in table and f"| {luong} | 2 |" in table  # a row per decoder, two seeds each
    assert "## Paired tests against none" in md and "What was tested: paired bootstrap" in md
    assert "Paired tests against none" in proc.stdout and "bleu_by_window" not in md  # no windows here
    for run in summary["runs"]:  # nmt-evaluate's files, and a learning curve from the validation history
        for key in ("hyp", "json", "md", "bleu_by_length"):
            assert Path(run["files"][key]).is_file()
        assert len(run["learning_curve"]["shortest"]["points"]) == 2  # validations at steps 10 and 20
    assert set(summary["long_sentence"]["outputs"]) == set(labels)


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
    for group in summary["groups"]:  # a group's numbers are its seeds' means, inside their intervals
        runs = [r for r in summary["runs"] if r["path"] in group["runs"]]
        assert group["seeds"] == [1, 2] and len(runs) == 2
        assert group["bleu"] == pytest.approx(sum(r["bleu"] for r in runs) / 2, abs=0.006)
        assert group["low"] <= group["bleu"] <= group["high"]
        for k, row in enumerate(group["by_length"]):
            assert row["seed_bleu"] == [r["by_length"][k]["bleu"] for r in runs]
            assert row["low"] <= row["bleu"] <= row["high"]
    none, luong = summary["groups"]  # luong is tested against none, seed by seed, in every cell
    pairs = {luong["label"]: {"baseline": none["label"], "seeds": [[1, 1], [2, 2]]}}
    assert none["test"] is None and summary["tests"]["pairs"] == pairs
    for cell in (luong["test"], *(r["test"] for r in luong["by_length"])):
        assert len(cell["p"]) == 2 and cell["p_max"] == max(cell["p"]) and 0 < cell["p_max"] <= 1


def test_study_of_run_directories_with_given_edges(sweep, study, tmp_path, one_thread):
    """Explicit run directories, edges given, no bootstrap: the library directly; valid is refused."""
    runs = _copy_runs(sweep, tmp_path, ["0_none_seed1", "2_luong_seed1"])
    with pytest.raises(ConfigError, match="valid chose each run's best.pt"):
        run_study(runs, _load_corpus, tmp_path / "out", StudySettings(splits=["valid", "test"]), progress=False)
    summary = run_study(
        runs,
        _load_corpus,
        tmp_path / "out",
        StudySettings(splits=["test"], edges=[0, 10, 20], bootstrap=0, heatmaps=0),
        progress=False,
    )
    assert summary["split"] == "test" and summary["sentences"] == 60 and summary["windows"] is None
    assert [r["n"] for r in summary["groups"][0]["by_length"]] == summary["buckets"]["counts"]
    assert sum(summary["buckets"]["counts"]) == 60 and summary["buckets"]["given"]
    assert all(r["low"] is None for g in summary["groups"] for r in g["by_length"])
    assert summary["tests"] is None and any("--bootstrap 0" in n for n in summary["notes"])
    assert [g["seeds"] for g in summary["groups"]] == [[1], [1]]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {*FIGURES, "study.md", "study.json"}


def _copy_runs(sweep: Path, tmp_path: Path, names: list[str]) -> list[Path]:
    """Copies of the sweep's runs (without their eval/), so that a study here leaves the fixture's files be."""
    for name in names:
        shutil.copytree(sweep / name, tmp_path / "runs" / name, ignore=shutil.ignore_patterns("eval"))
    return [tmp_path / "runs" / name for name in names]


def _load_corpus(config: dict) -> Corpus:
    from nmt.corpora import load_synthetic

    return load_synthetic(**{k: v for k, v in config["data"].items() if k not in ("name", "max_length")})


def _load_windowed(config: dict) -> Corpus:
    """The synthetic corpus with verse windows faked: the test pairs as "chapters" of 10 consecutive
    pairs, cut into windows of k = 1..3 (a chapter's last window holds one pair), as data.window=3 would."""
    corpus = _load_corpus(config)
    test = corpus.splits["test"]
    chapters = [i // 10 for i in range(len(test))]
    corpus.splits.update({f"test_k{k}": verse_windows(test, chapters, k) for k in (1, 2, 3)})
    return corpus


def test_verse_windows_are_detected_and_reported_per_k(sweep, study, tmp_path, one_thread):
    out = tmp_path / "out"
    _copy_runs(sweep, tmp_path, sorted(p.name for p in sweep.iterdir() if (p / "checkpoints").is_dir()))
    # a cap of 3 source pieces (the Translator's option) would cut every input: the study raises it
    settings = StudySettings(min_bucket=10, bootstrap=200, heatmaps=0, decoding={"max_src_pieces": 3})
    summary = run_study([tmp_path / "runs"], _load_windowed, out, settings, progress=False)
    assert summary["decoding"]["max_src_pieces"] > 3  # evaluation raises it to the longest source: none is cut
    windows = summary["windows"]
    assert windows["splits"] == ["test_k1", "test_k2", "test_k3"] and windows["n"] == [60, 30, 24]
    assert windows["source_words"][0] < windows["source_words"][1] < windows["source_words"][2]
    none, luong = summary["groups"]
    for group in (none, luong):
        rows = group["by_window"]
        assert [r["k"] for r in rows] == [1, 2, 3] and [r["n"] for r in rows] == windows["n"]
        assert rows[0]["bleu"] == group["bleu"]  # k=1: the single test sentences themselves
        for r in rows:
            assert r["low"] <= r["bleu"] <= r["high"] and len(r["seed_bleu"]) == 2
        assert group["window_ratio"] == pytest.approx(rows[-1]["bleu"] / rows[0]["bleu"], abs=1e-3)
    assert all(r["test"] is None for r in none["by_window"])
    for r in luong["by_window"]:
        assert len(r["test"]["p"]) == 2 and 0 < r["test"]["p_max"] <= 1
    for run in summary["runs"]:  # every k evaluated (k=1 reuses the test split's translations)
        assert set(run["windows"]) == set(windows["splits"])
        assert Path(run["windows"]["test_k3"]["files"]["json"]).name == "test_k3.json"
    md = (out / "study.md").read_text()
    assert "## The same verses, k at a time" in md and "(bleu_by_window.png)" in md and "| k=3 |" in md
    assert "BLEU k=3 / k=1" in md
    assert (out / "bleu_by_window.png").read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads((out / "study.json").read_text())["windows"] == windows


@pytest.mark.parametrize(
    "args, message",
    [
        (["{empty}"], "no runs"),
        (["{empty}/missing"], "no such directory"),
        (["{sweep}", "--buckets", "0,x"], "--buckets"),
        (["{sweep}", "--buckets", "10,5"], "strictly increasing"),
        (["{sweep}", "--split", "nosuch"], "not a split"),
        (["{sweep}", "--split", "valid"], "valid chose each run's best.pt"),
        (["{sweep}", "--split", "valid+test"], "use --split test"),
        (["{sweep}", "--split", "valid_k2"], "valid_k2 holds valid's verses, and valid chose each run's best.pt"),
    ],
)
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
