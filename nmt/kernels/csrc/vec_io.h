// torch's float vector and loads / stores of fp32 or bf16 lanes, shared by the kernels' headers (lstm_cell.h,
// additive_step.h). Lanes from n on read as 0 and are not written.
#ifndef NMT_VEC_IO_H
#define NMT_VEC_IO_H

using Vec = at::vec::Vectorized<float>;

static inline Vec load(const float* p, int64_t n) { return Vec::loadu(p, n); }
static inline Vec load(const c10::BFloat16* p, int64_t n) {
    return at::vec::convert<float>(at::vec::Vectorized<c10::BFloat16>::loadu(p, n));
}
static inline void store(Vec x, float* p, int64_t n) { x.store(p, n); }
static inline void store(Vec x, c10::BFloat16* p, int64_t n) {
    float tmp[Vec::size()];
    x.store(tmp, n);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<c10::BFloat16>(tmp[i]);
}

#endif  // NMT_VEC_IO_H
