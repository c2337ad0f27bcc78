// The k most likely outputs of each row of a decoder step's output layer and their log-probabilities, in one
// call (nmt/kernels/top_logprobs.py); rows are spread over the OpenMP threads torch runs with. For a row x (V)
// of the layer's products, to which the layer's bias is added here (so the products are a plain matmul):
//
//   lse = logsumexp(x)         over the whole row (the full softmax's normaliser)
//   top = the k largest x_j    with j not one of the two skipped ids (padding and BOS: never outputs)
//   out = top - lse, and the ids j, largest first; of equal values the lower id first
//
// in two passes over the row while it is in cache: the bias, the max and the running top k (a vector of
// values is looked at one by one only where one of them beats the k-th best so far), then sum exp(x - max).
// exp is torch's fast vector exp (at most 20 ulp), the tail of a row (V not a multiple of the vector width)
// std::exp. Everything fp32 but the ids (int64), contiguous. Built by Inductor's C++ toolchain (torch's vector
// ISA and flags), which calls the entry `kernel`.
#include <torch/csrc/inductor/cpp_prefix.h>
// torch's vector types, also where Inductor found no vector ISA (the prefix then leaves them out): scalar then
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>

using Vec = at::vec::Vectorized<float>;

// The running top k of a row, largest first: vals[0..n) and their ids.
struct Top {
    float* vals;
    int64_t* ids;
    int64_t n, k;
    float floor() const { return n < k ? -std::numeric_limits<float>::infinity() : vals[k - 1]; }
    void offer(float x, int64_t j) {  // ids come in increasing order: an equal value stays behind
        if (n == k && !(x > vals[k - 1])) return;
        int64_t i = n < k ? n++ : k - 1;
        while (i > 0 && x > vals[i - 1]) {
            vals[i] = vals[i - 1];
            ids[i] = ids[i - 1];
            --i;
        }
        vals[i] = x;
        ids[i] = j;
    }
};

static void row(float* x, const float* bias, float* out, int64_t* ids, int64_t V, int64_t k, int64_t skip_a,
                int64_t skip_b) {
    const int64_t W = Vec::size();
    const int64_t full = V - V % W;
    const int all = (1 << W) - 1;
    Top top{out, ids, 0, k};
    Vec mx(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < full; j += W) {
        const Vec a = bias ? Vec::loadu(x + j) + Vec::loadu(bias + j) : Vec::loadu(x + j);
        a.store(x + j);
        mx = at::vec::maximum(mx, a);
        const float thr = top.floor();
        if ((a > Vec(thr)).zero_mask() != all) {  // some value beats the k-th best so far
            for (int64_t l = 0; l < W; ++l) {
                if (j + l != skip_a && j + l != skip_b) top.offer(x[j + l], j + l);
            }
        }
    }
    float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, mx);
    for (int64_t j = full; j < V; ++j) {
        if (bias) x[j] += bias[j];
        m = std::max(m, x[j]);
        if (j != skip_a && j != skip_b) top.offer(x[j], j);
    }
    Vec es(0.0f);
    for (int64_t j = 0; j < full; j += W) es = es + (Vec::loadu(x + j) - Vec(m)).exp_u20();
    float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, es);
    for (int64_t j = full; j < V; ++j) sum += std::exp(x[j] - m);
    const float lse = m + std::log(sum);
    for (int64_t i = 0; i < top.n; ++i) out[i] -= lse;
}

// logits (rows, V) fp32 without the bias (V,) (0: none), overwritten by the logits with it; values (rows, k)
// fp32 and ids (rows, k) int64, written. k <= V - 2.
extern "C" void kernel(uintptr_t logits, uintptr_t bias, uintptr_t values, uintptr_t ids, int64_t rows, int64_t V,
                       int64_t k, int64_t skip_a, int64_t skip_b) {
    float* z = reinterpret_cast<float*>(logits);
    const float* b = reinterpret_cast<const float*>(bias);
    float* v = reinterpret_cast<float*>(values);
    int64_t* t = reinterpret_cast<int64_t*>(ids);
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) row(z + r * V, b, v + r * k, t + r * k, V, k, skip_a, skip_b);
}
