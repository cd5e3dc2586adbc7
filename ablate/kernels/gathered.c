/* Dot products of rows with gathered table rows, forward and backward:
       out[t, j] = <h[t], table[index[t, j]]>
   (a sampled loss's per-position negatives: t positions, k negatives each). torch either
   gathers the [t, k, d] vectors (t k d values moved, as many scattered back) or scores every
   item ([t, m] logits at m / k times the work); the table fits in cache, so reading its rows in
   place does the t k d multiply-adds and nothing more (benchmarks/RESULTS.md, session 13).

   grad_h[t]       = sum_j g[t, j] table[index[t, j]]
   grad_table[r]   = sum over (t, j) with index[t, j] = r, in (t, j) order, of g[t, j] h[t]
   A call of the table's gradient owns rows [r0, r1) and scans every (t, j): the sums' order does
   not depend on how the rows are split across threads. */
#include <stdint.h>

#define GATHERED(T)                                                                                 \
    void gathered_dot_forward_##T(const T *h, const T *table, const int64_t *index, T *out,         \
                                  int64_t t0, int64_t t1, int64_t k, int64_t d) {                   \
        for (int64_t t = t0; t < t1; t++) {                                                         \
            const T *ht = h + t * d;                                                                \
            for (int64_t j = 0; j < k; j++) {                                                       \
                const T *row = table + index[t * k + j] * d;                                        \
                T total = 0;                                                                        \
                for (int64_t e = 0; e < d; e++) total += ht[e] * row[e];                            \
                out[t * k + j] = total;                                                             \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    void gathered_dot_backward_h_##T(const T *grad, const T *table, const int64_t *index,           \
                                     T *grad_h, int64_t t0, int64_t t1, int64_t k, int64_t d) {     \
        for (int64_t t = t0; t < t1; t++) {                                                         \
            T *gt = grad_h + t * d;                                                                 \
            for (int64_t e = 0; e < d; e++) gt[e] = 0;                                              \
            for (int64_t j = 0; j < k; j++) {                                                       \
                const T *row = table + index[t * k + j] * d, g = grad[t * k + j];                   \
                for (int64_t e = 0; e < d; e++) gt[e] += g * row[e];                                \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    void gathered_dot_backward_table_##T(const T *grad, const T *h, const int64_t *index,           \
                                         T *grad_table, int64_t r0, int64_t r1, int64_t positions,  \
                                         int64_t k, int64_t d) {                                    \
        for (int64_t i = r0 * d; i < r1 * d; i++) grad_table[i] = 0;                                \
        for (int64_t t = 0; t < positions; t++) {                                                   \
            const T *ht = h + t * d;                                                                \
            for (int64_t j = 0; j < k; j++) {                                                       \
                const int64_t r = index[t * k + j];                                                 \
                if (r < r0 || r >= r1) continue;                                                    \
                T *row = grad_table + r * d;                                                        \
                const T g = grad[t * k + j];                                                        \
                for (int64_t e = 0; e < d; e++) row[e] += g * ht[e];                                \
            }                                                                                       \
        }                                                                                           \
    }

GATHERED(float)
GATHERED(double)
