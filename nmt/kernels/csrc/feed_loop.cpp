// The input-feeding decoder's teacher-forced loop (nmt/kernels/feed_loop.py), all its steps in one call each way:
//
//   forward   per step t, for its first n = active[t] rows:
//               x = [h~_{t-1}; h_{t-1}], z = x W_r^T (panels.h), h_t, cell_t = cell(x0_t + z, cell_{t-1})
//               q = h_t W_s^T, c_t, a_t = attend(q, keys, values) (additive_step.h)
//               y = [c_t; h_t], h~_t = tanh(y W_c^T) * mask_t (feed_step.h)
//   backward  the same steps in reverse, the products by the transposed panels
//
// Python took a dozen calls a step each way (the products, the kernels, the joins, their tensors); the arithmetic
// is theirs, in the same order. The rows of all steps lie one after another (N = sum of active; a step's rows start
// where the previous step's end): layer 0's input x0 (the embeddings' share, made for the loop's rows only) and
// what the weights' gradients need (the caller forms them once, as one matmul each: nmt.kernels.stepweight), so
// the gates' gradients are x0's as they stand. Built by Inductor's C++ toolchain (torch's vector ISA and flags), which
// calls `kernel`; nmt.kernels.compiled.source_text puts the headers in place.
// Shapes: B rows, T steps, S source positions, A attention size, D value size, H hidden; all fp32.
#include <torch/csrc/inductor/cpp_prefix.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstring>
#include <vector>

#include "panels.h"
#include "additive_step.h"
#include "feed_step.h"

// dst's n rows (ld floats apart) from a's (k1 floats each, rows k1 apart) then b's (k2, rows k2 apart)
static void join(float* dst, int64_t ld, const float* a, int64_t k1, const float* b, int64_t k2, int64_t n) {
#pragma omp parallel for if (n * ld > 32768)
    for (int64_t r = 0; r < n; ++r) {
        std::memcpy(dst + r * ld, a + r * k1, k1 * sizeof(float));
        std::memcpy(dst + r * ld + k1, b + r * k2, k2 * sizeof(float));
    }
}

// The addresses the entry receives, in this order (0 for an absent one).
enum Forward {
    F_X0, F_H0, F_C0, F_FEED0, F_KEYS, F_EXP_KEYS, F_V, F_MASK, F_VALUES, F_W_R, F_W_S, F_W_C, F_DROP,  // inputs
    F_STATES, F_CELLS, F_TANHS, F_FEEDS, F_WEIGHTS, F_QUERIES, F_JOINED, F_GATES, F_COMBINED,           // (N, .)
    F_Z, F_CONTEXT                                                                                      // (B, .)
};
enum Backward {
    B_X0, B_C0, B_KEYS, B_EXP_KEYS, B_V, B_VALUES, B_WEIGHTS, B_STATES, B_CELLS, B_TANHS, B_DROP, B_QUERIES,
    B_GATES, B_W_R, B_W_S, B_W_C, B_G_FEEDS, B_G_WEIGHTS,                                      // inputs
    B_G_V, B_G_PRE, B_G_CONTEXT, B_G_Q, B_G_Z, B_G_KEYS, B_G_X, B_G_C,                          // outputs
    B_G_STATE, B_G_CELL, B_G_Y, B_G_SCORES, B_G_V_ROWS                                        // (B, .) scratch
};

// x0 (N, 4H) like every (N, .) buffer: the forward's filled, in the order of the steps
static void forward(const uintptr_t* p, const int64_t* active, int64_t T, int64_t S, int64_t A, int64_t D,
                    int64_t H) {
    auto in = [p](int i) { return reinterpret_cast<const float*>(p[i]); };
    auto out = [p](int i) { return reinterpret_cast<float*>(p[i]); };
    const bool* mask = reinterpret_cast<const bool*>(p[F_MASK]);
    const float *h = in(F_H0), *c = in(F_C0), *feed = in(F_FEED0), *drop = in(F_DROP);
    float *z = out(F_Z), *context = out(F_CONTEXT);
    const int64_t Y = D + H;
    for (int64_t t = 0, row = 0; t < T; row += active[t], ++t) {
        const int64_t n = active[t];  // the sentences still decoded: the first n rows
        float* x = out(F_JOINED) + row * 2 * H;
        join(x, 2 * H, feed, H, h, H, n);
        float* wx = out(F_GATES) + row * 4 * H;
        product(x, 2 * H, in(F_W_R), n, 2 * H, 4 * H, wx, 4 * H);
        float *h_new = out(F_STATES) + row * H, *cell = out(F_CELLS) + row * H;
        ::forward<float>(in(F_X0) + row * 4 * H, 4 * H, wx, 4 * H, c, h_new, H, cell, n, H);
        float* q = out(F_QUERIES) + row * A;
        product(h_new, H, in(F_W_S), n, H, A, q, A);
        additive::forward<float>(q, in(F_KEYS), in(F_EXP_KEYS), in(F_V), mask, in(F_VALUES),
                                 out(F_WEIGHTS) + row * S, context, n, S, A, D);
        float* y = out(F_COMBINED) + row * Y;
        join(y, Y, context, D, h_new, H, n);
        product(y, Y, in(F_W_C), n, Y, H, z, H);
        float* feed_new = out(F_FEEDS) + row * H;
        feed_forward(z, drop ? drop + row * H : nullptr, out(F_TANHS) + row * H, feed_new, n, H);
        h = h_new, c = cell, feed = feed_new;
    }
}

// g_z (N, 4H), the gates' gradients, is x0's too; g_v (A) and g_keys (B, S, A) added into; the gradients of
// h~_{-1}, h_{-1} (g_x (B, 2H)) and cell_{-1} (g_c (B, H)) left in their buffers
static void backward(const uintptr_t* p, const int64_t* active, int64_t T, int64_t S, int64_t A, int64_t D,
                     int64_t H) {
    auto in = [p](int i) { return reinterpret_cast<const float*>(p[i]); };
    auto out = [p](int i) { return reinterpret_cast<float*>(p[i]); };
    const float *g_feeds = in(B_G_FEEDS), *g_weights = in(B_G_WEIGHTS), *drop = in(B_DROP);
    float *g_x = out(B_G_X), *g_c = out(B_G_C), *g_state = out(B_G_STATE), *g_cell = out(B_G_CELL);
    float *g_y = out(B_G_Y), *g_v_rows = out(B_G_V_ROWS), *g_v = out(B_G_V);
    const int64_t Y = D + H;
    std::vector<int64_t> starts(T + 1, 0);
    for (int64_t t = 0; t < T; ++t) starts[t + 1] = starts[t] + active[t];
    for (int64_t t = T - 1; t >= 0; --t) {
        const int64_t n = active[t], row = starts[t], m = t + 1 < T ? active[t + 1] : 0;
        // h~'s gradient (g_feeds' rows and the next step's for its m rows) through the dropout and the tanh, and
        // the next step's gradients of the state and the cell (zero below m)
        float* g_pre = out(B_G_PRE) + row * H;
        feed_backward(g_feeds ? g_feeds + row * H : nullptr, g_x, g_x + H, g_c, 2 * H, drop ? drop + row * H : nullptr,
                      in(B_TANHS) + row * H, g_pre, g_state, g_cell, n, m, H);
        product(g_pre, H, in(B_W_C), n, H, Y, g_y, Y);  // [c_t; h_t]'s gradient
        float* g_context = out(B_G_CONTEXT) + row * D;
#pragma omp parallel for if (n * Y > 32768)
        for (int64_t r = 0; r < n; ++r) {
            std::memcpy(g_context + r * D, g_y + r * Y, D * sizeof(float));
            for (int64_t j = 0; j < H; ++j) g_state[r * H + j] += g_y[r * Y + D + j];
        }
        float* g_q = out(B_G_Q) + row * A;
        additive::backward<float>(in(B_QUERIES) + row * A, in(B_KEYS), in(B_EXP_KEYS), in(B_V), in(B_VALUES),
                                  in(B_WEIGHTS) + row * S, g_context, g_weights ? g_weights + row * S : nullptr,
                                  out(B_G_SCORES), g_q, g_v_rows, out(B_G_KEYS), n, S, A, D);
        for (int64_t r = 0; r < n; ++r)
            for (int64_t a = 0; a < A; ++a) g_v[a] += g_v_rows[r * A + a];
        product(g_q, A, in(B_W_S), n, A, H, g_state, H, true);  // h_t's gradient through the query
        const float* c_prev = t == 0 ? in(B_C0) : in(B_CELLS) + starts[t - 1] * H;
        float* g_z = out(B_G_Z) + row * 4 * H;
        ::backward<float>(in(B_X0) + row * 4 * H, 4 * H, in(B_GATES) + row * 4 * H, 4 * H, c_prev,
                          in(B_CELLS) + row * H, g_state, g_cell, g_z, 4 * H, g_c, n, H);
        product(g_z, 4 * H, in(B_W_R), n, 4 * H, 2 * H, g_x, 2 * H);  // [h~_{t-1}; h_{t-1}]'s gradient
    }
}

// what 0: forward, 1: backward; p: the addresses (Forward's or Backward's order), active: T row counts
extern "C" void kernel(int64_t what, uintptr_t p, uintptr_t active, int64_t T, int64_t S, int64_t A, int64_t D,
                       int64_t H) {
    const uintptr_t* addresses = reinterpret_cast<const uintptr_t*>(p);
    const int64_t* rows = reinterpret_cast<const int64_t*>(active);
    if (what == 0)
        forward(addresses, rows, T, S, A, D, H);
    else
        backward(addresses, rows, T, S, A, D, H);
}
