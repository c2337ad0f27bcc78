"""The CPU fast paths: the same arithmetic as plain torch operations, with fewer passes over memory and fewer
dispatched operations per decoder step. Each is tested against the plain form.

    compiled.py        the process's kernels, one per component of a run's plan (nmt.plan), building them with
                       torch.compile's C++ toolchain (Inductor's generated loops and the hand-written C++ of
                       csrc/), and the once-logged fallbacks of calls a kernel does not take
    stepweight.py      weights (and batches of matrices) used at every step, their gradient one matmul over all steps
    step_gemm.py       a step's fp32 products through weights packed once per batch (csrc/step_gemm.cpp)
    energy.py          the additive attention's energy v^T tanh(q + k) in cache-sized pieces, its own backward
    additive_step.py   one decoder step of the additive attention in C++ (csrc/additive_step.cpp)
    lstm_cell.py       the decoder's LSTM written out one step at a time; its cell in C++ (csrc/lstm_cell.cpp)
    decoder_loop.py    RNNsearch's teacher-forced decoder loop as one autograd node
    feed_loop.py       the input-feeding decoder's teacher-forced loop as one autograd node (csrc/feed_loop.cpp)
    encoder_lstm.py    the encoder's (bi)LSTM, both directions at once (csrc/encoder_lstm.cpp)
    xent.py            the label-smoothed cross-entropy of a piece of logits and its gradient (csrc/smoothed_xent.cpp)
    keep_mask.py       dropout's keep mask from torch's random words in one pass (csrc/keep_mask.cpp)
    top_logprobs.py    a search step's k best log-probabilities and their ids (csrc/top_logprobs.cpp)

The model (nmt.attention, nmt.decoder) calls these; they never import the model (a contract in pyproject.toml,
checked by `lint-imports`): what a kernel needs from a module, the module hands it.
"""
