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

/* VEC: the layouts' unit in floats (the planes' room, the weight
 * gradient's padded rows and its lane sums per term), whatever the vector
 * width the loops run at; OB: the forward's output channels at once */
enum { DIRECT_MAX_K = 16, DIRECT_ALIGN = 64, VEC = 16, OB = 8 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

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

typedef struct direct_job direct_job;
struct direct_job {
    /* the vector loops at the width cx_isa_active() allows */
    void (*forward_image)(const direct_job *j, float *xp, float *planes, int64_t n);
    void (*weight_channels)(const direct_job *j, float *xp, float *d, float *sums, int64_t o0, int64_t o1);
    const cx_conv_geom *g;
    int dir;
    uint16_t *out;
    const uint16_t *x, *w, *dy;   /* dy: the weight gradient's */
    const cx_bf16_epi *epi;
    float *lanes_base;
    int64_t lanes, lane_floats, k, wp;
    int64_t off[DIRECT_MAX_K];      /* term t's offset in the lane's image (copies), from its output's pixel */
    cx_claims claims;   /* the forward's images */
};

/* weight_image for an image with an inf or a NaN: a column past a row's
 * end reads the next row's values, and its zero dy times an inf would be
 * a NaN no output has; there the products are masked instead. */
static void weight_image_masked(const direct_job *j, const float *xp, float *d, float *sums, int64_t n, int64_t o0,
                                int64_t o1)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, room = plane_room(g, 2), k = j->k;
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t r = 0; r < g->oh; r++) cx_bf16_widen_row(d + r * j->wp, j->dy + ((n * g->o + o) * g->oh + r) * ow, ow);
        float *s = sums + (o - o0) * k * VEC;
        for (int64_t p = 0; p < room; p++) {
            if (p % j->wp >= ow || p >= g->oh * j->wp) continue;
            for (int64_t t = 0; t < k; t++) s[t * VEC + p % VEC] += d[p] * xp[p + j->off[t]];
        }
    }
}

/* The loops, once per width (conv_direct_bf16_width.h says why); off x86
 * only the baseline's */
#define WIDTH_FILE "conv_direct_bf16_width.h"
#include "each_width.h"

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
        j->weight_channels(j, xp, d, d + plane_room(j->g, 2), o * tid / lanes, o * (tid + 1) / lanes);
        return;
    }
    for (;;) {
        int64_t n = cx_claims_next(&j->claims, tid);
        if (n < 0) return;
        j->forward_image(j, xp, xp + image_room(j->g, 0), n);
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
    j.forward_image = CX_BY_WIDTH(forward_image);
    j.weight_channels = CX_BY_WIDTH(weight_channels);
    uintptr_t p = ((uintptr_t)scratch + DIRECT_ALIGN - 1) & ~(uintptr_t)(DIRECT_ALIGN - 1);
    j.lanes_base = (float *)p;
    size_t usable = scratch_bytes > (size_t)(p - (uintptr_t)scratch) ? scratch_bytes - (size_t)(p - (uintptr_t)scratch) : 0;
    j.lanes = min64(work_items(g, dir), (int64_t)(usable / sizeof(float) / (size_t)j.lane_floats));
    CX_ASSERT(j.lanes >= 1);   /* the compiler sized it for one lane at least */
    cx_claims_init(&j.claims, g->n, min64(j.lanes, cx_pool_threads()));
    cx_pool_run_each(direct_each, &j);
}
