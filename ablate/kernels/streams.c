/* Hyper-connection stream mixing per token, forward and backward (ablate_plugins.connection's
   join: x <- H_res x + H_post^T f(H_pre x)). Each token's s streams of width d are mixed by its
   own tiny coefficients; torch runs that as batched s x s by s x d products, one small matrix
   pair per token, several times slower than one pass over the streams (benchmarks/RESULTS.md,
   session 13).

   Token b of x is s rows of d (row-major [tokens, s, d]); pre, post: [tokens, s]; res:
   [tokens, s, s] (row t: the weights of new stream t); y, h: [tokens, d].

   mix_in:   h = sum_s pre_s x_s
             dx_s = pre_s dh;  dpre_s = <dh, x_s>
   mix_out:  out_t = sum_s res_ts x_s + post_t y
             dx_s = sum_t res_ts g_t;  dres_ts = <g_t, x_s>;  dpost_t = <g_t, y>;  dy = sum_t post_t g_t

   Tokens [b0, b1) are done by one call; callers split the batch across threads. */
#include <stdint.h>

#define STREAMS(T)                                                                                  \
    static inline T dot_##T(const T *a, const T *b, int64_t d) {                                    \
        T total = 0;                                                                                \
        for (int64_t k = 0; k < d; k++) total += a[k] * b[k];                                       \
        return total;                                                                               \
    }                                                                                               \
                                                                                                    \
    void mix_in_forward_##T(const T *x, const T *pre, T *h, int64_t b0, int64_t b1, int64_t s,      \
                            int64_t d) {                                                            \
        for (int64_t b = b0; b < b1; b++) {                                                         \
            T *hb = h + b * d;                                                                      \
            for (int64_t k = 0; k < d; k++) hb[k] = 0;                                              \
            for (int64_t i = 0; i < s; i++) {                                                       \
                const T w = pre[b * s + i], *xs = x + (b * s + i) * d;                              \
                for (int64_t k = 0; k < d; k++) hb[k] += w * xs[k];                                 \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    void mix_in_backward_##T(const T *x, const T *pre, const T *dh, T *dx, T *dpre, int64_t b0,     \
                             int64_t b1, int64_t s, int64_t d) {                                    \
        for (int64_t b = b0; b < b1; b++) {                                                         \
            const T *g = dh + b * d;                                                                \
            for (int64_t i = 0; i < s; i++) {                                                       \
                const T w = pre[b * s + i], *xs = x + (b * s + i) * d;                              \
                T *dxs = dx + (b * s + i) * d;                                                      \
                for (int64_t k = 0; k < d; k++) dxs[k] = w * g[k];                                  \
                dpre[b * s + i] = dot_##T(g, xs, d);                                                \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    void mix_out_forward_##T(const T *x, const T *res, const T *post, const T *y, T *out,          \
                             int64_t b0, int64_t b1, int64_t s, int64_t d) {                        \
        for (int64_t b = b0; b < b1; b++) {                                                         \
            const T *yb = y + b * d;                                                                \
            for (int64_t t = 0; t < s; t++) {                                                       \
                T *o = out + (b * s + t) * d;                                                       \
                const T p = post[b * s + t];                                                        \
                for (int64_t k = 0; k < d; k++) o[k] = p * yb[k];                                   \
                for (int64_t i = 0; i < s; i++) {                                                   \
                    const T w = res[(b * s + t) * s + i], *xs = x + (b * s + i) * d;                \
                    for (int64_t k = 0; k < d; k++) o[k] += w * xs[k];                              \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    void mix_out_backward_##T(const T *x, const T *res, const T *post, const T *y, const T *grad,  \
                              T *dx, T *dres, T *dpost, T *dy, int64_t b0, int64_t b1, int64_t s,   \
                              int64_t d) {                                                          \
        for (int64_t b = b0; b < b1; b++) {                                                         \
            const T *yb = y + b * d;                                                                \
            T *dyb = dy + b * d;                                                                    \
            for (int64_t k = 0; k < d; k++) dyb[k] = 0;                                             \
            for (int64_t i = 0; i < s; i++) {                                                       \
                T *dxs = dx + (b * s + i) * d;                                                      \
                for (int64_t k = 0; k < d; k++) dxs[k] = 0;                                         \
            }                                                                                       \
            for (int64_t t = 0; t < s; t++) {                                                       \
                const T *g = grad + (b * s + t) * d, p = post[b * s + t];                           \
                dpost[b * s + t] = dot_##T(g, yb, d);                                               \
                for (int64_t k = 0; k < d; k++) dyb[k] += p * g[k];                                 \
                for (int64_t i = 0; i < s; i++) {                                                   \
                    const T *xs = x + (b * s + i) * d, w = res[(b * s + t) * s + i];                \
                    T *dxs = dx + (b * s + i) * d;                                                  \
                    dres[(b * s + t) * s + i] = dot_##T(g, xs, d);                                  \
                    for (int64_t k = 0; k < d; k++) dxs[k] += w * g[k];                             \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

STREAMS(float)
STREAMS(double)
