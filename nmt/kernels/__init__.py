"""The CPU fast paths: the same arithmetic as plain torch operations, with fewer passes over memory and fewer
dispatched operations per decoder step. Each is tested against the plain form.

    compiled.py        the process's kernel choice (trainer.kernels) and building kernels with torch.compile's
                       C++ toolchain: Inductor's generated loops and the hand-written C++ of csrc/
    stepweight.py      weights (and batches of matrices) used at every step, their gradient one matmul over all steps
    step_gemm.py       a step's fp32 products through weights packed once per batch (csrc/step_gemm.cpp)
    energy.py          the additive attention's energy v^T tanh(q + k) in cache-sized pieces, its own backward
    additive_step.py   one decoder step of the additive attention in C++ (csrc/additive_step.cpp)
    lstm_cell.py       the decoder's LSTM written out one step at a time; its cell in C++ (csrc/lstm_cell.cpp)
    decoder_loop.py    RNNsearch's teacher-forced decoder loop as one autograd node

The model (nmt.attention, nmt.decoder) calls these; they never import the model (a contract in pyproject.toml,
checked by `lint-imports`): what a kernel needs from a module, the module hands it.
"""
