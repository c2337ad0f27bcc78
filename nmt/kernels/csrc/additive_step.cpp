// One decoder step of the additive attention for nmt/kernels/additive_step.py: additive_step.h's forward and
// backward behind one entry. Built by Inductor's C++ toolchain (torch's vector ISA and flags), which calls the
// entry `kernel`; nmt.kernels.compiled.source_text puts the headers in place.
#include <torch/csrc/inductor/cpp_prefix.h>
// torch's vector types, also where Inductor found no vector ISA (the prefix then leaves them out): scalar then
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "additive_step.h"

template <typename T>
static T* at_(uintptr_t p) { return reinterpret_cast<T*>(p); }

// direction 0: forward, writes weights (B, S) and context (B, D); g_* unused. exp_keys: exp(-2 keys) or 0.
// direction 1: backward, reads weights (the forward's) and context (the context's gradient), g_weights (B, S) or
// 0, and writes g_scores (B, S), g_q (B, A), g_v (B, A: each row's share) and adds into g_w_keys (B, S, A).
// bf16: the values, context and its gradient are bf16, else fp32. Pointers are addresses (uintptr_t).
extern "C" void kernel(int64_t direction, int64_t bf16, uintptr_t q, uintptr_t keys, uintptr_t exp_keys, uintptr_t v,
                       uintptr_t mask, uintptr_t values, uintptr_t weights, uintptr_t context, uintptr_t g_weights,
                       uintptr_t g_scores, uintptr_t g_q, uintptr_t g_v, uintptr_t g_w_keys, int64_t B, int64_t S,
                       int64_t A, int64_t D) {
    using BF = c10::BFloat16;
    const bool* m = at_<const bool>(mask);
    const float* gw = g_weights ? at_<const float>(g_weights) : nullptr;
    const float *qf = at_<const float>(q), *kf = at_<const float>(keys), *vf = at_<const float>(v);
    const float* ek = exp_keys ? at_<const float>(exp_keys) : nullptr;
    if (direction == 0 && !bf16)
        additive::forward(qf, kf, ek, vf, m, at_<const float>(values), at_<float>(weights), at_<float>(context), B, S, A, D);
    else if (direction == 0)
        additive::forward(qf, kf, ek, vf, m, at_<const BF>(values), at_<float>(weights), at_<BF>(context), B, S, A, D);
    else if (!bf16)
        additive::backward(qf, kf, ek, vf, at_<const float>(values), at_<const float>(weights), at_<const float>(context), gw,
                 at_<float>(g_scores), at_<float>(g_q), at_<float>(g_v), at_<float>(g_w_keys), B, S, A, D);
    else
        additive::backward(qf, kf, ek, vf, at_<const BF>(values), at_<const float>(weights), at_<const BF>(context), gw,
                 at_<float>(g_scores), at_<float>(g_q), at_<float>(g_v), at_<float>(g_w_keys), B, S, A, D);
}
