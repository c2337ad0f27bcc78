// The encoder's one-layer (bi)LSTM over S steps, forward and backward, in fp32 (nmt/kernels/encoder_lstm.py):
// the recurrence only. The input's projection for every step and both directions (xw = x W_ih^T + b) comes in,
// one large matmul made by the caller, and so do the weights' gradients after the backward (large matmuls over
// the gates' gradients dz that this kernel writes).
//
// A direction's step is a product of ~100 rows by W_hh (a small matmul) and the cell's elementwise work (both
// through panels.h and lstm_cell.h). Split between two threads, a product that small gains little (on the 2-core
// AVX2 EPYC, 107 x 256 x 1024 took 708 us on one thread and 750 on two), so with two directions and two or more
// threads each direction runs on a thread of its own, its products and cells on that thread alone.
//
// Layouts, time-major: xw (S, B, D 4H), onto which the forward adds each step's h_{t-1} W_hh^T, so that it holds
// the gates' pre-activations z for the backward; cells (D, S, B, H); out (S, B, D H), the directions' states side
// by side; dz (S, B, D 4H) like xw; zeros: at least B H and 4H zero floats. The initial state is zero.
// Direction 0 runs t = 0 .. S-1, direction 1 t = S-1 .. 0.
#include <torch/csrc/inductor/cpp_prefix.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "panels.h"
#include "lstm_cell.h"

#include <algorithm>
#include <cstring>

struct Shape {
    int64_t S, B, H, D;
    int64_t G() const { return 4 * H; }
    int64_t t(int64_t d, int64_t k) const { return d == 0 ? k : S - 1 - k; }  // the k-th step of direction d
};

static void run_forward(const Shape& s, int64_t d, float* xw, const float* panels, const float* zeros, float* cells,
                        float* out) {
    const int64_t B = s.B, H = s.H, G = s.G(), XS = s.D * G, OS = s.D * H;
    for (int64_t k = 0; k < s.S; ++k) {
        const int64_t t = s.t(d, k), tp = s.t(d, k - 1);
        float* z = xw + t * B * XS + d * G;  // (B, 4H), rows XS apart
        if (k > 0) product(out + tp * B * OS + d * H, OS, panels, B, H, G, z, XS, true);  // += h_{t-1} W_hh^T
        const float* c = k == 0 ? zeros : cells + (d * s.S + tp) * B * H;
        forward(static_cast<const float*>(z), XS, zeros, 0, c, out + t * B * OS + d * H, OS,
                cells + (d * s.S + t) * B * H, B, H);
    }
}

// dout (S, B, D H) or null; dhn, dcn (D, B, H) or null: the final states' gradients. scratch: 2 x (B, H), then
// (G): the bias's gradient, dz's column sums over the steps (summed here while each step's rows are in cache,
// where the caller's sum read all of dz again).
static void run_backward(const Shape& s, int64_t d, const float* xw, const float* panels, const float* zeros,
                         const float* cells, const float* dout, const float* dhn, const float* dcn, float* scratch,
                         float* dz) {
    const int64_t B = s.B, H = s.H, G = s.G(), XS = s.D * G, OS = s.D * H;
    float* dh = scratch;          // (B, H): the gradient reaching h_t, then (after the cell) h_{t-1}'s from W_hh
    float* dc = scratch + B * H;  // (B, H): the gradient reaching c_t
    float* db = scratch + 2 * B * H;  // (G): the bias's gradient
    std::memset(db, 0, sizeof(float) * G);
    if (dhn) std::memcpy(dh, dhn + d * B * H, sizeof(float) * B * H); else std::memset(dh, 0, sizeof(float) * B * H);
    if (dcn) std::memcpy(dc, dcn + d * B * H, sizeof(float) * B * H); else std::memset(dc, 0, sizeof(float) * B * H);
    for (int64_t k = s.S - 1; k >= 0; --k) {
        const int64_t t = s.t(d, k), tp = s.t(d, k - 1);
        if (dout) {
            const float* g = dout + t * B * OS + d * H;
            for (int64_t r = 0; r < B; ++r)
                for (int64_t j = 0; j < H; ++j) dh[r * H + j] += g[r * OS + j];
        }
        const float* c = k == 0 ? zeros : cells + (d * s.S + tp) * B * H;
        float* dzt = dz + t * B * XS + d * G;
        backward(xw + t * B * XS + d * G, XS, zeros, 0, c, cells + (d * s.S + t) * B * H,
                 static_cast<const float*>(dh), static_cast<const float*>(dc), dzt, XS, dc, B, H);
        for (int64_t r = 0; r < B; ++r)
            for (int64_t j = 0; j < G; j += W) {
                const int64_t n = std::min(W, G - j);
                (Vec::loadu(db + j, n) + Vec::loadu(dzt + r * XS + j, n)).store(db + j, n);
            }
        if (k > 0) product(dzt, XS, panels, B, G, H, dh, H);  // dz_t W_hh: h_{t-1}'s gradient
    }
}

template <typename T>
static T* at_(uintptr_t p) { return reinterpret_cast<T*>(p); }

// what 0: forward (xw, panels[D] (forward: K H, N 4H), zeros, cells, out); 1: backward (xw, panels[D] (backward:
// K 4H, N H), zeros, cells, out, dout, dhn, dcn, scratch (D, 2 B H + 4H), dz); 2: NR into xw. panels: the address of D
// addresses. threads: torch's thread count; with 2 directions and at least 2 threads, a thread for each.
extern "C" void kernel(int64_t what, int64_t threads, uintptr_t xw, uintptr_t panels, uintptr_t zeros, uintptr_t cells,
                       uintptr_t out, uintptr_t dout, uintptr_t dhn, uintptr_t dcn, uintptr_t scratch, uintptr_t dz,
                       int64_t S, int64_t B, int64_t H, int64_t D) {
    if (what == 2) {
        *at_<int64_t>(xw) = NR;
        return;
    }
    const Shape s{S, B, H, D};
    const uintptr_t* pan = at_<const uintptr_t>(panels);
#pragma omp parallel for num_threads(2) schedule(static, 1) if (D == 2 && threads >= 2)
    for (int64_t d = 0; d < D; ++d) {
        if (what == 0)
            run_forward(s, d, at_<float>(xw), at_<const float>(pan[d]), at_<const float>(zeros), at_<float>(cells),
                        at_<float>(out));
        else
            run_backward(s, d, at_<const float>(xw), at_<const float>(pan[d]), at_<const float>(zeros),
                         at_<const float>(cells), at_<const float>(dout), at_<const float>(dhn),
                         at_<const float>(dcn), at_<float>(scratch) + d * (2 * B * H + 4 * H), at_<float>(dz));
    }
}
