/* bf16 convolution and its two gradients: the operands are widened into
 * f32 copies in the scratch, up to 8 images at a time, the f32 kernels
 * (conv.c, winograd.c) run on them, and the result is rounded once to
 * bf16 (the weight gradient summed over the chunks in f32 first). Widening is O(inputs)
 * against the kernels' O(inputs x kernel window x channels), and the
 * graph's tensors (activations saved for backward included) stay bf16. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
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

/* Images per call of the f32 kernels: their copies are what the scratch
 * holds, so a part of the batch, not all of it (a step's peak memory
 * counts the scratch). Chunks of even size, at most 8 images (each of
 * the kernels' routes spreads images over the threads). */
static int64_t chunk_of(const cx_conv_geom *g)
{
    int64_t parts = (g->n + 7) / 8;
    return (g->n + parts - 1) / parts;
}

static cx_conv_geom with_images(const cx_conv_geom *g, int64_t n)
{
    cx_conv_geom c = *g;
    c.n = n;
    return c;
}

size_t cx_conv2d_bf16_scratch_bytes(const cx_conv_geom *g, int dir)
{
    int64_t chunk = chunk_of(g), a, b, o;
    cx_conv_geom c = with_images(g, chunk), last = with_images(g, g->n - (g->n - 1) / chunk * chunk);
    roles(&c, dir, &a, &b, &o);
    size_t f32 = f32_scratch(&c, dir) > f32_scratch(&last, dir) ? f32_scratch(&c, dir) : f32_scratch(&last, dir);
    /* dir 2 sums the chunks' weight gradients in one more w-sized buffer */
    size_t acc = dir == 2 ? aligned((size_t)o * 4) : 0;
    return aligned((size_t)a * 4) + aligned((size_t)b * 4) + aligned((size_t)o * 4) + acc + ALIGN_BYTES + f32;
}

static void widen_n(float *dst, const uint16_t *src, int64_t n)
{
    conv_job j = { .f = dst, .src = src };
    cx_pool_parallel_for(n, 4096, widen_part, &j);
}

static void round_n(uint16_t *dst, const float *src, int64_t n)
{
    conv_job j = { .h = dst, .from = src };
    cx_pool_parallel_for(n, 4096, round_part, &j);
}

typedef struct { float *f0, *f1, *fo, *acc; char *rest; size_t left; } conv_bufs;

static conv_bufs carve(const cx_conv_geom *g, int dir, void *scratch, size_t scratch_bytes)
{
    int64_t a, b, o;
    cx_conv_geom c = with_images(g, chunk_of(g));
    roles(&c, dir, &a, &b, &o);
    conv_bufs u;
    char *p = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    u.f0 = (float *)p; p += aligned((size_t)a * 4);
    u.f1 = (float *)p; p += aligned((size_t)b * 4);
    u.fo = (float *)p; p += aligned((size_t)o * 4);
    u.acc = (float *)p; p += dir == 2 ? aligned((size_t)o * 4) : 0;
    u.rest = p;
    /* the compiler sized it (a loaded executable's is checked for presence only) */
    CX_ASSERT((size_t)(p - (char *)scratch) <= scratch_bytes);
    u.left = scratch_bytes - (size_t)(p - (char *)scratch);
    return u;
}

CX_HOT static void add_into(float *acc, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void cx_conv2d_bf16(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                    void *scratch, size_t scratch_bytes)
{
    const int64_t chunk = chunk_of(g), xi = g->c * g->h * g->w, yi = g->o * g->oh * g->ow;
    const int64_t nw = g->o * (g->c / g->groups) * g->kh * g->kw;
    conv_bufs u = carve(g, dir, scratch, scratch_bytes);
    if (dir != 2) widen_n(u.f1, in1, nw);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        const int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk;
        cx_conv_geom c = with_images(g, nb);
        if (dir == 0) {
            widen_n(u.f0, in0 + n0 * xi, nb * xi);
            cx_conv2d_fwd(u.fo, u.f0, u.f1, NULL, false, &c, u.rest, u.left);
            round_n(out + n0 * yi, u.fo, nb * yi);
        } else if (dir == 1) {
            widen_n(u.f0, in0 + n0 * yi, nb * yi);
            cx_conv2d_bwd_input(u.fo, u.f0, u.f1, NULL, &c, u.rest, u.left);
            round_n(out + n0 * xi, u.fo, nb * xi);
        } else {
            widen_n(u.f0, in0 + n0 * xi, nb * xi);
            widen_n(u.f1, in1 + n0 * yi, nb * yi);
            /* the first chunk's sums land in acc directly */
            cx_conv2d_bwd_weight(n0 ? u.fo : u.acc, u.f0, u.f1, &c, u.rest, u.left);
            if (n0) add_into(u.acc, u.fo, nw);
        }
    }
    if (dir == 2) round_n(out, u.acc, nw);
}
