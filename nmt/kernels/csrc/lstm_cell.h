// The LSTM cell's elementwise part (lstm_cell.cpp, encoder_lstm.cpp), gates in nn.LSTM's order (i, f, g, o) from
// the pre-activations z = x0 + wx:
//
//   forward   c' = sigmoid(f) c + sigmoid(i) tanh(g),  h = sigmoid(o) tanh(c')
//   backward  from dh and dc' (the next step's): dz (the gates' gradient) and dc (the previous cell's)
//
// The backward recomputes the gates from x0 + wx rather than storing them. x0 (n, 4H) is fp32; wx (n, 4H) and dh
// (n, H) are fp32 or bf16 (T: the matmuls' dtype); c, c' and dc (n, H) fp32; x0, wx, h and dz have row strides.
// dc may be dc' (in place). Rows split between threads from 4,096 elements: a step's ~100 x 512 took 333 us on
// one core of the AVX2 EPYC, 231 on two; inside another parallel region they run on the calling thread.
#ifndef NMT_LSTM_CELL_H
#define NMT_LSTM_CELL_H
#include <algorithm>

#include "vec_io.h"

// exp_u20, torch's inline exp (a polynomial; Sleef's exp is a call): 0.7x the cell's time here, and the sigmoid
// and tanh as close to fp64's as with Sleef's (at most 4e-7 relative, 1.8e-7 absolute). Its clamp would turn
// NaN into a number: NaN stays NaN.
static inline Vec sigmoid(Vec x) { return Vec::blendv(Vec(1.0f) / (Vec(1.0f) + x.neg().exp_u20()), x, x.isnan()); }
static inline Vec tanh_(Vec x) { return Vec(2.0f) * sigmoid(Vec(2.0f) * x) - Vec(1.0f); }

struct Gates {
    Vec i, f, g, o;
};

template <typename T>
static inline Gates gates(const float* x0, const T* wx, int64_t H, int64_t j, int64_t n) {
    return {sigmoid(load(x0 + j, n) + load(wx + j, n)), sigmoid(load(x0 + H + j, n) + load(wx + H + j, n)),
            tanh_(load(x0 + 2 * H + j, n) + load(wx + 2 * H + j, n)),
            sigmoid(load(x0 + 3 * H + j, n) + load(wx + 3 * H + j, n))};
}

template <typename T>
static void forward(const float* x0, int64_t x0_stride, const T* wx, int64_t wx_stride, const float* c, T* h,
                    int64_t h_stride, float* c_new, int64_t rows, int64_t H) {
    const int64_t W = Vec::size();
#pragma omp parallel for if (rows * H > 4096)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < H; j += W) {
            const int64_t n = std::min(W, H - j);
            const Gates z = gates(x0 + r * x0_stride, wx + r * wx_stride, H, j, n);
            const Vec cell = z.f * load(c + r * H + j, n) + z.i * z.g;
            store(cell, c_new + r * H + j, n);
            store(z.o * tanh_(cell), h + r * h_stride + j, n);
        }
    }
}

template <typename T>
static void backward(const float* x0, int64_t x0_stride, const T* wx, int64_t wx_stride, const float* c,
                     const float* c_new, const T* dh, const float* dc_new, float* dz, int64_t dz_stride, float* dc,
                     int64_t rows, int64_t H) {
    const int64_t W = Vec::size();
#pragma omp parallel for if (rows * H > 4096)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < H; j += W) {
            const int64_t n = std::min(W, H - j);
            const Gates z = gates(x0 + r * x0_stride, wx + r * wx_stride, H, j, n);
            const Vec one(1.0f);
            const Vec tc = tanh_(load(c_new + r * H + j, n));
            const Vec gh = dh ? load(dh + r * H + j, n) : Vec(0.0f);
            Vec gc = gh * z.o * (one - tc * tc);
            if (dc_new) gc = gc + load(dc_new + r * H + j, n);
            float* d = dz + r * dz_stride;
            store(gc * z.g * z.i * (one - z.i), d + j, n);                           // i
            store(gc * load(c + r * H + j, n) * z.f * (one - z.f), d + H + j, n);   // f
            store(gc * z.i * (one - z.g * z.g), d + 2 * H + j, n);                  // g
            store(gh * tc * z.o * (one - z.o), d + 3 * H + j, n);                   // o
            store(gc * z.f, dc + r * H + j, n);
        }
    }
}

#endif  // NMT_LSTM_CELL_H
