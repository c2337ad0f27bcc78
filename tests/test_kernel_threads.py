"""Every kernel computes what its torch form computes at 1, 2, 3, 4 and 8 threads, and each test sees its kernel
run (calls counted by the `kernel_calls` fixture). Sizes cross the thresholds from which the kernels split their
rows between threads, so that the parallel paths run too."""

import pytest
import torch
from test_decoder_loop import batch, model_of, train_step  # tests/ is on sys.path (pytest's prepend import mode)

from nmt.dropout import keep_mask
from nmt.kernels.compiled import KERNELS, SEARCH, set_kernels, use_kernels
from nmt.kernels.energy import additive_energy
from nmt.kernels.top_logprobs import top_log_probs
from nmt.loss import output_loss_sum

THREADS = [1, 2, 3, 4, 8]
HAND_WRITTEN = SEARCH  # every kernel but torch.compile's energy (compiled once below, at every count)


@pytest.fixture(params=THREADS, ids=[f"{n}-threads" for n in THREADS])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def both_ways(run):
    """run() with every hand-written kernel, then with none: the two results."""
    use_kernels(HAND_WRITTEN, strict=True)
    with_kernels = run()
    set_kernels("eager")
    return with_kernels, run()


def assert_close_all(got, want, rtol, atol):
    loss, weights, grads = got
    loss_ref, weights_ref, grads_ref = want
    torch.testing.assert_close(loss, loss_ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(weights, weights_ref, rtol=rtol, atol=atol)
    for k, grad in grads_ref.items():
        torch.testing.assert_close(grads[k], grad, rtol=rtol, atol=atol, msg=k)


DECODERS = {
    "input-feeding": dict(attention_query="current", input_feeding=True),
    "rnnsearch": dict(attention_query="previous", input_feeding=False),
}


def check_training_step(decoder: dict, kernel_calls) -> None:
    """The encoder's LSTM, the decoder's loop (feed_loop.cpp, or RNNsearch's with additive_step.cpp and
    lstm_cell.cpp), the step products' panels and the dropout masks: a training step's loss, attention and
    gradients equal the torch forms', 29 sentences (183 decoder rows) with dropout."""
    model, data = model_of(**decoder, dropout=0.2), batch(sorted(((7 * i) % 12 + 1 for i in range(29)), reverse=True))
    model.train()

    def run():
        torch.manual_seed(3)
        return train_step(model, *data, amp=False)

    got, want = both_ways(run)
    assert_close_all(got, want, rtol=1e-5, atol=1e-6)
    loop = "feed_loop.cpp" if decoder["input_feeding"] else "additive_step.cpp"
    for source in ("encoder_lstm.cpp", loop, "lstm_cell.cpp" if loop != "feed_loop.cpp" else loop, "step_gemm.cpp"):
        assert kernel_calls[source] > 0, source
    assert kernel_calls["keep_mask.cpp"] > 0


def check_output_loss(kernel_calls) -> None:
    """smoothed_xent.cpp with the output layer's panels (step_gemm.cpp): the loss and the gradients of the hidden
    states, the weight and the bias, over several pieces of rows, padding among the targets."""
    g = torch.Generator().manual_seed(2)
    output = torch.nn.Linear(24, 300)
    hidden = torch.randn(1100, 24, generator=g).requires_grad_()  # three pieces of OUTPUT_ROWS (512)
    target = torch.randint(0, 300, (1100,), generator=g)
    target[::7] = 0  # PAD_ID

    def run():
        output.zero_grad(set_to_none=True)
        hidden.grad = None
        loss = output_loss_sum(hidden, output, target, 0.1)
        loss.backward()
        return loss.detach(), hidden.grad.clone(), {"weight": output.weight.grad, "bias": output.bias.grad}

    got, want = both_ways(run)
    assert_close_all(got, want, rtol=1e-5, atol=1e-5)
    assert kernel_calls["smoothed_xent.cpp"] > 0 and kernel_calls["step_gemm.cpp"] > 0


def check_dropout_mask(kernel_calls) -> None:
    """keep_mask.cpp gives the torch operations' mask bit for bit above the size it splits between threads."""

    def run():
        torch.manual_seed(9)
        return keep_mask(((1 << 18) + 77,), 0.3, torch.float32)

    got, want = both_ways(run)
    assert torch.equal(got, want)
    assert kernel_calls["keep_mask.cpp"] > 0


def check_top_k(kernel_calls) -> None:
    """top_logprobs.cpp: the k best log-probabilities of every row and their ids, the skipped ids never among
    them, as log_softmax and topk give them."""
    g = torch.Generator().manual_seed(4)
    h, weight, bias = torch.randn(64, 32, generator=g), torch.randn(500, 32, generator=g), torch.randn(500, generator=g)
    use_kernels(HAND_WRITTEN, strict=True)
    values, ids = top_log_probs(h, weight, bias, 5, (0, 2))
    assert kernel_calls["top_logprobs.cpp"] > 0
    logp = torch.log_softmax(h @ weight.t() + bias, dim=-1)
    logp[:, [0, 2]] = float("-inf")
    want_values, want_ids = logp.topk(5, dim=-1)
    torch.testing.assert_close(values, want_values, rtol=0, atol=1e-5)
    assert torch.equal(ids, want_ids)


@pytest.mark.parametrize("decoder", DECODERS.values(), ids=DECODERS.keys())
def test_a_training_step_is_the_torch_forms_at_any_thread_count(decoder, threads, compiled, kernel_calls):
    check_training_step(decoder, kernel_calls)


def test_the_output_layers_loss_is_the_torch_forms_at_any_thread_count(threads, compiled, kernel_calls):
    check_output_loss(kernel_calls)


def test_the_dropout_mask_is_the_torch_forms_at_any_thread_count(threads, compiled, kernel_calls):
    check_dropout_mask(kernel_calls)


def test_a_search_steps_top_k_is_the_torch_forms_at_any_thread_count(threads, compiled, kernel_calls):
    check_top_k(kernel_calls)


def test_every_kernel_builds_and_runs_without_a_vector_isa(compiled, kernel_calls, one_thread):
    """Built for a CPU without a vector ISA (Inductor's simdlen 1 and -march=x86-64: no AVX, so ATen's Vectorized
    is its scalar form and keep_mask.cpp takes its scalar branch), every hand-written kernel is another library
    (its own index note) and computes the torch forms' numbers."""
    import torch._inductor.config as inductor_config

    from nmt.kernels import compiled as compiled_module
    from nmt.kernels.keep_mask import ARGTYPES, SOURCE

    vectorised = compiled_module._index(SOURCE, ARGTYPES)
    with inductor_config.patch({"cpp.simdlen": 1, "cpp.march": "x86-64"}):  # restored after, for every test
        assert compiled_module._index(SOURCE, ARGTYPES) != vectorised
        for decoder in DECODERS.values():
            check_training_step(decoder, kernel_calls)
        check_output_loss(kernel_calls)
        check_dropout_mask(kernel_calls)
        check_top_k(kernel_calls)
        assert all(key[1] == "simdlen 1 march x86-64" for key in compiled_module._cache)


def test_the_compiled_energy_is_the_torch_forms_at_any_thread_count(threads, compiled, kernel_calls):
    """torch.compile's energy (attention_energy) reads the thread count when it runs: the scores and their
    gradients equal the eager pieces' at every count, from one compilation."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(6, 5, 16, generator=g).requires_grad_()
    keys = torch.randn(6, 9, 16, generator=g).requires_grad_()
    v = torch.randn(16, generator=g).requires_grad_()

    def run():
        for t in (q, keys, v):
            t.grad = None
        scores = additive_energy(q, keys, v)
        scores.square().sum().backward()
        return scores.detach(), q.grad.clone(), {"keys": keys.grad.clone(), "v": v.grad.clone()}

    use_kernels(KERNELS, strict=True)
    got = run()
    assert sum(kernel_calls.values()) > 0  # the compiled forward and backward ran
    set_kernels("eager")
    assert_close_all(got, run(), rtol=1e-5, atol=1e-5)
