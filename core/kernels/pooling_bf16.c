/* bf16 max and average pooling: each (image, channel) plane, and its
 * gradient, is widened into the thread's f32 scratch, pooled by the f32
 * plane kernels (pooling.c) and rounded once. Widening is exact and a max
 * picks one of its inputs, so the bits are those of casting around the
 * f32 kernels, which is what the graph did before: three more passes over
 * the tensor, each a kernel of its own. Max pooling over 2x2 windows at
 * stride 2 (every CNN's) skips the f32 copies: see max2x2_fwd. */
#include "kernels.h"
#include "pool.h"
#include "cx_bf16.h"

#include <stdint.h>
#include <string.h>

/* one lane: the input plane widened, dy's plane widened, the f32 result
 * (an output plane forward, an input plane backward; an output plane may
 * be the larger: stride 1 with padding) */
static int64_t lane_floats(const cx_pool_geom *g)
{
    int64_t in = g->h * g->w, out = g->oh * g->ow;
    return (in + out + (in > out ? in : out) + 15) / 16 * 16;
}

size_t cx_pool2d_bf16_scratch_bytes(const cx_pool_geom *g)
{
    int64_t lanes = g->n * g->c, threads = cx_pool_threads();
    if (lanes > threads) lanes = threads;
    return (size_t)(lanes * lane_floats(g)) * sizeof(float) + 64;
}

size_t cx_pool2d_bf16_min_scratch_bytes(const cx_pool_geom *g)
{
    return (size_t)lane_floats(g) * sizeof(float) + 64;
}

typedef struct {
    int kind;   /* CX_POOL_BF16_* */
    const cx_pool_geom *g;
    bool max_2x2;   /* a max pool of 2x2 windows at stride 2: max2x2_*, asked once, not per plane */
    uint16_t *out;
    const uint16_t *x, *dy, *posmask;
    float *scratch;
    int64_t lanes;
    cx_claims claims;   /* runs of planes */
    int64_t run;        /* planes a run */
} bf16_job;

/* 2x2 windows at stride 2 without padding, on the bf16 bits in place: a
 * pair of columns (2q, 2q + 1) of a row is one 32-bit word with the even
 * column in its low half, so each half widens with a shift or a mask, with
 * no shuffles and no f32 copy of the plane (through the copies the bf16
 * pools took 1.4x the f32 ones' time). The max and its tap follow
 * pooling.c's MAX2X2: row-major, the first of equal maxima, a NaN taken.
 * What is stored was picked, not computed, so it is exact in bf16 and
 * narrowing changes only a NaN, made quiet as cx_f32_to_bf16_inline does:
 * the bits are the widening path's. */
typedef uint32_t u8w __attribute__((vector_size(32), aligned(2), may_alias));
typedef int32_t i8w __attribute__((vector_size(32)));
typedef float f8w __attribute__((vector_size(32)));
typedef uint16_t h8w __attribute__((vector_size(16), aligned(2), may_alias));
typedef uint32_t u4w __attribute__((vector_size(16), aligned(2), may_alias));
typedef int32_t i4w __attribute__((vector_size(16)));
typedef float f4w __attribute__((vector_size(16)));
typedef uint16_t h4w __attribute__((vector_size(8), aligned(2), may_alias));
typedef uint32_t u1w __attribute__((vector_size(4), aligned(2), may_alias));
typedef int32_t i1w __attribute__((vector_size(4)));
typedef float f1w __attribute__((vector_size(4)));
typedef uint16_t h1w __attribute__((vector_size(2), aligned(2), may_alias));

/* m: the max of windows q.. of rows r0 and r1, one per lane, as f32 bits;
 * k: its tap (0..3) */
#define MAX2X2_BF16(U, I, F, r0, r1, q, m, k)                                                  \
    do {                                                                                        \
        const U a_ = *(const U *)(const void *)((r0) + 2 * (q));                               \
        const U b_ = *(const U *)(const void *)((r1) + 2 * (q));                               \
        const U t_[4] = { a_ << 16, a_ & 0xffff0000u, b_ << 16, b_ & 0xffff0000u };            \
        m = (F)t_[0];                                                                           \
        k = (I){ 0 };                                                                           \
        for (int i_ = 1; i_ < 4; i_++) {                                                       \
            const F v_ = (F)t_[i_];                                                             \
            const I take_ = (v_ > m) | (v_ != v_);                                              \
            m = (F)(((I)v_ & take_) | ((I)m & ~take_));                                         \
            k = (take_ & i_) | (k & ~take_);                                                    \
        }                                                                                       \
    } while (0)

/* f32 bits (lanes of U) to bf16 bits, for values exact in bf16: a NaN quiet */
#define NARROW_EXACT(U, I, bits) (((bits) >> 16) | ((U)(((bits) & 0x7fffffffu) > 0x7f800000u) & 0x40u))

#define FWD_WINDOWS_BF16(U, I, F, H, W)                                                         \
    for (; q + (W) <= g->ow; q += (W)) {                                                        \
        F m;                                                                                    \
        I k;                                                                                    \
        MAX2X2_BF16(U, I, F, r0, r1, q, m, k);                                                  \
        (void)k;                                                                                \
        *(H *)(void *)(yr + q) = __builtin_convertvector(NARROW_EXACT(U, I, (U)m), H);          \
    }

CX_HOT static void max2x2_fwd(uint16_t *restrict y, const uint16_t *restrict x, const cx_pool_geom *g)
{
    for (int64_t oh = 0; oh < g->oh; oh++) {
        const uint16_t *r0 = x + 2 * oh * g->w, *r1 = r0 + g->w;
        uint16_t *yr = y + oh * g->ow;
        int64_t q = 0;
        FWD_WINDOWS_BF16(u8w, i8w, f8w, h8w, 8)
        FWD_WINDOWS_BF16(u4w, i4w, f4w, h4w, 4)
        FWD_WINDOWS_BF16(u1w, i1w, f1w, h1w, 1)
    }
}

/* dx's two rows under W windows: dy (relu's gradient folded in with
 * `positive`: kept where the max is > 0) at the max's tap, 0 elsewhere */
#define BWD_WINDOWS_BF16(U, I, F, H, W)                                                         \
    for (; q + (W) <= g->ow; q += (W)) {                                                        \
        F m;                                                                                    \
        I k;                                                                                    \
        MAX2X2_BF16(U, I, F, r0, r1, q, m, k);                                                  \
        U v = __builtin_convertvector(*(const H *)(const void *)(gr + q), U) << 16;             \
        if (positive) v &= (U)(m > 0);                                                          \
        v = NARROW_EXACT(U, I, v);                                                              \
        *(U *)(void *)(d0 + 2 * q) = (v & (U)(k == 0)) | (v & (U)(k == 1)) << 16;              \
        *(U *)(void *)(d1 + 2 * q) = (v & (U)(k == 2)) | (v & (U)(k == 3)) << 16;              \
    }

CX_HOT static void max2x2_bwd(uint16_t *restrict dx, const uint16_t *restrict x, const uint16_t *restrict dy, bool positive,
                       const cx_pool_geom *g)
{
    const int64_t w = g->w;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        const uint16_t *r0 = x + 2 * oh * w, *r1 = r0 + w, *gr = dy + oh * g->ow;
        uint16_t *d0 = dx + 2 * oh * w, *d1 = d0 + w;
        int64_t q = 0;
        BWD_WINDOWS_BF16(u8w, i8w, f8w, h8w, 8)
        BWD_WINDOWS_BF16(u4w, i4w, f4w, h4w, 4)
        BWD_WINDOWS_BF16(u1w, i1w, f1w, h1w, 1)
        for (int64_t c = 2 * g->ow; c < w; c++) d0[c] = d1[c] = 0;   /* an odd width's last column */
    }
    if (2 * g->oh < g->h) memset(dx + 2 * g->oh * w, 0, sizeof *dx * (size_t)((g->h - 2 * g->oh) * w));
}

static void plane(const bf16_job *j, float *lane, int64_t t)
{
    const cx_pool_geom *g = j->g;
    const int64_t in = g->h * g->w, out = g->oh * g->ow;
    if (j->kind == CX_POOL_BF16_MAX && j->max_2x2) {
        max2x2_fwd(j->out + t * out, j->x + t * in, g);
        return;
    }
    if (j->kind == CX_POOL_BF16_MAX_BWD && j->max_2x2) {
        /* a mask that is x itself (relu folded into the conv before) is
         * the max's sign at the one tap written */
        const bool folded = j->posmask == j->x;
        max2x2_bwd(j->out + t * in, j->x + t * in, j->dy + t * out, folded, g);
        if (j->posmask && !folded) cx_bf16_posmask(j->out + t * in, j->posmask + t * in, in);
        return;
    }
    float *xf = lane, *dyf = lane + in, *res = dyf + out;
    /* one plane of the f32 kernels' (N, C, ...) layout: their geometry
     * with a single image and channel */
    cx_pool_geom one = *g;
    one.n = one.c = 1;
    /* forward: x's plane to y's; backward: x's (max) and dy's to dx's */
    const bool bwd = j->kind == CX_POOL_BF16_MAX_BWD || j->kind == CX_POOL_BF16_AVG_BWD;
    if (j->kind != CX_POOL_BF16_AVG_BWD) cx_bf16_widen_row(xf, j->x + t * in, in);
    if (bwd) cx_bf16_widen_row(dyf, j->dy + t * out, out);
    cx_pool2d_plane_f32(j->kind, res, j->kind == CX_POOL_BF16_AVG_BWD ? NULL : xf, bwd ? dyf : NULL, &one);
    const int64_t n = bwd ? in : out;
    cx_bf16_round_row(j->out + t * n, res, n);
    if (j->posmask) cx_bf16_posmask(j->out + t * n, j->posmask + t * n, n);   /* relu's gradient, folded in */
}

/* Planes are claimed a run at a time, about 8 runs per thread: one
 * claim per plane (4096 of the seed cnn's 24x24 planes a step) made the
 * claims' cache line travel between the CPUs for each, which on these
 * VMs (100-300 ns a round trip) cost as much as the pooling. */
static void each(void *p, int64_t tid, int64_t nthreads)
{
    bf16_job *j = p;
    const int64_t lanes = j->lanes < nthreads ? j->lanes : nthreads, planes = j->g->n * j->g->c;
    if (tid >= lanes) return;
    float *lane = j->scratch + tid * lane_floats(j->g);
    for (int64_t r; (r = cx_claims_next(&j->claims, tid)) >= 0;)
        for (int64_t t = r * j->run; t < (r + 1) * j->run && t < planes; t++) plane(j, lane, t);
}

void cx_pool2d_bf16(int kind, uint16_t *out, const uint16_t *x, const uint16_t *dy, const uint16_t *posmask,
                    const cx_pool_geom *g, void *scratch, size_t scratch_bytes)
{
    bf16_job j = { .kind = kind, .g = g, .max_2x2 = cx_pool_geom_is_2x2(g), .out = out, .x = x, .dy = dy,
                   .posmask = kind == CX_POOL_BF16_MAX_BWD ? posmask : NULL };
    uintptr_t p = ((uintptr_t)scratch + 63) & ~(uintptr_t)63;
    j.scratch = (float *)(void *)p;
    size_t usable = scratch_bytes - (size_t)(p - (uintptr_t)scratch);
    j.lanes = (int64_t)(usable / ((size_t)lane_floats(g) * sizeof(float)));
    if (j.lanes < 1) j.lanes = 1;   /* never: the compiler plans one lane at least */
    const int64_t planes = g->n * g->c, lanes = j.lanes < cx_pool_threads() ? j.lanes : cx_pool_threads();
    j.run = (planes + 8 * lanes - 1) / (8 * lanes);
    cx_claims_init(&j.claims, (planes + j.run - 1) / j.run, lanes);
    cx_pool_run_each(each, &j);
}
