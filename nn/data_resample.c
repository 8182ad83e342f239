/* PIL's bilinear Image.resize (Pillow's libImaging/Resample.c), rewritten
 * for a window of the output: torchvision resizes PIL images with it, so
 * matching its coefficients and 8-bit fixed-point rounding bit for bit is
 * what makes the eval transform give torchvision's values. */
#include "nn_internal.h"

#include "data_image.h"

#include <math.h>

#define PREC 22   /* Pillow's PRECISION_BITS: 32 - 8 - 2 */

/* One axis: for each output index of the window, the first input index,
 * the count, and ksize fixed-point weights. */
typedef struct {
    int *bounds;   /* (n, 2): first, count */
    int32_t *k;    /* (n, ksize) */
    int ksize;
} coeffs;

static double triangle(double x)
{
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static void coeffs_free(coeffs *c)
{
    free(c->bounds);
    free(c->k);
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for outputs
 * [o0, o0 + n) of out_size, over input [in0, in1) of an axis of in_size.
 * @return false when out of memory. */
static bool coeffs_make(coeffs *c, int in_size, double in0, double in1, int out_size, int o0, int n)
{
    double scale = (in1 - in0) / out_size, fs = scale < 1.0 ? 1.0 : scale, support = fs;
    c->ksize = (int)ceil(support) * 2 + 1;
    c->bounds = malloc((size_t)n * 2 * sizeof *c->bounds);
    c->k = malloc((size_t)n * (size_t)c->ksize * sizeof *c->k);
    double *w = malloc((size_t)c->ksize * sizeof *w);
    if (!c->bounds || !c->k || !w) { free(w); coeffs_free(c); return false; }
    for (int i = 0; i < n; i++) {
        double center = in0 + (o0 + i + 0.5) * scale, sum = 0.0;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int cnt = hi - lo, x = 0;
        for (; x < cnt; x++) sum += w[x] = triangle((x + lo - center + 0.5) / fs);
        for (x = 0; x < cnt; x++) if (sum != 0.0) w[x] /= sum;
        int32_t *k = c->k + (size_t)i * (size_t)c->ksize;
        for (x = 0; x < c->ksize; x++) {
            double v = x < cnt ? w[x] : 0.0;
            k[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PREC) : 0.5 + v * (1 << PREC));
        }
        c->bounds[2 * i] = lo;
        c->bounds[2 * i + 1] = cnt < 0 ? 0 : cnt;
    }
    free(w);
    return true;
}

static uint8_t clip8(int32_t v)
{
    v >>= PREC;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Horizontal pass: rows [y_first, y_first + rows) of the region, the
 * window's columns, into tmp (rows, ncols, 3). */
static void pass_h(uint8_t *tmp, const cx_resample_src *s, const coeffs *h, int ncols, int y_first, int rows)
{
    for (int y = 0; y < rows; y++) {
        const uint8_t *row = s->src->px + ((size_t)(s->y0 + y_first + y) * (size_t)s->src->w + (size_t)s->x0) * 3;
        uint8_t *o = tmp + (size_t)y * (size_t)ncols * 3;
        for (int xx = 0; xx < ncols; xx++) {
            const int32_t *k = h->k + (size_t)xx * (size_t)h->ksize;
            const uint8_t *p = row + (size_t)h->bounds[2 * xx] * 3;
            int cnt = h->bounds[2 * xx + 1];
            int32_t s0 = 1 << (PREC - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < cnt; x++, p += 3) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            o[xx * 3] = clip8(s0), o[xx * 3 + 1] = clip8(s1), o[xx * 3 + 2] = clip8(s2);
        }
    }
}

/* Vertical pass from tmp (whose row 0 is the region's row y_first), a
 * whole row at a time (acc: one row of sums) so the compiler vectorizes it. */
static void pass_v(cx_rgb8 *dst, const uint8_t *tmp, const coeffs *v, int y_first, int32_t *acc)
{
    size_t stride = (size_t)dst->w * 3;
    for (int yy = 0; yy < dst->h; yy++) {
        const int32_t *k = v->k + (size_t)yy * (size_t)v->ksize;
        int lo = v->bounds[2 * yy] - y_first, cnt = v->bounds[2 * yy + 1];
        for (size_t xc = 0; xc < stride; xc++) acc[xc] = 1 << (PREC - 1);
        for (int y = 0; y < cnt; y++) {
            const uint8_t *in = tmp + (size_t)(lo + y) * stride;
            int32_t ky = k[y];
            for (size_t xc = 0; xc < stride; xc++) acc[xc] += in[xc] * ky;
        }
        uint8_t *o = dst->px + (size_t)yy * stride;
        for (size_t xc = 0; xc < stride; xc++) o[xc] = clip8(acc[xc]);
    }
}

cx_status cx_resample(cx_rgb8 *dst, const cx_resample_src *s, int out_w, int out_h, int ox, int oy)
{
    coeffs h = { 0 }, v = { 0 };
    if (!coeffs_make(&h, s->w, s->bx0, s->bx1, out_w, ox, dst->w)) return CX_ERR_OOM;
    if (!coeffs_make(&v, s->h, s->by0, s->by1, out_h, oy, dst->h)) { coeffs_free(&h); return CX_ERR_OOM; }
    /* the rows the window's vertical filters read: bounds grow with the output row */
    int y_first = v.bounds[0], y_last = v.bounds[2 * (dst->h - 1)] + v.bounds[2 * (dst->h - 1) + 1];
    int rows = y_last > y_first ? y_last - y_first : 1;
    uint8_t *tmp = malloc((size_t)rows * (size_t)dst->w * 3);
    int32_t *acc = malloc((size_t)dst->w * 3 * sizeof *acc);
    if (!tmp || !acc) { free(tmp); free(acc); coeffs_free(&h); coeffs_free(&v); return CX_ERR_OOM; }
    pass_h(tmp, s, &h, dst->w, y_first, y_last - y_first);
    pass_v(dst, tmp, &v, y_first, acc);
    free(tmp);
    free(acc);
    coeffs_free(&h);
    coeffs_free(&v);
    return CX_OK;
}
