// The label-smoothed cross-entropy of a piece of logits and its gradient, in place, one row at a time
// (nmt/kernels/smoothed_xent.py); rows are spread over the OpenMP threads torch runs with. For a row x (V) of the output
// layer's products, to which the layer's bias is added here (a pass fewer than addmm's), with target y and
// lse = logsumexp(x):
//
//   loss = (1 - eps) (lse - x_y) + eps (lse - mean(x))
//   x   <- softmax(x) - eps / V - (1 - eps) onehot(y)     (the loss's gradient with respect to x)
//
// in three passes over the row while it is in cache: its max and sum, exp(x - max) and its sum, the scaling,
// which also adds the gradient into the thread's column sums where the bias's gradient is asked for (a pass over
// the piece fewer than the caller's sum: 16 MB a piece of the multi30k_deen preset). The threads' sums are added
// into it after the rows, in the threads' order: the same sums every run with the same threads.
// A row whose target is `pad` gets loss 0 and a zero gradient. exp is torch's fast vector exp (at most 20
// ulp), the tail of a row (V not a multiple of the vector width) std::exp. Everything fp32, contiguous.
// Built by Inductor's C++ toolchain (torch's vector ISA and flags), which calls the entry `kernel`.
#include <torch/csrc/inductor/cpp_prefix.h>
// torch's vector types, also where Inductor found no vector ISA (the prefix then leaves them out): scalar then
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using Vec = at::vec::Vectorized<float>;

// acc: the thread's column sums (V), or null
static float row(float* x, const float* bias, int64_t y, int64_t V, float eps, float* acc) {
    const int64_t W = Vec::size();
    const int64_t full = V - V % W;
    Vec top(-std::numeric_limits<float>::infinity()), sum(0.0f);
    for (int64_t j = 0; j < full; j += W) {  // the bias added in this first pass
        const Vec a = Vec::loadu(x + j) + Vec::loadu(bias + j);
        a.store(x + j);
        top = at::vec::maximum(top, a);
        sum = sum + a;
    }
    float mx = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, top);
    float total = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum);
    for (int64_t j = full; j < V; ++j) {
        x[j] += bias[j];
        mx = std::max(mx, x[j]);
        total += x[j];
    }
    const float picked = x[y];
    Vec es(0.0f);
    for (int64_t j = 0; j < full; j += W) {
        const Vec e = (Vec::loadu(x + j) - Vec(mx)).exp_u20();
        e.store(x + j);
        es = es + e;
    }
    float e_sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, es);
    for (int64_t j = full; j < V; ++j) {
        x[j] = std::exp(x[j] - mx);
        e_sum += x[j];
    }
    const float lse = mx + std::log(e_sum), inv = 1.0f / e_sum, smooth = eps / static_cast<float>(V);
    for (int64_t j = 0; j < full; j += W) {
        const Vec g = Vec::loadu(x + j) * Vec(inv) - Vec(smooth);
        g.store(x + j);
        if (acc) (Vec::loadu(acc + j) + g).store(acc + j);
    }
    for (int64_t j = full; j < V; ++j) {
        x[j] = x[j] * inv - smooth;
        if (acc) acc[j] += x[j];
    }
    x[y] -= 1.0f - eps;
    if (acc) acc[y] -= 1.0f - eps;
    return (1.0f - eps) * (lse - picked) + eps * (lse - total / static_cast<float>(V));
}

// logits (rows, V) fp32 without the bias (V,), overwritten by the loss's gradient; target (rows,) int64; loss
// (rows,) fp32, written; bias_grad (V,) fp32: the gradient's column sums added into it (0: not asked for).
extern "C" void kernel(uintptr_t logits, uintptr_t bias, uintptr_t target, uintptr_t loss, int64_t rows, int64_t V,
                       float eps, int64_t pad, uintptr_t bias_grad) {
    float* z = reinterpret_cast<float*>(logits);
    const float* b = reinterpret_cast<const float*>(bias);
    const int64_t* t = reinterpret_cast<const int64_t*>(target);
    float* out = reinterpret_cast<float*>(loss);
    float* gb = reinterpret_cast<float*>(bias_grad);
    const int64_t threads = omp_get_max_threads();
    std::vector<float> sums(gb ? threads * V : 0, 0.0f);  // each thread's column sums
#pragma omp parallel num_threads(threads)
    {
        float* acc = gb ? sums.data() + omp_get_thread_num() * V : nullptr;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float* x = z + r * V;
            if (t[r] == pad) {
                std::fill(x, x + V, 0.0f);
                out[r] = 0.0f;
            } else {
                out[r] = row(x, b, t[r], V, eps, acc);
            }
        }
        if (gb) {
#pragma omp for schedule(static)
            for (int64_t j = 0; j < V; ++j) {
                float s = gb[j];
                for (int64_t k = 0; k < threads; ++k) s += sums[k * V + j];
                gb[j] = s;
            }
        }
    }
}
