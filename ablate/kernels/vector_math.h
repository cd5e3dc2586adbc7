/* math.h, plus glibc's vector expf and exp (libmvec) for loops the compiler vectorises. glibc
   declares them only under -ffast-math, whose -ffinite-math-only makes the -INFINITY the
   kernels compare with undefined; the build's narrower flags keep IEEE infinities, so they are
   declared here. They handle infinities and NaN as expf and exp do. */
#include <math.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    !defined(__FAST_MATH__)
__attribute__((__simd__("notinbranch"))) float expf(float);
__attribute__((__simd__("notinbranch"))) double exp(double);
#endif
