"""Tests for inference: search (greedy = beam 1, batch independence, n-best order), nmt.translator,
nmt.evaluation, and the nmt-evaluate / nmt-translate commands end to end on a model trained once.

    python -m pytest -q tests/test_inference.py
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib.image
import pytest
import torch
from omegaconf import OmegaConf

from nmt.attention import ATTENTIONS
from nmt.cli.common import typed
from nmt.decoder import DecoderState
from nmt.decoding import BEAM_BATCH_TOKENS, GREEDY_BATCH_TOKENS, Decoding
from nmt.errors import ConfigError
from nmt.evaluation import evaluate, format_report, heatmap_picks
from nmt.model import ModelConfig, Seq2Seq
from nmt.search import beam_search, greedy, length_penalty, search
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_sentencepiece
from nmt.translator import Translation, Translator

BIN = Path(sys.executable).parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
V = 24  # vocabulary of the random models


def small_model(attention: str = "luong", vocab: int = V, seed: int = 0) -> Seq2Seq:
    """A tiny random model; the EOS bias makes some sentences end early and others run to the limit."""
    torch.manual_seed(seed)
    query = "previous" if attention == "bahdanau" else "current"
    config = ModelConfig(
        embed_size=16, encoder_hidden_size=16, hidden_size=32, dropout=0.0, attention=attention, attention_query=query
    )
    model = Seq2Seq(config, vocab, vocab).eval()
    with torch.no_grad():
        model.decoder.output.bias[EOS_ID] += 1.5
    return model


def random_batch(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded sources (B, S) of the given real lengths (EOS last) and their lengths (B,)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for b, n in enumerate(lengths):
        src[b, : n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[b, n - 1] = EOS_ID
    return src, torch.tensor(lengths)


LENGTHS = [7, 2, 9, 4, 9, 5]


# ------------------------------------------------------------------------------------------------ search
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_beam_of_one_is_greedy(attention):
    model = small_model(attention)
    src, lengths = random_batch(LENGTHS)
    g = greedy(model, src, lengths, alpha=1.0)
    b = beam_search(model, src, lengths, beam_size=1, nbest=1, alpha=1.0)
    for gs, bs in zip(g, b, strict=True):
        assert gs[0].tokens == bs[0].tokens
        assert gs[0].score == pytest.approx(bs[0].score, abs=1e-4)
        assert gs[0].attention.shape == bs[0].attention.shape


@pytest.mark.parametrize("order", [LENGTHS, sorted(LENGTHS, reverse=True)], ids=["mixed", "longest-first"])
@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_search_does_not_depend_on_the_batch(attention, beam_size, order):
    """Alone or in a batch, a sentence gets the same hypotheses, scores and attention; in a batch, sentences
    that finish early leave it (longest-first, with no EOS: each sentence runs to its own length limit, so
    the last rows leave first) while the others go on."""
    model = small_model(attention)
    if order[0] > order[-1]:
        with torch.no_grad():
            model.decoder.output.bias[EOS_ID] = -1e4
    src, lengths = random_batch(order)
    limits = {"max_len_ratio": 1.0, "max_len_extra": 4}  # short outputs: fast, and some hit the limit
    together = search(model, src, lengths, beam_size, beam_size, **limits)
    for b, n in enumerate(order):
        alone = search(model, src[b : b + 1, :n], lengths[b : b + 1], beam_size, beam_size, **limits)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[b]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[b]], abs=1e-4)
        for h_alone, h_together in zip(alone, together[b], strict=True):
            assert h_alone.attention.shape == (len(h_alone.attention), n)
            assert torch.allclose(h_alone.attention, h_together.attention, atol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong"])
def test_done_sentences_leaving_the_batch_changes_no_result(attention, monkeypatch):
    """Done sentences leave the beam search's batch a share at a time (search.DONE_SHARE): leaving at every
    step, or never, gives the same hypotheses, scores and attention."""
    import nmt.search

    model = small_model(attention)
    with torch.no_grad():
        model.decoder.output.bias[EOS_ID] = -1e4  # each sentence runs to its own length limit: they leave one by one
    src, lengths = random_batch(LENGTHS + [3, 8, 6])
    step, rows = model.decoder.step, []
    monkeypatch.setattr(model.decoder, "step", lambda prev, *a, **kw: rows.append(len(prev)) or step(prev, *a, **kw))
    results = {}
    for share in (0.0, 0.25, 2.0):  # at every step (even with none done), a quarter (the default), never
        monkeypatch.setattr(nmt.search, "DONE_SHARE", share)
        rows.clear()
        results[share] = beam_search(model, src, lengths, beam_size=3, nbest=3, max_len_ratio=1.0, max_len_extra=4)
        assert (len(set(rows)) > 2) == (share < 1), f"the batch shrank: {rows}"
    for share in (0.0, 2.0):
        for ours, ref in zip(results[share], results[0.25], strict=True):
            assert [h.tokens for h in ours] == [h.tokens for h in ref]
            assert [h.score for h in ours] == pytest.approx([h.score for h in ref], abs=1e-4)
            for a, b in zip(ours, ref, strict=True):
                torch.testing.assert_close(a.attention, b.attention, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong", "none"])
def test_done_sentences_leaving_the_greedy_batch_changes_no_result(attention, monkeypatch):
    """Greedy search lets done sentences (EOS, or their length limit) leave its batch too: leaving at every
    step, or never, gives the same tokens, scores and attention."""
    import nmt.search

    model = small_model(attention)
    with torch.no_grad():
        model.decoder.output.bias[EOS_ID] = 0.2  # some sentences end at EOS, the others at their limits
    src, lengths = random_batch(LENGTHS + [3, 8, 6])
    step, rows = model.decoder.step, []
    monkeypatch.setattr(model.decoder, "step", lambda prev, *a, **kw: rows.append(len(prev)) or step(prev, *a, **kw))
    results = {}
    for share in (0.0, 0.25, 2.0):  # at every step, a quarter (the default), never
        monkeypatch.setattr(nmt.search, "DONE_SHARE", share)
        rows.clear()
        results[share] = greedy(model, src, lengths, max_len_ratio=1.0, max_len_extra=4)
        assert (len(set(rows)) > 1) == (share < 1), f"the batch shrank: {rows}"
    ended = [h[0].tokens for h in results[2.0]]
    assert len({len(t) for t in ended}) > 2, "the sentences should end at different steps"
    for share in (0.0, 0.25):
        for ours, ref in zip(results[share], results[2.0], strict=True):
            assert ours[0].tokens == ref[0].tokens
            assert ours[0].score == pytest.approx(ref[0].score, abs=1e-4)
            torch.testing.assert_close(ours[0].attention, ref[0].attention, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def plain_beam_search(model, src, n, K, nbest, alpha, limit):
    """One sentence, written out without batching: the K best prefixes by log-probability; a hypothesis ends at
    EOS or at the limit among a step's K best candidates; done when the step's best candidate is EOS and nbest
    have ended, when K have ended, or at the limit. Returns [(score / length penalty, tokens)] best first."""
    enc, keys, values, state = model.encode(src[None, :n], torch.tensor([n]))
    beams, finished = [(0.0, [], state)], []
    for t in range(limit):
        candidates = []
        for score, tokens, st in beams:
            prev = torch.tensor([tokens[-1] if tokens else BOS_ID])
            logits, new_state, _ = model.decoder.step(prev, st, keys, values, enc.mask)
            logp = logits[0].double().log_softmax(-1)
            logp[PAD_ID] = logp[BOS_ID] = float("-inf")
            candidates += [(score + float(logp[v]), [*tokens, v], new_state) for v in range(logp.numel())]
        candidates = sorted(candidates, key=lambda c: -c[0])[: 2 * K]
        beams = []
        for rank, (score, tokens, st) in enumerate(candidates):
            eos = tokens[-1] == EOS_ID
            if rank < K and (eos or t + 1 == limit):
                finished.append((score / length_penalty(t + 1, alpha), tokens[:-1] if eos else tokens))
            if not eos and len(beams) < K:
                beams.append((score, tokens, st))
        if len(finished) >= K or (candidates[0][1][-1] == EOS_ID and len(finished) >= nbest):
            break
    return sorted(finished, key=lambda h: -h[0])[:nbest]


@pytest.mark.parametrize("nbest", [1, 3])
@pytest.mark.parametrize("attention", ["bahdanau", "luong"])
def test_beam_search_equals_a_plain_search_one_sentence_at_a_time(attention, nbest):
    model = small_model(attention, seed=3)
    src, lengths = random_batch(LENGTHS, seed=4)
    fast = beam_search(model, src, lengths, beam_size=3, nbest=nbest, alpha=1.0, max_len_ratio=1.0, max_len_extra=4)
    for b, n in enumerate(lengths.tolist()):
        plain = plain_beam_search(model, src[b], n, 3, nbest, 1.0, n + 4)
        assert [h.tokens for h in fast[b]] == [tokens for _, tokens in plain]
        assert [h.score for h in fast[b]] == pytest.approx([score for score, _ in plain], abs=1e-4)


class ScriptedModel:
    """A model whose next-word probabilities depend on the previous word alone (TABLE), for beam search."""

    A, B = 4, 5  # two words besides EOS
    TABLE = {BOS_ID: {EOS_ID: 0.5, A: 0.3, B: 0.2}, A: {A: 0.9, EOS_ID: 0.1}, B: {EOS_ID: 0.99, A: 0.01}}

    def __init__(self):
        self.decoder = self
        self.output = torch.nn.Linear(6, 6)  # the vocabulary; the identity: step's h~ are the scripted logits
        with torch.no_grad():
            self.output.weight.copy_(torch.eye(6))
            self.output.bias.zero_()

    def encode(self, src, lengths):
        B = src.size(0)
        state = DecoderState(torch.zeros(1, B, 1), torch.zeros(1, B, 1), torch.zeros(B, 1))
        mask = src != PAD_ID
        return SimpleNamespace(mask=mask), src[..., None].float(), src[..., None].float(), state

    def step_params(self, device):
        return None

    def step(self, prev, state, keys, values, mask, params, rows=None, logits=True):
        logits = torch.full((prev.size(0), 6), -1e9)  # the output layer's input and output alike
        for row, word in enumerate(prev.tolist()):
            for nxt, p in self.TABLE[word].items():
                logits[row, nxt] = math.log(p)
        logits = logits if rows is None else logits[rows]
        return logits, state, mask.float() / mask.sum(1, keepdim=True)


def test_beam_search_stops_when_the_best_candidate_ends():
    """At step 0 EOS is the best candidate (p 0.5): the search stops there, as OpenNMT-py's and JoeyNMT's do,
    although "B EOS" (p 0.198) would score better under a strong length penalty ((7/6) ** 6 = 2.52 at length 2).
    Asked for two hypotheses, it goes on until two have ended, and then returns that better one first."""
    src, lengths = torch.tensor([[6, EOS_ID]]), torch.tensor([2])
    model = ScriptedModel()
    (best,) = beam_search(model, src, lengths, beam_size=2, nbest=1, alpha=6.0)
    assert [h.tokens for h in best] == [[]] and best[0].score == pytest.approx(math.log(0.5))
    (two,) = beam_search(model, src, lengths, beam_size=2, nbest=2, alpha=6.0)
    assert [h.tokens for h in two] == [[ScriptedModel.B], []]
    assert two[0].score == pytest.approx(math.log(0.2 * 0.99) / (7 / 6) ** 6)


def test_nbest_is_sorted_by_score_and_starts_with_the_best():
    model = small_model("luong")
    src, lengths = random_batch(LENGTHS)
    nbest = beam_search(model, src, lengths, beam_size=4, nbest=4)
    best = beam_search(model, src, lengths, beam_size=4, nbest=1)
    for hyps, top in zip(nbest, best, strict=True):
        assert 1 <= len(hyps) <= 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        # the search for nbest=4 runs on from where nbest=1 stops: its finished hypotheses include those
        assert hyps[0].score >= top[0].score - 1e-6
        assert any(h.tokens == top[0].tokens for h in hyps) or len(hyps) == 4


# ------------------------------------------------------------------------------------------- translator
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


@pytest.fixture(scope="module")
def translator_parts() -> tuple[Seq2Seq, Tokenizer]:
    sentences = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 6)) for i in range(60)]
    spm = train_sentencepiece(sentences, vocab_size=40)
    tokenizer = Tokenizer(spm, spm)
    return small_model("luong", vocab=tokenizer.src_vocab_size), tokenizer


TEXTS = ["alpha beta gamma", "", "delta " * 12, "   ", "mu", "kappa lambda mu eta theta"]


def test_translator_output_does_not_depend_on_batch_tokens(translator_parts):
    """In fp32 (amp=off): under bf16 autocast, rounding depends on the shapes of the batch's matmuls."""
    model, tok = translator_parts
    for beam in (1, 3):
        big = Translator(model, tok, beam_size=beam, nbest=beam, batch_tokens=100_000, amp="off").translate(TEXTS)
        small = Translator(model, tok, beam_size=beam, nbest=beam, batch_tokens=1, amp="off").translate(TEXTS)
        assert [[t.text for t in ts] for ts in big] == [[t.text for t in ts] for ts in small]
        scores = [t.score for ts in small for t in ts]
        assert [t.score for ts in big for t in ts] == pytest.approx(scores, abs=1e-4)


def test_batch_tokens_default_follows_the_search(translator_parts):
    """Unset, a batch holds 8,000 padded source pieces for greedy search and 4,000 for beam search (whose batch
    has beam_size rows a sentence); a value given is kept; below 1 is an error naming the setting."""
    model, tok = translator_parts
    assert Translator(model, tok, beam_size=1).decoding.batch_tokens == GREEDY_BATCH_TOKENS
    assert Translator(model, tok, beam_size=5).decoding.batch_tokens == BEAM_BATCH_TOKENS
    assert Translator(model, tok, beam_size=5, batch_tokens=123).settings["batch_tokens"] == 123
    assert GREEDY_BATCH_TOKENS > BEAM_BATCH_TOKENS
    with pytest.raises(ConfigError, match="batch_tokens"):
        Translator(model, tok, batch_tokens=0)
    # the config group: unset by default, an explicit value through typed() as nmt-evaluate reads it
    assert typed(Decoding, OmegaConf.create({"beam_size": 5}), "decoding").batch_tokens is None
    assert typed(Decoding, OmegaConf.create({"batch_tokens": 2000}), "decoding").batch_tokens == 2000


def test_translations_keep_order_and_shapes(translator_parts):
    model, tok = translator_parts
    results = Translator(model, tok, beam_size=2, nbest=2).translate(TEXTS)
    assert len(results) == len(TEXTS)
    for text, ts in zip(TEXTS, results, strict=True):
        if not text.strip():
            assert [(t.text, t.src_pieces, t.tgt_pieces) for t in ts] == [("", [], [])]
            continue
        assert ts[0].src_pieces == tok.src_pieces(text)
        for t in ts:
            assert t.attention.dtype == torch.float32 and t.attention.device.type == "cpu"
            assert t.attention.shape == (len(t.tgt_pieces), len(t.src_pieces))


def test_empty_inputs_do_not_call_the_model(translator_parts, monkeypatch):
    model, tok = translator_parts
    monkeypatch.setattr("nmt.translator.search", lambda *a, **k: pytest.fail("the model was called"))
    assert [[t.text for t in ts] for ts in Translator(model, tok).translate(["", " \t "])] == [[""], [""]]


def test_long_source_is_cut_with_a_warning(translator_parts, caplog):
    model, tok = translator_parts
    with caplog.at_level(logging.WARNING, logger="nmt.translator"):
        [[t]] = Translator(model, tok, max_src_pieces=6).translate(["alpha beta " * 30], first_line=7)
    assert len(t.src_pieces) == 6 and t.src_pieces[-1] == "</s>"
    assert "line 7" in caplog.text and "max_src_pieces=6" in caplog.text


def test_nbest_larger_than_the_beam_is_refused(translator_parts):
    model, tok = translator_parts
    with pytest.raises(Exception, match="nbest"):
        Translator(model, tok, beam_size=2, nbest=3)


# ------------------------------------------------------------------------------------------- evaluation
class EchoTranslator:
    """Returns the reference of each source: a perfect system, to test the evaluation's own arithmetic."""

    settings = {"beam_size": 1, "nbest": 1, "length_penalty": 1.0, "max_len_ratio": 1.5, "max_len_extra": 10}
    checkpoint = None
    has_alignment = False

    def __init__(self, pairs: list[tuple[str, str]]):
        self.ref = dict(pairs)

    def fit_to(self, texts: list[str]) -> None:
        """Nothing to fit: it cuts no input."""

    def translate(self, texts: list[str]) -> list[list[Translation]]:
        out = []
        for text in texts:
            src, tgt = text.split() + ["</s>"], self.ref[text].split() + ["</s>"]
            out.append([Translation(self.ref[text], 0.0, src, tgt, torch.zeros(len(tgt), len(src)))])
        return out


PAIRS = [
    (" ".join(f"s{i}w{j}" for j in range(n)), " ".join(f"t{i}w{j}" for j in range(n)))
    for i, n in enumerate([3, 5, 8, 12, 15, 25, 33, 4, 60])
]


def test_references_score_100_and_every_file_is_written(tmp_path):
    result = evaluate(EchoTranslator(PAIRS), PAIRS, [0, 10, 20, 30], 2, out_dir=tmp_path, split="dev")
    assert result["bleu"] == 100.0 and result["chrf"] == 100.0 and result["ter"] == 0.0
    assert sum(row["n"] for row in result["by_length"]) == len(PAIRS)
    assert [row["bucket"] for row in result["by_length"]] == ["0-9", "10-19", "20-29", "30+"]
    assert all(row["bleu"] == 100.0 for row in result["by_length"])
    assert (tmp_path / "dev.hyp").read_text().splitlines() == [t for _, t in PAIRS]
    saved = json.loads((tmp_path / "dev.json").read_text())
    assert saved["bleu"] == 100.0 and "nrefs:1" in saved["signatures"]["bleu"] and "hypotheses" not in saved
    assert "| 30+ | 2 | 100.00 | 100.00 |" in (tmp_path / "dev.md").read_text()
    heatmaps = sorted((tmp_path / "attention").glob("dev_*.png"))
    assert len(heatmaps) == 2 and (tmp_path / "attention" / "dev_9.png") in heatmaps  # the longest is drawn
    for png in [*heatmaps, tmp_path / "dev_bleu_by_length.png"]:
        assert_png(png)
    report = format_report(result)
    assert re.search(r"^BLEU +100\.00 +nrefs:1\|case:mixed", report, re.M) and "30+" in report


def test_heatmap_picks_spread_over_lengths_and_include_the_longest():
    lengths = [5, 0, 40, 12, 7, 30, 3, 40]
    assert heatmap_picks(lengths, 3) == heatmap_picks(lengths, 3)
    picks = heatmap_picks(lengths, 3)
    assert len(picks) == 3 and max(lengths[i] for i in picks) == 40 and 1 not in picks
    assert heatmap_picks(lengths, 0) == [] and heatmap_picks([0, 0], 2) == []
    assert len(heatmap_picks(lengths, 20)) <= 7


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 10 and image.shape[1] > 10


# ---------------------------------------------------------------------------------------- the commands
def run(*cmd: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / cmd[0]), *cmd[1:]], input=stdin, capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_nmt_evaluate_end_to_end(quick_run, tmp_path):
    out = tmp_path / "eval"
    proc = run(
        "nmt-evaluate",
        f"checkpoint={quick_run / 'checkpoints' / 'best.pt'}",
        f"output={out}",
        "heatmaps=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "translating test" in proc.stderr  # progress while it decodes, not a minute of silence
    assert re.search(r"^BLEU +\d+\.\d\d +nrefs:1\|case:mixed\|eff:no\|tok:13a", proc.stdout, re.M)
    assert re.search(r"^chrF +\d+\.\d\d +nrefs:1", proc.stdout, re.M)
    result = json.loads((out / "test.json").read_text())
    assert result["sentences"] == len((out / "test.hyp").read_text().splitlines()) == 300
    assert sum(row["n"] for row in result["by_length"]) == 300 and 0 < result["bleu"] <= 100
    assert result["checkpoint"].endswith("best.pt") and result["decoding"]["beam_size"] == 1
    assert (out / "test.md").read_text().startswith("# test")
    pngs = [out / "test_bleu_by_length.png", *sorted((out / "attention").glob("test_*.png"))]
    assert len(pngs) == 3
    for png in pngs:
        assert_png(png)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]  # Hydra wrote nothing of its own


def test_nmt_evaluate_unknown_split_lists_the_splits(quick_run, tmp_path):
    checkpoint = quick_run / "checkpoints" / "best.pt"
    proc = run("nmt-evaluate", f"checkpoint={checkpoint}", "split=nope", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "train, valid, test" in proc.stderr


def test_nmt_translate_round_trip_through_stdin(quick_run, tmp_path):
    ckpt = str(quick_run / "checkpoints" / "best.pt")
    proc = run("nmt-translate", ckpt, "--attention", str(tmp_path / "att"), stdin="one two\n\nthree four\n")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert len(lines) == 4 and lines[3] == "" and lines[1] == "" and lines[0] and lines[2]
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["1.png", "3.png"]
    for png in (tmp_path / "att").iterdir():
        assert_png(png)


def test_nmt_translate_nbest_and_alignment(quick_run):
    ckpt = str(quick_run / "checkpoints" / "best.pt")
    proc = run("nmt-translate", ckpt, "--beam", "3", "--nbest", "2", "--print-alignment", "one two", "three")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * 2 * 2  # 2 inputs x 2 hypotheses x (translation + alignment)
    scores = [float(line.split("\t")[0]) for line in lines[0::2]]
    assert all("\t" in line for line in lines[0::2]) and scores[0] >= scores[1] and scores[2] >= scores[3]
    assert all(all("->" in pair for pair in line.split(" ")) for line in lines[1::2])


def test_nmt_translate_without_arguments_asks_only_for_the_checkpoint(capsys):
    from nmt.cli.translate import parse_args

    with pytest.raises(SystemExit):
        parse_args([])
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "nmt-translate: error: the following arguments are required: checkpoint"
    assert "checkpoint [text ...]" in err  # the sentences are optional: without them, stdin is read


def test_nmt_translate_missing_checkpoint_is_one_line(tmp_path):
    proc = run("nmt-translate", str(tmp_path / "missing.pt"), "hello")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "missing.pt" in proc.stderr and "Traceback" not in proc.stderr


def test_nmt_translate_defaults_are_the_decoding_schema_and_parsing_needs_no_torch():
    """nmt-translate's option defaults come from nmt.decoding.Decoding (nmt-evaluate's schema), and its
    arguments are parsed before torch is imported (a quick --help)."""
    code = (
        "import json, sys\n"
        "from nmt.cli.translate import parse_args\n"
        "a = parse_args(['x.pt'])\n"
        "a = [a.beam, a.nbest, a.length_penalty, a.max_len_ratio, a.amp, a.kernels]\n"
        "print(json.dumps(a + ['torch' in sys.modules]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    d = Decoding()
    expected = [d.beam_size, d.nbest, d.length_penalty, d.max_len_ratio, str(d.amp), str(d.kernels), False]
    assert json.loads(proc.stdout) == expected


@pytest.mark.parametrize("edges", [[], [5, 10], [0, 10, 10], [0, 20, 10], [0, 1.5], "0,10", None, [0, True]])
def test_bad_bucket_edges_fail_naming_the_option(edges):
    """One check for bucket edges everywhere (nmt-evaluate's buckets, nmt-study's --buckets, the trainer's
    length_buckets): whole word counts from 0, strictly increasing."""
    from nmt.metrics import check_edges

    with pytest.raises(ConfigError, match=r"^trainer.length_buckets: bucket edges must be strictly increasing"):
        check_edges(edges, "trainer.length_buckets")
    assert check_edges((0, 10, 20), "x") == [0, 10, 20]


def test_evaluation_cuts_no_source(translator_parts):
    """A test set is scored on whole inputs: evaluate raises the Translator's cap on source pieces (a guard for
    free text) to the longest source, so the long ones are translated whole."""
    from nmt.evaluation import evaluate

    model, tok = translator_parts
    translator = Translator(model, tok, max_src_pieces=3, amp="off")
    pairs = [(t, t) for t in TEXTS]
    longest = max(len(ids) for ids in tok.encode_src(TEXTS))
    assert longest > 3
    result = evaluate(translator, pairs, heatmaps=0)
    assert translator.max_src_pieces == longest == result["decoding"]["max_src_pieces"]
