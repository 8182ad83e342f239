/* Max and average 2-D pooling, forward and backward, with PyTorch's
 * semantics (floor output size, max padding = -inf, avg divisor kh*kw).
 * Every (image, channel) plane is independent, so the pool splits the
 * N*C planes and each output element is produced by one thread in a fixed
 * order: backward passes need no atomics and are deterministic. */
#include "kernels.h"
#include "pool.h"

#include <math.h>
#include <string.h>

/* Floats touched per pool task before splitting pays off. */
#define POOL_GRAIN_FLOATS 16384

bool cx_pool_geom_finish(cx_pool_geom *g)
{
    if (!g) return false;
    if (g->n <= 0 || g->c <= 0 || g->h <= 0 || g->w <= 0) return false;
    if (g->kh <= 0 || g->kw <= 0 || g->sh <= 0 || g->sw <= 0 || g->ph < 0 || g->pw < 0) return false;
    /* PyTorch's rule; it also guarantees every window holds an input
     * element, so a max is always defined. */
    if (g->ph > g->kh / 2 || g->pw > g->kw / 2) return false;
    int64_t room_h = g->h + 2 * (int64_t)g->ph - g->kh;
    int64_t room_w = g->w + 2 * (int64_t)g->pw - g->kw;
    if (room_h < 0 || room_w < 0) return false;
    g->oh = room_h / g->sh + 1;
    g->ow = room_w / g->sw + 1;
    return g->oh > 0 && g->ow > 0;
}

typedef struct {
    const cx_pool_geom *g;
    float *out;
    const float *x;
    const float *dy;
} pool_job;

/* The clipped window of output (oh, ow): rows [h0, h1), cols [w0, w1). */
typedef struct {
    int64_t h0, h1, w0, w1;
} window;

static window window_at(const cx_pool_geom *g, int64_t oh, int64_t ow)
{
    window r;
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    r.h0 = hs < 0 ? 0 : hs;
    r.w0 = ws < 0 ? 0 : ws;
    r.h1 = hs + g->kh > g->h ? g->h : hs + g->kh;
    r.w1 = ws + g->kw > g->w ? g->w : ws + g->kw;
    return r;
}

/* Index of the window's maximum within the plane. Scanning row-major with
 * a strict '>' keeps the first of equal maxima; a NaN is taken (and a later
 * NaN replaces it), so NaN propagates as in PyTorch. Starting from the
 * first element makes an all -inf window pick that element. */
static int64_t argmax_window(const float *plane, int64_t w, window r)
{
    int64_t best = r.h0 * w + r.w0;
    float m = plane[best];
    for (int64_t ih = r.h0; ih < r.h1; ih++)
        for (int64_t iw = r.w0; iw < r.w1; iw++) {
            float v = plane[ih * w + iw];
            if (v > m || isnan(v)) {
                m = v;
                best = ih * w + iw;
            }
        }
    return best;
}

static void max_fwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        float *y = j->out + t * out_plane;
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++)
                y[oh * g->ow + ow] = x[argmax_window(x, g->w, window_at(g, oh, ow))];
    }
}

static void max_bwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        const float *dy = j->dy + t * out_plane;
        float *dx = j->out + t * in_plane;
        memset(dx, 0, sizeof(float) * (size_t)in_plane);
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++)
                dx[argmax_window(x, g->w, window_at(g, oh, ow))] += dy[oh * g->ow + ow];
    }
}

static void avg_fwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        float *y = j->out + t * out_plane;
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++) {
                window r = window_at(g, oh, ow);
                float s = 0.0f;
                for (int64_t ih = r.h0; ih < r.h1; ih++)
                    for (int64_t iw = r.w0; iw < r.w1; iw++) s += x[ih * g->w + iw];
                y[oh * g->ow + ow] = s * inv;
            }
    }
}

static void avg_bwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (int64_t t = begin; t < end; t++) {
        const float *dy = j->dy + t * out_plane;
        float *dx = j->out + t * in_plane;
        memset(dx, 0, sizeof(float) * (size_t)in_plane);
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++) {
                window r = window_at(g, oh, ow);
                float v = dy[oh * g->ow + ow] * inv;
                for (int64_t ih = r.h0; ih < r.h1; ih++)
                    for (int64_t iw = r.w0; iw < r.w1; iw++) dx[ih * g->w + iw] += v;
            }
    }
}

static void run_planes(const cx_pool_geom *g, cx_range_fn fn, float *out, const float *x, const float *dy)
{
    pool_job j = { .g = g, .out = out, .x = x, .dy = dy };
    int64_t per_plane = g->h * g->w + g->oh * g->ow * g->kh * g->kw;
    int64_t grain = POOL_GRAIN_FLOATS / (per_plane > 0 ? per_plane : 1);
    cx_pool_parallel_for(g->n * g->c, grain > 1 ? grain : 1, fn, &j);
}

void cx_max_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g)
{
    run_planes(g, max_fwd_range, y, x, NULL);
}

void cx_max_pool2d_bwd(float *dx, const float *x, const float *dy, const cx_pool_geom *g)
{
    run_planes(g, max_bwd_range, dx, x, dy);
}

void cx_avg_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g)
{
    run_planes(g, avg_fwd_range, y, x, NULL);
}

void cx_avg_pool2d_bwd(float *dx, const float *dy, const cx_pool_geom *g)
{
    run_planes(g, avg_bwd_range, dx, NULL, dy);
}
