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

/* n output lines of len bytes from input lines of len bytes (line i of
 * `in` is the axis' index first + i), a whole line at a time (acc: one
 * line of sums), which the compiler vectorizes: cloned for AVX2 and
 * AVX-512 (chosen at load time), since baseline x86-64 has no 32-bit
 * vector multiply and emulates it. Integer sums: every clone gives the
 * same bytes. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void filter_lines(uint8_t *out, const uint8_t *in, size_t len, const coeffs *c, int n, int first, int32_t *acc)
{
    for (int o = 0; o < n; o++) {
        const int32_t *k = c->k + (size_t)o * (size_t)c->ksize;
        int lo = c->bounds[2 * o] - first, cnt = c->bounds[2 * o + 1];
        for (size_t j = 0; j < len; j++) acc[j] = 1 << (PREC - 1);
        for (int t = 0; t < cnt; t++) {
            const uint8_t *line = in + (size_t)(lo + t) * len;
            int32_t kt = k[t];
            for (size_t j = 0; j < len; j++) acc[j] += line[j] * kt;
        }
        uint8_t *dst = out + (size_t)o * len;
        for (size_t j = 0; j < len; j++) dst[j] = clip8(acc[j]);
    }
}

/* Horizontal pass: rows [y_first, y_first + rows) of the region, the
 * window's ncols columns, into tmp (rows, ncols, 3). Done as lines too,
 * on the region's columns transposed to (cols, rows, 3) and back: the
 * same sums, vectorized. scratch: room for both transposes. */
static void pass_h(uint8_t *tmp, const cx_resample_src *s, const coeffs *h, int ncols, int y_first, int rows,
                   uint8_t *scratch, int32_t *acc)
{
    int x_first = h->bounds[0], cols = h->bounds[2 * (ncols - 1)] + h->bounds[2 * (ncols - 1) + 1] - x_first;
    size_t len = (size_t)rows * 3;
    uint8_t *t = scratch, *tout = scratch + (size_t)cols * len;
    for (int y = 0; y < rows; y++) {
        const uint8_t *row = s->src->px + ((size_t)(s->y0 + y_first + y) * (size_t)s->src->w + (size_t)(s->x0 + x_first)) * 3;
        for (int x = 0; x < cols; x++) memcpy(t + (size_t)x * len + (size_t)y * 3, row + (size_t)x * 3, 3);
    }
    filter_lines(tout, t, len, h, ncols, x_first, acc);
    for (int y = 0; y < rows; y++)
        for (int x = 0; x < ncols; x++)
            memcpy(tmp + ((size_t)y * (size_t)ncols + (size_t)x) * 3, tout + (size_t)x * len + (size_t)y * 3, 3);
}

cx_status cx_resample(cx_rgb8 *dst, const cx_resample_src *s, int out_w, int out_h, int ox, int oy)
{
    coeffs h = { 0 }, v = { 0 };
    if (!coeffs_make(&h, s->w, s->bx0, s->bx1, out_w, ox, dst->w)) return CX_ERR_OOM;
    if (!coeffs_make(&v, s->h, s->by0, s->by1, out_h, oy, dst->h)) { coeffs_free(&h); return CX_ERR_OOM; }
    /* the rows and columns the window's filters read: bounds grow with the output index */
    int y_first = v.bounds[0], rows = v.bounds[2 * (dst->h - 1)] + v.bounds[2 * (dst->h - 1) + 1] - y_first;
    int cols = h.bounds[2 * (dst->w - 1)] + h.bounds[2 * (dst->w - 1) + 1] - h.bounds[0];
    size_t len = (size_t)(rows > dst->w ? rows : dst->w) * 3;
    uint8_t *tmp = malloc((size_t)rows * (size_t)dst->w * 3 + 1);
    /* calloc: GCC 12 cannot see that the transpose fills every byte the filter reads */
    uint8_t *scratch = calloc((size_t)(cols + dst->w) * (size_t)rows * 3 + 1, 1);
    int32_t *acc = malloc(len * sizeof *acc);
    cx_status st = CX_ERR_OOM;
    if (tmp && scratch && acc) {
        pass_h(tmp, s, &h, dst->w, y_first, rows, scratch, acc);
        filter_lines(dst->px, tmp, (size_t)dst->w * 3, &v, dst->h, y_first, acc);
        st = CX_OK;
    }
    free(tmp);
    free(scratch);
    free(acc);
    coeffs_free(&h);
    coeffs_free(&v);
    return st;
}
