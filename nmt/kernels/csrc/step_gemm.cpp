// A decoder step's fp32 product with a weight packed once per batch (nmt/kernels/step_gemm.py), through panels.h:
// pack B (K, N) into panels of NR columns; product C (n, N) = A (n, K) B.
//
// A step multiplies about a hundred rows by a weight of a few MB: a general GEMM repacks the weight at every call
// and, over so few rows, that copy is a large part of the call. Built by Inductor's C++ toolchain (torch's vector
// ISA and flags), which calls `kernel`; nmt.kernels.compiled.source_text puts panels.h in place.
#include <torch/csrc/inductor/cpp_prefix.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "panels.h"

// what 0: pack (w, out, sk, sj, K, N); 1: product (a, packed, c, lda, ldc, n, K, N); 2: NR into x
extern "C" void kernel(int64_t what, uintptr_t x, uintptr_t y, uintptr_t z, int64_t s0, int64_t s1, int64_t n,
                       int64_t K, int64_t N) {
    if (what == 0) {
        pack(reinterpret_cast<const float*>(x), s0, s1, K, N, reinterpret_cast<float*>(y));
    } else if (what == 1) {
        product(reinterpret_cast<const float*>(x), s0, reinterpret_cast<const float*>(y), n, K, N,
                reinterpret_cast<float*>(z), s1);
    } else {
        *reinterpret_cast<int64_t*>(x) = NR;
    }
}
