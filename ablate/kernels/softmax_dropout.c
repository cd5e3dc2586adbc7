/* Causal softmax with dropout over attention logits, forward and backward, one pass per row.

   A matrix is `rows` query rows of `m` logits (row-major, contiguous). Row i of a matrix sees the
   keys j < limit(i) = min(m, offset + i + 1) when causal, all m keys otherwise; the rest of the
   row is written as 0. Dropout keeps entry j of row i of matrix b when lane(key, base +
   b * matrix_stride + i * row_stride + j) >= threshold (lanes.h: the draws of the whole
   [matrices, rows, keys] probabilities, so query chunks draw what one call would) and scales it
   by `scale`.

   forward:  y = softmax(x over the row's keys);  out = keep ? y * scale : 0
   backward: d = keep ? g * scale : 0;  gx = y * (d - sum(d * y))

   Matrices [m0, m1) are done by one call; callers split the batch across threads. */
#include "vector_math.h"

#include "lanes.h"

static inline int64_t row_limit(int64_t i, int64_t m, int64_t offset, int causal) {
    if (!causal) return m;
    int64_t limit = offset + i + 1;
    return limit < m ? limit : m;
}

void softmax_dropout_forward(const float *x, float *y, float *out, int64_t m0, int64_t m1,
                             int64_t rows, int64_t m, int64_t offset, int causal, uint64_t key,
                             int64_t base, int64_t matrix_stride, int64_t row_stride,
                             int32_t threshold, float scale) {
    int16_t lanes[LANE_BLOCK];
    for (int64_t b = m0; b < m1; b++) {
        for (int64_t i = 0; i < rows; i++) {
            const int64_t at = (b * rows + i) * m;
            const float *xr = x + at;
            float *yr = y + at, *outr = out + at;
            const int64_t lane0 = base + b * matrix_stride + i * row_stride;
            const int64_t limit = row_limit(i, m, offset, causal);
            float top = -INFINITY;
            /* a max reduction: vectorised without -ffinite-math-only */
#pragma omp simd reduction(max : top)
            for (int64_t j = 0; j < limit; j++) top = xr[j] > top ? xr[j] : top;
            float total = 0.0f;
            for (int64_t j = 0; j < limit; j++) {
                const float e = expf(xr[j] - top);
                yr[j] = e;
                total += e;
            }
            const float inv = 1.0f / total, kept = scale / total;
            for (int64_t j0 = 0, n; j0 < limit; j0 += n) {
                n = next_lanes(key, lane0 + j0, lane0 + limit, lanes);
                for (int64_t j = 0; j < n; j++) {
                    outr[j0 + j] = lanes[j] >= threshold ? yr[j0 + j] * kept : 0.0f;
                    yr[j0 + j] *= inv;
                }
            }
            for (int64_t j = limit; j < m; j++) {
                yr[j] = 0.0f;
                outr[j] = 0.0f;
            }
        }
    }
}

void softmax_dropout_backward(const float *g, const float *y, float *gx, int64_t m0, int64_t m1,
                              int64_t rows, int64_t m, int64_t offset, int causal, uint64_t key,
                              int64_t base, int64_t matrix_stride, int64_t row_stride,
                              int32_t threshold, float scale) {
    int16_t lanes[LANE_BLOCK];
    for (int64_t b = m0; b < m1; b++) {
        for (int64_t i = 0; i < rows; i++) {
            const int64_t at = (b * rows + i) * m;
            const float *gr = g + at, *yr = y + at;
            float *gxr = gx + at;
            const int64_t lane0 = base + b * matrix_stride + i * row_stride;
            const int64_t limit = row_limit(i, m, offset, causal);
            float dot = 0.0f;
            for (int64_t j0 = 0, n; j0 < limit; j0 += n) {
                n = next_lanes(key, lane0 + j0, lane0 + limit, lanes);
                for (int64_t j = 0; j < n; j++) {
                    const float d = lanes[j] >= threshold ? gr[j0 + j] * scale : 0.0f;
                    gxr[j0 + j] = d;
                    dot += d * yr[j0 + j];
                }
            }
            for (int64_t j = 0; j < limit; j++) gxr[j] = yr[j] * (gxr[j] - dot);
            for (int64_t j = limit; j < m; j++) gxr[j] = 0.0f;
        }
    }
}
