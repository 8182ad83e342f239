/* The executor: runs an executable's kernels in order. Fused kernels are
 * SSA programs evaluated a block of CX_BLK elements at a time, so every
 * op is a tight loop the compiler vectorizes; blocks are split across the
 * worker pool. Dense ops go to kernels_*.c (OpenBLAS). */
#include "runtime.h"
#include "backend.h"
#include "buffer.h"
#include "philox.h"
#include "obs.h"
#include "pool.h"
#include "vmath.h"

#include <math.h>
#include <pthread.h>

typedef struct {
    const cx_executable *e;
    void **slot_ptr;
    const double *rt_f;
    const int64_t *rt_i;
} run_ctx;

static inline bool is_float_class(int dt) { return dt == CX_F32 || dt == CX_BF16; }

/* ---- program evaluation ---------------------------------------------------------- */

typedef union { float f[CX_BLK]; int64_t i[CX_BLK]; } reg_t;

static inline int64_t view_base(const cx_view *v, const int64_t *idx, int nd, int64_t j0)
{
    int64_t a = v->offset;
    for (int d = 0; d < nd - 1; d++) a += idx[d] * v->strides[d];
    if (nd > 0) a += j0 * v->strides[nd - 1];
    return a;
}

/* lanes [jlo, jhi) are valid; returns false if the whole block is masked */
static inline bool view_lanes(const cx_view *v, const int64_t *idx, int nd, int64_t j0, int len, int *jlo, int *jhi)
{
    *jlo = 0;
    *jhi = len;
    if (!v->masked) return true;
    for (int d = 0; d < nd - 1; d++) if (idx[d] < v->lo[d] || idx[d] >= v->hi[d]) return false;
    if (nd > 0) {
        int64_t lo = v->lo[nd - 1] - j0, hi = v->hi[nd - 1] - j0;
        if (lo > 0) *jlo = lo > len ? len : (int)lo;
        if (hi < len) *jhi = hi < 0 ? 0 : (int)hi;
    } else if (v->hi[0] <= v->lo[0]) {
        return false;
    }
    return *jlo < *jhi;
}

static inline float bf16_round(float x) { return cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(x)); }

CX_HOT static void load_block(reg_t *r, const void *base, int dt, const cx_view *v, const int64_t *idx, int nd, int64_t j0, int len)
{
    int jlo, jhi;
    bool any = view_lanes(v, idx, nd, j0, len, &jlo, &jhi);
    bool fc = is_float_class(dt);
    if (!any) {
        if (fc) for (int j = 0; j < len; j++) r->f[j] = 0;
        else for (int j = 0; j < len; j++) r->i[j] = 0;
        return;
    }
    if (fc) { for (int j = 0; j < jlo; j++) r->f[j] = 0; for (int j = jhi; j < len; j++) r->f[j] = 0; }
    else { for (int j = 0; j < jlo; j++) r->i[j] = 0; for (int j = jhi; j < len; j++) r->i[j] = 0; }
    int64_t a = view_base(v, idx, nd, j0);
    int64_t s = nd > 0 ? v->strides[nd - 1] : 0;
    switch (dt) {
    case CX_F32: {
        const float *p = (const float *)base + a;
        if (s == 1) for (int j = jlo; j < jhi; j++) r->f[j] = p[j];
        else if (s == 0) { float x = p[0]; for (int j = jlo; j < jhi; j++) r->f[j] = x; }
        else for (int j = jlo; j < jhi; j++) r->f[j] = p[j * s];
        break;
    }
    case CX_BF16: { const uint16_t *p = (const uint16_t *)base + a; for (int j = jlo; j < jhi; j++) r->f[j] = cx_bf16_to_f32_inline(p[j * s]); break; }
    case CX_I32: { const int32_t *p = (const int32_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    case CX_I64: { const int64_t *p = (const int64_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    default: { const uint8_t *p = (const uint8_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    }
}

CX_HOT static void un_float(int op, float *o, const float *a, int len)
{
    switch (op) {
    case OP_NEG: for (int j = 0; j < len; j++) o[j] = -a[j]; break;
    case OP_EXP: for (int j = 0; j < len; j++) o[j] = cx_vexpf(a[j]); break;
    case OP_LOG: for (int j = 0; j < len; j++) o[j] = logf(a[j]); break;
    case OP_SQRT: for (int j = 0; j < len; j++) o[j] = sqrtf(a[j]); break;
    case OP_RSQRT: for (int j = 0; j < len; j++) o[j] = 1.0f / sqrtf(a[j]); break;
    case OP_TANH: for (int j = 0; j < len; j++) o[j] = tanhf(a[j]); break;
    case OP_ERF: for (int j = 0; j < len; j++) o[j] = cx_verff(a[j]); break;
    case OP_ABS: for (int j = 0; j < len; j++) o[j] = fabsf(a[j]); break;
    case OP_SIGN: for (int j = 0; j < len; j++) o[j] = (float)((a[j] > 0) - (a[j] < 0)); break;
    default: CX_ASSERT(!"unary op");
    }
}

CX_HOT static void un_int(int op, int64_t *o, const int64_t *a, int len)
{
    switch (op) {
    case OP_NEG: for (int j = 0; j < len; j++) o[j] = -a[j]; break;
    case OP_ABS: for (int j = 0; j < len; j++) o[j] = a[j] < 0 ? -a[j] : a[j]; break;
    case OP_SIGN: for (int j = 0; j < len; j++) o[j] = (a[j] > 0) - (a[j] < 0); break;
    default: CX_ASSERT(!"integer unary op");
    }
}

CX_HOT static void bin_float(int op, float *o, const float *a, const float *b, int len)
{
    switch (op) {
    case OP_ADD: for (int j = 0; j < len; j++) o[j] = a[j] + b[j]; break;
    case OP_SUB: for (int j = 0; j < len; j++) o[j] = a[j] - b[j]; break;
    case OP_MUL: for (int j = 0; j < len; j++) o[j] = a[j] * b[j]; break;
    case OP_DIV: for (int j = 0; j < len; j++) o[j] = a[j] / b[j]; break;
    case OP_MAX: for (int j = 0; j < len; j++) o[j] = (a[j] != a[j] || a[j] > b[j]) ? a[j] : b[j]; break;
    case OP_MIN: for (int j = 0; j < len; j++) o[j] = (a[j] != a[j] || a[j] < b[j]) ? a[j] : b[j]; break;
    case OP_POW: for (int j = 0; j < len; j++) o[j] = powf(a[j], b[j]); break;
    default: CX_ASSERT(!"binary op");
    }
}

CX_HOT static void bin_int(int op, int64_t *o, const int64_t *a, const int64_t *b, int len)
{
    switch (op) {
    case OP_ADD: for (int j = 0; j < len; j++) o[j] = a[j] + b[j]; break;
    case OP_SUB: for (int j = 0; j < len; j++) o[j] = a[j] - b[j]; break;
    case OP_MUL: for (int j = 0; j < len; j++) o[j] = a[j] * b[j]; break;
    case OP_MAX: for (int j = 0; j < len; j++) o[j] = a[j] > b[j] ? a[j] : b[j]; break;
    case OP_MIN: for (int j = 0; j < len; j++) o[j] = a[j] < b[j] ? a[j] : b[j]; break;
    default: CX_ASSERT(!"integer binary op");
    }
}

CX_HOT static void cmp_block(int op, int64_t *o, const reg_t *a, const reg_t *b, bool fc, int len)
{
    if (fc) {
        switch (op) {
        case OP_LT: for (int j = 0; j < len; j++) o[j] = a->f[j] < b->f[j]; break;
        case OP_LE: for (int j = 0; j < len; j++) o[j] = a->f[j] <= b->f[j]; break;
        default: for (int j = 0; j < len; j++) o[j] = a->f[j] == b->f[j]; break;
        }
    } else {
        switch (op) {
        case OP_LT: for (int j = 0; j < len; j++) o[j] = a->i[j] < b->i[j]; break;
        case OP_LE: for (int j = 0; j < len; j++) o[j] = a->i[j] <= b->i[j]; break;
        default: for (int j = 0; j < len; j++) o[j] = a->i[j] == b->i[j]; break;
        }
    }
}

static inline int64_t wrap_int(int64_t v, int dt)
{
    switch (dt) {
    case CX_I32: return (int32_t)v;
    case CX_U8: return (uint8_t)v;
    case CX_BOOL: return v != 0;
    default: return v;
    }
}

CX_HOT static void cast_block(reg_t *o, int to, const reg_t *a, int from, int len)
{
    bool ff = is_float_class(from), tf = is_float_class(to);
    if (ff && tf) {
        if (to == CX_BF16) for (int j = 0; j < len; j++) o->f[j] = bf16_round(a->f[j]);
        else if (o != a) memcpy(o->f, a->f, sizeof(float) * (size_t)len);
    } else if (ff) {
        if (to == CX_BOOL) for (int j = 0; j < len; j++) o->i[j] = a->f[j] != 0;
        else for (int j = 0; j < len; j++) {
            float x = a->f[j];
            /* truncation toward zero, as torch; NaN/inf become 0 rather than UB */
            int64_t v = (x == x && fabsf(x) < 9.2e18f) ? (int64_t)x : 0;
            o->i[j] = wrap_int(v, to);
        }
    } else if (tf) {
        for (int j = 0; j < len; j++) o->f[j] = (float)a->i[j];
        if (to == CX_BF16) for (int j = 0; j < len; j++) o->f[j] = bf16_round(o->f[j]);
    } else {
        for (int j = 0; j < len; j++) o->i[j] = wrap_int(a->i[j], to);
    }
}

/* Evaluates a program for lanes [j0, j0+len) of the row at outer index idx.
 * @return the result register. */
CX_HOT static reg_t *eval_block(const run_ctx *rc, const cx_program *p, reg_t *regs, const int64_t *idx, int nd, int64_t j0, int len)
{
    for (int n = 0; n < p->n; n++) {
        const cx_pinstr *in = &p->ins[n];
        reg_t *r = &regs[n];
        bool fc = is_float_class(in->dtype);
        switch ((cx_pkind)in->kind) {
        case P_LOAD:
            load_block(r, rc->slot_ptr[in->slot], in->src_dtype, &p->views[in->view], idx, nd, j0, len);
            break;
        case P_CONST:
            if (fc) { float x = (float)in->f; if (in->dtype == CX_BF16) x = bf16_round(x); for (int j = 0; j < len; j++) r->f[j] = x; }
            else { int64_t x = wrap_int((int64_t)in->f, in->dtype); for (int j = 0; j < len; j++) r->i[j] = x; }
            break;
        case P_RT:
            if (fc) { float x = (float)rc->rt_f[in->slot]; for (int j = 0; j < len; j++) r->f[j] = x; }
            else { int64_t x = rc->rt_i[in->slot]; for (int j = 0; j < len; j++) r->i[j] = x; }
            break;
        case P_IOTA: {
            const cx_view *v = &p->views[in->view];
            int64_t a = view_base(v, idx, nd, j0), s = nd > 0 ? v->strides[nd - 1] : 0;
            if (fc) for (int j = 0; j < len; j++) r->f[j] = (float)(a + j * s);
            else for (int j = 0; j < len; j++) r->i[j] = a + j * s;
            break;
        }
        case P_RNG: {
            const cx_view *v = &p->views[in->view];
            int64_t a = view_base(v, idx, nd, j0), s = nd > 0 ? v->strides[nd - 1] : 0;
            uint64_t seed = (uint64_t)rc->rt_i[in->slot], off = (uint64_t)rc->rt_i[in->a];
            if (in->i == 0) for (int j = 0; j < len; j++) r->f[j] = cx_rng_uniform01(seed, off + (uint64_t)(a + j * s));
            else for (int j = 0; j < len; j++) r->f[j] = cx_rng_normal01(seed, off + (uint64_t)(a + j * s));
            break;
        }
        case P_UN:
            if (fc) { un_float(in->op, r->f, regs[in->a].f, len); if (in->dtype == CX_BF16) for (int j = 0; j < len; j++) r->f[j] = bf16_round(r->f[j]); }
            else { un_int(in->op, r->i, regs[in->a].i, len); for (int j = 0; j < len; j++) r->i[j] = wrap_int(r->i[j], in->dtype); }
            break;
        case P_BIN:
            if (in->op == OP_LT || in->op == OP_LE || in->op == OP_EQ) {
                cmp_block(in->op, r->i, &regs[in->a], &regs[in->b], is_float_class(in->src_dtype), len);
            } else if (fc) {
                bin_float(in->op, r->f, regs[in->a].f, regs[in->b].f, len);
                if (in->dtype == CX_BF16) for (int j = 0; j < len; j++) r->f[j] = bf16_round(r->f[j]);
            } else {
                bin_int(in->op, r->i, regs[in->a].i, regs[in->b].i, len);
                for (int j = 0; j < len; j++) r->i[j] = wrap_int(r->i[j], in->dtype);
            }
            break;
        case P_WHERE: {
            const int64_t *c = regs[in->a].i;
            if (fc) { const float *x = regs[in->b].f, *y = regs[in->c].f; for (int j = 0; j < len; j++) r->f[j] = c[j] ? x[j] : y[j]; }
            else { const int64_t *x = regs[in->b].i, *y = regs[in->c].i; for (int j = 0; j < len; j++) r->i[j] = c[j] ? x[j] : y[j]; }
            break;
        }
        case P_CAST:
            cast_block(r, in->dtype, &regs[in->a], p->ins[in->a].dtype, len);
            break;
        case P_RELU: {
            const float *x = regs[in->a].f;
            for (int j = 0; j < len; j++) r->f[j] = x[j] > 0 ? x[j] : 0.0f;
            break;
        }
        case P_POSMASK: {
            const float *x = regs[in->a].f, *g = regs[in->b].f;
            for (int j = 0; j < len; j++) r->f[j] = x[j] > 0 ? g[j] : 0.0f;
            break;
        }
        case P_MASK: {
            int jlo, jhi;
            const reg_t *a = &regs[in->a];
            bool any = view_lanes(&p->views[in->view], idx, nd, j0, len, &jlo, &jhi);
            if (!any) { jlo = 0; jhi = 0; }
            if (fc) {
                float pv = (float)in->f;
                for (int j = 0; j < len; j++) r->f[j] = (j >= jlo && j < jhi) ? a->f[j] : pv;
            } else {
                int64_t pv = (int64_t)in->f;
                for (int j = 0; j < len; j++) r->i[j] = (j >= jlo && j < jhi) ? a->i[j] : pv;
            }
            break;
        }
        }
    }
    return &regs[p->result];
}

CX_HOT static void store_block(void *out, int dt, int64_t off, const reg_t *r, int len)
{
    switch (dt) {
    case CX_F32: memcpy((float *)out + off, r->f, sizeof(float) * (size_t)len); break;
    case CX_BF16: { uint16_t *o = (uint16_t *)out + off; for (int j = 0; j < len; j++) o[j] = cx_f32_to_bf16_inline(r->f[j]); break; }
    case CX_I32: { int32_t *o = (int32_t *)out + off; for (int j = 0; j < len; j++) o[j] = (int32_t)r->i[j]; break; }
    case CX_I64: memcpy((int64_t *)out + off, r->i, sizeof(int64_t) * (size_t)len); break;
    default: { uint8_t *o = (uint8_t *)out + off; for (int j = 0; j < len; j++) o[j] = (uint8_t)r->i[j]; break; }
    }
}

/* per-thread register files, grown on demand */
static _Thread_local reg_t *t_regs;
static _Thread_local int t_nregs;

static reg_t *thread_regs(int n)
{
    if (n > t_nregs) {
        free(t_regs);
        t_regs = aligned_alloc(64, sizeof(reg_t) * (size_t)n);
        t_nregs = t_regs ? n : 0;
    }
    return t_regs;
}

/* ---- fused kernels ----------------------------------------------------------------- */

typedef struct {
    const run_ctx *rc;
    const cx_kernel *k;
    int64_t inner, blocks_per_row;
} fused_job;

static void unravel_outer(const int64_t *shape, int nd, int64_t row, int64_t *idx)
{
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = row % shape[d];
        row /= shape[d];
    }
}

CX_HOT static void fused_range(void *p, int64_t b, int64_t e)
{
    fused_job *j = p;
    const cx_kernel *k = j->k;
    reg_t *regs = thread_regs(k->prog.n);
    if (!regs) return;
    int64_t idx[CX_MAX_DIMS] = { 0 };
    int nd = k->ndim;
    void *out = j->rc->slot_ptr[k->out_slot];
    for (int64_t u = b; u < e; u++) {
        int64_t row = u / j->blocks_per_row, blk = u % j->blocks_per_row;
        unravel_outer(k->shape, nd, row, idx);
        int64_t j0 = blk * CX_BLK;
        int len = (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK);
        reg_t *r = eval_block(j->rc, &k->prog, regs, idx, nd, j0, len);
        store_block(out, k->out_dtype, row * j->inner + j0, r, len);
    }
}

static void run_fused(const run_ctx *rc, const cx_kernel *k)
{
    if (k->out_numel == 0) return;
    int64_t inner = k->ndim > 0 ? k->shape[k->ndim - 1] : 1;
    int64_t rows = inner ? k->out_numel / inner : 0;
    int64_t bpr = (inner + CX_BLK - 1) / CX_BLK;
    fused_job j = { rc, k, inner, bpr };
    /* ~32K elements per chunk keeps the fork cost negligible */
    int64_t units = rows * bpr;
    int64_t grain = (32768 + CX_BLK - 1) / CX_BLK;
    if (inner < CX_BLK) grain = 32768 / (inner ? inner : 1) + 1;
    cx_pool_parallel_for(units, grain, fused_range, &j);
}

/* ---- reductions ------------------------------------------------------------------------ */

typedef struct {
    const run_ctx *rc;
    const cx_kernel *k;
    int64_t outer, inner_rows, inner;   /* reduced part: inner_rows rows of `inner` */
    int nd;
} reduce_job;

/* Sum of a block in double: eight partial sums combined in a fixed order
 * (deterministic, and vectorizable, unlike one running sum). */
CX_HOT static double sum_block(const float *f, int len)
{
    double acc[8] = { 0 };
    int q = 0;
    for (; q + 8 <= len; q += 8)
        for (int l = 0; l < 8; l++) acc[l] += f[q + l];
    for (int l = 0; q < len; q++, l++) acc[l] += f[q];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

CX_HOT static void reduce_one(const reduce_job *j, reg_t *regs, int64_t o, int64_t row_b, int64_t row_e, double *acc_f,
                       int64_t *acc_i, int64_t *best_idx, bool *first)
{
    const cx_kernel *k = j->k;
    int nd = k->ndim;
    int64_t idx[CX_MAX_DIMS] = { 0 };
    /* kept dims: unravel o over shape[0..nkeep) */
    int64_t t = o;
    for (int d = k->nkeep - 1; d >= 0; d--) { idx[d] = t % k->shape[d]; t /= k->shape[d]; }
    bool fc = is_float_class(k->prog.ins[k->prog.result].dtype);
    const cx_pinstr *ld = &k->prog.ins[0];
    const cx_view *v = &k->prog.views[ld->view];
    const bool direct = k->red_op == OP_REDUCE_SUM && k->prog.n == 1 && ld->kind == P_LOAD && ld->dtype == CX_F32 &&
                        ld->src_dtype == CX_F32 && !v->masked && nd > 0 && v->strides[nd - 1] == 1;
    for (int64_t row = row_b; row < row_e; row++) {
        int64_t rr = row;
        for (int d = nd - 2; d >= k->nkeep; d--) { idx[d] = rr % k->shape[d]; rr /= k->shape[d]; }
        if (direct) {
            /* a plain sum of a contiguous f32 row: no copy into registers */
            const float *src = (const float *)j->rc->slot_ptr[ld->slot] + view_base(v, idx, nd, 0);
            for (int64_t j0 = 0; j0 < j->inner; j0 += CX_BLK)
                *acc_f += sum_block(src + j0, (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK));
            continue;
        }
        for (int64_t j0 = 0; j0 < j->inner; j0 += CX_BLK) {
            int len = (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK);
            reg_t *r = eval_block(j->rc, &k->prog, regs, idx, nd, j0, len);
            if (k->red_op == OP_REDUCE_SUM) {
                if (fc) *acc_f += sum_block(r->f, len);
                else { int64_t s = 0; for (int q = 0; q < len; q++) s += r->i[q]; *acc_i += s; }
            } else if (k->red_op == OP_REDUCE_MAX) {
                for (int q = 0; q < len; q++) {
                    if (fc) {
                        double x = r->f[q];
                        /* NaN wins and stays, as torch.max */
                        if (*first) *acc_f = x;
                        else if (*acc_f == *acc_f && (x > *acc_f || x != x)) *acc_f = x;
                    } else if (*first || r->i[q] > *acc_i) {
                        *acc_i = r->i[q];
                    }
                    *first = false;
                }
            } else { /* argmax over the single reduced axis */
                for (int q = 0; q < len; q++) {
                    double x = fc ? r->f[q] : (double)r->i[q];
                    if (*first || x > *acc_f || (x != x && *acc_f == *acc_f)) { *acc_f = x; *best_idx = j0 + q; }
                    *first = false;
                }
            }
        }
    }
}

static void store_scalar(void *out, int dt, int64_t o, double f, int64_t i, bool fc)
{
    switch (dt) {
    case CX_F32: ((float *)out)[o] = (float)(fc ? f : (double)i); break;
    case CX_BF16: ((uint16_t *)out)[o] = cx_f32_to_bf16_inline((float)(fc ? f : (double)i)); break;
    case CX_I32: ((int32_t *)out)[o] = (int32_t)(fc ? (int64_t)f : i); break;
    case CX_I64: ((int64_t *)out)[o] = fc ? (int64_t)f : i; break;
    default: ((uint8_t *)out)[o] = (uint8_t)(fc ? (int64_t)f : i); break;
    }
}

CX_HOT static void reduce_range(void *p, int64_t b, int64_t e)
{
    reduce_job *j = p;
    const cx_kernel *k = j->k;
    reg_t *regs = thread_regs(k->prog.n);
    if (!regs) return;
    void *out = j->rc->slot_ptr[k->out_slot];
    bool fc = is_float_class(k->prog.ins[k->prog.result].dtype);
    for (int64_t o = b; o < e; o++) {
        double af = 0;
        int64_t ai = 0, best = 0;
        bool first = true;
        reduce_one(j, regs, o, 0, j->inner_rows, &af, &ai, &best, &first);
        if (k->red_op == OP_ARGMAX) store_scalar(out, k->out_dtype, o, 0, best, false);
        else store_scalar(out, k->out_dtype, o, af, ai, fc);
    }
}

/* one output, many rows: fixed chunks (deterministic whatever the thread count) */
#define CX_RED_CHUNKS 64
typedef struct { reduce_job *j; double f[CX_RED_CHUNKS]; int64_t i[CX_RED_CHUNKS]; bool any[CX_RED_CHUNKS]; } split_job;

CX_HOT static void reduce_split_range(void *p, int64_t b, int64_t e)
{
    split_job *s = p;
    reg_t *regs = thread_regs(s->j->k->prog.n);
    if (!regs) return;
    for (int64_t c = b; c < e; c++) {
        int64_t rb = s->j->inner_rows * c / CX_RED_CHUNKS, re = s->j->inner_rows * (c + 1) / CX_RED_CHUNKS;
        double af = 0; int64_t ai = 0, best = 0; bool first = true;
        reduce_one(s->j, regs, 0, rb, re, &af, &ai, &best, &first);
        s->f[c] = af; s->i[c] = ai; s->any[c] = !first;
    }
}

/* ---- sums over leading axes (column sums) ---------------------------------------------- */

/* A sum whose reduced axes are not the innermost in memory (a bias
 * gradient: (N, C) -> (C)) would read one strided column per output.
 * Instead the program is evaluated along the last kept axis, contiguous
 * in its inputs, one reduced row after another, into a row of
 * accumulators: the kernel's iteration order permuted so that the last
 * kept axis comes last. Each output is still summed by one thread in a
 * fixed order, so the result does not depend on the thread count. */
typedef struct {
    const run_ctx *rc;
    const cx_kernel *k;
    cx_program prog;          /* k's program over the permuted views */
    int nd;
    int64_t shape[CX_MAX_DIMS];   /* kept[0..nkeep-1), reduced..., kept[nkeep-1] */
    int64_t width, blocks, rows;  /* last kept axis; its blocks; reduced rows */
} colsum_job;

static void permute_view(cx_view *v, const int *perm, int nd)
{
    cx_view o = *v;
    for (int d = 0; d < nd; d++) {
        v->strides[d] = o.strides[perm[d]];
        v->lo[d] = o.lo[perm[d]];
        v->hi[d] = o.hi[perm[d]];
    }
}

CX_HOT static void colsum_range(void *p, int64_t b, int64_t e)
{
    colsum_job *j = p;
    reg_t *regs = thread_regs(j->prog.n);
    if (!regs) return;
    int nd = j->nd, nlead = j->k->nkeep - 1;
    float *out = j->rc->slot_ptr[j->k->out_slot];
    double acc[CX_BLK];
    for (int64_t u = b; u < e; u++) {
        int64_t lead = u / j->blocks, j0 = (u % j->blocks) * CX_BLK;
        int len = (int)(j->width - j0 < CX_BLK ? j->width - j0 : CX_BLK);
        int64_t idx[CX_MAX_DIMS] = { 0 };
        int64_t t = lead;
        for (int d = nlead - 1; d >= 0; d--) { idx[d] = t % j->shape[d]; t /= j->shape[d]; }
        for (int q = 0; q < len; q++) acc[q] = 0;
        for (int64_t row = 0; row < j->rows; row++) {
            int64_t rr = row;
            for (int d = nd - 2; d >= nlead; d--) { idx[d] = rr % j->shape[d]; rr /= j->shape[d]; }
            const reg_t *r = eval_block(j->rc, &j->prog, regs, idx, nd, j0, len);
            for (int q = 0; q < len; q++) acc[q] += r->f[q];
        }
        for (int q = 0; q < len; q++) out[lead * j->width + j0 + q] = (float)acc[q];
    }
}

/* @return whether k was run as a column sum (an f32 sum over axes that are
 * not contiguous, whose last kept axis is contiguous or broadcast in every
 * input). */
static bool try_run_colsum(const run_ctx *rc, const cx_kernel *k)
{
    int nd = k->ndim, nk = k->nkeep;
    if (k->red_op != OP_REDUCE_SUM || k->out_dtype != CX_F32 || nk < 1 || nd <= nk || nd > CX_MAX_DIMS ||
        !is_float_class(k->prog.ins[k->prog.result].dtype) || k->shape[nk - 1] < 8 || k->prog.nviews > 64)
        return false;
    bool strided_inner = false;
    for (int i = 0; i < k->prog.n; i++) {
        const cx_pinstr *in = &k->prog.ins[i];
        if (in->kind != P_LOAD) continue;
        const cx_view *v = &k->prog.views[in->view];
        if (v->strides[nk - 1] > 1 || v->strides[nk - 1] < 0) return false;
        if (v->strides[nd - 1] != 1) strided_inner = true;
    }
    if (!strided_inner) return false;
    int perm[CX_MAX_DIMS];
    for (int d = 0; d < nk - 1; d++) perm[d] = d;
    for (int d = nk; d < nd; d++) perm[d - 1] = d;
    perm[nd - 1] = nk - 1;
    cx_view views[64];
    memcpy(views, k->prog.views, sizeof *views * (size_t)k->prog.nviews);
    for (int i = 0; i < k->prog.nviews; i++) permute_view(&views[i], perm, nd);
    colsum_job j = { .rc = rc, .k = k, .prog = k->prog, .nd = nd, .rows = 1 };
    j.prog.views = views;
    for (int d = 0; d < nd; d++) j.shape[d] = k->shape[perm[d]];
    for (int d = nk - 1; d < nd - 1; d++) j.rows *= j.shape[d];
    j.width = k->shape[nk - 1];
    j.blocks = (j.width + CX_BLK - 1) / CX_BLK;
    int64_t lead = 1;
    for (int d = 0; d < nk - 1; d++) lead *= k->shape[d];
    int64_t work = j.rows * (j.width < CX_BLK ? j.width : CX_BLK);
    cx_pool_parallel_for(lead * j.blocks, work >= 32768 ? 1 : 32768 / (work ? work : 1) + 1, colsum_range, &j);
    return true;
}

static void run_reduce(const run_ctx *rc, const cx_kernel *k)
{
    if (k->out_numel == 0 || try_run_colsum(rc, k)) return;
    int nd = k->ndim;
    int64_t outer = 1, rows = 1, inner = 1;
    for (int d = 0; d < k->nkeep; d++) outer *= k->shape[d];
    if (nd > k->nkeep) {
        inner = k->shape[nd - 1];
        for (int d = k->nkeep; d < nd - 1; d++) rows *= k->shape[d];
    } else {
        inner = 1; /* nothing reduced after size-1 removal */
    }
    reduce_job j = { rc, k, outer, rows, inner, nd };
    bool fc = is_float_class(k->prog.ins[k->prog.result].dtype);
    if (outer == 1 && k->red_op != OP_ARGMAX && rows >= CX_RED_CHUNKS && cx_pool_threads() > 1) {
        split_job s = { .j = &j };
        cx_pool_parallel_for(CX_RED_CHUNKS, 1, reduce_split_range, &s);
        double af = 0; int64_t ai = 0; bool first = true;
        for (int c = 0; c < CX_RED_CHUNKS; c++) {
            if (!s.any[c]) continue;
            if (k->red_op == OP_REDUCE_SUM) { af += s.f[c]; ai += s.i[c]; }
            else {
                if (first || s.f[c] > af || s.f[c] != s.f[c]) af = s.f[c];
                if (first || s.i[c] > ai) ai = s.i[c];
            }
            first = false;
        }
        store_scalar(rc->slot_ptr[k->out_slot], k->out_dtype, 0, af, ai, fc);
        return;
    }
    int64_t work = rows * inner;
    int64_t grain = work >= 32768 ? 1 : 32768 / (work ? work : 1) + 1;
    cx_pool_parallel_for(outer, grain, reduce_range, &j);
}

/* ---- heavy kernels ------------------------------------------------------------------------- */

static void run_epilogue(const run_ctx *rc, const cx_kernel *k)
{
    cx_kernel f = *k;
    f.kind = K_FUSED;
    run_fused(rc, &f);
}

static int64_t prod(const int64_t *s, int a, int b)
{
    int64_t p = 1;
    for (int i = a; i < b; i++) p *= s[i];
    return p;
}

static void run_matmul(const run_ctx *rc, const cx_kernel *k)
{
    const cx_kin *A = &k->in[0], *B = &k->in[1];
    int nd = A->ndim;
    int64_t m = A->shape[nd - 2], kk = A->shape[nd - 1], n = B->shape[nd - 1];
    int64_t batch = prod(A->shape, 0, nd - 2);
    const float *a = (const float *)rc->slot_ptr[A->slot] + A->offset;
    const float *b = (const float *)rc->slot_ptr[B->slot] + B->offset;
    int64_t sa = batch > 1 ? A->batch_stride : 0, sb = batch > 1 ? B->batch_stride : 0;
    cx_matmul_f32(rc->slot_ptr[k->out_slot], a, b, batch, m, n, kk, A->trans, B->trans, sa, sb);
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

static void run_attention(const run_ctx *rc, const cx_kernel *k, void *out, void *scratch)
{
    cx_attn_geom g;
    cx_kernel_attn_geom(k, &g);
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
    if (k->kind == K_LAYER_NORM) cx_layer_norm_fwd(out, xp, w, third, rows, c, (float)k->fval);
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
    const char *in = rc->slot_ptr[x->slot];
    for (int64_t o = 0; o < outer; o++)
        memcpy(out + ((size_t)(o * row + at * inner)) * es, in + (size_t)(o * piece) * es, (size_t)piece * es);
}

/* Collectives over contiguous buffers; non-leading axes go through a
 * rearrangement into (group, ...) blocks. */
static void block_permute(char *dst, const char *src, int64_t outer, int64_t g, int64_t piece, size_t es, bool to_group_major)
{
    /* src (outer, g, piece) <-> dst (g, outer, piece) */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t q = 0; q < g; q++) {
            const char *s = to_group_major ? src + ((o * g + q) * piece) * (int64_t)es : src + ((q * outer + o) * piece) * (int64_t)es;
            char *d = to_group_major ? dst + ((q * outer + o) * piece) * (int64_t)es : dst + ((o * g + q) * piece) * (int64_t)es;
            memcpy(d, s, (size_t)piece * es);
        }
}

static cx_status run_coll(const run_ctx *rc, const cx_kernel *k, void **req_out, bool now)
{
    const cx_comm_backend *be = cx_comm_get();
    const cx_kin *x = &k->in[0];
    int op = k->coll_op;
    int rank = be->rank(be->ctx);
    int gsize = be->world_size(be->ctx);
    const int *group = NULL;
    int64_t groups = CX_ATTR(k, CX_AT_COLL_GROUPS);
    if (groups > 0) {
        group = cx_groups_lookup(groups, rank, &gsize);
        if (!group) { cx_set_last_error("%s: this rank (%d) is in no replica group", cx_op_table[op].name, rank); return CX_ERR_COMM; }
    }
    size_t es = cx_dtype_size((cx_dtype)x->dtype);
    cx_comm_op c = { .dtype = (cx_dtype)x->dtype, .scale = k->fval, .red = (cx_reduce_op)CX_ATTR(k, CX_AT_COLL_REDUCE),
                     .group = group, .group_size = group ? gsize : 0 };
    char *in = rc->slot_ptr[x->slot];
    char *out = rc->slot_ptr[k->out_slot];
    char *scratch = k->scratch_slot >= 0 ? rc->slot_ptr[k->scratch_slot] : NULL;
    int ax = (int)CX_ATTR(k, CX_AT_COLL_AXIS);
    int64_t outer = prod(x->shape, 0, ax);
    *req_out = NULL;
    switch (op) {
    case OP_ALL_REDUCE:
        c.kind = CX_COLL_ALL_REDUCE; c.in = in; c.out = out; c.count = x->numel;
        break;
    case OP_BROADCAST:
        c.kind = CX_COLL_BROADCAST; c.in = in; c.out = out; c.count = x->numel; c.root = (int)CX_ATTR(k, CX_AT_COLL_ROOT);
        break;
    case OP_ALL_GATHER:
        c.kind = CX_COLL_ALL_GATHER; c.in = in; c.count = x->numel;
        c.out = outer == 1 ? out : scratch;
        break;
    case OP_REDUCE_SCATTER:
        c.kind = CX_COLL_REDUCE_SCATTER; c.count = k->out_numel; c.out = out;
        if (outer == 1) c.in = in;
        else { block_permute(scratch, in, outer, gsize, x->numel / outer / gsize, es, true); c.in = scratch; }
        break;
    case OP_ALL_TO_ALL: {
        int sa = ax, ca = (int)CX_ATTR(k, CX_AT_COLL_CONCAT_AXIS);
        /* blocks along the split axis, group-major */
        int64_t so = prod(x->shape, 0, sa), spiece = x->numel / so / gsize;
        block_permute(scratch, in, so, gsize, spiece, es, true);
        char *recv = scratch + x->numel * (int64_t)es;
        c.kind = CX_COLL_ALL_TO_ALL; c.in = scratch; c.out = recv; c.count = x->numel;
        void *req = be->start(be->ctx, &c);
        if (!req) return CX_ERR_COMM;
        cx_status st = be->wait(be->ctx, req);
        if (st != CX_OK) return st;
        /* received block q holds the peer's split slice: shape = x with dim sa / g;
         * place it at position q along the concat axis */
        int64_t bshape[CX_MAX_DIMS];
        memcpy(bshape, x->shape, sizeof bshape);
        bshape[sa] /= gsize;
        int64_t co = prod(bshape, 0, ca), cpiece = (x->numel / gsize) / co;
        block_permute(out, recv, co, gsize, cpiece, es, false);
        return CX_OK;
    }
    default:
        cx_set_last_error("collective: unknown op %d", op);
        return CX_ERR_COMM;
    }
    bool permute_after = op == OP_ALL_GATHER && outer != 1;
    if ((now || permute_after) && be->run) {
        cx_status st = be->run(be->ctx, &c);
        if (st == CX_OK && permute_after) block_permute(out, scratch, outer, gsize, x->numel / outer, es, false);
        return st;
    }
    void *req = be->start(be->ctx, &c);
    if (!req) return CX_ERR_COMM;
    if (permute_after) {
        cx_status st = be->wait(be->ctx, req);
        if (st != CX_OK) return st;
        block_permute(out, scratch, outer, gsize, x->numel / outer, es, false);
        return CX_OK;
    }
    *req_out = req;
    return CX_OK;
}

static cx_status run_heavy(const run_ctx *rc, const cx_kernel *k)
{
    void *out = rc->slot_ptr[k->out_slot];
    void *scratch = k->scratch_slot >= 0 ? rc->slot_ptr[k->scratch_slot] : NULL;
    switch (k->kind) {
    case K_MATMUL: run_matmul(rc, k); break;
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
    case K_GATHER: {
        int ax = (int)CX_ATTR(k, CX_AT_AXIS);
        const cx_kin *src = &k->in[0], *ix = &k->in[1];
        int64_t outer = prod(ix->shape, 0, ax), inner = prod(ix->shape, ax + 1, ix->ndim);
        int64_t bad = cx_gather_f32(out, rc->slot_ptr[src->slot], rc->slot_ptr[ix->slot], outer, src->shape[ax],
                                    ix->shape[ax], inner);
        if (bad) { cx_set_last_error("gather: %lld indices out of range [0, %lld)", (long long)bad, (long long)src->shape[ax]); return CX_ERR_ARG; }
        break;
    }
    case K_SCATTER_ADD: {
        int ax = (int)CX_ATTR(k, CX_AT_AXIS);
        const cx_kin *base = &k->in[0], *ix = &k->in[1], *src = &k->in[2];
        if (rc->slot_ptr[base->slot] != out) memcpy(out, rc->slot_ptr[base->slot], (size_t)base->numel * sizeof(float));
        int64_t outer = prod(ix->shape, 0, ax), inner = prod(ix->shape, ax + 1, ix->ndim);
        int64_t bad = cx_scatter_add_f32(out, rc->slot_ptr[src->slot], rc->slot_ptr[ix->slot], outer, base->shape[ax],
                                         ix->shape[ax], inner);
        if (bad) { cx_set_last_error("scatter_add: %lld indices out of range [0, %lld)", (long long)bad, (long long)base->shape[ax]); return CX_ERR_ARG; }
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

static const char *kernel_kind_name(int kind)
{
    static const char *const names[] = {
        [K_FUSED] = "fused", [K_REDUCE] = "reduce", [K_MATMUL] = "matmul", [K_CONV] = "conv2d",
        [K_CONV_BI] = "conv2d_bwd_input", [K_CONV_BW] = "conv2d_bwd_weight", [K_MAXPOOL] = "max_pool2d",
        [K_MAXPOOL_BWD] = "max_pool2d_bwd", [K_AVGPOOL] = "avg_pool2d", [K_AVGPOOL_BWD] = "avg_pool2d_bwd",
        [K_GATHER] = "gather", [K_SCATTER_ADD] = "scatter_add", [K_CONCAT] = "concat", [K_PAD] = "pad",
        [K_COLL] = "collective", [K_ATTENTION] = "attention", [K_ATTENTION_BWD] = "attention_bwd",
        [K_LAYER_NORM] = "layer_norm", [K_LAYER_NORM_BWD] = "layer_norm_bwd", [K_COPY] = "copy",
    };
    if (kind < 0 || (size_t)kind >= sizeof names / sizeof *names || !names[kind]) return "kernel";
    return names[kind];
}
/* One profiler event for kernel ki (collectives carry their op and bytes). */
static void trace_kernel(const cx_executable *e, int ki, double t0, double t1)
{
    const cx_kernel *k = &e->kernels[ki];
    char args[112];
    if (k->kind == K_COLL) {
        int64_t bytes = k->in[0].numel * (int64_t)cx_dtype_size((cx_dtype)k->in[0].dtype);
        snprintf(args, sizeof args, "\"kernel\": %d, \"bytes\": %lld", ki, (long long)bytes);
        cx_obs_trace("collective", cx_op_table[k->coll_op].name, t0, t1, args);
    } else {
        snprintf(args, sizeof args, "\"kernel\": %d, \"numel\": %lld%s", ki, (long long)k->out_numel,
                 k->has_epilogue ? ", \"epilogue\": true" : "");
        cx_obs_trace("kernel", kernel_kind_name(k->kind), t0, t1, args);
    }
}

cx_status cx_execute(const cx_executable *e, void *const *inputs, const double *rt_f, const int64_t *rt_i,
                     void *const *outputs)
{
    void *small[256];
    void **ptr = e->nslots <= 256 ? small : malloc(sizeof(void *) * (size_t)e->nslots);
    void **reqs = calloc((size_t)e->nkernels + 1, sizeof(void *));
    if (!ptr || !reqs) { if (ptr != small) free(ptr); free(reqs); cx_set_last_error("execute: out of memory"); return CX_ERR_OOM; }
    char *arena = NULL;
    if (e->arena_bytes > 0) {
        arena = cx_arena_get(e->arena_bytes);
        if (!arena) { if (ptr != small) free(ptr); free(reqs); return CX_ERR_OOM; }
    }
    for (int s = 0; s < e->nslots; s++) {
        const cx_slot *sl = &e->slots[s];
        ptr[s] = sl->kind == SLOT_INPUT ? inputs[sl->index] : sl->kind == SLOT_OUTPUT ? outputs[sl->index] : arena + sl->offset;
    }
    run_ctx rc = { e, ptr, rt_f, rt_i };
    const cx_comm_backend *be = cx_comm_get();
    cx_status st = CX_OK;
    /* profiler (trace.c): per-kernel events only while a trace records;
     * a collective's event spans its start to the end of its wait */
    double *coll_t0 = (cx_obs_get() & OBS_TRACE) ? calloc((size_t)e->nkernels + 1, sizeof(double)) : NULL;
    int outstanding = 0;   /* collectives started and not yet waited for */
    /* the desync check: started now, settled before the first collective */
    cx_desync_pending *check = cx_desync_begin_graph(e, &st);
    for (int ki = 0; ki < e->nkernels && st == CX_OK; ki++) {
        if (check && e->kernels[ki].kind == K_COLL) {
            st = cx_desync_end_graph(check, e);
            check = NULL;
            if (st != CX_OK) break;
        }
        /* wait for collectives whose result this kernel needs */
        for (int j = 0; outstanding && j < ki; j++)
            if (reqs[j] && e->kernels[j].wait_at <= ki) {
                cx_status w = be->wait(be->ctx, reqs[j]);
                reqs[j] = NULL;
                outstanding--;
                if (w != CX_OK && st == CX_OK) st = w;
                if (coll_t0) trace_kernel(e, j, coll_t0[j], cx_now());
            }
        if (st != CX_OK) break;
        const cx_kernel *k = &e->kernels[ki];
        double tk = coll_t0 ? cx_now() : 0;
        switch (k->kind) {
        case K_FUSED: run_fused(&rc, k); break;
        case K_REDUCE: run_reduce(&rc, k); break;
        case K_COLL:
            st = run_coll(&rc, k, &reqs[ki], k->wait_at <= ki + 1);
            outstanding += reqs[ki] != NULL;
            break;
        default: st = run_heavy(&rc, k); break;
        }
        if (coll_t0) {
            if (reqs[ki]) coll_t0[ki] = tk;
            else trace_kernel(e, ki, tk, cx_now());
        }
    }
    if (check) {   /* an error came first: the exchange still completes */
        cx_status c = cx_desync_end_graph(check, e);
        if (st == CX_OK) st = c;
    }
    for (int j = 0; j < e->nkernels; j++)
        if (reqs[j]) {
            cx_status w = be->wait(be->ctx, reqs[j]);
            if (w != CX_OK && st == CX_OK) st = w;
            if (coll_t0) trace_kernel(e, j, coll_t0[j], cx_now());
        }
    if (ptr != small) free(ptr);
    free(reqs);
    free(coll_t0);
    return st;
}
