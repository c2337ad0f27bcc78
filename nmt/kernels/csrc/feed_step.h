// The input-feeding loop's elementwise work around h~ (feed_loop.cpp), once each way per step:
//
//   forward   th = tanh(z), feed = th * mask (th where no dropout)             z = W_c [c_t; h_t], (n, H)
//   backward  g = (g_att or 0) + (g_feed on the first m rows), g_pre = g * mask * (1 - th^2);
//             g_state = g_h, g_cell = g_c on the first m rows, 0 below         (the next step's, m <= n)
//
// where torch took a tanh (~1.8 ns an element on the AVX2 EPYC), a copy and a product forward and about ten
// small operations backward, each a pass and a dispatch. tanh is 2 sigmoid(2x) - 1, as in lstm_cell.h.
// g_feed and g_h have rows `gs` floats apart (the halves of one (m, 2H) gradient); everything else is (n, H).
#ifndef NMT_FEED_STEP_H
#define NMT_FEED_STEP_H
#include <algorithm>

#include "lstm_cell.h"

static inline Vec or_zero(const float* p, int64_t n) { return p ? Vec::loadu(p, n) : Vec(0.0f); }

static void feed_forward(const float* z, const float* mask, float* th, float* feed, int64_t n, int64_t H) {
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

static void feed_backward(const float* g_att, const float* g_feed, const float* g_h, const float* g_c, int64_t gs,
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

#endif  // NMT_FEED_STEP_H
