// Products with a weight packed in panels (step_gemm.cpp, encoder_lstm.cpp):
//
//   pack     B (K, N), its element (k, j) at w[k * sk + j * sj], into panels of NR = 2 vectors of columns, each
//            panel K rows of NR floats, the last one padded with zeros: for x W^T (W (N, K): sk 1, sj K; whole
//            W x W blocks transposed in registers) or for g W (W (K, N): sk N, sj 1; a vector of a row at a time)
//   product  C (n, N) = A (n, K) B (or C += A B: accumulate), A's rows lda apart, C's ldc apart
//
// Each thread takes a range of panels, and for every KC rows of a panel (16 KB, in the L1 cache) runs through MC
// of A's rows (in the L2 cache; a step's rows are one such pass), MR at a time, with MR x NR sums in registers.
// Both split their work between OpenMP's threads; inside another parallel region they run on the calling thread.
#ifndef NMT_PANELS_H
#define NMT_PANELS_H
#include <algorithm>

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();
constexpr int64_t NR = 2 * W;  // a panel's columns
constexpr int64_t MR = 6;      // rows a register block: 2 x MR sums, 2 of B and one of A (12 + 3 of 16 on AVX2)
constexpr int64_t KC = 256;    // a panel's rows that stay in the L1 cache: KC x NR floats (16 KB on AVX2)
constexpr int64_t MC = 144;    // A's rows a pass over the panels takes: MC x KC floats (144 KB) in the L2 cache

static void pack(const float* w, int64_t sk, int64_t sj, int64_t K, int64_t N, float* out) {
    const int64_t panels = (N + NR - 1) / NR;
#pragma omp parallel for
    for (int64_t p = 0; p < panels; ++p) {
        for (int64_t k0 = 0; k0 < K; k0 += 64) {  // 64 rows of the panel (4 KB on AVX2) filled column by column
            const int64_t k1 = std::min(K, k0 + 64);
            float* dst = out + p * K * NR;
            if (sj == 1) {  // a row of the panel is contiguous in w: row by row
                const int64_t cols = std::min(NR, N - p * NR);
                for (int64_t k = k0; k < k1; ++k) {
                    const float* src = w + k * sk + p * NR;
                    Vec::loadu(src, std::min(W, cols)).store(dst + k * NR);  // loadu(p, n): zeros past n
                    Vec::loadu(src + W, std::max<int64_t>(cols - W, 0)).store(dst + k * NR + W);
                }
                continue;
            }
            int64_t k = k0;
            if (sk == 1 && p * NR + NR <= N)  // a column of the panel is contiguous in w: W x W blocks transposed
                for (; k + W <= k1; k += W)
                    for (int64_t c = 0; c < NR; c += W)
                        at::vec::transpose_mxn<float, W, W>(w + k + (p * NR + c) * sj, sj, dst + k * NR + c, NR);
            for (int64_t c = 0; c < NR; ++c) {  // the rest element by element
                const int64_t j = p * NR + c;
                for (int64_t r = k; r < k1; ++r) dst[r * NR + c] = j < N ? w[r * sk + j * sj] : 0.0f;
            }
        }
    }
}

// One row of the block: its two sums into C (onto C with `add`), the first `cols` columns.
static inline void put(Vec s0, Vec s1, float* out, bool add, int64_t cols) {
    if (cols == NR) {
        (add ? s0 + Vec::loadu(out) : s0).store(out);
        (add ? s1 + Vec::loadu(out + W) : s1).store(out + W);
        return;
    }
    float tmp[NR];
    s0.store(tmp);
    s1.store(tmp + W);
    for (int64_t j = 0; j < cols; ++j) out[j] = add ? out[j] + tmp[j] : tmp[j];
}

// rows (<= MR) x NR of C from rows of A (lda apart) times kc rows of a panel; `add`: onto C; `cols`: C's columns
// kept. The sums are named variables, not an array, so that the compiler keeps all of them in registers.
#define NMT_ROW(i)                                                 \
    if constexpr (rows > i) {                                      \
        const Vec x(a[i * lda + k]);                               \
        s##i##0 = at::vec::fmadd(x, b0, s##i##0);                  \
        s##i##1 = at::vec::fmadd(x, b1, s##i##1);                  \
    }
#define NMT_PUT(i) \
    if constexpr (rows > i) put(s##i##0, s##i##1, c + i * ldc, add, cols);

template <int64_t rows>
static inline void block(const float* a, int64_t lda, const float* b, int64_t kc, float* c, int64_t ldc, bool add,
                         int64_t cols) {
    Vec s00(0.0f), s01(0.0f), s10(0.0f), s11(0.0f), s20(0.0f), s21(0.0f);
    Vec s30(0.0f), s31(0.0f), s40(0.0f), s41(0.0f), s50(0.0f), s51(0.0f);
    for (int64_t k = 0; k < kc; ++k) {
        const Vec b0 = Vec::loadu(b + k * NR), b1 = Vec::loadu(b + k * NR + W);
        NMT_ROW(0) NMT_ROW(1) NMT_ROW(2) NMT_ROW(3) NMT_ROW(4) NMT_ROW(5)
    }
    NMT_PUT(0) NMT_PUT(1) NMT_PUT(2) NMT_PUT(3) NMT_PUT(4) NMT_PUT(5)
}
#undef NMT_ROW
#undef NMT_PUT

static void product(const float* a, int64_t lda, const float* packed, int64_t n, int64_t K, int64_t N, float* c,
                    int64_t ldc, bool accumulate = false) {
    const int64_t panels = (N + NR - 1) / NR;
    for (int64_t i0 = 0; i0 < n; i0 += MC) {  // MC rows of A at a time: KC columns of them stay in the L2 cache
        const int64_t m = std::min(MC, n - i0);
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t cols = std::min(NR, N - p * NR);
            const float* panel = packed + p * K * NR;
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                const int64_t kc = std::min(KC, K - k0);
                const bool add = accumulate || k0 > 0;
                const float* b = panel + k0 * NR;
                const float* ai = a + i0 * lda + k0;
                float* ci = c + i0 * ldc + p * NR;
                int64_t i = 0;
                for (; i + MR <= m; i += MR) block<MR>(ai + i * lda, lda, b, kc, ci + i * ldc, ldc, add, cols);
                ai += i * lda;
                ci += i * ldc;
                switch (m - i) {
                    case 5: block<5>(ai, lda, b, kc, ci, ldc, add, cols); break;
                    case 4: block<4>(ai, lda, b, kc, ci, ldc, add, cols); break;
                    case 3: block<3>(ai, lda, b, kc, ci, ldc, add, cols); break;
                    case 2: block<2>(ai, lda, b, kc, ci, ldc, add, cols); break;
                    case 1: block<1>(ai, lda, b, kc, ci, ldc, add, cols); break;
                    default: break;
                }
            }
        }
    }
}

#endif  // NMT_PANELS_H
