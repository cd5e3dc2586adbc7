/* Sinkhorn-Knopp normalisation of many small s x s matrices, forward and backward, one matrix
   at a time in cache (mHC's H_res: one 4 x 4 matrix per token and connection). torch's form
   makes four passes over the whole [tokens, s, s] tensor per iteration and as many again
   backward: 20 iterations cost ~160 tiny ops forward and ~400 in autograd per connection
   (benchmarks/RESULTS.md, session 13).

   forward, per matrix:  m = exp(x - max x);  iters x { m /= column sums;  m /= row sums }
   backward: the chain rule through each normalisation, last first. For m' = m / c (c the sums
   of m along one axis, broadcast along the other), dL/dm = (g' - sum(g' * m') along that axis)
   / c; for the exponential, dL/dx = g * m0 (the max cancels: the output does not depend on a
   constant shift). The backward pass recomputes the forward iterates instead of storing them
   for every token.

   Matrices go WIDTH at a time, entry-major ([s * s][WIDTH]), so every loop over the block is a
   vector loop across matrices (s is 4 in mHC: rows are too short to vectorise along).

   Matrices [m0, m1) are done by one call; callers split the batch across threads. */
/* The build's flags leave out -ffinite-math-only (the -INFINITY of softmax_dropout.c); this file
   has no infinities (exponentials of finite logits less their maximum), and with it and
   -funsafe-math-optimizations GCC divides vectors of floats by a reciprocal estimate and one
   Newton step, as these kernels' float numbers have been made (exact division differs by an ulp). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("unsafe-math-optimizations", "finite-math-only")
#endif
#include "vector_math.h"
#include <stdint.h>
#include <stdlib.h>

#define WIDTH 16

#define SINKHORN(T, EXP)                                                                            \
    /* block[e][w] = x of matrix m0 + w, entry e; matrices past m1 repeat the last one */           \
    static void load_##T(const T *x, T *block, int64_t b, int64_t m1, int64_t size) {               \
        for (int64_t w = 0; w < WIDTH; w++) {                                                       \
            const T *src = x + (b + w < m1 ? b + w : m1 - 1) * size;                                \
            for (int64_t e = 0; e < size; e++) block[e * WIDTH + w] = src[e];                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    /* each column (columns) or row of every matrix of the block, divided by its sum; entry      \
       (c, a) of the block's matrices is at (c s + a) WIDTH, so a column's entries are s WIDTH      \
       apart and a row's WIDTH apart */                                                             \
    static void normalise_##T(T *m, int64_t s, int columns) {                                       \
        const int64_t along = (columns ? s : 1) * WIDTH, across = (columns ? 1 : s) * WIDTH;        \
        for (int64_t a = 0; a < s; a++) {                                                           \
            T *first = m + a * across;                                                              \
            T inverse[WIDTH];                                                                       \
            for (int64_t w = 0; w < WIDTH; w++) inverse[w] = first[w];                              \
            for (int64_t c = 1; c < s; c++)                                                         \
                for (int64_t w = 0; w < WIDTH; w++) inverse[w] += first[c * along + w];             \
            for (int64_t w = 0; w < WIDTH; w++) inverse[w] = 1 / inverse[w];                        \
            for (int64_t c = 0; c < s; c++)                                                         \
                for (int64_t w = 0; w < WIDTH; w++) first[c * along + w] *= inverse[w];             \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    /* iterates[0] = exp(x - max) (in place of the block x); iterates[k] = iterates[k - 1]          \
       normalised, odd k along columns; with keep_all 0 all k share iterates[0] */                  \
    static void iterate_##T(T *iterates, int64_t s, int64_t iters, int keep_all) {                  \
        const int64_t size = s * s;                                                                 \
        T top[WIDTH];                                                                               \
        for (int64_t w = 0; w < WIDTH; w++) top[w] = iterates[w];                                   \
        for (int64_t e = 1; e < size; e++)                                                          \
            for (int64_t w = 0; w < WIDTH; w++)                                                     \
                top[w] = iterates[e * WIDTH + w] > top[w] ? iterates[e * WIDTH + w] : top[w];       \
        for (int64_t e = 0; e < size; e++)                                                          \
            for (int64_t w = 0; w < WIDTH; w++)                                                     \
                iterates[e * WIDTH + w] = EXP(iterates[e * WIDTH + w] - top[w]);                    \
        T *m = iterates;                                                                            \
        for (int64_t k = 1; k <= 2 * iters; k++) {                                                  \
            if (keep_all) {                                                                         \
                for (int64_t i = 0; i < size * WIDTH; i++) m[size * WIDTH + i] = m[i];              \
                m += size * WIDTH;                                                                  \
            }                                                                                       \
            normalise_##T(m, s, k % 2);                                                             \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    static void store_##T(const T *block, T *out, int64_t b, int64_t m1, int64_t size) {            \
        for (int64_t w = 0; w < WIDTH && b + w < m1; w++)                                           \
            for (int64_t e = 0; e < size; e++) out[(b + w) * size + e] = block[e * WIDTH + w];      \
    }                                                                                               \
                                                                                                    \
    void sinkhorn_forward_##T(const T *x, T *out, int64_t m0, int64_t m1, int64_t s,                \
                              int64_t iters) {                                                      \
        const int64_t size = s * s;                                                                 \
        T *block = malloc(sizeof(T) * (size_t)(size * WIDTH));                                      \
        if (block == NULL) abort();                                                                 \
        for (int64_t b = m0; b < m1; b += WIDTH) {                                                  \
            load_##T(x, block, b, m1, size);                                                        \
            iterate_##T(block, s, iters, 0);                                                        \
            store_##T(block, out, b, m1, size);                                                     \
        }                                                                                           \
        free(block);                                                                                \
    }                                                                                               \
                                                                                                    \
    void sinkhorn_backward_##T(const T *x, const T *grad, T *grad_x, int64_t m0, int64_t m1,        \
                               int64_t s, int64_t iters) {                                          \
        const int64_t size = s * s, stride = size * WIDTH;                                          \
        T *work = malloc(sizeof(T) * (size_t)((2 * iters + 2) * stride));                           \
        if (work == NULL) abort();                                                                  \
        T *g = work + (2 * iters + 1) * stride;                                                     \
        for (int64_t b = m0; b < m1; b += WIDTH) {                                                  \
            load_##T(x, work, b, m1, size);                                                         \
            iterate_##T(work, s, iters, 1);                                                         \
            load_##T(grad, g, b, m1, size);                                                         \
            for (int64_t k = 2 * iters; k >= 1; k--) {                                              \
                const T *after = work + k * stride, *before = work + (k - 1) * stride;              \
                const int columns = k % 2;                                                          \
                const int64_t along = (columns ? s : 1) * WIDTH, across = (columns ? 1 : s) * WIDTH; \
                for (int64_t a = 0; a < s; a++) {                                                   \
                    const int64_t first = a * across;                                               \
                    T dot[WIDTH] = {0}, inverse[WIDTH] = {0};                                       \
                    for (int64_t c = 0; c < s; c++) {                                               \
                        const int64_t e = first + c * along;                                        \
                        for (int64_t w = 0; w < WIDTH; w++) {                                       \
                            dot[w] += g[e + w] * after[e + w];                                      \
                            inverse[w] += before[e + w];                                            \
                        }                                                                           \
                    }                                                                               \
                    for (int64_t w = 0; w < WIDTH; w++) inverse[w] = 1 / inverse[w];                \
                    for (int64_t c = 0; c < s; c++) {                                               \
                        const int64_t e = first + c * along;                                        \
                        for (int64_t w = 0; w < WIDTH; w++)                                         \
                            g[e + w] = (g[e + w] - dot[w]) * inverse[w];                            \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
            for (int64_t i = 0; i < stride; i++) g[i] *= work[i];                                   \
            store_##T(g, grad_x, b, m1, size);                                                      \
        }                                                                                           \
        free(work);                                                                                 \
    }

SINKHORN(float, expf)
SINKHORN(double, exp)
