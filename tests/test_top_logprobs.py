"""The search step's top-k kernel (nmt.kernels.top_logprobs) against the torch operations it replaces, and the
decoding kernels' choice (a Translator's plan): the same translations both ways, the process's choice restored,
and a built kernel loaded by a later process without Inductor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_inference import random_batch, small_model

from nmt.kernels import compiled as compiled_module
from nmt.kernels.top_logprobs import top_log_probs
from nmt.search import beam_search, greedy
from nmt.special import BOS_ID, PAD_ID
from nmt.tokenizer import Tokenizer, train_sentencepiece
from nmt.translator import Translator

SKIP = (PAD_ID, BOS_ID)


def reference(h, weight, bias, k):
    """The log-softmax's k best of each row without padding and BOS, largest first, lower id first on ties."""
    logp = F.log_softmax(F.linear(h.double(), weight.double(), None if bias is None else bias.double()), dim=-1)
    logp[:, list(SKIP)] = float("-inf")
    ids = torch.arange(logp.size(1)).expand_as(logp)
    # sort by value descending, then by id ascending: a stable sort on the value of rows ordered by id
    order = torch.sort(logp, dim=-1, descending=True, stable=True).indices[:, :k]
    return logp.gather(1, order), ids.gather(1, order)


@pytest.mark.parametrize("V", [37, 64, 8000])
@pytest.mark.parametrize("k", [1, 3, 10])
def test_kernel_matches_log_softmax_top_k(compiled, V, k, kernel_calls):
    g = torch.Generator().manual_seed(V + k)
    h, weight, bias = torch.randn(9, 32, generator=g), torch.randn(V, 32, generator=g), torch.randn(V, generator=g)
    weight[BOS_ID] = weight[PAD_ID] = weight[5] * 3  # padding and BOS would win: they must not be chosen
    for b in (bias, None):
        values, ids = top_log_probs(h, weight, b, k, SKIP)
        want_values, want_ids = reference(h, weight, b, k)
        assert values.dtype == torch.float32 and ids.dtype == torch.long and values.shape == (9, k)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(values.double(), want_values, rtol=1e-5, atol=1e-5)
    assert kernel_calls["top_logprobs.cpp"] > 0


def test_kernel_ties_go_to_the_lower_id(compiled, kernel_calls):
    weight = torch.zeros(40, 4)
    weight[[7, 30, 12]] = 1.0  # three equal logits, the largest; the rest equal and lower
    values, ids = top_log_probs(torch.ones(2, 4), weight, None, 5, SKIP)
    assert ids[0, :3].tolist() == [7, 12, 30] and ids[0, 3:].tolist() == [1, 3]  # then 0 and 2 are skipped
    assert torch.equal(values[0], values[1]) and values[0, 0] == values[0, 2]
    assert kernel_calls["top_logprobs.cpp"] > 0


def test_kernel_steps_aside_where_it_does_not_apply(compiled):
    h, weight = torch.randn(3, 8), torch.randn(20, 8)
    assert top_log_probs(h, weight, None, 19, SKIP) is None  # k over V - 2: torch's topk fills with -inf
    assert top_log_probs(h.bfloat16(), weight.bfloat16(), None, 2, SKIP) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert top_log_probs(h, weight, None, 2, SKIP) is None
    compiled_module.set_kernels("eager")
    assert top_log_probs(h, weight, None, 2, SKIP) is None


def test_search_is_the_same_with_the_kernels(compiled, kernel_calls):
    """Greedy and beam search on a model whose vocabulary fits the kernel's k: the same hypotheses, the same
    scores to rounding, with the compiled kernels (attention step, LSTM cell, top k) as with eager ones."""
    model = small_model("luong", vocab=64)
    src, lengths = random_batch([7, 2, 9, 4, 9, 5])
    runs = {}
    for mode in ("compiled", "eager"):
        compiled_module.set_kernels(mode)
        runs[mode] = [greedy(model, src, lengths), beam_search(model, src, lengths, beam_size=4, nbest=2)]
    for fast, plain in zip(runs["compiled"], runs["eager"], strict=True):
        assert [[h.tokens for h in hs] for hs in fast] == [[h.tokens for h in hs] for hs in plain]
        scores = [h.score for hs in plain for h in hs]
        assert [h.score for hs in fast for h in hs] == pytest.approx(scores, abs=1e-5)
    assert kernel_calls["top_logprobs.cpp"] > 0


def test_translator_chooses_its_kernels_and_leaves_the_process_alone(torch_compiles):
    """kernels=auto (the default) takes the search's C++ kernels for fp32 on a CPU with a compiler, and its plan
    says why; the process's own choice (a Trainer's) is back once a translation is done."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    spm = train_sentencepiece([" ".join(words[i % 10 : i % 10 + 4]) for i in range(40)], vocab_size=30)
    tok = Tokenizer(spm, spm)
    model = small_model("luong", vocab=tok.src_vocab_size)
    auto = Translator(model, tok, amp="off")
    assert auto.settings["kernels"] == "auto" and auto.settings["plan"]["beam_topk"]["reason"]
    assert auto.kernels == ("compiled" if torch_compiles else "eager")
    assert ("beam_topk" in auto.plan.kernels) == torch_compiles
    eager = Translator(model, tok, amp="off", kernels="eager")
    assert eager.kernels == "eager" and eager.settings["plan"]["beam_topk"]["reason"] == "kernels=eager"
    before = compiled_module.kernels()
    assert [t[0].text for t in auto.translate(["alpha beta", "gamma delta eta"])] == [
        t[0].text for t in eager.translate(["alpha beta", "gamma delta eta"])
    ]
    assert compiled_module.kernels() == before  # the Translator's choice held only while it translated
    with pytest.raises(Exception, match="kernels"):
        Translator(model, tok, kernels="fast")


def test_a_built_kernel_loads_in_a_later_process_without_inductor(compiled):
    """The first build notes where its library is; a fresh process loads it from there, without importing
    Inductor (over a second), and it computes what it should."""
    from nmt.kernels.top_logprobs import ARGTYPES, SOURCE

    assert compiled_module.cpp_kernel(SOURCE, ARGTYPES, "beam_topk") is not None
    assert json.loads(compiled_module._index(SOURCE, ARGTYPES).read_text())["file"]
    code = (
        "import sys, torch\n"
        "from nmt.kernels import compiled\n"
        "from nmt.kernels.top_logprobs import top_log_probs\n"
        "compiled.set_kernels('compiled')\n"
        "v, i = top_log_probs(torch.eye(4), torch.eye(4) * 5, None, 1, (0, 2))\n"
        "print(i.view(-1).tolist(), 'torch._inductor.codecache' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[1, 1, 1, 3] False"  # rows 0 and 2 favour skipped ids: the best of the rest, 1


def test_a_translators_kernels_are_the_hand_written_ones_only(compiled):
    """Inside a Translator's search the C++ kernels load, but nothing goes through torch.compile, which would
    trace in every decoding process (seconds): Luong's concat score, say, scores with torch operations there."""
    from nmt.kernels.top_logprobs import ARGTYPES, SOURCE

    with compiled_module.kernels_for(compiled_module.Kernels.compiled):
        assert compiled_module.compiled(torch.sigmoid) is None
        assert compiled_module.cpp_kernel(SOURCE, ARGTYPES, "beam_topk") is not None
    assert compiled_module.compiled(torch.sigmoid) is not None  # the Trainer's choice again


def test_a_failed_build_decodes_eagerly_or_stops_when_insisted_on(monkeypatch, caplog, torch_compiles):
    """kernels=auto meeting a failed build warns and translates with torch operations (the same text);
    kernels=compiled is then an error that names the fix."""
    if not torch_compiles:
        pytest.skip("no C++ compiler: the kernels are never built here")
    from torch._inductor import codecache

    from nmt.errors import ConfigError

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    spm = train_sentencepiece([" ".join(words[i % 10 : i % 10 + 4]) for i in range(40)], vocab_size=30)
    tok = Tokenizer(spm, spm)
    model = small_model("bahdanau", vocab=tok.src_vocab_size)
    want = [t[0].text for t in Translator(model, tok, amp="off", kernels="eager").translate(["alpha beta gamma"])]

    def broken(*_args, **_kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(codecache.CppPythonBindingsCodeCache, "load_pybinding", broken)
    monkeypatch.setattr(compiled_module, "_cache", {})
    monkeypatch.setattr(compiled_module, "_load_built", lambda *_args: None)
    monkeypatch.setattr(compiled_module, "has_compiler", lambda: True)
    auto = Translator(model, tok, amp="off")
    assert auto.kernels == "compiled"
    with caplog.at_level("WARNING"):
        assert [t[0].text for t in auto.translate(["alpha beta gamma"])] == want
    assert "failed" in caplog.text
    with pytest.raises(ConfigError, match="kernels=eager"):
        Translator(model, tok, amp="off", kernels="compiled").translate(["alpha beta gamma"])


def test_a_translators_choice_holds_in_its_own_thread_only(compiled):
    """nmt-serve searches in threads: one Translator's kernels leave the other threads' (and the process's) alone,
    however the threads' searches interleave."""
    import threading

    entered, leave, seen = threading.Event(), threading.Event(), {}

    def search():
        with compiled_module.kernels_for(compiled_module.Kernels.eager):
            seen["inside"] = compiled_module.kernels()
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=search)
    thread.start()
    entered.wait(10)
    assert seen["inside"] == "eager" and compiled_module.kernels() == "compiled"  # the process's, here
    with compiled_module.kernels_for(compiled_module.Kernels.compiled):
        leave.set()
        thread.join(10)
        assert compiled_module.compiled(torch.sigmoid) is None  # still this thread's search
    assert compiled_module.kernels() == "compiled" and compiled_module.compiled(torch.sigmoid) is not None
