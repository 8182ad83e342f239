/* Layer norm over the last dim, forward and backward in one pass each per
 * row, so neither the mean, the variance nor the normalized input is ever
 * written out. The weight and bias gradients sum rows in fixed blocks whose
 * partial sums are added in block order: the same bits whatever the thread
 * count. */
#include "kernels.h"
#include "pool.h"
#include "cx_bf16.h"

#include <math.h>
#include <string.h>

enum { ROW_BLOCK = 32, LANES = 16 };

typedef struct {
    float *out, *part;
    uint16_t *out_bf16;   /* the forward's output rounded to bf16, instead of out */
    const float *x, *w, *b, *dy;
    int64_t rows, c;
    float eps;
} norm_job;

/* The row sums keep LANES partial sums, element e in lane e % LANES, added
 * pairwise at the end: one running sum is a chain of dependent adds that
 * the compiler may not reorder, so it ran scalar, at a quarter of a GPT
 * step's layer-norm time per sum. The order is fixed, so the bits do not
 * depend on the thread count. */
static inline float lanes_total(float *a)
{
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    return a[0];
}

static inline float row_sum(const float *x, int64_t c)
{
    float a[LANES] = { 0 };
    int64_t e = 0;
    for (; e + LANES <= c; e += LANES)
        for (int l = 0; l < LANES; l++) a[l] += x[e + l];
    for (int l = 0; e < c; e++, l++) a[l] += x[e];
    return lanes_total(a);
}

/* mean and 1/std of one row */
static inline void row_stats(const float *x, int64_t c, float eps, float *mean, float *rstd)
{
    float mu = row_sum(x, c) / (float)c, a[LANES] = { 0 };
    int64_t e = 0;
    for (; e + LANES <= c; e += LANES)
        for (int l = 0; l < LANES; l++) { float t = x[e + l] - mu; a[l] += t * t; }
    for (int l = 0; e < c; e++, l++) { float t = x[e] - mu; a[l] += t * t; }
    *mean = mu;
    *rstd = 1.0f / sqrtf(lanes_total(a) / (float)c + eps);
}

/* One output value: the f32 and bf16 forwards share the expression, so
 * the bf16 one stores the f32 one's values rounded, bit for bit (the same
 * contraction into a fused multiply-add in each clone). */
static inline float norm_value(const norm_job *j, const float *x, int64_t e, float mu, float rs)
{
    float v = (x[e] - mu) * rs;
    return v * (j->w ? j->w[e] : 1.0f) + (j->b ? j->b[e] : 0.0f);
}

CX_HOT static void fwd_rows(void *p, int64_t r0, int64_t r1)
{
    const norm_job *j = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->c;
        float mu, rs;
        row_stats(x, j->c, j->eps, &mu, &rs);
        if (j->out_bf16) {
            uint16_t *y = j->out_bf16 + r * j->c;
            for (int64_t e = 0; e < j->c; e++) y[e] = cx_f32_to_bf16_inline(norm_value(j, x, e, mu, rs));
        } else {
            float *y = j->out + r * j->c;
            for (int64_t e = 0; e < j->c; e++) y[e] = norm_value(j, x, e, mu, rs);
        }
    }
}

void cx_layer_norm_fwd(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c, float eps)
{
    norm_job j = { .out = y, .x = x, .w = w, .b = b, .rows = rows, .c = c, .eps = eps };
    if (rows > 0 && c > 0) cx_pool_parallel_for(rows, 16, fwd_rows, &j);
}

void cx_layer_norm_fwd_bf16(uint16_t *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c,
                            float eps)
{
    norm_job j = { .out_bf16 = y, .x = x, .w = w, .b = b, .rows = rows, .c = c, .eps = eps };
    if (rows > 0 && c > 0) cx_pool_parallel_for(rows, 16, fwd_rows, &j);
}

size_t cx_layer_norm_bwd_scratch_bytes(int64_t rows, int64_t c)
{
    return (size_t)((rows + ROW_BLOCK - 1) / ROW_BLOCK) * (size_t)(2 * c) * sizeof(float);
}

/* Elements [e, e + n) of a row's first backward sweep: the lane sums of g
 * and g * xhat, and the row's share of dw and db. */
static inline void bwd_lanes(const norm_job *j, const float *x, const float *dy, float mu, float rs, int64_t e, int n,
                             float *sg, float *sgx, float *dw, float *db)
{
    for (int l = 0; l < n; l++) {
        float xh = (x[e + l] - mu) * rs, g = dy[e + l] * (j->w ? j->w[e + l] : 1.0f);
        sg[l] += g;
        sgx[l] += g * xh;
        dw[e + l] += dy[e + l] * xh;
        db[e + l] += dy[e + l];
    }
}

/* One block of rows: dx, and its partial dw and db. */
CX_HOT static void bwd_block(const norm_job *j, int64_t blk)
{
    const int64_t c = j->c, r1 = (blk + 1) * ROW_BLOCK < j->rows ? (blk + 1) * ROW_BLOCK : j->rows;
    float *dw = j->part + blk * 2 * c, *db = dw + c;
    memset(dw, 0, sizeof *dw * (size_t)(2 * c));
    for (int64_t r = blk * ROW_BLOCK; r < r1; r++) {
        const float *x = j->x + r * c, *dy = j->dy + r * c;
        float *dx = j->out + r * c, mu, rs, sg[LANES] = { 0 }, sgx[LANES] = { 0 };
        row_stats(x, c, j->eps, &mu, &rs);
        int64_t e = 0;
        for (; e + LANES <= c; e += LANES) bwd_lanes(j, x, dy, mu, rs, e, LANES, sg, sgx, dw, db);
        bwd_lanes(j, x, dy, mu, rs, e, (int)(c - e), sg, sgx, dw, db);
        const float mg = lanes_total(sg) / (float)c, mgx = lanes_total(sgx) / (float)c;
        for (int64_t e = 0; e < c; e++) {
            float xh = (x[e] - mu) * rs, g = dy[e] * (j->w ? j->w[e] : 1.0f);
            dx[e] = rs * (g - mg - xh * mgx);
        }
    }
}

static void bwd_blocks(void *p, int64_t b0, int64_t b1)
{
    for (int64_t b = b0; b < b1; b++) bwd_block(p, b);
}

void cx_layer_norm_bwd(float *dxwb, const float *x, const float *w, const float *dy, int64_t rows, int64_t c,
                       float eps, void *scratch, size_t scratch_bytes)
{
    float *dw = dxwb + rows * c, *db = dw + c;
    memset(dw, 0, sizeof *dw * (size_t)(2 * c));
    if (rows <= 0 || c <= 0) return;
    const int64_t blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
    (void)scratch_bytes;   /* sized by cx_layer_norm_bwd_scratch_bytes for these rows */
    norm_job j = { .out = dxwb, .part = scratch, .x = x, .w = w, .dy = dy, .rows = rows, .c = c, .eps = eps };
    cx_pool_parallel_for(blocks, 1, bwd_blocks, &j);
    for (int64_t b = 0; b < blocks; b++) {
        const float *pw = j.part + b * 2 * c, *pb = pw + c;
        for (int64_t e = 0; e < c; e++) { dw[e] += pw[e]; db[e] += pb[e]; }
    }
}
