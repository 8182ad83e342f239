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

/* One output value: the f32 and bf16 forwards share the expression, so
 * the bf16 one stores the f32 one's values rounded, bit for bit (the same
 * contraction into a fused multiply-add in each clone). */
static inline float norm_value(const norm_job *j, const float *x, int64_t e, float mu, float rs)
{
    float v = (x[e] - mu) * rs;
    return v * (j->w ? j->w[e] : 1.0f) + (j->b ? j->b[e] : 0.0f);
}

/* The row loops once per vector width (norm_width.h), picked by
 * cx_isa_active(); off x86 only the baseline's. The row sums keep LANES
 * partial sums, element e in lane e % LANES, folded in halves at the end:
 * one running sum is a chain of dependent adds the compiler may not
 * reorder. The order is fixed, so the bits do not depend on the thread
 * count. */
#define WIDTH_FILE "norm_width.h"
#include "each_width.h"

void cx_layer_norm_fwd(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c, float eps)
{
    norm_job j = { .out = y, .x = x, .w = w, .b = b, .rows = rows, .c = c, .eps = eps };
    if (rows > 0 && c > 0) cx_pool_parallel_for(rows, 16, CX_BY_WIDTH(fwd_rows), &j);
}

void cx_layer_norm_fwd_bf16(uint16_t *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c,
                            float eps)
{
    norm_job j = { .out_bf16 = y, .x = x, .w = w, .b = b, .rows = rows, .c = c, .eps = eps };
    if (rows > 0 && c > 0) cx_pool_parallel_for(rows, 16, CX_BY_WIDTH(fwd_rows), &j);
}

size_t cx_layer_norm_bwd_scratch_bytes(int64_t rows, int64_t c)
{
    return (size_t)((rows + ROW_BLOCK - 1) / ROW_BLOCK) * (size_t)(2 * c) * sizeof(float);
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
    cx_pool_parallel_for(blocks, 1, CX_BY_WIDTH(bwd_blocks), &j);
    for (int64_t b = 0; b < blocks; b++) {
        const float *pw = j.part + b * 2 * c, *pb = pw + c;
        for (int64_t e = 0; e < c; e++) { dw[e] += pw[e]; db[e] += pb[e]; }
    }
}
