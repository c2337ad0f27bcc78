// The LSTM cell's elementwise part for one decoder step (nmt/kernels/lstm_cell.py), forward and backward, through
// lstm_cell.h; the matmuls stay torch's. x0 is a view of the embeddings' projection for all steps, or the bias
// with stride 0. Built by Inductor's C++ toolchain (torch's vector ISA and flags), which calls the entry `kernel`;
// nmt.kernels.compiled.source_text puts lstm_cell.h in place.
#include <torch/csrc/inductor/cpp_prefix.h>
// torch's vector types, also where Inductor found no vector ISA (the prefix then leaves them out): scalar then
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "lstm_cell.h"

template <typename T>
static T* at_(uintptr_t p) { return reinterpret_cast<T*>(p); }

// direction 0: forward, writes h and c_new. direction 1: backward, reads dh (or 0) and dc_new (or 0), writes
// dz (rows, 4H) and dc (rows, H). bf16: wx, h and dh are bf16, else fp32. Pointers are addresses (uintptr_t).
extern "C" void kernel(int64_t direction, int64_t bf16, uintptr_t x0, int64_t x0_stride, uintptr_t wx, uintptr_t c,
                       uintptr_t c_new, uintptr_t h, uintptr_t dh, uintptr_t dc_new, uintptr_t dz, uintptr_t dc,
                       int64_t rows, int64_t H) {
    using BF = c10::BFloat16;
    const float* x = at_<const float>(x0);
    if (direction == 0 && !bf16)
        forward(x, x0_stride, at_<const float>(wx), 4 * H, at_<const float>(c), at_<float>(h), H, at_<float>(c_new), rows,
                H);
    else if (direction == 0)
        forward(x, x0_stride, at_<const BF>(wx), 4 * H, at_<const float>(c), at_<BF>(h), H, at_<float>(c_new), rows, H);
    else if (!bf16)
        backward(x, x0_stride, at_<const float>(wx), 4 * H, at_<const float>(c), at_<const float>(c_new),
                 dh ? at_<const float>(dh) : nullptr, dc_new ? at_<const float>(dc_new) : nullptr, at_<float>(dz),
                 4 * H, at_<float>(dc), rows, H);
    else
        backward(x, x0_stride, at_<const BF>(wx), 4 * H, at_<const float>(c), at_<const float>(c_new),
                 dh ? at_<const BF>(dh) : nullptr, dc_new ? at_<const float>(dc_new) : nullptr, at_<float>(dz),
                 4 * H, at_<float>(dc), rows, H);
}
