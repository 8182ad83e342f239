/* Direct bf16 convolution for a short window over few input channels: the
 * forward (with its folded epilogue) and the weight gradient of a conv
 * whose C * KH * KW is at most DIRECT_MAX_K, one group, stride and
 * dilation 1 (the seed cnn's conv1: one channel, 3x3, K = 9). There a
 * GEMM of K = 9 fills a fraction of its tiles, and the widening route
 * copied every image and gradient into f32 before the f32 kernels' own
 * im2col.
 *
 * Each lane widens one image at a time into a zero-padded f32 copy, so
 * the window never tests a border, and sums along each output plane in
 * f32 vectors:
 *   forward:         y[n,o,p] = sum_t w[o,t] x[n, p + off_t]  (OB channels at once)
 *   weight gradient: dw[o,t]  = sum_{n,p} dy[n,o,p] x[n, p + off_t]
 * where p runs over the plane with the padded image's row stride. Every
 * output is rounded once to bf16; the forward's epilogue is the bf16
 * program's (cx_bf16_add_bias_inline). The weight gradient's sums for an
 * output channel run over the images in order on one lane (channels are
 * split between lanes), so its bits do not depend on the thread count. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
#include "cx_bf16.h"

#include <cxla/core.h>
#include <string.h>

enum { DIRECT_MAX_K = 16, DIRECT_ALIGN = 64, VEC = 16, OB = 8 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* VEC floats: one register where the clone has AVX-512, two or four below */
typedef float vf __attribute__((vector_size(VEC * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(VEC * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(VEC * sizeof(uint16_t))));

bool cx_conv2d_bf16_direct_applies(const cx_conv_geom *g, int dir)
{
    return (dir == 0 || dir == 2) && g->groups == 1 && g->stride_h == 1 && g->stride_w == 1 && g->dil_h == 1 &&
           g->dil_w == 1 && g->c * g->kh * g->kw <= DIRECT_MAX_K;
}

/* The sums run along a whole output plane laid out with the padded
 * image's row stride (WP): output (r, q) at r * WP + q reads the window
 * at the same place plus the term's offset, so one flat loop of full
 * vectors covers every row; the WP - OW columns past each row's end are
 * computed and never stored (the forward) or read against zeros (the
 * weight gradient). The forward's WP is the padded width. The weight
 * gradient's is rounded up to whole vectors and its lane keeps KW copies
 * of the image, copy jj shifted left by jj columns, so that each of its
 * K loads per vector is aligned: its loads are not shared between
 * output channels as the forward's are, and line-splitting ones (6 of 9
 * with a 3x3 window) had bound it. */
static int64_t row_stride(const cx_conv_geom *g, int dir)
{
    const int64_t wp = g->w + 2 * g->pad_w;
    return dir == 2 ? (wp + VEC - 1) / VEC * VEC : wp;
}

static int64_t image_copies(const cx_conv_geom *g, int dir) { return dir == 2 ? g->kw : 1; }

static int64_t plane_room(const cx_conv_geom *g, int dir)
{
    return (g->oh * row_stride(g, dir) + VEC - 1) / VEC * VEC;
}

/* a forward output plane's place in the lane: its room and a vector more,
 * since the last row's last vector of sums is read whole however few of
 * its lanes are stored */
static int64_t plane_stride(const cx_conv_geom *g) { return plane_room(g, 0) + VEC; }

static int64_t padded_floats(const cx_conv_geom *g, int dir)
{
    return g->c * (g->h + 2 * g->pad_h) * row_stride(g, dir);
}

/* one copy of the padded image: the flat loop's last vector reads up to
 * a vector past the plane, plus the window's reach (zeros, never stored;
 * the weight gradient's copies take the columns' reach) */
static int64_t image_room(const cx_conv_geom *g, int dir)
{
    const int64_t reach = ((g->c - 1) * (g->h + 2 * g->pad_h) + g->kh - 1) * row_stride(g, dir) +
                          (dir == 2 ? 0 : g->kw - 1);
    int64_t need = plane_room(g, dir) + reach;
    need = need > padded_floats(g, dir) ? need : padded_floats(g, dir);
    return (need + 15) / 16 * 16;
}

/* floats of one lane: the padded image (copies), then OB output planes
 * (forward) or dy's plane and the sums of every channel, a vector per
 * term (weight gradient: a lane may take every channel) */
static int64_t lane_floats(const cx_conv_geom *g, int dir)
{
    const int64_t k = g->c * g->kh * g->kw;
    return image_copies(g, dir) * image_room(g, dir) +
           (dir == 0 ? OB * plane_stride(g) : plane_room(g, dir) + g->o * k * VEC);
}

static int64_t work_items(const cx_conv_geom *g, int dir) { return dir == 0 ? g->n : g->o; }

size_t cx_conv2d_bf16_direct_scratch_bytes(const cx_conv_geom *g, int dir, bool least)
{
    int64_t lanes = least ? 1 : min64(work_items(g, dir), cx_get_num_threads() > 0 ? cx_get_num_threads() : 1);
    return (size_t)lanes * (size_t)lane_floats(g, dir) * sizeof(float) + DIRECT_ALIGN;
}

typedef struct {
    const cx_conv_geom *g;
    int dir;
    uint16_t *out;
    const uint16_t *x, *w, *dy;   /* dy: the weight gradient's */
    const cx_bf16_epi *epi;
    float *lanes_base;
    int64_t lanes, lane_floats, k, wp;
    int64_t off[DIRECT_MAX_K];      /* term t's offset in the lane's image (copies), from its output's pixel */
    cx_claims claims;   /* the forward's images */
} direct_job;

/* image n of x, widened into xp (C, H + 2 PH, W + 2 PW; rows j->wp
 * apart) with zeros around, then the weight gradient's shifted copies.
 * @return whether every value is finite */
static bool widen_padded(float *xp, const uint16_t *x, const direct_job *j, int64_t n)
{
    const cx_conv_geom *g = j->g;
    const int64_t hp = g->h + 2 * g->pad_h, wp = j->wp, room = image_room(g, j->dir);
    memset(xp, 0, sizeof *xp * (size_t)room);
    uint16_t special = 0;   /* an exponent of all ones: inf or NaN */
    for (int64_t c = 0; c < g->c; c++)
        for (int64_t r = 0; r < g->h; r++) {
            const uint16_t *src = x + ((n * g->c + c) * g->h + r) * g->w;
            float *dst = xp + (c * hp + r + g->pad_h) * wp + g->pad_w;
            for (int64_t q = 0; q < g->w; q++) {
                dst[q] = cx_bf16_to_f32_inline(src[q]);
                special |= (uint16_t)((src[q] & 0x7f80u) == 0x7f80u);
            }
        }
    for (int64_t jj = 1; jj < image_copies(g, j->dir); jj++) {
        float *copy = xp + jj * room;
        memcpy(copy, xp + jj, sizeof *xp * (size_t)(room - jj));
        memset(copy + room - jj, 0, sizeof *xp * (size_t)jj);
    }
    return !special;
}

/* VEC values rounded to bf16 as cx_f32_to_bf16_inline does (to nearest
 * even, a NaN kept quiet), in vector lanes */
static inline __attribute__((always_inline)) void round_bf16_bits(vu *h, const vu *f32_bits)
{
    const vu u = *f32_bits;
    vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    vu even = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    *h = (even & ~nan) | (((u >> 16) | 0x40u) & nan);
}

/* outputs [q0, q0 + lanes) of one row from their f32 sums: rounded once,
 * then the epilogue as cx_bf16_add_bias_inline computes it (+ the bf16
 * bias, rounded, relu with NaN to 0) */
static inline __attribute__((always_inline)) void store_row(uint16_t *y, const float *sums, int lanes, bool add_bias,
                                                            bool relu, float bias)
{
    vu u;
    memcpy(&u, sums, sizeof u);
    vu h;
    round_bf16_bits(&h, &u);
    if (add_bias) {
        vu hb = h << 16;
        vf f;
        memcpy(&f, &hb, sizeof f);
        f += bias;
        memcpy(&u, &f, sizeof u);
        round_bf16_bits(&h, &u);
        if (relu) {
            vu back = h << 16;
            memcpy(&f, &back, sizeof f);
            h &= (vu)(f > 0.0f);
        }
    }
    vh out = __builtin_convertvector(h, vh);
    if (lanes == VEC) {
        memcpy(y, &out, sizeof out);
    } else {
        uint16_t part[VEC];
        memcpy(part, &out, sizeof out);
        for (int l = 0; l < lanes; l++) y[l] = part[l];
    }
}

/* Output channels [o0, o0 + OB) of image n (xp): OB independent sums per
 * vector of the plane, over the window in registers with AVX-512 (a sum
 * kept in memory waited for its last store at every term, one alone in a
 * register for its last FMA; with AVX2 a vector is two registers and
 * some sums spill), into OB planes, then rounded row by row. K is a
 * constant where inlined for the common window. */
static inline __attribute__((always_inline)) void forward_block(const direct_job *j, const float *xp, float *planes,
                                                                int64_t n, int64_t o0, const int64_t k)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, ob = min64(OB, g->o - o0), room = plane_room(g, 0), stride = plane_stride(g);
    float w[DIRECT_MAX_K][OB] = { { 0 } }, bias[OB] = { 0 };
    for (int64_t b = 0; b < ob; b++) {
        for (int64_t t = 0; t < k; t++) w[t][b] = cx_bf16_to_f32_inline(j->w[(o0 + b) * k + t]);
        if (j->epi && j->epi->bias) bias[b] = cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(j->epi->bias[o0 + b]));
    }
    for (int64_t p0 = 0; p0 < room; p0 += VEC) {
        vf a[OB];
        for (int b = 0; b < OB; b++) a[b] = (vf){ 0 };
        for (int64_t t = 0; t < k; t++) {
            vf v;
            memcpy(&v, xp + p0 + j->off[t], sizeof v);
            for (int b = 0; b < OB; b++) a[b] += w[t][b] * v;
        }
        for (int b = 0; b < OB; b++) memcpy(planes + b * stride + p0, &a[b], sizeof a[b]);
    }
    /* a row's last vector is stored whole where it ends inside the plane:
     * what spills into the next rows is written over by them right after;
     * nothing spills past the plane (the next may be another thread's) */
    const int64_t plane = g->oh * ow, oh = g->oh, wp = j->wp;
    /* in locals: every store (a memcpy) may alias the job, so its fields
     * were read again at each */
    const bool add_bias = j->epi && j->epi->bias, relu = add_bias && j->epi->relu;
    uint16_t *const y = j->out + (n * g->o + o0) * plane;
    for (int64_t b = 0; b < ob; b++)
        for (int64_t r = 0; r < oh; r++)
            for (int64_t q0 = 0; q0 < ow; q0 += VEC)
                store_row(y + (b * oh + r) * ow + q0, planes + b * stride + r * wp + q0,
                          r * ow + q0 + VEC <= plane ? VEC : (int)min64(VEC, ow - q0), add_bias, relu, bias[b]);
}

/* image n's output planes, every channel */
CX_HOT static void forward_image(const direct_job *j, float *xp, float *planes, int64_t n)
{
    (void)widen_padded(xp, j->x, j, n);   /* a column past a row's end is never stored */
    for (int64_t o0 = 0; o0 < j->g->o; o0 += OB) {
        if (j->k == 9) forward_block(j, xp, planes, n, o0, 9);
        else forward_block(j, xp, planes, n, o0, j->k);
    }
}

/* n bf16 values widened into dst: whole vectors, the last one
 * overlapping the one before (element by element, dy's rows had taken a
 * quarter of the weight gradient's time) */
static inline __attribute__((always_inline)) void widen_row(float *restrict dst, const uint16_t *restrict src, int64_t n)
{
    if (n < VEC) {
        for (int64_t q = 0; q < n; q++) dst[q] = cx_bf16_to_f32_inline(src[q]);
        return;
    }
    for (int64_t q = 0;; q += VEC) {
        if (q + VEC > n) q = n - VEC;
        vh h;
        memcpy(&h, src + q, sizeof h);
        const vu w = __builtin_convertvector(h, vu) << 16;
        memcpy(dst + q, &w, sizeof w);
        if (q + VEC == n) return;
    }
}

/* Image n's terms of dw for output channels [o0, o1), added into sums (a
 * vector per channel and term): dy's plane widened into d with the padded
 * row stride (its zeros between rows set once), then the K sums along it, in registers
 * with AVX-512 (with AVX2, 9 sums of two registers each spill some). */
static inline __attribute__((always_inline)) void weight_image(const direct_job *j, const float *xp, float *d,
                                                               float *sums, int64_t n, int64_t o0, int64_t o1,
                                                               const int64_t k)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, room = plane_room(g, 2);
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t r = 0; r < g->oh; r++) widen_row(d + r * j->wp, j->dy + ((n * g->o + o) * g->oh + r) * ow, ow);
        float *s = sums + (o - o0) * k * VEC;
        vf a[DIRECT_MAX_K];
        for (int64_t t = 0; t < k; t++) memcpy(&a[t], s + t * VEC, sizeof a[t]);
        for (int64_t p0 = 0; p0 < room; p0 += VEC) {
            vf dv;
            memcpy(&dv, d + p0, sizeof dv);
            for (int64_t t = 0; t < k; t++) {
                vf v;
                memcpy(&v, xp + p0 + j->off[t], sizeof v);
                a[t] += dv * v;
            }
        }
        for (int64_t t = 0; t < k; t++) memcpy(s + t * VEC, &a[t], sizeof a[t]);
    }
}

/* weight_image for an image with an inf or a NaN: a column past a row's
 * end reads the next row's values, and its zero dy times an inf would be
 * a NaN no output has; there the products are masked instead. */
static void weight_image_masked(const direct_job *j, const float *xp, float *d, float *sums, int64_t n, int64_t o0,
                                int64_t o1)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, room = plane_room(g, 2), k = j->k;
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t r = 0; r < g->oh; r++) widen_row(d + r * j->wp, j->dy + ((n * g->o + o) * g->oh + r) * ow, ow);
        float *s = sums + (o - o0) * k * VEC;
        for (int64_t p = 0; p < room; p++) {
            if (p % j->wp >= ow || p >= g->oh * j->wp) continue;
            for (int64_t t = 0; t < k; t++) s[t * VEC + p % VEC] += d[p] * xp[p + j->off[t]];
        }
    }
}

/* dw of output channels [o0, o1): the images in order, then each term's
 * lanes in order */
CX_HOT static void weight_channels(const direct_job *j, float *xp, float *d, float *sums, int64_t o0, int64_t o1)
{
    const cx_conv_geom *g = j->g;
    const int64_t k = j->k;
    memset(sums, 0, sizeof *sums * (size_t)((o1 - o0) * k * VEC));
    /* the columns past each row's end and the plane's tail stay zero:
     * every plane after writes only its rows' outputs */
    memset(d, 0, sizeof *d * (size_t)plane_room(g, 2));
    for (int64_t n = 0; n < g->n; n++) {
        if (!widen_padded(xp, j->x, j, n)) weight_image_masked(j, xp, d, sums, n, o0, o1);
        else if (k == 9) weight_image(j, xp, d, sums, n, o0, o1, 9);
        else weight_image(j, xp, d, sums, n, o0, o1, k);
    }
    for (int64_t o = o0; o < o1; o++)
        for (int64_t t = 0; t < k; t++) {
            float total = 0.0f;
            for (int l = 0; l < VEC; l++) total += sums[((o - o0) * k + t) * VEC + l];
            j->out[o * k + t] = cx_f32_to_bf16_inline(total);
        }
}

static void direct_each(void *p, int64_t tid, int64_t nthreads)
{
    direct_job *j = p;
    const int64_t lanes = min64(j->lanes, nthreads);
    if (tid >= lanes) return;
    float *xp = j->lanes_base + (size_t)tid * (size_t)j->lane_floats;
    if (j->dir == 2) {
        /* a fixed split of the channels: each channel's sum has one order */
        const int64_t o = j->g->o;
        float *d = xp + image_copies(j->g, 2) * image_room(j->g, 2);
        weight_channels(j, xp, d, d + plane_room(j->g, 2), o * tid / lanes, o * (tid + 1) / lanes);
        return;
    }
    for (;;) {
        int64_t n = cx_claims_next(&j->claims, tid);
        if (n < 0) return;
        forward_image(j, xp, xp + image_room(j->g, 0), n);
    }
}

void cx_conv2d_bf16_direct(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                           const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes)
{
    CX_ASSERT(cx_conv2d_bf16_direct_applies(g, dir));
    direct_job j = { .g = g, .dir = dir, .out = out, .x = in0, .w = dir == 0 ? in1 : NULL, .dy = dir == 2 ? in1 : NULL,
                     .epi = epi, .lane_floats = lane_floats(g, dir), .k = g->c * g->kh * g->kw,
                     .wp = row_stride(g, dir) };
    const int64_t hp = g->h + 2 * g->pad_h;
    for (int64_t c = 0, t = 0; c < g->c; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t jj = 0; jj < g->kw; jj++)
                j.off[t++] = dir == 2 ? jj * image_room(g, 2) + (c * hp + i) * j.wp : (c * hp + i) * j.wp + jj;
    uintptr_t p = ((uintptr_t)scratch + DIRECT_ALIGN - 1) & ~(uintptr_t)(DIRECT_ALIGN - 1);
    j.lanes_base = (float *)p;
    size_t usable = scratch_bytes > (size_t)(p - (uintptr_t)scratch) ? scratch_bytes - (size_t)(p - (uintptr_t)scratch) : 0;
    j.lanes = min64(work_items(g, dir), (int64_t)(usable / sizeof(float) / (size_t)j.lane_floats));
    CX_ASSERT(j.lanes >= 1);   /* the compiler sized it for one lane at least */
    cx_claims_init(&j.claims, g->n, min64(j.lanes, cx_pool_threads()));
    cx_pool_run_each(direct_each, &j);
}
