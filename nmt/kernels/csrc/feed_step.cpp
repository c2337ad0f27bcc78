// The input-feeding loop's elementwise work around h~ (nmt/kernels/feed_loop.py), one call each way per step:
//
//   forward   th = tanh(z), feed = th * mask (th where no dropout)             z = W_c [c_t; h_t], (n, H)
//   backward  g = (g_att or 0) + (g_feed on the first m rows), g_pre = g * mask * (1 - th^2);
//             g_state = g_h, g_cell = g_c on the first m rows, 0 below         (the next step's, m <= n)
//
// where torch took a tanh (~1.8 ns an element on the AVX2 EPYC), a copy and a product forward and about ten
// small operations backward, each a pass and a dispatch. tanh is 2 sigmoid(2x) - 1, as in lstm_cell.h.
// g_feed and g_h have rows `gs` floats apart (the halves of one (m, 2H) gradient); everything else is (n, H).
// Built by Inductor's C++ toolchain (torch's vector ISA and flags), which calls `kernel`.
#include <torch/csrc/inductor/cpp_prefix.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "lstm_cell.h"

static inline Vec or_zero(const float* p, int64_t n) { return p ? Vec::loadu(p, n) : Vec(0.0f); }

static void forward_(const float* z, const float* mask, float* th, float* feed, int64_t n, int64_t H) {
    const int64_t W = Vec::size();
#pragma omp parallel for if (n * H > 16384)
    for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < H; j += W) {
            const int64_t k = std::min(W, H - j), i = r * H + j;
            const Vec t = tanh_(Vec::loadu(z + i, k));
            t.store(th + i, k);
            (mask ? t * Vec::loadu(mask + i, k) : t).store(feed + i, k);
        }
}

static void backward_(const float* g_att, const float* g_feed, const float* g_h, const float* g_c, int64_t gs,
                      const float* mask, const float* th, float* g_pre, float* g_state, float* g_cell, int64_t n,
                      int64_t m, int64_t H) {
    const int64_t W = Vec::size();
#pragma omp parallel for if (n * H > 16384)
    for (int64_t r = 0; r < n; ++r) {
        const bool next = r < m;  // the sentence is still decoded at the next step
        for (int64_t j = 0; j < H; j += W) {
            const int64_t k = std::min(W, H - j), i = r * H + j;
            Vec g = or_zero(g_att ? g_att + i : nullptr, k);
            if (next) g = g + Vec::loadu(g_feed + r * gs + j, k);
            if (mask) g = g * Vec::loadu(mask + i, k);
            const Vec t = Vec::loadu(th + i, k);
            (g * (Vec(1.0f) - t * t)).store(g_pre + i, k);
            (next ? Vec::loadu(g_h + r * gs + j, k) : Vec(0.0f)).store(g_state + i, k);
            (next ? Vec::loadu(g_c + r * H + j, k) : Vec(0.0f)).store(g_cell + i, k);
        }
    }
}

template <typename T>
static T* at_(uintptr_t p) { return reinterpret_cast<T*>(p); }

// what 0: forward (z, mask or 0, th, feed); 1: backward (g_att or 0, g_feed, g_h, g_c (0 where m is 0), mask or
// 0, th, g_pre, g_state, g_cell). Pointers are addresses (uintptr_t).
extern "C" void kernel(int64_t what, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, uintptr_t f,
                       uintptr_t g, uintptr_t h, uintptr_t i, int64_t gs, int64_t n, int64_t m, int64_t H) {
    if (what == 0)
        forward_(at_<const float>(a), at_<const float>(b), at_<float>(c), at_<float>(d), n, H);
    else
        backward_(at_<const float>(a), at_<const float>(b), at_<const float>(c), at_<const float>(d), gs,
                  at_<const float>(e), at_<const float>(f), at_<float>(g), at_<float>(h), at_<float>(i), n, m, H);
}
