/* Inverted dropout, out[i] = lane(key, i) >= threshold ? x[i] * scale : 0, over entries [i0, i1)
   of a contiguous tensor (callers split the range across threads). The same call on the
   gradient is the backward pass. One pass, where torch's form draws a mask, compares, converts
   and multiplies (benchmarks/RESULTS.md, session 12). bfloat16 is widened to float, multiplied
   and rounded to nearest even. */
#include "lanes.h"

void dropout_float32(const float *x, float *out, int64_t i0, int64_t i1, uint64_t key, int32_t threshold,
                     float scale) {
    int16_t lanes[LANE_BLOCK];
    for (int64_t at = i0, n; at < i1; at += n) {
        n = next_lanes(key, at, i1, lanes);
        for (int64_t j = 0; j < n; j++) out[at + j] = lanes[j] >= threshold ? x[at + j] * scale : 0.0f;
    }
}

static inline float widen(uint16_t v) {
    union { uint32_t u; float f; } c = {.u = (uint32_t)v << 16};
    return c.f;
}

static inline uint16_t round_bf16(float f) {
    union { uint32_t u; float f; } c = {.f = f};
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40);  /* NaN stays NaN */
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

void dropout_bfloat16(const uint16_t *x, uint16_t *out, int64_t i0, int64_t i1, uint64_t key,
                      int32_t threshold, float scale) {
    int16_t lanes[LANE_BLOCK];
    for (int64_t at = i0, n; at < i1; at += n) {
        n = next_lanes(key, at, i1, lanes);
        for (int64_t j = 0; j < n; j++)
            out[at + j] = lanes[j] >= threshold ? round_bf16(widen(x[at + j]) * scale) : 0;
    }
}
