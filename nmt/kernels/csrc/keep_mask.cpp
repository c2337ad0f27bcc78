// Dropout's keep mask from torch's random words (nmt.dropout.keep_mask): each int64 word (63 random bits) gives
// three 16-bit uniforms, the int16s at bits 0-15, 16-31 and 32-47 (on a little-endian machine, the int16 view's
// fields 0-2 of the word); element i is field i % 3 of word i / 3, kept (`scale`) where it is >= `threshold`,
// else 0. The same numbers as the torch operations it replaces, in one pass: those took ~4 ns an element on the
// AVX2 EPYC (a strided int16 copy, a compare, a cast, a scale), most of a decoder step's dropout.
//
// With AVX2 (also set where Inductor builds for AVX-512), four words at a time: a byte shuffle drops each word's
// top field and a dword permutation joins the two halves, giving 12 int16s in order; they are widened, compared
// and turned into 0 or `scale` 8 and 4 at a time. Elsewhere, and for the last words, a plain loop.
// Built by Inductor's C++ toolchain (torch's flags), which calls `kernel`.
#include <torch/csrc/inductor/cpp_prefix.h>

#include <algorithm>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static void plain(const int16_t* u, int64_t words, int64_t n, int16_t t, float scale, float* o) {
    for (int64_t j = 0; j < words; ++j)
        for (int64_t f = 0; f < 3 && 3 * j + f < n; ++f) o[3 * j + f] = u[4 * j + f] >= t ? scale : 0.0f;
}

// n elements from the words at u (4 int16 each) into o.
static void run(const int16_t* u, int64_t n, int16_t t, float scale, float* o) {
    int64_t j = 0;  // words done
#if defined(__AVX2__)
    // within each 128-bit half (two words, 8 int16): fields 0-2 of both words into its first 12 bytes
    const __m256i drop = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, -1, -1, -1, -1,
                                          0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);  // the halves' 3 dwords each, side by side
    const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(t) - 1);
    const __m256 kept = _mm256_set1_ps(scale);
    for (; 3 * (j + 4) <= n; j += 4) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 4 * j));
        const __m256i f = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(w, drop), join);  // 12 int16 in order
        const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(f));                 // fields 0-7
        const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(f, 1));            // 8-11 (and 4 unused)
        const __m256 m_lo = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(lo, below)), kept);
        const __m256 m_hi = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(hi, below)), kept);
        _mm256_storeu_ps(o + 3 * j, m_lo);
        _mm_storeu_ps(o + 3 * j + 8, _mm256_castps256_ps128(m_hi));
    }
#endif
    plain(u + 4 * j, (n - 3 * j + 2) / 3, n - 3 * j, t, scale, o + 3 * j);
}

extern "C" void kernel(uintptr_t words, int64_t n, int64_t threshold, float scale, uintptr_t out) {
    const int16_t* u = reinterpret_cast<const int16_t*>(words);
    float* o = reinterpret_cast<float*>(out);
    const int16_t t = static_cast<int16_t>(threshold);
    constexpr int64_t CHUNK = 3 * 8192;  // elements a thread takes at a time: whole words (and whole blocks of 4)
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (n > (1 << 18))
    for (int64_t c = 0; c < chunks; ++c)
        run(u + 4 * (c * CHUNK / 3), std::min(CHUNK, n - c * CHUNK), t, scale, o + c * CHUNK);
}
