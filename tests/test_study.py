"""Tests for the bottleneck study (nmt.study): the presets' sweeps, decoder labels, what runs may differ in,
refused splits and inputs, corrupt records, version-1 records beside version-2 ones, decodings only some seeds
have, seeds paired by their recorded seed, the package's imports, and `nmt-study` end to end on a tiny sweep
(attention=none,bahdanau x seed=1,2 on two small line-aligned files with caption windows k = 1..3, trained once
per module; 25 test captions, so windows of exactly k leave one out at k = 2 and 3): its records (greedy and
beam 5) and numbers checked against sacrebleu, and the study rebuilt from its records alone equal to the
original, file for file; the committed studies rebuilt from their records.
The statistics alone (bootstrap by hand, paired tests, Holm, p-values) are in tests/test_study_stats.py.

    python -m pytest -q tests/test_study.py
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import sacrebleu

from nmt.errors import ConfigError, DataError
from nmt.study.build import StudySettings
from nmt.study.checks import check_records, check_split
from nmt.study.configs import check_comparable, decoder_label, differing_keys
from nmt.study.lengths import CANDIDATE_EDGES, choose_edges
from nmt.study.records import (
    FORMAT,
    VERSION,
    StudyRun,
    exact_windows,
    read_record,
    record_decodings,
    references_sha256,
    set_outputs,
    write_record,
)
from nmt.study.runs import find_inputs
from nmt.study.summary import summarise

BIN = Path(sys.executable).parent
STUDY_DIR = Path(__file__).parents[1] / "nmt" / "study"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ("bleu_by_window.png", "bleu_by_length.png", "learning_curves.png", "attention_long.png")
B = 1000  # nmt-study's default resamples, the fewest it accepts
TINY = [
    "data.window=2",
    "data.window_test=3",
    "tokenizer.vocab_size=30",
    "model.embed_size=16",
    "model.encoder_hidden_size=16",
    "model.hidden_size=32",
    "optim.lr=0.02",
    "trainer.max_steps=40",
    "trainer.valid_every=20",
    "trainer.batch_tokens=400",
    "trainer.progress=false",
    "trainer.heatmaps=0",
    "trainer.threads=1",
    "kernels=eager",  # the study's bookkeeping, not the kernels: no torch.compile of bahdanau's energy (seconds a run)
]
GERMAN = "ein zwei drei vier fuenf sechs sieben acht".split()
WORDS = dict(zip(GERMAN, "one two three four five six seven eight".split(), strict=True))


# ------------------------------------------------------------------------------------------- fixtures
def _write_pairs(root: Path, name: str, n: int, rng: random.Random) -> list[str]:
    """n line-aligned pairs, root/<name>.de and root/<name>.en (a word-for-word toy language); the targets."""
    src, tgt = [], []
    for _ in range(n):
        words = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 7))]
        src.append(" ".join(words))
        tgt.append(" ".join(WORDS[w] for w in words))
    (root / f"{name}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
    (root / f"{name}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return tgt


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """`nmt-train -m data=files attention=none,bahdanau seed=1,2` on tiny files (test: 25 captions, so 12
    windows of k=2 and 8 of k=3, one caption left out of each; trained on windows of up to 2), a tiny model,
    40 steps: seconds."""
    root = tmp_path_factory.mktemp("study")
    rng = random.Random(0)
    for name, n in (("train", 300), ("valid", 20), ("test", 25)):
        _write_pairs(root, name, n, rng)
    files = {name: f"data.{name}=['{root / name}.de','{root / name}.en']" for name in ("train", "valid", "test")}
    cmd = [
        sys.executable,
        "-m",
        "nmt.cli.train",
        "-m",
        "data=files",
        *files.values(),
        "attention=none,bahdanau",
        "seed=1,2",
        *TINY,
        f"paths.data_dir={root / 'data'}",
        f"hydra.sweep.dir={root / 'sweep'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "sweep"


STUDY_ARGS = ["--buckets", "0,10,20", "--threads", "1", "--device", "cpu"]


def _nmt_study(*args: str | Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(BIN / "nmt-study"), *map(str, args), *STUDY_ARGS], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def study(sweep) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """nmt-study on the sweep directory, --output A: (the process, study.json, A)."""
    out = sweep.parent / "A"
    proc = _nmt_study(sweep, "--output", out)
    return proc, json.loads((out / "study.json").read_text()), out


@pytest.fixture(scope="module")
def rebuilt(sweep, study) -> Path:
    """nmt-study on A/records alone, --output B, with the sweep's run directories moved out of reach."""
    _, _, a = study
    away = sweep.parent / "sweep_moved_away"
    sweep.rename(away)
    try:
        _nmt_study(a / "records", "--output", sweep.parent / "B")
    finally:
        away.rename(sweep)
    return sweep.parent / "B"


def _records(out: Path) -> dict[str, dict]:
    return {p.name.removesuffix(".json.gz"): read_record(p) for p in sorted((out / "records").glob("*.json.gz"))}


# ----------------------------------------------------------------------------------------- fake records
REFERENCES = [
    "a man in a blue shirt is standing on a ladder",
    "two dogs play with a red ball in the snow",
    "a girl is reading a book under a large tree",
    "people walk along the beach at sunset",
    "a cyclist rides down a steep mountain road",
    "three children sit on a bench eating ice cream",
    "a woman sells fruit at a busy street market",
    "an old man plays the guitar on the corner",
]


def _hypotheses(references: list[str], keep: float, variant: int) -> list[str]:
    rng = random.Random(variant)
    return [" ".join(w for w in ref.split() if rng.random() < keep) or "a" for ref in references]


def fake_record(
    name: str, attention: str, seed: int, variant: int, keep: float = 0.7, beams=(1,), version: int = VERSION, **trainer
) -> dict:
    """A record as nmt.study.records writes one (version 2, or 1: greedy only, its windows cut as version 1
    cut them: a short last window), of 9 captions and their windows of k = 1, 2 (one caption left out)."""
    captions = [*REFERENCES, "a dog runs across the green grass"]
    hyps = {b: _hypotheses(captions, keep - 0.05 * (b > 1), variant + b) for b in beams}
    sets = {}
    for k in (1, 2):
        sizes = [k] * (len(captions) // k) + ([len(captions) % k] if version == 1 and len(captions) % k else [])
        starts = [k * i for i in range(len(sizes))]
        refs = [" ".join(captions[s : s + n]) for s, n in zip(starts, sizes, strict=True)]
        outputs = {
            ("greedy" if b == 1 else f"beam{b}"): {
                "hypotheses": [" ".join(hyps[b][s : s + n]) for s, n in zip(starts, sizes, strict=True)],
                "bleu": 0.0,
                "chrf": 0.0,
                "ter": 0.0,
            }
            for b in beams
        }
        sets[f"test_k{k}"] = {
            "k": k,
            "sizes": sizes,
            "references": refs,
            "references_sha256": references_sha256(refs),
            "source_words": [len(r.split()) for r in refs],
            **({"left_out": len(captions) - k * (len(captions) // k), "outputs": outputs} if version > 1 else {}),
            **(outputs["greedy"] if version == 1 else {}),
        }
    config = {
        "seed": seed,
        "device": "cpu",
        "paths": {"data_dir": f"data/{name}"},
        "data": {"name": "files", "window": 2},
        "attention": {"name": attention, "query": "previous"},
        "model": {"input_feeding": False},
        "trainer": {"max_epochs": 9, "threads": 1, **trainer},
    }
    decodings = {("greedy" if b == 1 else f"beam{b}"): {"beam_size": b, "batch_tokens": 4000} for b in beams}
    return {
        "format": FORMAT,
        "version": version,
        "name": name,
        "config": config,
        "provenance": {"commit": "abc", "cpu_model": "cpu", "torch": "2"},
        "corpus": "files",
        "split": "test",
        "units": None,
        "overlap": {"pairs": 9, "source": 0, "target": 0, "both": 0},
        "train_minutes": 1.0,
        "steps": 10,
        "epochs": 1,
        "finished": True,
        "best": {"metric": "bleu", "value": 1.0, "step": 10},
        "learning_curve": {},
        "parameters": 100,
        **({"decodings": decodings} if version > 1 else {"decoding": {"beam_size": 1, "batch_tokens": 8000}}),
        "signatures": {},
        "sets": sets,
        "long": {"set": "test_k1", "index": 0, "source": "x", "reference": "y", "text": "y", "attention": None},
        "recorded_by": {"cpu_model": "cpu", "torch": "2"},
    }


# --------------------------------------------------------------------------------------------- presets
def sweep_size(experiment: str) -> tuple[dict, int, dict]:
    """The composed preset's sweeper params, the number of jobs they make, and its data section."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from nmt.cli.common import compose_config

    cfg = compose_config([f"experiment={experiment}"], hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    jobs = math.prod(len(list(o.sweep_iterator())) if o.is_sweep_override() else 1 for o in overrides)
    return params, jobs, OmegaConf.to_container(cfg.data)


BOTTLENECK = sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "experiment").glob("bottleneck*.yaml"))


@pytest.mark.parametrize("experiment", BOTTLENECK)
def test_bottleneck_presets_sweep_the_three_attentions(experiment):
    """Every bottleneck preset sweeps the three attentions (and at most the seed besides)."""
    params, jobs, data = sweep_size(experiment)
    seeds = str(params.get("seed", "0")).split(",")
    assert params["attention"] == "none,bahdanau,luong" and set(params) <= {"attention", "seed"}
    assert jobs == 3 * len(seeds)
    if experiment == "bottleneck":  # the headline study: Multi30k caption windows, k=5 never trained on
        assert (data["name"], data["window"], data["window_test"], len(seeds)) == ("multi30k", 4, 5, 5)
    if experiment == "bottleneck_bible":
        assert (data["name"], data["window"], len(seeds)) == ("bible", 4, 3)


def test_the_bottleneck_study_trains_to_the_plateau_in_fp32():
    """experiment=bottleneck stops on validation BLEU's plateau, not a fixed budget: the learning rate is halved at
    least twice without a gain before a run stops, the ceiling is far beyond any pilot's plateau, and the
    precision is the same (fp32) on every machine."""
    from omegaconf import OmegaConf

    from nmt.cli.common import compose_config

    cfg = OmegaConf.to_container(compose_config(["experiment=bottleneck"]), resolve=True)
    trainer, optim = cfg["trainer"], cfg["optim"]
    assert trainer["best_metric"] == "bleu" and optim["schedule"] == "plateau"
    assert trainer["patience"] >= 2 * (optim["plateau_patience"] + 1)  # two cuts of the rate, then the stop
    assert trainer["max_epochs"] >= 100 and trainer["max_steps"] is None and trainer["max_minutes"] is None
    assert trainer["amp"] == "off"


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
    config["model"].update(self_attention_layers=2, self_attention_heads=4)  # the encoder's layers are named too
    assert decoder_label(config).endswith("encoder self-attention 2x4)")


def test_runs_may_differ_only_in_the_attention_the_seed_and_ignored_keys():
    a, b = fake_record("a", "none", 1, 1)["config"], fake_record("b", "luong", 2, 2)["config"]
    b["trainer"]["threads"], b["device"], b["trainer"]["progress"] = 4, "cuda", True  # none of these matter
    check_comparable([a, b], ["a", "b"])
    assert differing_keys([a, b]) == ["attention.name", "seed"]
    c = fake_record("c", "luong", 3, 3, max_epochs=10)["config"]
    with pytest.raises(DataError, match=r"differ in trainer\.max_epochs: a has 9, c has 10"):
        check_comparable([a, b, c], ["a", "b", "c"])


def test_runs_trained_before_a_config_key_existed_compare_as_its_neutral_value():
    """Records of runs trained before model.self_attention_* existed combine with new runs without the layer
    (the heads of zero layers change nothing), not with runs that have one."""
    old = fake_record("a", "none", 1, 1)["config"]
    new = fake_record("b", "bahdanau", 1, 2)["config"]
    new["model"].update(self_attention_layers=0, self_attention_heads=4)
    check_comparable([old, new], ["a", "b"])
    layered = fake_record("c", "bahdanau", 2, 3)["config"]
    layered["model"].update(self_attention_layers=1, self_attention_heads=4)
    with pytest.raises(DataError, match=r"differ in model\.self_attention_heads: a has \"<unset>\", c has 4"):
        check_comparable([old, new, layered], ["a", "b", "c"])


def test_the_keys_that_say_how_to_resume_do_not_stop_old_records_combining():
    """trainer.resume_fallback arrived after seeds 1, 4, 5 were trained: a run that has it and one
    that lacks it still form one study, since where a resume may fall back changes nothing learnt."""
    old = fake_record("a", "none", 1, 1)["config"]
    new = fake_record("b", "bahdanau", 1, 2)["config"]
    new["trainer"].update(resume_fallback=False, resume="auto", resume_changes="refuse")
    check_comparable([old, new], ["a", "b"])
    assert differing_keys([old, new]) == ["attention.name"]


def test_automatic_edges_are_the_finest_with_enough_items():
    uniform = [n for n in range(3, 41) for _ in range(16)]  # 3-40 words, 16 items each
    assert choose_edges(uniform, 80) == ([0, 10, 20, 30], True)  # 40+ holds only 16: the 5-bucket sets fail
    bible_like = [5] * 40 + [12] * 200 + [22] * 300 + [32] * 200 + [45] * 90
    assert choose_edges(bible_like, 80) == ([0, 15, 25, 35], True)  # 40 under 10 words rules out 0,10,...
    assert choose_edges(bible_like, 30)[0] == CANDIDATE_EDGES[0][:5]  # [0,10,20,30,40]: 50+ is empty
    few = [5] * 10 + [25] * 10 + [35] * 10  # nothing qualifies: the set whose smallest bucket is largest
    assert choose_edges(few, 80) == ([0, 20, 30], False)


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "split, message",
    [
        ("train", "the runs trained on it"),
        ("train_k2", "the runs trained on it"),
        ("valid", "valid chose each run's best.pt"),
        ("valid_k2", "valid chose each run's best.pt"),
        ("test+test", "a split is given twice"),
        ("valid+test", "give one held-out split"),
    ],
)
def test_splits_that_trained_or_chose_the_runs_are_refused(split, message):
    with pytest.raises(ConfigError, match=message):
        check_split(split)


def test_held_out_splits_are_accepted():
    assert check_split("test") == "test" and check_split("test_2017_flickr") == "test_2017_flickr"
    assert check_split("validation_extra") == "validation_extra"  # only valid and valid_k<k> chose best.pt


def test_records_that_may_not_be_combined_are_refused():
    a, b = fake_record("a", "none", 1, 1), fake_record("b", "bahdanau", 1, 2)
    check_records([a, b])
    with pytest.raises(DataError, match="run a is given twice"):
        check_records([a, b, fake_record("a", "none", 1, 1)])
    with pytest.raises(DataError, match="runs a and c are the same model with the same seed"):
        check_records([a, b, fake_record("c", "none", 1, 3)])
    with pytest.raises(DataError, match=r"trainer\.max_epochs: a has 9, d has 10"):
        check_records([a, b, fake_record("d", "bahdanau", 2, 4, max_epochs=10)])
    other = fake_record("e", "bahdanau", 2, 5)
    other["sets"]["test_k1"]["references"][0] = "a different caption"
    other["sets"]["test_k1"]["references_sha256"] = references_sha256(other["sets"]["test_k1"]["references"])
    with pytest.raises(DataError, match="records a and e have different references for test_k1"):
        check_records([a, b, other])
    other_greedy = fake_record("f", "bahdanau", 2, 6)
    other_greedy["decodings"]["greedy"]["length_penalty"] = 0.6
    with pytest.raises(DataError, match="decoded differently for greedy"):
        check_records([a, other_greedy])
    beam = fake_record("g", "bahdanau", 2, 6, beams=(1, 5))  # beam 5 beside greedy: combines
    old = fake_record("h", "bahdanau", 3, 7, version=1)  # version 1 (batch_tokens 8000, a short window)
    check_records([a, beam, old])


def test_corrupt_record_files_are_data_errors_naming_the_file(tmp_path):
    cases = {
        "plain.json.gz": b'{"format": "nmt-study-record"}',  # not gzip'd
        "text.json.gz": gzip.compress(b"this is not JSON"),
        "list.json.gz": gzip.compress(b"[1, 2, 3]"),
        "noformat.json.gz": gzip.compress(json.dumps({"name": "x", "sets": {}}).encode()),
        "truncated.json.gz": gzip.compress(json.dumps(fake_record("x", "none", 1, 1)).encode())[:-30],
        "empty.json.gz": b"",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError) as e:
            read_record(tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and "nmt-study" in str(e.value), name
    lacking = fake_record("x", "none", 1, 1)
    del lacking["sets"]
    write_record(lacking, tmp_path / "lacking.json.gz")
    with pytest.raises(DataError, match="lacks sets"):
        read_record(tmp_path / "lacking.json.gz")


def test_a_record_round_trips_byte_for_byte(tmp_path):
    record = fake_record("x", "none", 1, 1)
    first = write_record(record, tmp_path / "a" / "x.json.gz").read_bytes()
    again = write_record(read_record(tmp_path / "a" / "x.json.gz"), tmp_path / "b" / "x.json.gz").read_bytes()
    assert first == again and read_record(tmp_path / "b" / "x.json.gz") == record


def _main_error(args: list, capsys) -> str:
    from nmt.cli.study import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "evaluating runs" not in x]  # no bar
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "train"], "--split train: the runs trained on it"),
        (["--split", "valid"], "valid chose each run's best.pt"),
        (["--split", "valid_k2"], "--split valid_k2: valid chose each run's best.pt"),
        (["--split", "test+test"], "a split is given twice"),
        (["--bootstrap", "999"], "--bootstrap 999: use at least 1000 resamples"),
        (["--buckets", "0,x"], "--buckets 0,x"),
        (["--buckets", "10,5"], "strictly increasing"),
        (["--beam", "0,5"], "--beam 0,5: beam sizes must be at least 1"),
        (["--beam", "1,five"], "--beam 1,five: give beam sizes separated by commas"),
    ],
)
def test_refused_options_are_one_line_errors(args, message, tmp_path, capsys):
    record = write_record(fake_record("a", "none", 1, 1), tmp_path / "a.json.gz")
    assert message in _main_error([record, *args, "--output", tmp_path / "out"], capsys)
    assert not (tmp_path / "out").exists()


def test_refused_records_are_one_line_errors(tmp_path, capsys):
    a = write_record(fake_record("a", "none", 1, 1), tmp_path / "a.json.gz")
    b = write_record(fake_record("b", "bahdanau", 1, 2), tmp_path / "b.json.gz")
    out = ["--output", tmp_path / "out"]
    longer = write_record(fake_record("c", "bahdanau", 2, 3, max_epochs=10), tmp_path / "c.json.gz")
    err = _main_error([a, b, longer, *out], capsys)
    assert "trainer.max_epochs" in err and "a has 9" in err and "c has 10" in err
    other = fake_record("d", "bahdanau", 2, 4)
    other["sets"]["test_k2"]["references"][-2] += " again"
    other["sets"]["test_k2"]["references_sha256"] = references_sha256(other["sets"]["test_k2"]["references"])
    err = _main_error([a, write_record(other, tmp_path / "d.json.gz"), *out], capsys)
    assert "different references for test_k2 (sha256 " in err
    copy = write_record(fake_record("a", "none", 1, 1), tmp_path / "copy" / "a.json.gz")
    assert "run a is given twice" in _main_error([a, b, copy, *out], capsys)
    same = write_record(fake_record("e", "bahdanau", 1, 5), tmp_path / "e.json.gz")
    assert "runs b and e are the same model with the same seed (1)" in _main_error([a, b, same, *out], capsys)
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip")
    assert str(tmp_path / "broken.json.gz") in _main_error([a, tmp_path / "broken.json.gz", *out], capsys)
    assert "no such directory or record" in _main_error([tmp_path / "missing", *out], capsys)
    (tmp_path / "empty").mkdir()
    assert "no runs" in _main_error([tmp_path / "empty", *out], capsys)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- seed pairing
def _bleu(record: dict, k: int, decoding: str = "greedy", captions: int | None = None) -> float:
    """sacrebleu's BLEU of a fake record's windows of exactly k (the first `captions` single ones at k=1)."""
    s = record["sets"][f"test_k{k}"]
    keep = [i for i, n in enumerate(s["sizes"]) if n == k][:captions]
    hyps = s["outputs"][decoding]["hypotheses"] if "outputs" in s else s["hypotheses"]
    return sacrebleu.corpus_bleu([hyps[i] for i in keep], [[s["references"][i] for i in keep]]).score


def test_seeds_are_paired_by_the_recorded_seed_not_the_name():
    """bahdanau's runs are named x (seed 2) and y (seed 1): x pairs with none's seed 2, y with seed 1."""
    records = [
        fake_record("a", "none", 1, 10),
        fake_record("b", "none", 2, 20, keep=0.6),
        fake_record("x", "bahdanau", 2, 21),
        fake_record("y", "bahdanau", 1, 11, keep=0.9),
    ]
    check_records(records)
    runs = sorted((StudyRun.of(r) for r in records), key=lambda r: r.name)
    summary = summarise(runs, StudySettings(edges=[0, 10, 20]), [])
    res = summary["results"]["greedy"]
    named = {r["name"]: r for r in records}

    def bleu(name: str, k: int, captions: int | None = None) -> float:
        return _bleu(named[name], k, captions=captions)

    assert summary["headline"] == "greedy" and list(summary["results"]) == ["greedy"]
    assert res["models"]["bahdanau"]["seed_list"] == [1, 2]
    assert res["models"]["bahdanau"]["runs"] == ["y", "x"] and res["models"]["none"]["runs"] == ["a", "b"]
    for k in (1, 2):
        by_seed = [bleu("y", k) - bleu("a", k), bleu("x", k) - bleu("b", k)]
        by_name = [bleu("x", k) - bleu("a", k), bleu("y", k) - bleu("b", k)]  # what pairing by name would give
        assert [round(d, 2) for d in by_seed] != [round(d, 2) for d in by_name]
        cell = res["paired"]["bahdanau"][str(k)]
        assert cell["deltas"] == pytest.approx(by_seed, abs=0.006)
    # the ratio: k=2 over the 8 single captions its windows hold (the 9th is in no window of 2)
    ratios = [bleu(r, 2) / bleu(r, 1, captions=8) for r in ("y", "a", "x", "b")]
    assert res["interaction"]["bahdanau"]["per_seed"] == pytest.approx(
        [ratios[0] - ratios[1], ratios[2] - ratios[3]], abs=0.0006
    )
    assert summary["sets"][1]["left_out"] == 1 and summary["sets"][1]["n"] == 4
    assert any("k = 2: 4 windows of exactly 2; the last 1 pair left out" in n for n in summary["notes"])


def test_a_seed_with_bleu_0_at_k1_gets_no_ratio_and_no_interaction():
    records = [fake_record("a", "none", 1, 10), fake_record("b", "bahdanau", 1, 11)]
    for s in records[0]["sets"].values():
        out = s["outputs"]["greedy"]
        out["hypotheses"] = ["zzz"] * len(out["hypotheses"])  # nothing matches: BLEU 0 at every k
    notes: list[str] = []
    res = summarise([StudyRun.of(r) for r in records], StudySettings(edges=[0, 10, 20]), notes)["results"]["greedy"]
    assert "ratio" not in res["models"]["none"] and "ratio" in res["models"]["bahdanau"]
    assert res["interaction"] == {} and any("none has BLEU 0 at k=1" in n for n in notes)
    assert res["paired"]["bahdanau"]["1"]["deltas"][0] > 0


def test_version_1_records_read_as_version_2_without_their_short_windows(tmp_path):
    """A version-1 record (greedy only, a short last window, batch_tokens 8000) and the version-2 record of
    the same translations give the same outputs and the same study; written back, it is unchanged."""
    old = [fake_record("a", "none", 1, 10, version=1), fake_record("b", "bahdanau", 1, 11, version=1)]
    new = [fake_record("a", "none", 1, 10), fake_record("b", "bahdanau", 1, 11)]
    assert old[0]["sets"]["test_k2"]["sizes"] == [2, 2, 2, 2, 1] and new[0]["sets"]["test_k2"]["sizes"] == [2] * 4
    check_records([old[0], new[1]])  # one study may mix them
    for v1, v2 in zip(old, new, strict=True):
        a, b = StudyRun.of(v1), StudyRun.of(v2)
        for name in ("test_k1", "test_k2"):
            assert a.outputs["greedy"][name].hypotheses == b.outputs["greedy"][name].hypotheses
            assert (a.outputs["greedy"][name].stats == b.outputs["greedy"][name].stats).all()
        path = write_record(v1, tmp_path / f"{v1['name']}.json.gz")
        assert write_record(read_record(path), tmp_path / "again.json.gz").read_bytes() == path.read_bytes()
    settings = StudySettings(edges=[0, 10, 20])
    one = summarise([StudyRun.of(r) for r in old], settings, [])
    two = summarise([StudyRun.of(r) for r in new], settings, [])
    assert one["results"] == two["results"] and one["sets"] == two["sets"]


def test_a_decoding_only_some_seeds_have_is_reported_on_those():
    """Beam 5 for seed 1 only: the greedy rows have two seeds, the beam-5 rows one, and a note says so."""
    records = [
        fake_record("a", "none", 1, 10, beams=(1, 5)),
        fake_record("b", "none", 2, 20),
        fake_record("c", "bahdanau", 1, 11, beams=(1, 5), keep=0.9),
        fake_record("d", "bahdanau", 2, 21, keep=0.9),
    ]
    check_records(records)
    summary = summarise([StudyRun.of(r) for r in records], StudySettings(edges=[0, 10, 20]), [])
    assert summary["headline"] == "greedy" and list(summary["results"]) == ["greedy", "beam5"]
    assert summary["decodings"]["beam5"]["beam_size"] == 5
    greedy, beam = summary["results"]["greedy"], summary["results"]["beam5"]
    assert {m["seeds"] for m in greedy["models"].values()} == {2} and {m["seeds"] for m in beam["models"].values()} == {
        1
    }
    assert all(row["seeds"] == 1 and row["ci_seeds"] is None for row in beam["models"]["none"]["by_k"])
    assert beam["paired"]["bahdanau"]["1"]["deltas"] == pytest.approx(
        [_bleu(records[2], 1, "beam5") - _bleu(records[0], 1, "beam5")]
    )
    assert any("beam5 has only some seeds" in n and "none 1 of 2" in n for n in summary["notes"])
    from nmt.study.tables import windows_markdown

    assert "| none: none (RNNencdec: context into every step) | 1 |" in windows_markdown(summary, "beam5")
    only_beam = [fake_record("e", "none", 1, 10, beams=(5,)), fake_record("f", "bahdanau", 1, 11, beams=(5,))]
    assert summarise([StudyRun.of(r) for r in only_beam], StudySettings(edges=[0, 10, 20]), [])["headline"] == "beam5"


# ---------------------------------------------------------------------------------------------- imports
def _study_imports() -> dict[str, set[str]]:
    """Module -> the nmt.study modules it imports anywhere (top level or inside functions)."""
    modules = {p.stem: p for p in STUDY_DIR.glob("*.py")}
    name = lambda stem: "nmt.study" if stem == "__init__" else f"nmt.study.{stem}"  # noqa: E731
    graph = {}
    for stem, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from .x import y
                    base = "nmt.study" + (f".{base}" if base else "")
                if base == "nmt.study":
                    deps |= {name(a.name) if a.name in modules else "nmt.study" for a in node.names}
                elif base.startswith("nmt.study."):
                    deps.add(base)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name == "nmt.study" or a.name.startswith("nmt.study.")}
        graph[name(stem)] = deps - {name(stem)}
    return graph


def test_the_study_modules_import_no_cycle():
    graph = _study_imports()
    assert {"nmt.study.records", "nmt.study.stats"} <= graph["nmt.study.build"]  # the parse found imports
    assert "nmt.study.stats" in graph["nmt.study.records"]
    for module, deps in graph.items():  # importing a submodule runs the package first: it may not come back
        if module != "nmt.study":
            assert "nmt.study" not in deps, f"{module} imports the package nmt.study itself"
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, "import cycle: " + " -> ".join([*path, module])
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


# ------------------------------------------------------------------------------------------ nmt-study
def test_study_writes_records_tables_and_figures(study):
    from nmt.study.tables import interaction_markdown, paired_markdown, windows_markdown

    proc, summary, out = study
    for name in (*FIGURES, "bleu_by_window_beam5.png", "study.md", "study.json"):
        assert (out / name).is_file(), name
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
            assert matplotlib.image.imread(out / name).shape[2] in (3, 4)
    md = (out / "study.md").read_text()
    assert summary["headline"] == "greedy" and list(summary["results"]) == ["greedy", "beam5"]
    for decoding in ("greedy", "beam5"):
        for table in (windows_markdown(summary, decoding), paired_markdown(summary, decoding)):
            assert table and table in md and table in proc.stdout
        interaction = interaction_markdown(summary, decoding)  # this tiny model's beam 5 may score 0 at k=1
        assert interaction in md and interaction in proc.stdout and (interaction or decoding == "beam5")
    assert "(bleu_by_window.png)" in md and "(bleu_by_window_beam5.png)" in md and "k=3 (untrained)" in md
    assert "Headline: greedy decoding; beam 5 beside it" in md
    assert "translating test_k1" in proc.stderr  # progress within a run's evaluation, not only per run
    assert sorted(p.name for p in (out / "records").iterdir()) == [
        "0_none_seed1.json.gz",
        "1_none_seed2.json.gz",
        "2_bahdanau_seed1.json.gz",
        "3_bahdanau_seed2.json.gz",
    ]
    assert summary["trained_k"] == 2 and [s["k"] for s in summary["sets"]] == [1, 2, 3]
    assert [(s["n"], s["left_out"]) for s in summary["sets"]] == [(25, 0), (12, 1), (8, 1)] and summary[
        "bootstrap"
    ] == B
    for decoding, res in summary["results"].items():
        for att in ("none", "bahdanau"):
            m = res["models"][att]
            assert set(m["bleu_by_k"]) == {"1", "2", "3"} and m["seeds"] == 2 and m["seed_list"] == [1, 2]
            if "ratio" in m or decoding == "greedy":  # (no ratio where a seed's BLEU at k=1 is 0: noted)
                assert m["ratio_k"] == 2 and isinstance(m["ratio"], float) and math.isfinite(m["ratio"])
            for row in m["by_k"]:
                assert row["seeds"] == 2 and len(row["seed_bleu"]) == 2 and row["interval"] == "seeds"
                assert row["low"] <= row["bleu"] <= row["high"] and [row["low"], row["high"]] == row["ci_seeds"]
                assert row["ci_test"][0] <= row["ci_test"][1]
        for x in res["interaction"].values():
            assert isinstance(x["difference"], float) and x["k"] == 2 and x["seeds"] == 2
            assert x["ci_seeds"][0] <= x["difference"] <= x["ci_seeds"][1]
            # this tiny model's k=1 BLEU can be 0 in a draw: no ratio there; too many such draws, no interval
            assert x["ci_test"][0] <= x["ci_test"][1] if x["ci_test"] else x["draws_undefined"] > 0.025 * B
        assert "bahdanau" in res["interaction"] or any("BLEU 0 at k=1" in n for n in summary["notes"])
        for k in ("1", "2", "3"):
            cell = res["paired"]["bahdanau"][k]
            assert 0 < cell["p_holm"] <= 1 and cell["p_holm"] >= cell["p"] and isinstance(cell["seeds_agree"], bool)
            assert cell["significant"] == (cell["seeds_agree"] and cell["p_holm"] < 0.05)
        assert "none" not in res["paired"]


def test_records_are_self_describing_and_small(sweep, study):
    _, _, out = study
    tests = [line for line in (sweep.parent / "test.en").read_text().splitlines()]
    sources = [line for line in (sweep.parent / "test.de").read_text().splitlines()]
    for name, record in _records(out).items():
        assert (out / "records" / f"{name}.json.gz").stat().st_size < 300_000
        assert record["name"] == name and record["split"] == "test" and record["units"] is None
        assert record["version"] == 2 and sorted(record["decodings"]) == ["beam5", "greedy"]
        assert record["decodings"]["beam5"]["beam_size"] == 5 and record["decodings"]["greedy"]["beam_size"] == 1
        assert record["config"]["seed"] in (1, 2) and record["config"]["data"]["window"] == 2
        assert isinstance(record["provenance"]["torch"], str) and "commit" in record["provenance"]
        assert record["overlap"]["pairs"] == 25 and record["finished"] and record["steps"] == 40
        assert sorted(record["sets"]) == ["test_k1", "test_k2", "test_k3"]
        for k in (1, 2, 3):
            s = record["sets"][f"test_k{k}"]
            starts = range(0, 25 - 25 % k, k)  # windows of exactly k; the last 25 mod k captions left out
            assert s["k"] == k and s["sizes"] == [k] * (25 // k) and s["left_out"] == 25 % k
            joined = [" ".join(tests[i : i + k]) for i in starts]  # the same captions, k at a time
            assert s["references"] == joined
            assert s["references_sha256"] == hashlib.sha256("\n".join(joined).encode()).hexdigest()
            assert s["source_words"] == [len(" ".join(sources[i : i + k]).split()) for i in starts]
            for out_ in s["outputs"].values():
                assert len(out_["hypotheses"]) == len(joined)
                assert out_["bleu"] == pytest.approx(
                    sacrebleu.corpus_bleu(out_["hypotheses"], [joined]).score, abs=0.006
                )
        attention = record["long"]["attention"]
        if record["config"]["attention"]["name"] == "none":
            assert attention is None
        else:
            assert len(attention) == len(record["long"]["tgt_pieces"]) and len(attention[0]) > 1


def test_study_numbers_agree_with_sacrebleu(study, monkeypatch):
    _, summary, out = study
    records = _records(out)
    bleu = {
        (r["config"]["attention"]["name"], r["config"]["seed"], s["k"], dec): sacrebleu.corpus_bleu(
            o["hypotheses"], [s["references"]]
        ).score
        for r in records.values()
        for s in r["sets"].values()
        for dec, o in s["outputs"].items()
    }
    assert all(bleu[att, seed, 1, "greedy"] > 0 for att in ("none", "bahdanau") for seed in (1, 2))
    for dec in ("greedy", "beam5"):
        for att in ("none", "bahdanau"):
            m = summary["results"][dec]["models"][att]
            for k in (1, 2, 3):
                both = [bleu[att, 1, k, dec], bleu[att, 2, k, dec]]
                assert m["bleu_by_k"][str(k)] == pytest.approx(sum(both) / 2, abs=0.006)
                assert m["by_k"][k - 1]["seed_bleu"] == pytest.approx(both, abs=0.006)
    # at k = 1 (captions) and k = 2 (windows, one caption left out), each seed pair's p is sacrebleu's paired
    # test on that set's items with its default seed
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    for k in ("1", "2"):
        cell = summary["results"]["greedy"]["paired"]["bahdanau"][k]
        for i, seed in enumerate((1, 2)):
            sys_set = records[f"{2 + i}_bahdanau_seed{seed}"]["sets"][f"test_k{k}"]
            base_set = records[f"{i}_none_seed{seed}"]["sets"][f"test_k{k}"]
            hyps = [x["outputs"]["greedy"]["hypotheses"] for x in (base_set, sys_set)]
            assert cell["deltas"][i] == pytest.approx(
                bleu["bahdanau", seed, int(k), "greedy"] - bleu["none", seed, int(k), "greedy"], abs=0.006
            )
            if hyps[0] == hyps[1]:
                assert cell["p_seeds"][i] == 1.0
                continue
            p = _sacrebleu_p(hyps[0], hyps[1], sys_set["references"])
            assert abs(cell["p_seeds"][i] - p) <= 2 / (B + 1), (k, cell["p_seeds"][i], p)


def _sacrebleu_p(base: list[str], system: list[str], references: list[str]) -> float:
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("none", base), ("bahdanau", system)], {"BLEU": BLEU()}, [references], "bs", B)
    return test()[1]["BLEU"][1].p_value


def test_the_study_rebuilt_from_its_records_alone_is_the_same_file_for_file(study, rebuilt):
    _, _, a = study
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file()) == files
    assert {str(f) for f in files} >= {*FIGURES, "study.md", "study.json", "records/0_none_seed1.json.gz"}
    for f in files:
        assert (rebuilt / f).read_bytes() == (a / f).read_bytes(), f


def test_a_run_and_its_record_together_are_the_same_run_twice(sweep, study, tmp_path, capsys):
    _, _, out = study
    err = _main_error([sweep / "0_none_seed1", out / "records" / "0_none_seed1.json.gz"], capsys)
    assert "run 0_none_seed1 is given twice" in err


def test_a_split_the_corpus_lacks_is_one_line_error(sweep, study, tmp_path, capsys):
    err = _main_error([sweep, "--split", "nosuch", "--output", tmp_path / "out"], capsys)
    assert "split 'nosuch' is not a split of corpus files" in err and "test_k3" in err


def test_find_inputs_skips_unfinished_jobs_and_reads_directories_of_records(sweep, study, tmp_path):
    _, _, out = study
    (tmp_path / "5_bahdanau_seed3" / ".hydra").mkdir(parents=True)  # a job without a checkpoint yet
    (tmp_path / "0_none_seed1").symlink_to(sweep / "0_none_seed1")
    runs, records, skipped = find_inputs([tmp_path])
    assert [p.name for p in runs] == ["0_none_seed1"] and records == []
    assert [p.name for p in skipped] == ["5_bahdanau_seed3"]
    runs, records, skipped = find_inputs([out / "records", out / "records" / "1_none_seed2.json.gz"])
    assert runs == [] and skipped == [] and len(records) == 4  # the record given twice is read once
    shutil.rmtree(tmp_path / "5_bahdanau_seed3")


STUDIES = Path(__file__).parents[1] / "docs" / "study"
COMMITTED = [STUDIES / "caption_windows", STUDIES / "caption_windows_fr"]  # de -> en, fr -> en


@pytest.mark.parametrize("committed", COMMITTED, ids=lambda p: p.name)
def test_the_committed_study_rebuilds_from_its_records_alone(committed, tmp_path):
    """`nmt-study docs/study/<study>/records` with no run directory anywhere writes the committed study.json
    and study.md again, byte for byte; every row names its seeds, as many as the records of that model hold
    that decoding; the committed records stay under 300 KB each (beam 5 beside greedy: about 250 KB)."""
    if not (committed / "records").is_dir():
        pytest.skip(f"no committed study {committed.name}")
    shutil.copytree(committed / "records", tmp_path / "records")
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.cli.study", str(tmp_path / "records")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("study.json", "study.md"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name
    assert all(p.stat().st_size < 300_000 for p in (committed / "records").iterdir())
    summary = json.loads((committed / "study.json").read_text())
    records = [read_record(p) for p in sorted((committed / "records").iterdir())]
    for decoding, res in summary["results"].items():
        for m in res["models"].values():
            holding = [r for r in records if r["name"] in m["runs"] and decoding in record_decodings(r)]
            assert m["seeds"] == len(holding) == len(m["runs"]) and all(row["seeds"] == m["seeds"] for row in m["by_k"])


def _printed_cells(text: str, first_cell: str) -> dict[str, list[str]]:
    """Rows of the Markdown tables in `text` whose header starts with `first_cell`: {row label: cells}."""
    rows, inside = {}, False
    for line in text.splitlines():
        if line.startswith(f"| {first_cell} |"):
            inside = True
        elif not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cells[0], []).append(cells)
    return rows


@pytest.mark.parametrize("committed", COMMITTED, ids=lambda p: p.name)
def test_every_printed_bleu_cell_is_the_records_mean_rounded_once(committed):
    """Each model's BLEU at each k in study.md is sacrebleu's corpus BLEU of every seed's record (the windows of
    exactly k), averaged over the seeds and rounded once to one decimal: computed here from the records alone,
    with sacrebleu, not with the study's code. Every seed's windows of k share their references: sacrebleu reads
    them once per k (BLEU(references=...), its own cache), not once per seed and decoding."""
    from sacrebleu.metrics import BLEU

    if not (committed / "records").is_dir():
        pytest.skip(f"no committed study {committed.name}")
    summary = json.loads((committed / "study.json").read_text())
    records = {r["name"]: r for r in (read_record(p) for p in sorted((committed / "records").iterdir()))}
    text = (committed / "study.md").read_text()
    tables = [t for t in text.split("\n\n") if t.startswith("| model | seeds | k=1")]
    checked, scorers = 0, {}
    for decoding, res in summary["results"].items():
        for key, m in res["models"].items():
            means = []
            for row in m["by_k"]:
                scores = []
                for name in m["runs"]:
                    s = records[name]["sets"][row["set"]]
                    keep, _ = exact_windows(s)
                    hyps = set_outputs(records[name], row["set"])[decoding]["hypotheses"]
                    refs = tuple(s["references"][i] for i in keep)
                    if refs not in scorers:
                        scorers[refs] = BLEU(references=[list(refs)])
                    scores.append(scorers[refs].corpus_score([hyps[i] for i in keep], None).score)
                means.append(f"{sum(scores) / len(scores):.1f}")
            printed = [
                [c.split(" ")[0] for c in cells[2 : 2 + len(means)]]
                for table in tables
                for label, rows in _printed_cells(table, "model").items()
                if label.startswith(f"{key}:")
                for cells in rows
            ]
            assert means in printed, (decoding, key, means, printed)
            checked += len(means)
    assert checked >= 3 * 5  # at least the headline decoding: three models at five k
