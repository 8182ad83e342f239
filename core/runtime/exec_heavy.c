/* Heavy kernels: dense ops (matmul, convolution, pooling, attention,
 * layer norm) handed to the kernels layer (OpenBLAS and kernels_*.c), and
 * the data movement ops (gather, scatter-add, pad, concat, copy). A fused
 * epilogue program, when the compiler attached one, runs after the kernel
 * over its output. */
#include "exec_internal.h"
#include "kernels.h"

static void run_epilogue(const run_ctx *rc, const cx_kernel *k)
{
    cx_kernel f = *k;
    f.kind = K_FUSED;
    cx_run_fused(rc, &f);
}

/* The bias (f32) or mask (bf16) a bf16 kernel's folded epilogue reads. */
static cx_bf16_epi bf16_epi(const run_ctx *rc, const cx_kernel *k)
{
    const void *p = k->epi != EPI_PROG ? rc->slot_ptr[k->prog.ins[k->epi_load].slot] : NULL;
    return (cx_bf16_epi){ .bias = k->epi == EPI_BIAS || k->epi == EPI_BIAS_RELU ? p : NULL,
                          .relu = k->epi == EPI_BIAS_RELU, .posmask = k->epi == EPI_POSMASK ? p : NULL };
}

static void run_matmul(const run_ctx *rc, const cx_kernel *k, void *scratch)
{
    const cx_kin *A = &k->in[0], *B = &k->in[1];
    int nd = A->ndim;
    int64_t m = A->shape[nd - 2], kk = A->shape[nd - 1], n = B->shape[nd - 1];
    int64_t batch = prod(A->shape, 0, nd - 2);
    const float *a = (const float *)rc->slot_ptr[A->slot] + A->offset;
    const float *b = (const float *)rc->slot_ptr[B->slot] + B->offset;
    int64_t sa = batch > 1 ? A->batch_stride : 0, sb = batch > 1 ? B->batch_stride : 0;
    if (A->dtype == CX_BF16) {
        const uint16_t *ah = (const uint16_t *)rc->slot_ptr[A->slot] + A->offset;
        const uint16_t *bh = (const uint16_t *)rc->slot_ptr[B->slot] + B->offset;
        if (cx_kernel_is_matmul_f32_sums(k)) {   /* its f32 cast folded in: the sums themselves */
            cx_matmul_bf16_f32(rc->slot_ptr[k->out_slot], false, ah, bh, batch, m, n, kk, A->trans, B->trans, sa, sb,
                               scratch, (size_t)k->scratch_bytes);
            return;
        }
        const cx_bf16_epi e = bf16_epi(rc, k);
        cx_matmul_bf16_epi(rc->slot_ptr[k->out_slot], &e, ah, bh, batch, m, n, kk, A->trans, B->trans, sa, sb,
                           scratch, (size_t)k->scratch_bytes);
        return;
    }
    cx_matmul_f32(rc->slot_ptr[k->out_slot], a, b, batch, m, n, kk, A->trans, B->trans, sa, sb);
    if (k->has_epilogue && k->epi != EPI_PROG) {
        /* the epilogue folded (epilogue.c): the interpreter's pass over
         * the output had cost a gpt step's forward products 0.1-0.3 ms
         * each, a plain loop a third of that */
        const int add = k->epi == EPI_BIAS_ADD ? cx_kernel_epi_addend(k) : -1;
        cx_linear_epilogue_f32(rc->slot_ptr[k->out_slot], rc->slot_ptr[k->prog.ins[k->epi_load].slot],
                               add >= 0 ? rc->slot_ptr[k->prog.ins[add].slot] : NULL, k->epi == EPI_BIAS_RELU,
                               batch * m, n);
    }
}

/* The relu-gradient mask a kernel applies itself, or NULL. */
static const float *epi_mask(const run_ctx *rc, const cx_kernel *k)
{
    return k->epi == EPI_POSMASK ? rc->slot_ptr[k->prog.ins[k->epi_load].slot] : NULL;
}

static const float *kin_data(const run_ctx *rc, const cx_kin *x)
{
    return (const float *)rc->slot_ptr[x->slot] + x->view.offset;
}

static const uint16_t *kin_bf16(const run_ctx *rc, const cx_kin *x)
{
    return (const uint16_t *)rc->slot_ptr[x->slot] + x->view.offset;
}

static void run_attention_bf16(const run_ctx *rc, const cx_kernel *k, const cx_attn_geom *g, void *out, void *scratch)
{
    const uint16_t *q = kin_bf16(rc, &k->in[0]), *kk = kin_bf16(rc, &k->in[1]), *v = kin_bf16(rc, &k->in[2]);
    if (k->kind == K_ATTENTION)
        cx_attention_bf16_fwd(out, q, kk, v, g, scratch, (size_t)k->scratch_bytes);
    else
        cx_attention_bf16_bwd(out, q, kk, v, kin_bf16(rc, &k->in[3]), kin_bf16(rc, &k->in[4]), g, scratch,
                              (size_t)k->scratch_bytes);
}

static void run_attention(const run_ctx *rc, const cx_kernel *k, void *out, void *scratch)
{
    cx_attn_geom g;
    cx_kernel_attn_geom(k, &g);
    if (k->in[0].dtype == CX_BF16) { run_attention_bf16(rc, k, &g, out, scratch); return; }
    const float *q = kin_data(rc, &k->in[0]), *kk = kin_data(rc, &k->in[1]), *v = kin_data(rc, &k->in[2]);
    if (k->kind == K_ATTENTION)
        cx_attention_fwd(out, q, kk, v, &g, scratch, (size_t)k->scratch_bytes);
    else
        cx_attention_bwd(out, q, kk, v, kin_data(rc, &k->in[3]), kin_data(rc, &k->in[4]), &g, scratch,
                         (size_t)k->scratch_bytes);
}

static void run_layer_norm(const run_ctx *rc, const cx_kernel *k, void *out, void *scratch)
{
    const cx_kin *x = &k->in[0];
    int64_t c = x->shape[x->ndim - 1], rows = c ? x->numel / c : 0;
    /* inputs: x, w, then b (forward) or dy (backward) */
    const float *xp = rc->slot_ptr[x->slot], *w = rc->slot_ptr[k->in[1].slot], *third = rc->slot_ptr[k->in[2].slot];
    if (k->kind == K_LAYER_NORM && k->out_dtype == CX_BF16)
        cx_layer_norm_fwd_bf16(out, xp, w, third, rows, c, (float)k->fval);
    else if (k->kind == K_LAYER_NORM) cx_layer_norm_fwd(out, xp, w, third, rows, c, (float)k->fval);
    else cx_layer_norm_bwd(out, xp, w, third, rows, c, (float)k->fval, scratch, (size_t)k->scratch_bytes);
}

static void fill_value(void *out, int dt, int64_t n, double v)
{
    switch (dt) {
    case CX_F32: { float x = (float)v; float *o = out; for (int64_t i = 0; i < n; i++) o[i] = x; break; }
    case CX_BF16: { uint16_t x = cx_f32_to_bf16_inline((float)v); uint16_t *o = out; for (int64_t i = 0; i < n; i++) o[i] = x; break; }
    case CX_I32: { int32_t x = (int32_t)v; int32_t *o = out; for (int64_t i = 0; i < n; i++) o[i] = x; break; }
    case CX_I64: { int64_t x = (int64_t)v; int64_t *o = out; for (int64_t i = 0; i < n; i++) o[i] = x; break; }
    default: memset(out, (uint8_t)(dt == CX_BOOL ? v != 0 : (int)v), (size_t)n); break;
    }
}

static void run_pad(const run_ctx *rc, const cx_kernel *k)
{
    const cx_kin *x = &k->in[0];
    int nd = x->ndim;
    size_t es = cx_dtype_size((cx_dtype)k->out_dtype);
    char *out = rc->slot_ptr[k->out_slot];
    const char *in = rc->slot_ptr[x->slot];
    fill_value(out, k->out_dtype, k->out_numel, k->fval);
    int64_t So[CX_MAX_DIMS];
    int64_t acc = 1;
    for (int d = nd - 1; d >= 0; d--) { So[d] = acc; acc *= k->shape[d]; }
    int64_t lo[CX_MAX_DIMS], step[CX_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        lo[d] = CX_ATTR(k, CX_AT_PAD_LO(nd, d));
        step[d] = CX_ATTR(k, CX_AT_PAD_INTERIOR(nd, d)) + 1;
    }
    int64_t idx[CX_MAX_DIMS] = { 0 };
    for (int64_t e = 0; e < x->numel; e++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off += (lo[d] + idx[d] * step[d]) * So[d];
        memcpy(out + off * (int64_t)es, in + e * (int64_t)es, es);
        for (int d = nd - 1; d >= 0; d--) { if (++idx[d] < x->shape[d]) break; idx[d] = 0; }
    }
}

static void run_concat(const run_ctx *rc, const cx_kernel *k)
{
    const cx_kin *x = &k->in[0];
    int ax = (int)CX_ATTR(k, CX_AT_AXIS);
    int64_t at = CX_ATTR(k, CX_AT_CONCAT_OFFSET);
    size_t es = cx_dtype_size((cx_dtype)k->out_dtype);
    int64_t inner = prod(k->shape, ax + 1, k->ndim), outer = prod(k->shape, 0, ax);
    int64_t piece = x->shape[ax] * inner, row = k->shape[ax] * inner;
    char *out = rc->slot_ptr[k->out_slot];
    const char *in = (const char *)rc->slot_ptr[x->slot] + (size_t)x->view.offset * es;
    for (int64_t o = 0; o < outer; o++)
        memcpy(out + ((size_t)(o * row + at * inner)) * es, in + (size_t)(o * piece) * es, (size_t)piece * es);
}


/* A bf16 convolution or gradient, with its folded bias, relu or mask. */
static bool run_conv_bf16(const run_ctx *rc, const cx_kernel *k, void *out, void *scratch)
{
    int dir = k->kind == K_CONV ? 0 : k->kind == K_CONV_BI ? 1 : k->kind == K_CONV_BW ? 2 : -1;
    if (dir < 0 || k->in[0].dtype != CX_BF16) return false;
    cx_conv_geom g;
    cx_kernel_conv_geom(k, &g);
    const cx_bf16_epi e = bf16_epi(rc, k);
    cx_conv2d_bf16(dir, out, rc->slot_ptr[k->in[0].slot], rc->slot_ptr[k->in[1].slot], &g, &e, scratch,
                   (size_t)k->scratch_bytes);
    return true;
}

/* A bf16 pool or its gradient, a max backward with its folded mask. */
static bool run_pool_bf16(const run_ctx *rc, const cx_kernel *k, void *out, void *scratch)
{
    int kind = k->kind == K_MAXPOOL ? CX_POOL_BF16_MAX : k->kind == K_AVGPOOL ? CX_POOL_BF16_AVG
             : k->kind == K_MAXPOOL_BWD ? CX_POOL_BF16_MAX_BWD : k->kind == K_AVGPOOL_BWD ? CX_POOL_BF16_AVG_BWD : -1;
    if (kind < 0 || k->out_dtype != CX_BF16) return false;
    cx_pool_geom g;
    cx_kernel_pool_geom(k, &g);
    const void *x = kind == CX_POOL_BF16_AVG_BWD ? NULL : rc->slot_ptr[k->in[0].slot];
    const void *dy = kind == CX_POOL_BF16_MAX_BWD ? rc->slot_ptr[k->in[1].slot]
                   : kind == CX_POOL_BF16_AVG_BWD ? rc->slot_ptr[k->in[0].slot] : NULL;
    cx_pool2d_bf16(kind, out, x, dy, bf16_epi(rc, k).posmask, &g, scratch, (size_t)k->scratch_bytes);
    return true;
}

/* A scatter-add's output starts as its base: a copy unless it is the
 * same buffer, or one value broadcast (a gather gradient's zeros). */
static void start_from_base(const run_ctx *rc, const cx_kin *base, float *out)
{
    const float *from = rc->slot_ptr[base->slot];
    if (!cx_view_is_identity(&base->view, base->shape, base->ndim)) {
        const float v = from[base->view.offset];
        for (int64_t i = 0; i < base->numel; i++) out[i] = v;
    } else if (from != out) {
        memcpy(out, from, (size_t)base->numel * sizeof(float));
    }
}

/* torch.gather / scatter_add along the axis attribute. The index is
 * contiguous, or one value per row read in place (an embedding's). */
static cx_status run_indexed(const run_ctx *rc, const cx_kernel *k, float *out)
{
    const bool gather = k->kind == K_GATHER;
    const int ax = (int)CX_ATTR(k, CX_AT_AXIS);
    const cx_kin *ix = &k->in[1], *src = &k->in[gather ? 0 : 2], *base = &k->in[0];
    const int64_t other = gather ? src->shape[ax] : base->shape[ax];
    const int64_t outer = prod(ix->shape, 0, ax), inner = prod(ix->shape, ax + 1, ix->ndim);
    const int64_t *index = rc->slot_ptr[ix->slot];
    const float *from = rc->slot_ptr[src->slot];
    if (!gather) start_from_base(rc, base, out);
    int64_t so, sd, bad;
    if (cx_view_is_identity(&ix->view, ix->shape, ix->ndim)) {
        bad = gather ? cx_gather_f32(out, from, index, outer, other, ix->shape[ax], inner)
                     : cx_scatter_add_f32(out, from, index, outer, other, ix->shape[ax], inner);
    } else {
        const bool rows = cx_index_is_rows(ix, ax, &so, &sd);
        CX_ASSERT(rows);   /* the compiler and the cache loader admit no other index view */
        index += ix->view.offset;
        bad = gather ? cx_gather_rows_f32(out, from, index, so, sd, outer, other, ix->shape[ax], inner)
                     : cx_scatter_add_rows_f32(out, from, index, so, sd, outer, other, ix->shape[ax], inner);
    }
    if (bad) {
        cx_set_last_error("%s: %lld indices out of range [0, %lld)", gather ? "gather" : "scatter_add", (long long)bad,
                          (long long)other);
        return CX_ERR_ARG;
    }
    return CX_OK;
}

cx_status cx_run_heavy(const run_ctx *rc, const cx_kernel *k)
{
    void *out = rc->slot_ptr[k->out_slot];
    void *scratch = k->scratch_slot >= 0 ? rc->slot_ptr[k->scratch_slot] : NULL;
    bool bf16 = run_conv_bf16(rc, k, out, scratch) || run_pool_bf16(rc, k, out, scratch);
    switch (bf16 ? -1 : (int)k->kind) {
    case -1: break;
    case K_MATMUL: run_matmul(rc, k, scratch); break;
    case K_CONV: {
        cx_conv_geom g;
        cx_kernel_conv_geom(k, &g);
        const bool bias = k->epi == EPI_BIAS || k->epi == EPI_BIAS_RELU;
        cx_conv2d_fwd(out, rc->slot_ptr[k->in[0].slot], rc->slot_ptr[k->in[1].slot],
                      bias ? rc->slot_ptr[k->prog.ins[k->epi_load].slot] : NULL, k->epi == EPI_BIAS_RELU, &g, scratch,
                      (size_t)k->scratch_bytes);
        break;
    }
    case K_CONV_BI: {
        cx_conv_geom g;
        cx_kernel_conv_geom(k, &g);
        cx_conv2d_bwd_input(out, rc->slot_ptr[k->in[0].slot], rc->slot_ptr[k->in[1].slot], epi_mask(rc, k), &g,
                            scratch, (size_t)k->scratch_bytes);
        break;
    }
    case K_CONV_BW: {
        cx_conv_geom g;
        cx_kernel_conv_geom(k, &g);
        cx_conv2d_bwd_weight(out, rc->slot_ptr[k->in[0].slot], rc->slot_ptr[k->in[1].slot], &g, scratch,
                      (size_t)k->scratch_bytes);
        break;
    }
    case K_MAXPOOL: case K_AVGPOOL: {
        cx_pool_geom g;
        cx_kernel_pool_geom(k, &g);
        if (k->kind == K_MAXPOOL) cx_max_pool2d_fwd(out, rc->slot_ptr[k->in[0].slot], &g);
        else cx_avg_pool2d_fwd(out, rc->slot_ptr[k->in[0].slot], &g);
        break;
    }
    case K_MAXPOOL_BWD: {
        cx_pool_geom g;
        cx_kernel_pool_geom(k, &g);
        cx_max_pool2d_bwd(out, rc->slot_ptr[k->in[0].slot], rc->slot_ptr[k->in[1].slot], epi_mask(rc, k), &g);
        break;
    }
    case K_AVGPOOL_BWD: {
        cx_pool_geom g;
        cx_kernel_pool_geom(k, &g);
        cx_avg_pool2d_bwd(out, rc->slot_ptr[k->in[0].slot], &g);
        break;
    }
    case K_GATHER: case K_SCATTER_ADD: {
        cx_status st = run_indexed(rc, k, out);
        if (st != CX_OK) return st;
        break;
    }
    case K_PAD: run_pad(rc, k); break;
    case K_ATTENTION: case K_ATTENTION_BWD: run_attention(rc, k, out, scratch); break;
    case K_LAYER_NORM: case K_LAYER_NORM_BWD: run_layer_norm(rc, k, out, scratch); break;
    case K_CONCAT: run_concat(rc, k); break;
    case K_COPY: memcpy(out, rc->slot_ptr[k->in[0].slot], (size_t)k->out_numel); break;
    default: CX_ASSERT(!"heavy kernel kind");
    }
    if (k->has_epilogue && k->epi == EPI_PROG) run_epilogue(rc, k);
    return CX_OK;
}
