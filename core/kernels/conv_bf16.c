/* bf16 convolution and its two gradients, f32 sums rounded once to bf16.
 * With AVX512_BF16, on the shapes where it wins (gemm_wins), they are
 * lowered to the bf16 GEMM (gemm_bf16.c) over bf16 im2col columns, so the
 * products run on vdpbf16ps. Where Winograd applies, its transforms read
 * and write bf16 themselves (winograd.c) and the epilogue is applied as
 * they round. Elsewhere the operands are widened into f32 copies in the
 * scratch, a chunk of images at a time, for the f32 kernels (conv.c), the
 * weight gradient summed over the chunks in f32 first: widening is
 * O(inputs) against the kernels' O(inputs x kernel window x channels),
 * and the graph's tensors (activations saved for backward included) stay
 * bf16. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
#include "cx_bf16.h"

#include <string.h>

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
 * counts the scratch): as many as keep the f32 copies of x and y within
 * CHUNK_BYTES, in chunks of even size. Each chunk costs the widening,
 * the kernel's own passes and the rounding a pool dispatch each, which
 * 8 images at a time made the seed cnn's conv1 0.54x of f32 through the
 * core (0.83x in chunks of 4 MB). */
enum { CHUNK_BYTES = 4 << 20 };
static int64_t chunk_of(const cx_conv_geom *g)
{
    const int64_t per_image = (g->c * g->h * g->w + g->o * g->oh * g->ow) * 4;
    int64_t most = CHUNK_BYTES / (per_image ? per_image : 1);
    most = most < 1 ? 1 : most;
    int64_t parts = (g->n + most - 1) / most;
    return (g->n + parts - 1) / parts;
}

static cx_conv_geom with_images(const cx_conv_geom *g, int64_t n)
{
    cx_conv_geom c = *g;
    c.n = n;
    return c;
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

/* ---- the epilogue, a chunk of images at a time ---------------------------------------- */

typedef struct {
    uint16_t *y;
    const float *from;      /* the chunk's f32 sums, rounded into y in the same pass; NULL: y holds them */
    const cx_bf16_epi *e;
    const uint16_t *mask;   /* at the chunk's first element */
    int64_t plane, channels;
} epi_job;

void cx_bf16_posmask(uint16_t *y, const uint16_t *mask, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = cx_bf16_to_f32_inline(mask[i]) > 0.0f ? y[i] : 0;
}

/* planes [lo, hi) of the chunk: (image, channel) pairs */
CX_HOT static void epi_part(void *p, int64_t lo, int64_t hi)
{
    const epi_job *j = p;
    const bool relu = j->e->relu;
    for (int64_t q = lo; q < hi; q++) {
        uint16_t *y = j->y + q * j->plane;
        const float *f = j->from ? j->from + q * j->plane : NULL;
        if (f)
            for (int64_t i = 0; i < j->plane; i++) y[i] = cx_f32_to_bf16_inline(f[i]);
        if (j->mask) {
            cx_bf16_posmask(y, j->mask + q * j->plane, j->plane);
            continue;
        }
        const float b = cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(j->e->bias[q % j->channels]));
        for (int64_t i = 0; i < j->plane; i++) y[i] = cx_bf16_add_bias_inline(y[i], b, relu);
    }
}

static bool has_epi(int dir, const cx_bf16_epi *e)
{
    return e && dir != 2 && (dir == 0 ? e->bias != NULL : e->posmask != NULL);
}

/* epi over images [n0, n0 + nb) of out: y (dir 0; a fold always has its
 * bias) or dx (dir 1); with from (the chunk's f32 sums), each plane is
 * rounded into out first, in the same pass (a rounding pass of its own
 * and then this one cost the cnn's bf16 convs a pass over their output) */
static void apply_epi(int dir, uint16_t *out, const float *from, const cx_conv_geom *g, const cx_bf16_epi *e,
                      int64_t n0, int64_t nb)
{
    if (!has_epi(dir, e)) return;
    const int64_t ch = dir == 0 ? g->o : g->c, plane = dir == 0 ? g->oh * g->ow : g->h * g->w;
    epi_job j = { .y = out + n0 * ch * plane, .from = from, .e = e, .plane = plane, .channels = ch,
                  .mask = dir == 1 ? e->posmask + n0 * ch * plane : NULL };
    cx_pool_parallel_for(nb * ch, plane >= 4096 ? 1 : 4096 / (plane ? plane : 1) + 1, epi_part, &j);
}

CX_HOT static void add_into(float *acc, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

/* the Winograd route's own buffer, the weights (or their gradient) in f32, before winograd.c's scratch */
static size_t wino_fixed(const cx_conv_geom *g)
{
    return aligned((size_t)(g->o * g->c * 9) * 4) + ALIGN_BYTES;
}

/* Winograd straight on the bf16 tensors: widening a chunk of images, the
 * f32 kernel and then a rounding and epilogue pass over its output cost
 * the cnn's conv2 three passes over memory the transforms make anyway */
static void wino_route(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                       const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes)
{
    const int64_t nw = g->o * g->c * 9;
    float *wf = (float *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    char *rest = (char *)wf + aligned((size_t)nw * 4);
    CX_ASSERT((size_t)(rest - (char *)scratch) <= scratch_bytes);
    const size_t left = scratch_bytes - (size_t)(rest - (char *)scratch);
    if (dir == 2) {
        cx_wino_bwd_weight_bf16(wf, in0, in1, g, rest, left);
        round_n(out, wf, nw);
        return;
    }
    widen_n(wf, in1, nw);
    const bool epi_on = has_epi(dir, epi);
    if (dir == 0)
        cx_wino_fwd_bf16(out, in0, wf, epi_on ? epi->bias : NULL, epi_on && epi->relu, g, rest, left);
    else
        cx_wino_bwd_input_bf16(out, in0, wf, epi_on ? epi->posmask : NULL, g, rest, left);
}

static void widen_route(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                        const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes)
{
    /* a scratch without room for a direct lane was planned for the
     * chunked routes below (an executable from before the direct kernels;
     * widen_min_scratch sends it here) */
    if (cx_conv2d_bf16_direct_applies(g, dir) && scratch_bytes >= cx_conv2d_bf16_direct_scratch_bytes(g, dir, true)) {
        cx_conv2d_bf16_direct(dir, out, in0, in1, g, epi, scratch, scratch_bytes);
        return;
    }
    if (cx_wino_applies(g)) {
        wino_route(dir, out, in0, in1, g, epi, scratch, scratch_bytes);
        return;
    }
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
            if (has_epi(0, epi)) apply_epi(0, out, u.fo, g, epi, n0, nb);
            else round_n(out + n0 * yi, u.fo, nb * yi);
        } else if (dir == 1) {
            widen_n(u.f0, in0 + n0 * yi, nb * yi);
            cx_conv2d_bwd_input(u.fo, u.f0, u.f1, NULL, &c, u.rest, u.left);
            if (has_epi(1, epi)) apply_epi(1, out, u.fo, g, epi, n0, nb);
            else round_n(out + n0 * xi, u.fo, nb * xi);
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

/* ---- the GEMM route ------------------------------------------------------------------------
 * One layout serves the three directions: a chunk of nb images' columns
 * side by side, L = nb * OH * OW wide, so each GEMM is one product per
 * group (batch G) whatever the batch:
 *   cols (C * KH * KW, L) bf16: row c * KH * KW + ki * KW + kj (a group's
 *     rows are one block, as w's (O, C/G, KH, KW) are);
 *   t (O, L) bf16: y or dy with images and channels swapped.
 * y_g = w_g cols_g; dcols_g = w_g^T dy_g (f32, then col2im in f32 and one
 * rounding); dw_g += dy_g cols_g^T (f32 over the chunks, one rounding). */

typedef struct {
    const cx_conv_geom *g;
    int64_t nb, l, kk;   /* images in the chunk, columns, KH * KW */
} gemm_shape;

/* Images per chunk: the column copies hold about 2^19 values (1 MB of
 * bf16, within L2 with the GEMM's tiles), at most 8 images, chunks of
 * even size. */
static int64_t gemm_chunk(const cx_conv_geom *g)
{
    int64_t ohw = g->oh * g->ow, ckk = g->c * g->kh * g->kw, rows = ckk > g->o ? ckk : g->o;
    int64_t nb = ((int64_t)1 << 19) / (rows * ohw);
    nb = nb < 1 ? 1 : nb > 8 ? 8 : nb;
    nb = nb < g->n ? nb : g->n;
    int64_t parts = (g->n + nb - 1) / nb;
    return (g->n + parts - 1) / parts;
}

/* the GEMM's batch, m, n, k for direction dir over l columns */
static void gemm_dims(const cx_conv_geom *g, int dir, int64_t l, int64_t d[4])
{
    int64_t og = g->o / g->groups, ckkg = g->c / g->groups * g->kh * g->kw;
    d[0] = g->groups;
    d[1] = dir == 1 ? ckkg : og;
    d[2] = dir == 2 ? ckkg : l;
    d[3] = dir == 0 ? ckkg : dir == 1 ? og : l;
}

/* the route's own buffers, before the GEMM's scratch */
static size_t gemm_fixed(const cx_conv_geom *g, int dir, int64_t nb)
{
    int64_t l = nb * g->oh * g->ow, ckk = g->c * g->kh * g->kw;
    size_t b = aligned((size_t)(g->o * l) * 2) + ALIGN_BYTES;
    if (dir != 1) b += aligned((size_t)(ckk * l) * 2);
    if (dir == 1) b += aligned((size_t)(ckk * l) * 4) + aligned((size_t)(nb * g->c * g->h * g->w) * 4);
    if (dir == 2) b += aligned((size_t)(g->o * (g->c / g->groups) * g->kh * g->kw) * 4);
    return b;
}

static size_t gemm_scratch(const cx_conv_geom *g, int dir, bool least)
{
    int64_t nb = gemm_chunk(g), d[4];
    gemm_dims(g, dir, nb * g->oh * g->ow, d);
    return gemm_fixed(g, dir, nb) + (least ? cx_matmul_bf16_min_scratch_bytes(d[0], d[1], d[2], d[3])
                                           : cx_matmul_bf16_scratch_bytes(d[0], d[1], d[2], d[3]));
}

/* The scratch of the chunked routes: Winograd on the bf16 tensors, or the
 * f32 kernels on widened copies */
static size_t chunked_scratch(const cx_conv_geom *g, int dir)
{
    if (cx_wino_applies(g)) return wino_fixed(g) + cx_wino_bf16_scratch_bytes(g, dir);
    int64_t chunk = chunk_of(g), a, b, o;
    cx_conv_geom c = with_images(g, chunk), last = with_images(g, g->n - (g->n - 1) / chunk * chunk);
    roles(&c, dir, &a, &b, &o);
    size_t f32 = f32_scratch(&c, dir) > f32_scratch(&last, dir) ? f32_scratch(&c, dir) : f32_scratch(&last, dir);
    /* dir 2 sums the chunks' weight gradients in one more w-sized buffer */
    size_t acc = dir == 2 ? aligned((size_t)o * 4) : 0;
    return aligned((size_t)a * 4) + aligned((size_t)b * 4) + aligned((size_t)o * 4) + acc + ALIGN_BYTES + f32;
}

static size_t widen_scratch(const cx_conv_geom *g, int dir)
{
    if (cx_conv2d_bf16_direct_applies(g, dir)) return cx_conv2d_bf16_direct_scratch_bytes(g, dir, false);
    return chunked_scratch(g, dir);
}

/* The least the widening route (Winograd's and the direct kernels'
 * included) runs in: Winograd and the direct kernels run as few lanes as
 * their scratch holds, so a plan made for fewer threads than run now
 * still takes them; a direct shape's scratch planned for the chunked
 * route (an executable from before the direct kernels) runs that route */
static size_t widen_min_scratch(const cx_conv_geom *g, int dir)
{
    size_t chunked = cx_wino_applies(g) ? wino_fixed(g) + cx_wino_bf16_min_scratch_bytes(g, dir) : chunked_scratch(g, dir);
    if (!cx_conv2d_bf16_direct_applies(g, dir)) return chunked;
    size_t direct = cx_conv2d_bf16_direct_scratch_bytes(g, dir, true);
    return direct < chunked ? direct : chunked;
}

size_t cx_conv2d_bf16_route_scratch_bytes(const cx_conv_geom *g, int dir, bool gemm)
{
    return gemm ? gemm_scratch(g, dir, false) : widen_scratch(g, dir);
}

/* Where the GEMM route wins with AVX512_BF16, measured (single-thread CPU
 * time, batch 64, Zen 4): a 3x3 stride-2 conv 32 -> 64 channels
 * 1.10-1.17x of the f32 kernels, a 1x1 conv 64 -> 128 1.18-1.57x. Where
 * Winograd applies, its f32 transforms do 2.25x fewer products than any
 * GEMM and the widened route won (the seed cnn's conv2, 32 -> 64 3x3:
 * GEMM 0.58-0.68x); few output channels (a LeNet 10 -> 20 5x5: 0.5-0.7x)
 * or a short K (one input channel, K = 9: 0.76-1.13x) leave the bf16
 * tiles mostly padding and the im2col copies unpaid. */
static bool gemm_wins(const cx_conv_geom *g)
{
    return !cx_wino_applies(g) && g->o / g->groups >= 48 && g->c / g->groups * g->kh * g->kw >= 32;
}

bool cx_conv2d_bf16_plans_gemm(const cx_conv_geom *g)
{
    return cx_isa_active() >= CX_ISA_AVX512_BF16 && gemm_wins(g);
}

size_t cx_conv2d_bf16_scratch_bytes(const cx_conv_geom *g, int dir)
{
    return cx_conv2d_bf16_route_scratch_bytes(g, dir, cx_conv2d_bf16_plans_gemm(g));
}

typedef struct {
    const gemm_shape *s;
    uint16_t *cols, *t, *out;
    const uint16_t *x, *y;
    const float *dcols;
    float *dx;
    bool to_images;
} gemm_job;

/* [lo, hi): the output columns ow whose input column iw0 + ow * stride
 * lies inside the image */
static void valid_cols(const cx_conv_geom *g, int64_t iw0, int64_t *lo, int64_t *hi)
{
    int64_t l = iw0 >= 0 ? 0 : (-iw0 + g->stride_w - 1) / g->stride_w;
    int64_t h = g->w - iw0 <= 0 ? 0 : (g->w - iw0 + g->stride_w - 1) / g->stride_w;
    *lo = l < g->ow ? l : g->ow;
    *hi = h < *lo ? *lo : h > g->ow ? g->ow : h;
}

/* rows [lo, hi) of cols from the chunk's images x (nb, C, H, W); outside
 * the image, zeros */
CX_HOT static void im2col_part(void *p, int64_t lo, int64_t hi)
{
    const gemm_job *j = p;
    const cx_conv_geom *g = j->s->g;
    for (int64_t r = lo; r < hi; r++) {
        int64_t c = r / j->s->kk, ki = r % j->s->kk / g->kw, kj = r % g->kw;
        for (int64_t n = 0; n < j->s->nb; n++) {
            const uint16_t *src = j->x + (n * g->c + c) * g->h * g->w;
            for (int64_t oh = 0; oh < g->oh; oh++) {
                uint16_t *dst = j->cols + r * j->s->l + (n * g->oh + oh) * g->ow;
                int64_t ih = oh * g->stride_h - g->pad_h + ki * g->dil_h;
                if (ih < 0 || ih >= g->h) { memset(dst, 0, sizeof *dst * (size_t)g->ow); continue; }
                int64_t lo_w, hi_w, iw0 = kj * g->dil_w - g->pad_w;
                valid_cols(g, iw0, &lo_w, &hi_w);
                /* an index, not a pointer: iw0 may lie left of the image */
                const int64_t row = ih * g->w + iw0;
                memset(dst, 0, sizeof *dst * (size_t)lo_w);
                if (g->stride_w != 1)
                    for (int64_t ow = lo_w; ow < hi_w; ow++) dst[ow] = src[row + ow * g->stride_w];
                else if (hi_w > lo_w)
                    memcpy(dst + lo_w, src + row + lo_w, sizeof *dst * (size_t)(hi_w - lo_w));
                memset(dst + hi_w, 0, sizeof *dst * (size_t)(g->ow - hi_w));
            }
        }
    }
}

/* channels [lo, hi) of dx: the chunk's dcols summed back onto the image
 * in f32, then rounded once into out (nb, C, H, W) */
CX_HOT static void col2im_part(void *p, int64_t lo, int64_t hi)
{
    const gemm_job *j = p;
    const cx_conv_geom *g = j->s->g;
    const int64_t hw = g->h * g->w;
    for (int64_t c = lo; c < hi; c++)
        for (int64_t n = 0; n < j->s->nb; n++) {
            float *dst = j->dx + (n * g->c + c) * hw;
            memset(dst, 0, sizeof *dst * (size_t)hw);
            for (int64_t k = 0; k < j->s->kk; k++) {
                const float *src = j->dcols + (c * j->s->kk + k) * j->s->l + n * g->oh * g->ow;
                int64_t ki = k / g->kw, kj = k % g->kw;
                for (int64_t oh = 0; oh < g->oh; oh++) {
                    int64_t ih = oh * g->stride_h - g->pad_h + ki * g->dil_h;
                    if (ih < 0 || ih >= g->h) continue;
                    int64_t lo_w, hi_w, iw0 = kj * g->dil_w - g->pad_w;
                    valid_cols(g, iw0, &lo_w, &hi_w);
                    const int64_t row = ih * g->w + iw0;
                    const float *s = src + oh * g->ow;
                    for (int64_t ow = lo_w; ow < hi_w; ow++) dst[row + ow * g->stride_w] += s[ow];
                }
            }
            uint16_t *o = j->out + (n * g->c + c) * hw;
            for (int64_t i = 0; i < hw; i++) o[i] = cx_f32_to_bf16_inline(dst[i]);
        }
}

/* rows [lo, hi) of (O, nb): t (O, L) to or from the images' (nb, O, OH * OW) */
static void swap_part(void *p, int64_t lo, int64_t hi)
{
    const gemm_job *j = p;
    const cx_conv_geom *g = j->s->g;
    const int64_t ohw = g->oh * g->ow;
    for (int64_t r = lo; r < hi; r++) {
        int64_t o = r / j->s->nb, n = r % j->s->nb;
        uint16_t *t = j->t + o * j->s->l + n * ohw;
        if (j->to_images) memcpy(j->out + (n * g->o + o) * ohw, t, sizeof *t * (size_t)ohw);
        else memcpy(t, j->y + (n * g->o + o) * ohw, sizeof *t * (size_t)ohw);
    }
}

typedef struct { uint16_t *cols, *t; float *dcols, *dx, *acc; char *rest; size_t left; } gemm_bufs;

static gemm_bufs gemm_carve(const cx_conv_geom *g, int dir, int64_t nb, void *scratch, size_t scratch_bytes)
{
    int64_t l = nb * g->oh * g->ow, ckk = g->c * g->kh * g->kw;
    gemm_bufs u = { 0 };
    char *p = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    u.t = (uint16_t *)p; p += aligned((size_t)(g->o * l) * 2);
    if (dir != 1) { u.cols = (uint16_t *)p; p += aligned((size_t)(ckk * l) * 2); }
    if (dir == 1) {
        u.dcols = (float *)p; p += aligned((size_t)(ckk * l) * 4);
        u.dx = (float *)p; p += aligned((size_t)(nb * g->c * g->h * g->w) * 4);
    }
    if (dir == 2) { u.acc = (float *)p; p += aligned((size_t)(g->o * (g->c / g->groups) * g->kh * g->kw) * 4); }
    CX_ASSERT((size_t)(p - (char *)scratch) <= scratch_bytes);
    u.rest = p;
    u.left = scratch_bytes - (size_t)(p - (char *)scratch);
    return u;
}

/* one chunk of nb images starting at image n0 */
static void gemm_chunk_run(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                           const gemm_bufs *u, int64_t n0, int64_t nb)
{
    const int64_t ohw = g->oh * g->ow, l = nb * ohw, xi = g->c * g->h * g->w, d4 = g->o / g->groups;
    const int64_t ckkg = g->c / g->groups * g->kh * g->kw;
    gemm_shape s = { g, nb, l, g->kh * g->kw };
    gemm_job j = { .s = &s, .cols = u->cols, .t = u->t };
    int64_t d[4];
    gemm_dims(g, dir, l, d);
    if (dir != 1) {
        j.x = in0 + n0 * xi;
        cx_pool_parallel_for(g->c * s.kk, 1, im2col_part, &j);
    }
    if (dir != 0) {
        j.y = (dir == 1 ? in0 : in1) + n0 * g->o * ohw;
        cx_pool_parallel_for(g->o * nb, 16, swap_part, &j);
    }
    if (dir == 0) {
        cx_matmul_bf16(u->t, in1, u->cols, d[0], d[1], d[2], d[3], false, false, d4 * ckkg, ckkg * l, u->rest,
                       u->left);
        j.to_images = true;
        j.out = out + n0 * g->o * ohw;
        cx_pool_parallel_for(g->o * nb, 16, swap_part, &j);
    } else if (dir == 1) {
        cx_matmul_bf16_f32(u->dcols, false, in1, u->t, d[0], d[1], d[2], d[3], true, false, d4 * ckkg, d4 * l,
                           u->rest, u->left);
        j.dcols = u->dcols;
        j.dx = u->dx;
        j.out = out + n0 * xi;
        cx_pool_parallel_for(g->c, 1, col2im_part, &j);
    } else {
        cx_matmul_bf16_f32(u->acc, n0 > 0, u->t, u->cols, d[0], d[1], d[2], d[3], false, true, d4 * l, ckkg * l,
                           u->rest, u->left);
    }
}

void cx_conv2d_bf16_gemm(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                         const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes)
{
    const int64_t chunk = gemm_chunk(g);
    gemm_bufs u = gemm_carve(g, dir, chunk, scratch, scratch_bytes);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        const int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk;
        gemm_chunk_run(dir, out, in0, in1, g, &u, n0, nb);
        apply_epi(dir, out, NULL, g, epi, n0, nb);
    }
    if (dir == 2) round_n(out, u.acc, g->o * (g->c / g->groups) * g->kh * g->kw);
}

bool cx_conv2d_bf16_takes_gemm(const cx_conv_geom *g, int dir, size_t scratch_bytes)
{
    /* a scratch planned for the other route (the persistent cache, another
     * CX_CPU_ISA) runs the route it fits */
    return cx_conv2d_bf16_plans_gemm(g) ? scratch_bytes >= gemm_scratch(g, dir, true)
                                        : scratch_bytes < widen_min_scratch(g, dir);
}

void cx_conv2d_bf16(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                    const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes)
{
    if (cx_conv2d_bf16_takes_gemm(g, dir, scratch_bytes))
        cx_conv2d_bf16_gemm(dir, out, in0, in1, g, epi, scratch, scratch_bytes);
    else widen_route(dir, out, in0, in1, g, epi, scratch, scratch_bytes);
}
