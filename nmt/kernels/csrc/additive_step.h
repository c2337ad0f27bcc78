// One decoder step of the additive attention, forward and backward (additive_step.cpp for
// nmt/kernels/additive_step.py, feed_loop.cpp), one sentence
// (row b) at a time; rows are spread over the OpenMP threads torch runs with.
//
//   forward   e_s = v^T tanh(q + k_s) for the real positions s, a = softmax(e), context = sum_s a_s V_s
//   backward  da_s = g_context . V_s (+ g_weights_s), g_s = a_s (da_s - sum_s' a_s' da_s'), and from g:
//             g_q = 4 v sum_s g_s w_s, g_w_keys[s] += g_s w_s (StepKeys' sums: 4 v is applied once, at the
//             end), g_v (per row) = 2 sum_s g_s sigma_s - sum_s g_s
//             with sigma = sigmoid(2 (q + k)), w = sigma (1 - sigma)
//
// tanh(x) = 2 sigmoid(2x) - 1, so v^T tanh(x) = 2 v^T sigmoid(2x) - sum(v) and tanh' = 4 sigma (1 - sigma);
// the backward recomputes sigma rather than storing it. With exp_keys = exp(-2 k) (computed once per batch
// by the caller, only where every |k| <= 20), sigma = 1 / (1 + exp(-2 q) exp(-2 k)): one exp per query element
// a step instead of one per (position, element). Every rounding there is relative (a few ulp); a product
// leaves the normal floats only where q + k < -24 or > 24, where sigma is 0 or 1 to 1e-21 either way, and
// exp(-2 q) = inf never meets exp(-2 k) = 0. Without exp_keys, an exp per element. Keys, queries and the sums are fp32;
// values, context and its gradient are fp32 or bf16 (VT), read and written in their dtype, added up in fp32.
// Shapes: B rows, S source positions, A attention size, D value size; every tensor contiguous.
#ifndef NMT_ADDITIVE_STEP_H
#define NMT_ADDITIVE_STEP_H
#include <algorithm>
#include <limits>
#include <vector>

#include "vec_io.h"

namespace additive {

static inline float total(Vec x) {
    return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}
// sigmoid(2 (q + k)): Fast, from x = exp(-2 q) and y = exp(-2 k), 1 / (1 + x y); else from x = q and y = k,
// with torch's fast exp (at most 20 ulp: ~2e-6 relative)
template <bool Fast>
static inline Vec sigmoid2(Vec x, Vec y) {
    if constexpr (Fast) return Vec(1.0f) / at::vec::fmadd(x, y, Vec(1.0f));
    return Vec(1.0f) / (Vec(1.0f) + ((x + y) * Vec(-2.0f)).exp_u20());
}

// Row b's query side of the factored sigmoid2, exp(-2 q) (A), into eq
static const float* exp_query(const float* qb, float* eq, int64_t A) {
    const int64_t W = Vec::size();
    for (int64_t a = 0; a < A; a += W) {
        const int64_t n = std::min(W, A - a);
        (load(qb + a, n) * Vec(-2.0f)).exp().store(eq + a, n);
    }
    return eq;
}

// Row b's scores 2 v^T sigma_s - sum(v) at the real positions (-inf on padding), from x (A) and y (S, A) as
// sigmoid2 reads them; returns the largest.
template <bool Fast>
static float scores(const float* x, const float* y, const float* v, float v_sum, const bool* mask, float* wb,
                    int64_t S, int64_t A) {
    const int64_t W = Vec::size();
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < S; ++s) {
        if (!mask[s]) {
            wb[s] = -std::numeric_limits<float>::infinity();
            continue;
        }
        Vec acc(0.0f);
        for (int64_t a = 0; a < A; a += W) {
            const int64_t n = std::min(W, A - a);
            acc = at::vec::fmadd(sigmoid2<Fast>(load(x + a, n), load(y + s * A + a, n)), load(v + a, n), acc);
        }
        wb[s] = 2.0f * total(acc) - v_sum;
        top = std::max(top, wb[s]);
    }
    return top;
}

// Row b's energy backward from the scores' gradient gb (S): adds g_s w_s into gq (A) and gk (S, A), and g_s sigma_s
// into gs (A); returns sum_s g_s. x and y as sigmoid2 reads them.
template <bool Fast>
static float energy_backward(const float* x, const float* y, const float* gb, float* gq, float* gk, float* gs,
                             int64_t S, int64_t A) {
    const int64_t W = Vec::size();
    float g_sum = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
        const float g = gb[s];
        g_sum += g;
        if (g == 0.0f) continue;
        const Vec gv(g);
        for (int64_t a = 0; a < A; a += W) {
            const int64_t n = std::min(W, A - a);
            const Vec sig = sigmoid2<Fast>(load(x + a, n), load(y + s * A + a, n));
            const Vec g_sig = gv * sig;
            const Vec g_w = g_sig - g_sig * sig;  // g sigma (1 - sigma)
            (load(gq + a, n) + g_w).store(gq + a, n);
            (load(gk + s * A + a, n) + g_w).store(gk + s * A + a, n);
            (load(gs + a, n) + g_sig).store(gs + a, n);
        }
    }
    return g_sum;
}

template <typename VT>
static void forward(const float* q, const float* keys, const float* exp_keys, const float* v, const bool* mask,
                    const VT* values, float* weights, VT* context, int64_t B, int64_t S, int64_t A, int64_t D) {
    const int64_t W = Vec::size();
    float v_sum = 0.0f;
    for (int64_t a = 0; a < A; ++a) v_sum += v[a];
#pragma omp parallel
    {
        std::vector<float> ctx(D), eq(A);
#pragma omp for
        for (int64_t b = 0; b < B; ++b) {
            const float* qb = q + b * A;
            float* wb = weights + b * S;
            const float top = exp_keys
                                  ? scores<true>(exp_query(qb, eq.data(), A), exp_keys + b * S * A, v, v_sum,
                                                 mask + b * S, wb, S, A)
                                  : scores<false>(qb, keys + b * S * A, v, v_sum, mask + b * S, wb, S, A);
            float sum = 0.0f;  // softmax: exp(e - max) (exactly 0 on padding), then normalised
            for (int64_t s = 0; s < S; s += W) {
                const int64_t n = std::min(W, S - s);
                Vec e = (load(wb + s, n) - Vec(top)).exp();
                e.store(wb + s, n);
                sum += total(Vec::set(Vec(0.0f), e, n));
            }
            const float inv = 1.0f / sum;
            std::fill(ctx.begin(), ctx.end(), 0.0f);
            for (int64_t s = 0; s < S; ++s) {  // context = sum_s a_s V_s
                wb[s] *= inv;
                if (wb[s] == 0.0f) continue;
                const Vec a(wb[s]);
                const VT* vs = values + (b * S + s) * D;
                for (int64_t d = 0; d < D; d += W) {
                    const int64_t n = std::min(W, D - d);
                    at::vec::fmadd(a, load(vs + d, n), load(ctx.data() + d, n)).store(ctx.data() + d, n);
                }
            }
            for (int64_t d = 0; d < D; ++d) context[b * D + d] = static_cast<VT>(ctx[d]);
        }
    }
}

template <typename VT>
static void backward(const float* q, const float* keys, const float* exp_keys, const float* v, const VT* values,
                     const float* weights, const VT* g_context, const float* g_weights, float* g_scores, float* g_q,
                     float* g_v, float* g_w_keys, int64_t B, int64_t S, int64_t A, int64_t D) {
    const int64_t W = Vec::size();
#pragma omp parallel
    {
        std::vector<float> gc(D), eq(A);
#pragma omp for
        for (int64_t b = 0; b < B; ++b) {
            const float* qb = q + b * A;
            const float* wb = weights + b * S;
            float* gb = g_scores + b * S;
            for (int64_t d = 0; d < D; ++d) gc[d] = static_cast<float>(g_context[b * D + d]);
            float dot = 0.0f;
            for (int64_t s = 0; s < S; ++s) {  // the weights' gradient: g_context . V_s (+ g_weights_s)
                if (wb[s] == 0.0f) {  // padding (or a weight that underflowed): its score gets no gradient
                    gb[s] = 0.0f;
                    continue;
                }
                const VT* vs = values + (b * S + s) * D;
                Vec acc(0.0f);
                for (int64_t d = 0; d < D; d += W) {
                    const int64_t n = std::min(W, D - d);
                    acc = at::vec::fmadd(load(gc.data() + d, n), load(vs + d, n), acc);
                }
                gb[s] = total(acc) + (g_weights ? g_weights[b * S + s] : 0.0f);
                dot += wb[s] * gb[s];
            }
            float* gq = g_q + b * A;
            float* gs = g_v + b * A;
            std::fill(gq, gq + A, 0.0f);
            std::fill(gs, gs + A, 0.0f);
            for (int64_t s = 0; s < S; ++s) gb[s] = wb[s] * (gb[s] - dot);  // the softmax's backward
            float* gk = g_w_keys + b * S * A;
            const float g_sum =  // the energy's
                exp_keys ? energy_backward<true>(exp_query(qb, eq.data(), A), exp_keys + b * S * A, gb, gq, gk, gs, S, A)
                         : energy_backward<false>(qb, keys + b * S * A, gb, gq, gk, gs, S, A);
            for (int64_t a = 0; a < A; a += W) {  // g_q = 4 v sum g w, g_v = 2 sum g sigma - sum g
                const int64_t n = std::min(W, A - a);
                (Vec(4.0f) * load(v + a, n) * load(gq + a, n)).store(gq + a, n);
                (Vec(2.0f) * load(gs + a, n) - Vec(g_sum)).store(gs + a, n);
            }
        }
    }
}

}  // namespace additive

#endif  // NMT_ADDITIVE_STEP_H
