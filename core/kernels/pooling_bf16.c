/* bf16 max and average pooling: each (image, channel) plane, and its
 * gradient, is widened into the thread's f32 scratch, pooled by the f32
 * plane kernels (pooling.c) and rounded once. Widening is exact and a max
 * picks one of its inputs, so the bits are those of casting around the
 * f32 kernels, which is what the graph did before: three more passes over
 * the tensor, each a kernel of its own. */
#include "kernels.h"
#include "pool.h"
#include "cx_bf16.h"

#include <stdatomic.h>
#include <stdint.h>

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
    uint16_t *out;
    const uint16_t *x, *dy, *posmask;
    float *scratch;
    int64_t lanes;
    atomic_int_fast64_t next;
} bf16_job;

CX_HOT static void widen(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_bf16_to_f32_inline(src[i]);
}

CX_HOT static void narrow(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_f32_to_bf16_inline(src[i]);
}

static void plane(const bf16_job *j, float *lane, int64_t t)
{
    const cx_pool_geom *g = j->g;
    const int64_t in = g->h * g->w, out = g->oh * g->ow;
    float *xf = lane, *dyf = lane + in, *res = dyf + out;
    /* one plane of the f32 kernels' (N, C, ...) layout: their geometry
     * with a single image and channel */
    cx_pool_geom one = *g;
    one.n = one.c = 1;
    /* forward: x's plane to y's; backward: x's (max) and dy's to dx's */
    const bool bwd = j->kind == CX_POOL_BF16_MAX_BWD || j->kind == CX_POOL_BF16_AVG_BWD;
    if (j->kind != CX_POOL_BF16_AVG_BWD) widen(xf, j->x + t * in, in);
    if (bwd) widen(dyf, j->dy + t * out, out);
    cx_pool2d_plane_f32(j->kind, res, j->kind == CX_POOL_BF16_AVG_BWD ? NULL : xf, bwd ? dyf : NULL, &one);
    const int64_t n = bwd ? in : out;
    narrow(j->out + t * n, res, n);
    if (j->posmask) cx_bf16_posmask(j->out + t * n, j->posmask + t * n, n);   /* relu's gradient, folded in */
}

/* Planes are claimed a run at a time, about 8 runs per thread: one
 * atomic add per plane (4096 of the seed cnn's 24x24 planes a step) made
 * the counter's cache line travel between the CPUs for each, which on
 * these VMs (100-300 ns a round trip) cost as much as the pooling. */
static void each(void *p, int64_t tid, int64_t nthreads)
{
    bf16_job *j = p;
    const int64_t lanes = j->lanes < nthreads ? j->lanes : nthreads, planes = j->g->n * j->g->c;
    if (tid >= lanes) return;
    const int64_t run = (planes + 8 * lanes - 1) / (8 * lanes);
    float *lane = j->scratch + tid * lane_floats(j->g);
    for (;;) {
        int64_t t0 = atomic_fetch_add_explicit(&j->next, run, memory_order_relaxed);
        if (t0 >= planes) return;
        for (int64_t t = t0; t < t0 + run && t < planes; t++) plane(j, lane, t);
    }
}

void cx_pool2d_bf16(int kind, uint16_t *out, const uint16_t *x, const uint16_t *dy, const uint16_t *posmask,
                    const cx_pool_geom *g, void *scratch, size_t scratch_bytes)
{
    bf16_job j = { .kind = kind, .g = g, .out = out, .x = x, .dy = dy,
                   .posmask = kind == CX_POOL_BF16_MAX_BWD ? posmask : NULL };
    uintptr_t p = ((uintptr_t)scratch + 63) & ~(uintptr_t)63;
    j.scratch = (float *)(void *)p;
    size_t usable = scratch_bytes - (size_t)(p - (uintptr_t)scratch);
    j.lanes = (int64_t)(usable / ((size_t)lane_floats(g) * sizeof(float)));
    if (j.lanes < 1) j.lanes = 1;   /* never: the compiler plans one lane at least */
    atomic_init(&j.next, 0);
    cx_pool_run_each(each, &j);
}
