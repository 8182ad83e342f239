/* Kernels that are programs: fused kernels and reductions. A program is
 * SSA over registers of CX_BLK lanes, evaluated a block at a time, so every
 * instruction is a tight loop the compiler vectorizes; blocks (or rows) are
 * split across the worker pool.
 * The block evaluator and every loop that calls it once per block (fused,
 * reductions, column sums) share this file on purpose: they are CX_HOT
 * statics, so each CPU variant of a loop calls the same variant of the
 * evaluator directly. Called from another file, the evaluator would be an
 * extern ifunc: a PLT hop per block, and GCC 12 exports such a symbol from
 * the library whatever its visibility. */
#include "exec_internal.h"
#include "kernels.h"
#include "philox.h"
#include "pool.h"
#include "vmath.h"

#include <math.h>

static inline bool is_float_class(int dt) { return dt == CX_F32 || dt == CX_BF16; }
static inline bool is_compare(int op) { return op == OP_LT || op == OP_LE || op == OP_EQ; }

/* ---- program evaluation ---------------------------------------------------------- */

typedef union { float f[CX_BLK]; int64_t i[CX_BLK]; } reg_t;

/* What an instruction's readers see: its register, or, for a load of a
 * whole contiguous f32 block, the source buffer itself. Copying such loads
 * into registers was the largest cost of a transformer step's fused
 * kernels (bias, GELU, AdamW): the copy streams the block through a
 * register file that, at 2 KiB a register, does not fit in L1 for long
 * programs. */
typedef struct { const float *f; const int64_t *i; } val_t;

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

static inline float bf16_round(float x) { return cx_bf16_round_inline(x); }

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
    case CX_BF16: {
        const uint16_t *p = (const uint16_t *)base + a;
        if (s == 1) for (int j = jlo; j < jhi; j++) r->f[j] = cx_bf16_to_f32_inline(p[j]);
        else for (int j = jlo; j < jhi; j++) r->f[j] = cx_bf16_to_f32_inline(p[j * s]);
        break;
    }
    case CX_I32: { const int32_t *p = (const int32_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    case CX_I64: { const int64_t *p = (const int64_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    default: { const uint8_t *p = (const uint8_t *)base + a; for (int j = jlo; j < jhi; j++) r->i[j] = p[j * s]; break; }
    }
}

/* The float ops, each a plain loop the compiler vectorizes, in two
 * copies: f32, and bf16, where each result is rounded to bf16 in the same
 * loop (a rounding pass of its own after every instruction had made a
 * bf16 program cost 2-3x the f32 one). R is what a result goes through. */
#define F32_RESULT(x) (x)
#define DEFINE_UN_FLOAT(NAME, R)                                                                               \
    CX_HOT static void NAME(int op, float *o, const float *a, int len)                                         \
    {                                                                                                          \
        switch (op) {                                                                                          \
        case OP_NEG: for (int j = 0; j < len; j++) o[j] = R(-a[j]); break;                                     \
        case OP_EXP: for (int j = 0; j < len; j++) o[j] = R(cx_vexpf(a[j])); break;                           \
        case OP_LOG: for (int j = 0; j < len; j++) o[j] = R(cx_vlogf(a[j])); break;                           \
        case OP_SQRT: for (int j = 0; j < len; j++) o[j] = R(sqrtf(a[j])); break;                             \
        case OP_RSQRT: for (int j = 0; j < len; j++) o[j] = R(1.0f / sqrtf(a[j])); break;                     \
        case OP_TANH: for (int j = 0; j < len; j++) o[j] = R(tanhf(a[j])); break;                             \
        case OP_ERF: for (int j = 0; j < len; j++) o[j] = R(cx_verff(a[j])); break;                           \
        /* as the composite (0.5 x) (1 + erf(x / sqrt 2)) computed, to the bit */                            \
        case OP_GELU:                                                                                          \
            for (int j = 0; j < len; j++) o[j] = R((a[j] * 0.5f) * (cx_verff(a[j] * (float)M_SQRT1_2) + 1.0f)); \
            break;                                                                                             \
        case OP_GELU_GRAD:                                                                                     \
            for (int j = 0; j < len; j++) {                                                                    \
                float x = a[j], cdf = 0.5f * (cx_verff(x * (float)M_SQRT1_2) + 1.0f);                          \
                o[j] = R(cdf + x * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2) * cx_vexpf_nonpos(-0.5f * x * x));           \
            }                                                                                                  \
            break;                                                                                             \
        case OP_ABS: for (int j = 0; j < len; j++) o[j] = R(fabsf(a[j])); break;                              \
        case OP_SIGN: for (int j = 0; j < len; j++) o[j] = R((float)((a[j] > 0) - (a[j] < 0))); break;        \
        default: CX_ASSERT(!"unary op");                                                                       \
        }                                                                                                      \
    }
DEFINE_UN_FLOAT(un_float, F32_RESULT)
DEFINE_UN_FLOAT(un_bf16, bf16_round)

CX_HOT static void un_int(int op, int64_t *o, const int64_t *a, int len)
{
    switch (op) {
    case OP_NEG: for (int j = 0; j < len; j++) o[j] = -a[j]; break;
    case OP_ABS: for (int j = 0; j < len; j++) o[j] = a[j] < 0 ? -a[j] : a[j]; break;
    case OP_SIGN: for (int j = 0; j < len; j++) o[j] = (a[j] > 0) - (a[j] < 0); break;
    default: CX_ASSERT(!"integer unary op");
    }
}

#define DEFINE_BIN_FLOAT(NAME, R)                                                                              \
    CX_HOT static void NAME(int op, float *o, const float *a, const float *b, int len)                         \
    {                                                                                                          \
        switch (op) {                                                                                          \
        case OP_ADD: for (int j = 0; j < len; j++) o[j] = R(a[j] + b[j]); break;                               \
        case OP_SUB: for (int j = 0; j < len; j++) o[j] = R(a[j] - b[j]); break;                               \
        case OP_MUL: for (int j = 0; j < len; j++) o[j] = R(a[j] * b[j]); break;                               \
        case OP_DIV: for (int j = 0; j < len; j++) o[j] = R(a[j] / b[j]); break;                               \
        case OP_MAX: for (int j = 0; j < len; j++) o[j] = R((a[j] != a[j] || a[j] > b[j]) ? a[j] : b[j]); break; \
        case OP_MIN: for (int j = 0; j < len; j++) o[j] = R((a[j] != a[j] || a[j] < b[j]) ? a[j] : b[j]); break; \
        case OP_POW: for (int j = 0; j < len; j++) o[j] = R(powf(a[j], b[j])); break;                          \
        default: CX_ASSERT(!"binary op");                                                                      \
        }                                                                                                      \
    }
DEFINE_BIN_FLOAT(bin_float, F32_RESULT)
DEFINE_BIN_FLOAT(bin_bf16, bf16_round)
#undef DEFINE_UN_FLOAT
#undef DEFINE_BIN_FLOAT
#undef F32_RESULT

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

CX_HOT static void cmp_block(int op, int64_t *o, const val_t *a, const val_t *b, bool fc, int len)
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

CX_HOT static void cast_block(reg_t *o, int to, const val_t *a, int from, int len)
{
    bool ff = is_float_class(from), tf = is_float_class(to);
    if (ff && tf) {
        if (to == CX_BF16) for (int j = 0; j < len; j++) o->f[j] = bf16_round(a->f[j]);
        else if (o->f != a->f) memcpy(o->f, a->f, sizeof(float) * (size_t)len);
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

/* Whether a load reads f32 that is contiguous along the last axis and
 * unmasked: a whole block of it can be read in place. */
static inline bool f32_load_in_place(const cx_program *p, const cx_pinstr *in, int nd)
{
    const cx_view *v = &p->views[in->view];
    return in->src_dtype == CX_F32 && in->dtype == CX_F32 && !v->masked && nd > 0 && v->strides[nd - 1] == 1;
}

/* The source of a load when it can be read in place, else NULL. */
static inline const float *direct_load(const run_ctx *rc, const cx_program *p, const cx_pinstr *in, const int64_t *idx,
                                       int nd, int64_t j0)
{
    if (!f32_load_in_place(p, in, nd)) return NULL;
    return (const float *)rc->slot_ptr[in->slot] + view_base(&p->views[in->view], idx, nd, j0);
}

/* the values of operand a of instruction in (only where it has one) */
#define VA (&vals[in->a])

/* ---- bf16 tables -------------------------------------------------------------------- */
/* A bf16 erf, exp, log, tanh, GELU or GELU gradient of bf16 values reads
 * its results from a table of all 65536 (kernels/bf16_lut.c), filled by
 * un_bf16 itself, so the bits are the loop's. */
static bool has_bf16_lut(int op)
{
    return op == OP_EXP || op == OP_LOG || op == OP_TANH || op == OP_ERF || op == OP_GELU || op == OP_GELU_GRAD;
}

/* Whether instruction a's values are exactly bf16: a load of bf16, a cast
 * to bf16, or a bf16 op that rounds in its loop. The one op eval_block may
 * leave unrounded is the result, whose value only the store reads, and
 * rounds: a table's rounded values store the same bits. */
static bool holds_bf16_values(const cx_program *p, int a)
{
    const cx_pinstr *x = &p->ins[a];
    if (x->dtype != CX_BF16) return false;
    return (x->kind == P_LOAD && x->src_dtype == CX_BF16) || x->kind == P_CAST || x->kind == P_UN ||
           (x->kind == P_BIN && !is_compare(x->op));
}

static void fill_bf16_lut(int op, float *out, const float *in, int n) { un_bf16(op, out, in, n); }

/* The table instruction n of p may read (NULL: compute it). */
static const uint16_t *bf16_lut_for(const cx_program *p, int n)
{
    const cx_pinstr *in = &p->ins[n];
    if (in->dtype != CX_BF16 || !has_bf16_lut(in->op) || !holds_bf16_values(p, in->a)) return NULL;
    return cx_bf16_lut(in->op, fill_bf16_lut);
}

/* Evaluates a program for lanes [j0, j0+len) of the row at outer index idx
 * (constants and runtime scalars are already in place: prog_regs).
 * Instruction `unrounded` (-1: none), a bf16 one whose values the caller
 * rounds as it stores them, is computed in f32 and left unrounded.
 * @return the result's values. */
CX_HOT static val_t eval_block(const run_ctx *rc, const cx_program *p, reg_t *regs, val_t *vals, const int64_t *idx,
                               int nd, int64_t j0, int len, int unrounded)
{
    for (int n = 0; n < p->n; n++) {
        const cx_pinstr *in = &p->ins[n];
        reg_t *r = &regs[n];
        bool fc = is_float_class(in->dtype);
        if (in->kind != P_CONST && in->kind != P_RT) vals[n] = (val_t){ r->f, r->i };
        switch ((cx_pkind)in->kind) {
        case P_LOAD: {
            const float *src = direct_load(rc, p, in, idx, nd, j0);
            if (src) vals[n].f = src;
            else load_block(r, rc->slot_ptr[in->slot], in->src_dtype, &p->views[in->view], idx, nd, j0, len);
            break;
        }
        case P_CONST: case P_RT: break;
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
        case P_UN: {
            const uint16_t *lut = in->dtype == CX_BF16 ? bf16_lut_for(p, n) : NULL;
            if (lut) cx_bf16_lut_apply(r->f, VA->f, lut, len);
            else if (in->dtype == CX_BF16 && n != unrounded) un_bf16(in->op, r->f, VA->f, len);
            else if (fc) un_float(in->op, r->f, VA->f, len);
            else { un_int(in->op, r->i, VA->i, len); for (int j = 0; j < len; j++) r->i[j] = wrap_int(r->i[j], in->dtype); }
            break;
        }
        case P_BIN:
            if (is_compare(in->op)) {
                cmp_block(in->op, r->i, VA, &vals[in->b], is_float_class(in->src_dtype), len);
            } else if (in->dtype == CX_BF16 && n != unrounded) {
                bin_bf16(in->op, r->f, VA->f, vals[in->b].f, len);
            } else if (fc) {
                bin_float(in->op, r->f, VA->f, vals[in->b].f, len);
            } else {
                bin_int(in->op, r->i, VA->i, vals[in->b].i, len);
                for (int j = 0; j < len; j++) r->i[j] = wrap_int(r->i[j], in->dtype);
            }
            break;
        case P_WHERE: {
            const int64_t *c = VA->i;
            if (fc) { const float *x = vals[in->b].f, *y = vals[in->c].f; for (int j = 0; j < len; j++) r->f[j] = c[j] ? x[j] : y[j]; }
            else { const int64_t *x = vals[in->b].i, *y = vals[in->c].i; for (int j = 0; j < len; j++) r->i[j] = c[j] ? x[j] : y[j]; }
            break;
        }
        case P_CAST:
            /* a float register holds f32 values (a bf16 one, values bf16
             * can hold), so a cast to f32 is the operand itself */
            if (in->dtype == CX_F32 && is_float_class(p->ins[in->a].dtype)) vals[n] = *VA;
            else cast_block(r, in->dtype, VA, p->ins[in->a].dtype, len);
            break;
        case P_RELU: {
            const float *x = VA->f;
            for (int j = 0; j < len; j++) r->f[j] = x[j] > 0 ? x[j] : 0.0f;
            break;
        }
        case P_POSMASK: {
            const float *x = VA->f, *g = vals[in->b].f;
            for (int j = 0; j < len; j++) r->f[j] = x[j] > 0 ? g[j] : 0.0f;
            break;
        }
        case P_MASK: {
            int jlo, jhi;
            const val_t *a = VA;
            bool any = view_lanes(&p->views[in->view], idx, nd, j0, len, &jlo, &jhi);
            if (!any) { jlo = 0; jhi = 0; }
            if (fc) {
                /* three plain loops: a select around a load is not vectorized */
                float pv = (float)in->f;
                for (int j = 0; j < jlo; j++) r->f[j] = pv;
                for (int j = jlo; j < jhi; j++) r->f[j] = a->f[j];
                for (int j = jhi; j < len; j++) r->f[j] = pv;
            } else {
                int64_t pv = (int64_t)in->f;
                for (int j = 0; j < len; j++) r->i[j] = (j >= jlo && j < jhi) ? a->i[j] : pv;
            }
            break;
        }
        }
    }
    return vals[p->result];
}
#undef VA

/* A bf16 kernel's result is rounded once, as it is stored. An arithmetic
 * result is computed unrounded for that (eval_block's `unrounded`): the
 * rounding inside a bf16 GELU's loop, and again in the store, had made it
 * 1.75x the f32 GELU (AVX2). A cast or a load of bf16 is bf16 values
 * already, stored by keeping their high halves. */
static bool is_arith(const cx_pinstr *in)
{
    return in->kind == P_UN || (in->kind == P_BIN && !is_compare(in->op));
}

static int unrounded_result(const cx_kernel *k)
{
    const cx_pinstr *in = &k->prog.ins[k->prog.result];
    return k->out_dtype == CX_BF16 && in->dtype == CX_BF16 && is_arith(in) ? k->prog.result : -1;
}

static bool result_is_bf16_exact(const cx_kernel *k)
{
    const cx_pinstr *in = &k->prog.ins[k->prog.result];
    return k->out_dtype == CX_BF16 && in->dtype == CX_BF16 &&
           (in->kind == P_CAST || (in->kind == P_LOAD && in->src_dtype == CX_BF16));
}

static inline uint16_t high_half(float x)
{
    union { float f; uint32_t u; } v = { .f = x };
    return (uint16_t)(v.u >> 16);
}

CX_HOT static void store_block(void *out, int dt, int64_t off, val_t r, int len, bool bf16_exact)
{
    switch (dt) {
    /* memmove: an in-place kernel's result may be its own input, read in place */
    case CX_F32: memmove((float *)out + off, r.f, sizeof(float) * (size_t)len); break;
    case CX_BF16: {
        uint16_t *o = (uint16_t *)out + off;
        if (bf16_exact) for (int j = 0; j < len; j++) o[j] = high_half(r.f[j]);
        else for (int j = 0; j < len; j++) o[j] = cx_f32_to_bf16_inline(r.f[j]);
        break;
    }
    case CX_I32: { int32_t *o = (int32_t *)out + off; for (int j = 0; j < len; j++) o[j] = (int32_t)r.i[j]; break; }
    case CX_I64: memcpy((int64_t *)out + off, r.i, sizeof(int64_t) * (size_t)len); break;
    default: { uint8_t *o = (uint8_t *)out + off; for (int j = 0; j < len; j++) o[j] = (uint8_t)r.i[j]; break; }
    }
}

/* per-thread register files, grown on demand */
static _Thread_local reg_t *t_regs;
static _Thread_local val_t *t_vals;
static _Thread_local int t_nregs;

/* The calling thread's registers for p, with its constants and runtime
 * scalars filled once for every block of a range, not once a block.
 * @return false when they could not be allocated. */
static bool prog_regs(const run_ctx *rc, const cx_program *p, reg_t **regs, val_t **vals)
{
    if (p->n > t_nregs) {
        free(t_regs);
        free(t_vals);
        t_regs = aligned_alloc(64, sizeof(reg_t) * (size_t)p->n);
        t_vals = malloc(sizeof(val_t) * (size_t)p->n);
        t_nregs = t_regs && t_vals ? p->n : 0;
        if (!t_nregs) return false;
    }
    for (int n = 0; n < p->n; n++) {
        const cx_pinstr *in = &p->ins[n];
        reg_t *r = &t_regs[n];
        bool fc = is_float_class(in->dtype);
        t_vals[n] = (val_t){ r->f, r->i };
        if (in->kind == P_CONST && fc) {
            float x = (float)in->f;
            if (in->dtype == CX_BF16) x = bf16_round(x);
            for (int j = 0; j < CX_BLK; j++) r->f[j] = x;
        } else if (in->kind == P_CONST) {
            int64_t x = wrap_int((int64_t)in->f, in->dtype);
            for (int j = 0; j < CX_BLK; j++) r->i[j] = x;
        } else if (in->kind == P_RT && fc) {
            for (int j = 0; j < CX_BLK; j++) r->f[j] = (float)rc->rt_f[in->slot];
        } else if (in->kind == P_RT) {
            for (int j = 0; j < CX_BLK; j++) r->i[j] = rc->rt_i[in->slot];
        }
    }
    *regs = t_regs;
    *vals = t_vals;
    return true;
}

/* ---- fused kernels ----------------------------------------------------------------- */

typedef struct {
    const run_ctx *rc;
    const cx_kernel *k;
    int64_t inner, blocks_per_row;
    bool cast_to_bf16;   /* the program is a contiguous f32 load cast to bf16 */
    bool bf16_exact;     /* result_is_bf16_exact */
    int unrounded;       /* unrounded_result */
} fused_job;

/* Whether k's program is one contiguous f32 load cast to bf16 (autocast's
 * casts of weights and inputs): then each block is rounded from its
 * source straight into the output, once, not rounded into f32 registers
 * and rounded again as they are stored (the fc1 weight's cast had taken
 * 1.4 % of the cnn's bf16 step). */
static bool is_cast_to_bf16(const cx_kernel *k)
{
    const cx_program *p = &k->prog;
    if (p->n != 2 || p->result != 1 || k->out_dtype != CX_BF16) return false;
    const cx_pinstr *ld = &p->ins[0], *cast = &p->ins[1];
    return ld->kind == P_LOAD && f32_load_in_place(p, ld, k->ndim) && cast->kind == P_CAST && cast->a == 0 &&
           cast->dtype == CX_BF16;
}

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
    reg_t *regs;
    val_t *vals;
    if (!prog_regs(j->rc, &k->prog, &regs, &vals)) return;
    int64_t idx[CX_MAX_DIMS] = { 0 };
    int nd = k->ndim;
    void *out = j->rc->slot_ptr[k->out_slot];
    for (int64_t u = b; u < e; u++) {
        int64_t row = u / j->blocks_per_row, blk = u % j->blocks_per_row;
        unravel_outer(k->shape, nd, row, idx);
        int64_t j0 = blk * CX_BLK;
        int len = (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK);
        if (j->cast_to_bf16) {
            cx_bf16_round_row((uint16_t *)out + row * j->inner + j0,
                              direct_load(j->rc, &k->prog, &k->prog.ins[0], idx, nd, j0), len);
            continue;
        }
        val_t r = eval_block(j->rc, &k->prog, regs, vals, idx, nd, j0, len, j->unrounded);
        store_block(out, k->out_dtype, row * j->inner + j0, r, len, j->bf16_exact);
    }
}

void cx_run_fused(const run_ctx *rc, const cx_kernel *k)
{
    if (k->out_numel == 0) return;
    int64_t inner = k->ndim > 0 ? k->shape[k->ndim - 1] : 1;
    int64_t rows = inner ? k->out_numel / inner : 0;
    int64_t bpr = (inner + CX_BLK - 1) / CX_BLK;
    fused_job j = { rc, k, inner, bpr, is_cast_to_bf16(k), result_is_bf16_exact(k), unrounded_result(k) };
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

/* Sum of a block in double: 32 partial sums combined in a fixed tree
 * (deterministic whatever the thread count, and four independent vector
 * chains: with one chain of eight the adds' latency bounded the bias
 * gradients' sums); of f32 values, or of bf16 ones widened as they are
 * added (exact: the bits of summing the widened block). */
static inline float as_f32(float x) { return x; }
#define CX_SUM_LANES 32
#define DEFINE_SUM_BLOCK(NAME, T, WIDEN)                                              \
    CX_HOT static double NAME(const T *f, int len)                                    \
    {                                                                                 \
        double acc[CX_SUM_LANES] = { 0 };                                             \
        int q = 0;                                                                    \
        for (; q + CX_SUM_LANES <= len; q += CX_SUM_LANES)                            \
            for (int l = 0; l < CX_SUM_LANES; l++) acc[l] += WIDEN(f[q + l]);         \
        for (int l = 0; q < len; q++, l++) acc[l] += WIDEN(f[q]);                     \
        for (int w = CX_SUM_LANES / 2; w >= 1; w /= 2)                                \
            for (int l = 0; l < w; l++) acc[l] += acc[l + w];                         \
        return acc[0];                                                                \
    }
DEFINE_SUM_BLOCK(sum_block, float, as_f32)
DEFINE_SUM_BLOCK(sum_block_bf16, uint16_t, cx_bf16_to_f32_inline)

/* The largest of a block's len >= 1 values, in CX_SUM_LANES lanes the
 * compiler vectorizes (a loop of compares through the running maximum,
 * with its NaN test, ran one value at a time: the loss's max over a GPT's
 * logits took 0.26 ms a step). *nan: whether any value is NaN. Max is
 * exact, so the lanes give the sequential loop's value; of a +0 and a -0
 * tied for the maximum either may come back. */
CX_HOT static float max_block(const float *f, int len, bool *nan)
{
    float m[CX_SUM_LANES];
    int bad = 0, q = 0;
    for (int l = 0; l < CX_SUM_LANES; l++) m[l] = -INFINITY;
    for (; q + CX_SUM_LANES <= len; q += CX_SUM_LANES)
        for (int l = 0; l < CX_SUM_LANES; l++) {
            float x = f[q + l];
            bad |= x != x;
            m[l] = x > m[l] ? x : m[l];
        }
    for (int l = 0; q < len; q++, l++) {
        bad |= f[q] != f[q];
        m[l] = f[q] > m[l] ? f[q] : m[l];
    }
    float best = m[0];
    for (int l = 1; l < CX_SUM_LANES; l++) best = m[l] > best ? m[l] : best;
    *nan = bad != 0;
    return best;
}

/* A program that is one unmasked load of f32 or bf16 values (widened, or
 * kept in their dtype) contiguous along the last of nd axes: a plain sum
 * reads its rows in place. */
static bool is_plain_load(const cx_program *p, const cx_view *views, int nd)
{
    const cx_pinstr *in = &p->ins[0];
    return p->n == 1 && in->kind == P_LOAD && (in->src_dtype == CX_F32 || in->src_dtype == CX_BF16) &&
           (in->dtype == CX_F32 || in->dtype == in->src_dtype) && !views[in->view].masked && nd > 0 &&
           views[in->view].strides[nd - 1] == 1;
}

CX_HOT static void reduce_one(const reduce_job *j, reg_t *regs, val_t *vals, int64_t o, int64_t row_b, int64_t row_e, double *acc_f,
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
    const bool direct = k->red_op == OP_REDUCE_SUM && is_plain_load(&k->prog, k->prog.views, nd);
    for (int64_t row = row_b; row < row_e; row++) {
        int64_t rr = row;
        for (int d = nd - 2; d >= k->nkeep; d--) { idx[d] = rr % k->shape[d]; rr /= k->shape[d]; }
        if (direct) {
            /* a plain sum of a contiguous f32 or bf16 row (a conv's bias
             * gradient): no copy into registers, which had made the bf16
             * sum 1.1x the f32 one's time over half the bytes */
            const int64_t at = view_base(v, idx, nd, 0);
            for (int64_t j0 = 0; j0 < j->inner; j0 += CX_BLK) {
                const int len = (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK);
                if (ld->src_dtype == CX_BF16) *acc_f += sum_block_bf16((const uint16_t *)j->rc->slot_ptr[ld->slot] + at + j0, len);
                else *acc_f += sum_block((const float *)j->rc->slot_ptr[ld->slot] + at + j0, len);
            }
            continue;
        }
        for (int64_t j0 = 0; j0 < j->inner; j0 += CX_BLK) {
            int len = (int)(j->inner - j0 < CX_BLK ? j->inner - j0 : CX_BLK);
            val_t v = eval_block(j->rc, &k->prog, regs, vals, idx, nd, j0, len, -1);
            const val_t *r = &v;
            if (k->red_op == OP_REDUCE_SUM) {
                if (fc) *acc_f += sum_block(r->f, len);
                else { int64_t s = 0; for (int q = 0; q < len; q++) s += r->i[q]; *acc_i += s; }
            } else if (k->red_op == OP_REDUCE_MAX && fc) {
                bool nan;
                double x = max_block(r->f, len, &nan);
                if (nan) x = NAN;
                /* NaN wins and stays, as torch.max */
                if (*first) *acc_f = x;
                else if (*acc_f == *acc_f && (x > *acc_f || x != x)) *acc_f = x;
                *first = false;
            } else if (k->red_op == OP_REDUCE_MAX) {
                for (int q = 0; q < len; q++) {
                    if (*first || r->i[q] > *acc_i) *acc_i = r->i[q];
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
    reg_t *regs;
    val_t *vals;
    if (!prog_regs(j->rc, &k->prog, &regs, &vals)) return;
    void *out = j->rc->slot_ptr[k->out_slot];
    bool fc = is_float_class(k->prog.ins[k->prog.result].dtype);
    for (int64_t o = b; o < e; o++) {
        double af = 0;
        int64_t ai = 0, best = 0;
        bool first = true;
        reduce_one(j, regs, vals, o, 0, j->inner_rows, &af, &ai, &best, &first);
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
    reg_t *regs;
    val_t *vals;
    if (!prog_regs(s->j->rc, &s->j->k->prog, &regs, &vals)) return;
    for (int64_t c = b; c < e; c++) {
        int64_t rb = s->j->inner_rows * c / CX_RED_CHUNKS, re = s->j->inner_rows * (c + 1) / CX_RED_CHUNKS;
        double af = 0; int64_t ai = 0, best = 0; bool first = true;
        reduce_one(s->j, regs, vals, 0, rb, re, &af, &ai, &best, &first);
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
    int bw;                       /* a block's columns: CX_BLK, or fewer for more tasks */
    bool plain;                   /* the program is one unmasked contiguous f32 or bf16 load */
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
    reg_t *regs;
    val_t *vals;
    if (!prog_regs(j->rc, &j->prog, &regs, &vals)) return;
    int nd = j->nd, nlead = j->k->nkeep - 1;
    void *out = j->rc->slot_ptr[j->k->out_slot];
    bool bf16 = j->k->out_dtype == CX_BF16;
    double acc[CX_BLK];
    for (int64_t u = b; u < e; u++) {
        int64_t lead = u / j->blocks, j0 = (u % j->blocks) * j->bw;
        int len = (int)(j->width - j0 < j->bw ? j->width - j0 : j->bw);
        int64_t idx[CX_MAX_DIMS] = { 0 };
        int64_t t = lead;
        for (int d = nlead - 1; d >= 0; d--) { idx[d] = t % j->shape[d]; t /= j->shape[d]; }
        for (int q = 0; q < len; q++) acc[q] = 0;
        for (int64_t row = 0; row < j->rows; row++) {
            int64_t rr = row;
            for (int d = nd - 2; d >= nlead; d--) { idx[d] = rr % j->shape[d]; rr /= j->shape[d]; }
            if (j->plain) {
                /* a plain load (a bias gradient) read in place: eval_block
                 * would first copy (and a bf16 one widen) it into a register */
                const cx_pinstr *in = &j->prog.ins[0];
                int64_t a = view_base(&j->prog.views[in->view], idx, nd, j0);
                if (in->src_dtype == CX_BF16) {
                    const uint16_t *h = (const uint16_t *)j->rc->slot_ptr[in->slot] + a;
                    for (int q = 0; q < len; q++) acc[q] += cx_bf16_to_f32_inline(h[q]);
                } else {
                    const float *f = (const float *)j->rc->slot_ptr[in->slot] + a;
                    for (int q = 0; q < len; q++) acc[q] += f[q];
                }
                continue;
            }
            const float *r = eval_block(j->rc, &j->prog, regs, vals, idx, nd, j0, len, -1).f;
            for (int q = 0; q < len; q++) acc[q] += r[q];
        }
        int64_t o = lead * j->width + j0;
        if (bf16) for (int q = 0; q < len; q++) ((uint16_t *)out)[o + q] = cx_f32_to_bf16_inline((float)acc[q]);
        else for (int q = 0; q < len; q++) ((float *)out)[o + q] = (float)acc[q];
    }
}

/* @return whether k was run as a column sum (an f32 or bf16 sum over axes
 * that are not contiguous, whose last kept axis is contiguous or broadcast
 * in every input; a bf16 sum is rounded from the double sum through f32,
 * as the row-wise path rounds it). */
static bool try_run_colsum(const run_ctx *rc, const cx_kernel *k)
{
    int nd = k->ndim, nk = k->nkeep;
    if (k->red_op != OP_REDUCE_SUM || (k->out_dtype != CX_F32 && k->out_dtype != CX_BF16) || nk < 1 || nd <= nk || nd > CX_MAX_DIMS ||
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
    j.plain = is_plain_load(&k->prog, views, nd);
    for (int d = 0; d < nd; d++) j.shape[d] = k->shape[perm[d]];
    for (int d = nk - 1; d < nd - 1; d++) j.rows *= j.shape[d];
    j.width = k->shape[nk - 1];
    int64_t lead = 1;
    for (int d = 0; d < nk - 1; d++) lead *= k->shape[d];
    /* Narrower blocks where CX_BLK-wide ones would leave threads idle: a
     * bias gradient of 768 columns was 3 blocks on 2 threads, one thread
     * summing two of them while the other waited. Each output is still
     * one thread's sum in row order, so the bits do not change. */
    j.bw = CX_BLK;
    int64_t want = 4 * (int64_t)cx_pool_threads();
    while (j.bw > 32 && lead * ((j.width + j.bw - 1) / j.bw) < want) j.bw /= 2;
    j.blocks = (j.width + j.bw - 1) / j.bw;
    int64_t work = j.rows * (j.width < j.bw ? j.width : j.bw);
    cx_pool_parallel_for(lead * j.blocks, work >= 32768 ? 1 : 32768 / (work ? work : 1) + 1, colsum_range, &j);
    return true;
}

void cx_run_reduce(const run_ctx *rc, const cx_kernel *k)
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
