/* bf16 convolution and its two gradients: the operands are widened into
 * f32 copies in the scratch, the f32 kernels (conv.c, winograd.c) run on
 * them, and the result is rounded once to bf16. Widening is O(inputs)
 * against the kernels' O(inputs x kernel window x channels), and the
 * graph's tensors (activations saved for backward included) stay bf16. */
#include "kernels.h"
#include "pool.h"
#include "cx_bf16.h"

enum { ALIGN_BYTES = 64 };

static size_t aligned(size_t b) { return (b + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES; }

typedef struct { float *f; uint16_t *h; const uint16_t *src; const float *from; } conv_job;

CX_HOT static void widen_part(void *p, int64_t lo, int64_t hi)
{
    const conv_job *j = p;
    for (int64_t i = lo; i < hi; i++) j->f[i] = cx_bf16_to_f32_inline(j->src[i]);
}

CX_HOT static void round_part(void *p, int64_t lo, int64_t hi)
{
    const conv_job *j = p;
    for (int64_t i = lo; i < hi; i++) j->h[i] = cx_f32_to_bf16_inline(j->from[i]);
}

/* element counts of x (N, C, H, W), w (O, C/groups, KH, KW), y (N, O, OH, OW) */
static void sizes(const cx_conv_geom *g, int64_t n[3])
{
    n[0] = g->n * g->c * g->h * g->w;
    n[1] = g->o * (g->c / g->groups) * g->kh * g->kw;
    n[2] = g->n * g->o * g->oh * g->ow;
}

/* dir 0: y from x, w; 1: dx from dy, w; 2: dw from x, dy. The two
 * operands' and the output's element counts. */
static void roles(const cx_conv_geom *g, int dir, int64_t *in0, int64_t *in1, int64_t *out)
{
    int64_t n[3];
    sizes(g, n);
    static const int r[3][3] = { { 0, 1, 2 }, { 2, 1, 0 }, { 0, 2, 1 } };
    *in0 = n[r[dir][0]];
    *in1 = n[r[dir][1]];
    *out = n[r[dir][2]];
}

static size_t f32_scratch(const cx_conv_geom *g, int dir)
{
    return dir == 0 ? cx_conv2d_scratch_bytes(g) : dir == 1 ? cx_conv2d_bwd_input_scratch_bytes(g)
                                                            : cx_conv2d_bwd_weight_scratch_bytes(g);
}

size_t cx_conv2d_bf16_scratch_bytes(const cx_conv_geom *g, int dir)
{
    int64_t a, b, o;
    roles(g, dir, &a, &b, &o);
    return aligned((size_t)a * 4) + aligned((size_t)b * 4) + aligned((size_t)o * 4) + ALIGN_BYTES + f32_scratch(g, dir);
}

void cx_conv2d_bf16(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                    void *scratch, size_t scratch_bytes)
{
    int64_t a, b, o;
    roles(g, dir, &a, &b, &o);
    char *base = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    float *f0 = (float *)base, *f1 = (float *)(base + aligned((size_t)a * 4));
    float *fo = (float *)((char *)f1 + aligned((size_t)b * 4));
    char *rest = (char *)fo + aligned((size_t)o * 4);
    size_t left = scratch_bytes - (size_t)(rest - (char *)scratch);
    conv_job j0 = { .f = f0, .src = in0 }, j1 = { .f = f1, .src = in1 }, jo = { .h = out, .from = fo };
    cx_pool_parallel_for(a, 4096, widen_part, &j0);
    cx_pool_parallel_for(b, 4096, widen_part, &j1);
    if (dir == 0) cx_conv2d_fwd(fo, f0, f1, NULL, false, g, rest, left);
    else if (dir == 1) cx_conv2d_bwd_input(fo, f0, f1, NULL, g, rest, left);
    else cx_conv2d_bwd_weight(fo, f0, f1, g, rest, left);
    cx_pool_parallel_for(o, 4096, round_part, &jo);
}
