/* The rules a loaded executable's dense kernels must meet now that they
 * run in f32 or bf16 (core/executable/serialize.c): every operand in the
 * output's dtype (but a bf16 matmul's folded f32 cast), a matmul's output
 * its m x n values, a bf16 matmul or pool with at least one thread's scratch,
 * an attention (f32 or bf16) with the least its route runs in, and a
 * pool's geometry that of its buffers.
 * A hand-built one-matmul executable goes through the serialized form
 * with each rule broken in turn. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "executable.h"

enum { M = 20, K = 30, N = 40 };

static void kin(cx_kin *x, int slot, cx_dtype dt, int64_t rows, int64_t cols)
{
    memset(x, 0, sizeof *x);
    x->slot = slot;
    x->dtype = (uint8_t)dt;
    x->ndim = 2;
    x->shape[0] = rows;
    x->shape[1] = cols;
    x->numel = rows * cols;
    x->view.strides[0] = cols;
    x->view.strides[1] = 1;
    x->batch_stride = rows * cols;
}

/* every slot in the arena, one after the other */
static void lay_out_arena(cx_executable *e)
{
    int64_t off = 0;
    for (int s = 0; s < e->nslots; s++) { e->slots[s].offset = off; off += e->slots[s].bytes; }
    e->arena_bytes = off;
}

/* a (M, K) @ b (K, N) -> c, all in dt, with `scratch` bytes of scratch
 * (-1: no scratch slot) */
static cx_executable *one_matmul(cx_dtype dt, int64_t scratch)
{
    cx_executable *e = calloc(1, sizeof *e);
    cr_assert(e);
    int64_t es = (int64_t)cx_dtype_size(dt);
    int sa = cx_exec_add_slot(e, SLOT_ARENA, -1, M * K * es), sb = cx_exec_add_slot(e, SLOT_ARENA, -1, K * N * es);
    int sc = cx_exec_add_slot(e, SLOT_ARENA, -1, M * N * es);
    int ss = scratch >= 0 ? cx_exec_add_slot(e, SLOT_ARENA, -1, scratch) : -1;
    cr_assert(sa >= 0 && sb >= 0 && sc >= 0 && (scratch < 0 || ss >= 0));
    lay_out_arena(e);
    cx_kernel *k = cx_exec_add_kernel(e);
    cr_assert(k);
    k->kind = K_MATMUL;
    k->out_slot = sc;
    k->out_dtype = (uint8_t)dt;
    k->out_numel = M * N;
    k->ndim = 2;
    k->shape[0] = M;
    k->shape[1] = N;
    k->nin = 2;
    kin(&k->in[0], sa, dt, M, K);
    kin(&k->in[1], sb, dt, K, N);
    k->scratch_slot = ss;
    k->scratch_bytes = scratch > 0 ? scratch : 0;
    return e;
}

/* k's epilogue program, room for nviews views and nins instructions, its
 * view 0 c's row-major (M, N) layout; has_epilogue set */
static cx_program *epilogue_program(cx_kernel *k, int nviews, int nins)
{
    cx_program *p = &k->prog;
    p->views = calloc((size_t)nviews, sizeof *p->views);
    p->ins = calloc((size_t)nins, sizeof *p->ins);
    cr_assert(p->views && p->ins);
    p->views[0].strides[0] = N;
    p->views[0].strides[1] = 1;
    p->nviews = p->vcap = nviews;
    p->n = p->cap = nins;
    k->has_epilogue = true;
    return p;
}

/* a (M, K) @ b (K, N) of bf16 into f32 c (a folded cast), with `scratch`
 * bytes of scratch; f32_b: b f32 instead; epilogue: with one (a program
 * of c alone) */
static cx_executable *f32_sums(int64_t scratch, bool f32_b, bool epilogue)
{
    cx_executable *e = one_matmul(CX_BF16, scratch);
    cx_kernel *k = &e->kernels[0];
    k->out_dtype = CX_F32;
    e->slots[k->out_slot].bytes = M * N * 4;
    if (f32_b) {
        k->in[1].dtype = CX_F32;
        e->slots[k->in[1].slot].bytes = K * N * 4;
    }
    lay_out_arena(e);
    if (epilogue)
        epilogue_program(k, 1, 1)->ins[0] =
            (cx_pinstr){ .kind = P_LOAD, .dtype = CX_F32, .src_dtype = CX_F32, .slot = k->out_slot, .view = 0 };
    return e;
}

/* whether e survives serialize + deserialize; frees e */
static bool loads(cx_executable *e)
{
    cx_sbuf w = { 0 };
    cx_exec_serialize(&w, e);
    cr_assert(!w.oom);
    cx_executable *back = cx_exec_deserialize((const unsigned char *)w.s, w.n);
    bool ok = back != NULL;
    cx_executable_free(back);
    cx_executable_free(e);
    free(w.s);
    return ok;
}

Test(bf16_exec, dense_kernels_keep_one_dtype_and_bf16_matmul_has_scratch)
{
    int64_t need = (int64_t)cx_matmul_bf16_min_scratch_bytes(1, M, N, K);
    cr_assert(need > 0);
    cr_assert(loads(one_matmul(CX_F32, -1)), "an f32 matmul without scratch is valid");
    cr_assert(loads(one_matmul(CX_BF16, need)), "a bf16 matmul with one thread's scratch is valid");
    cr_assert(!loads(one_matmul(CX_BF16, -1)), "a bf16 matmul without scratch must be refused");
    cr_assert(!loads(one_matmul(CX_BF16, need - 1)), "a bf16 matmul with too little scratch must be refused");

    cx_executable *mixed = one_matmul(CX_BF16, need);
    mixed->kernels[0].in[1].dtype = CX_F32;
    cr_assert(!loads(mixed), "a matmul reading an operand in another dtype must be refused");
    cx_executable *wide_out = one_matmul(CX_F32, -1);
    wide_out->kernels[0].out_dtype = CX_I32;
    cr_assert(!loads(wide_out), "a matmul must run in f32 or bf16");

    /* a bf16 matmul's f32 cast folded in: f32 sums of bf16 operands */
    cr_assert(loads(f32_sums(need, false, false)), "a bf16 matmul into f32 with its scratch is valid");
    cr_assert(!loads(f32_sums(-1, false, false)), "a bf16 matmul into f32 without scratch must be refused");
    cr_assert(!loads(f32_sums(need, true, false)), "an f32 operand of a matmul into f32 sums must be refused");
    cr_assert(!loads(f32_sums(need, false, true)), "a bf16 matmul into f32 takes no epilogue");

    /* the product's shapes against its output and each other */
    cx_executable *more = one_matmul(CX_F32, -1);
    more->kernels[0].out_numel = M * N - 1;
    cr_assert(!loads(more), "a matmul's output must hold exactly its m x n values");
    cx_executable *inner = one_matmul(CX_F32, -1);
    inner->kernels[0].in[1].shape[0] = K - 1;
    inner->kernels[0].in[1].numel = (K - 1) * N;
    cr_assert(!loads(inner), "B must have A's k rows");
}

/* one_matmul with autocast's Linear bias folded (EPI_BIAS): the program
 * out + cast(bias, bf16) over (M, N), its bias a slot of bias_floats
 * f32 read through strides {0, col_stride} */
static cx_executable *matmul_with_bias(cx_dtype dt, int64_t bias_floats, int64_t col_stride)
{
    cx_executable *e = one_matmul(dt, (int64_t)cx_matmul_bf16_min_scratch_bytes(1, M, N, K));
    int sbias = cx_exec_add_slot(e, SLOT_ARENA, -1, bias_floats * 4);
    cr_assert(sbias >= 0);
    lay_out_arena(e);
    cx_kernel *k = &e->kernels[0];
    k->epi = EPI_BIAS;
    k->epi_load = 1;
    cx_program *p = epilogue_program(k, 2, 4);
    p->views[1].strides[1] = col_stride;
    p->ins[0] = (cx_pinstr){ .kind = P_LOAD, .dtype = (uint8_t)dt, .src_dtype = (uint8_t)dt, .slot = k->out_slot, .view = 0 };
    p->ins[1] = (cx_pinstr){ .kind = P_LOAD, .dtype = CX_F32, .src_dtype = CX_F32, .slot = sbias, .view = 1 };
    p->ins[2] = (cx_pinstr){ .kind = P_CAST, .dtype = (uint8_t)dt, .a = 1 };
    p->ins[3] = (cx_pinstr){ .kind = P_BIN, .op = OP_ADD, .dtype = (uint8_t)dt, .src_dtype = (uint8_t)dt, .a = 0, .b = 2 };
    p->result = 3;
    return e;
}

Test(bf16_exec, a_bf16_linear_bias_fold_reads_a_whole_bias)
{
    cr_assert(loads(matmul_with_bias(CX_BF16, N, 1)), "a bf16 matmul adding an (N) f32 bias itself is valid");
    cr_assert(!loads(matmul_with_bias(CX_BF16, N - 1, 0)),
              "a folded bias of fewer than N floats must be refused (the kernel reads N, whatever the view)");
    cr_assert(loads(matmul_with_bias(CX_F32, N, 1)), "an f32 matmul adding an (N) f32 bias itself is valid");
    cr_assert(!loads(matmul_with_bias(CX_F32, N - 1, 0)), "an f32 matmul's folded bias holds N floats");
}

/* an f32 matmul with its bias and then an addend of addend_floats folded
 * (EPI_BIAS_ADD): r + (out + bias); with_addend false: no addend load */
static cx_executable *matmul_with_residual(cx_dtype dt, int64_t addend_floats, bool with_addend)
{
    cx_executable *e = one_matmul(dt, dt == CX_BF16 ? (int64_t)cx_matmul_bf16_min_scratch_bytes(1, M, N, K) : -1);
    int sbias = cx_exec_add_slot(e, SLOT_ARENA, -1, N * 4), sres = cx_exec_add_slot(e, SLOT_ARENA, -1, addend_floats * 4);
    cr_assert(sbias >= 0 && sres >= 0);
    lay_out_arena(e);
    cx_kernel *k = &e->kernels[0];
    k->epi = EPI_BIAS_ADD;
    k->epi_load = 2;
    cx_program *p = epilogue_program(k, 2, 5);
    p->views[1].strides[1] = 1;
    const cx_pinstr ld = { .kind = P_LOAD, .dtype = (uint8_t)dt, .src_dtype = (uint8_t)dt };
    p->ins[0] = ld;
    p->ins[0].slot = with_addend ? sres : k->out_slot;
    p->ins[1] = ld;
    p->ins[1].slot = k->out_slot;
    p->ins[2] = (cx_pinstr){ .kind = P_LOAD, .dtype = CX_F32, .src_dtype = CX_F32, .slot = sbias, .view = 1 };
    p->ins[3] = (cx_pinstr){ .kind = P_BIN, .op = OP_ADD, .dtype = (uint8_t)dt, .a = 1, .b = 2 };
    p->ins[4] = (cx_pinstr){ .kind = P_BIN, .op = OP_ADD, .dtype = (uint8_t)dt, .a = 0, .b = 3 };
    p->result = 4;
    return e;
}

Test(bf16_exec, an_f32_linear_residual_fold_reads_a_whole_addend)
{
    cr_assert(loads(matmul_with_residual(CX_F32, M * N, true)), "an f32 matmul adding its bias and an addend is valid");
    cr_assert(!loads(matmul_with_residual(CX_F32, M * N - 1, true)), "the addend holds the output's M x N floats");
    cr_assert(!loads(matmul_with_residual(CX_F32, M * N, false)), "a folded addend needs its load");
    cr_assert(!loads(matmul_with_residual(CX_BF16, M * N, true)), "a bf16 matmul does not fold an addend");
}

/* a 2x2 stride-2 max pool of (2, 3, 8, 8) in dt, with `scratch` bytes of
 * scratch (-1: none) */
static cx_executable *one_pool(cx_dtype dt, int64_t scratch)
{
    cx_executable *e = calloc(1, sizeof *e);
    cr_assert(e);
    const int64_t es = (int64_t)cx_dtype_size(dt), in_n = 2 * 3 * 8 * 8, out_n = 2 * 3 * 4 * 4;
    int sx = cx_exec_add_slot(e, SLOT_ARENA, -1, in_n * es), sy = cx_exec_add_slot(e, SLOT_ARENA, -1, out_n * es);
    int ss = scratch >= 0 ? cx_exec_add_slot(e, SLOT_ARENA, -1, scratch) : -1;
    cr_assert(sx >= 0 && sy >= 0 && (scratch < 0 || ss >= 0));
    lay_out_arena(e);
    cx_kernel *k = cx_exec_add_kernel(e);
    cr_assert(k);
    k->kind = K_MAXPOOL;
    k->out_slot = sy;
    k->out_dtype = (uint8_t)dt;
    k->out_numel = out_n;
    k->ndim = 4;
    const int64_t ys[4] = { 2, 3, 4, 4 }, xs[4] = { 2, 3, 8, 8 };
    memcpy(k->shape, ys, sizeof ys);
    k->nin = 1;
    cx_kin *x = &k->in[0];
    x->slot = sx;
    x->dtype = (uint8_t)dt;
    x->ndim = 4;
    memcpy(x->shape, xs, sizeof xs);
    x->numel = in_n;
    cx_contiguous_strides(xs, 4, x->view.strides);
    k->nattrs = CX_AT_POOL_COUNT;
    k->attrs[CX_AT_POOL_KH] = k->attrs[CX_AT_POOL_KW] = k->attrs[CX_AT_POOL_SH] = k->attrs[CX_AT_POOL_SW] = 2;
    k->scratch_slot = ss;
    k->scratch_bytes = scratch > 0 ? scratch : 0;
    return e;
}

/* A loaded pool's geometry is its buffers' (the kernel reads and writes
 * them whole from their starts), and a bf16 pool has one thread's planes
 * of scratch; no kernel claims more scratch than its slot has. */
Test(bf16_exec, pools_keep_their_geometry_and_bf16_pools_have_scratch)
{
    cx_pool_geom g = { .n = 2, .c = 3, .h = 8, .w = 8, .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
    cr_assert(cx_pool_geom_finish(&g));
    const int64_t need = (int64_t)cx_pool2d_bf16_min_scratch_bytes(&g);
    cr_assert(loads(one_pool(CX_F32, -1)), "an f32 pool needs no scratch");
    cr_assert(loads(one_pool(CX_BF16, need)), "a bf16 pool with one thread's planes is valid");
    cr_assert(!loads(one_pool(CX_BF16, -1)), "a bf16 pool without scratch must be refused");
    cr_assert(!loads(one_pool(CX_BF16, need - 1)), "a bf16 pool with too little scratch must be refused");
    cx_executable *small_out = one_pool(CX_BF16, need);
    small_out->kernels[0].out_numel = 1;
    cr_assert(!loads(small_out), "a pool whose output is not its geometry's must be refused");
    cx_executable *big_in = one_pool(CX_F32, -1);
    big_in->kernels[0].in[0].shape[2] = 16;
    cr_assert(!loads(big_in), "a pool whose input is not its geometry's must be refused");
    cx_executable *claims = one_pool(CX_F32, 64);
    claims->kernels[0].scratch_bytes = 1 << 20;
    cr_assert(!loads(claims), "a kernel claiming more scratch than its slot must be refused");
}

/* a causal attention over q, k, v (2, t, 2, 4) each, in dt, with
 * `scratch` bytes of scratch (-1: none) */
static cx_executable *attention_of(int64_t t, cx_dtype dt, int64_t scratch)
{
    cx_executable *e = calloc(1, sizeof *e);
    cr_assert(e);
    const int64_t es = (int64_t)cx_dtype_size(dt), shape[4] = { 2, t, 2, 4 }, n = 2 * t * 2 * 4;
    int sq[3], so = -1;
    for (int i = 0; i < 3; i++) sq[i] = cx_exec_add_slot(e, SLOT_ARENA, -1, n * es);
    so = cx_exec_add_slot(e, SLOT_ARENA, -1, n * es);
    int ss = scratch >= 0 ? cx_exec_add_slot(e, SLOT_ARENA, -1, scratch) : -1;
    cr_assert(sq[0] >= 0 && sq[1] >= 0 && sq[2] >= 0 && so >= 0 && (scratch < 0 || ss >= 0));
    lay_out_arena(e);
    cx_kernel *k = cx_exec_add_kernel(e);
    cr_assert(k);
    k->kind = K_ATTENTION;
    k->out_slot = so;
    k->out_dtype = (uint8_t)dt;
    k->out_numel = n;
    k->ndim = 4;
    memcpy(k->shape, shape, sizeof shape);
    k->nin = 3;
    for (int i = 0; i < 3; i++) {
        cx_kin *x = &k->in[i];
        x->slot = sq[i];
        x->dtype = (uint8_t)dt;
        x->ndim = 4;
        memcpy(x->shape, shape, sizeof shape);
        x->numel = n;
        cx_contiguous_strides(shape, 4, x->view.strides);
    }
    k->nattrs = CX_AT_ATTN_COUNT;
    k->attrs[CX_AT_ATTN_CAUSAL] = 1;
    k->fval = 0.5;
    k->scratch_slot = ss;
    k->scratch_bytes = scratch > 0 ? scratch : 0;
    return e;
}

static cx_executable *one_attention(cx_dtype dt, int64_t scratch) { return attention_of(8, dt, scratch); }

/* g of attention_of(t, ...) */
static cx_attn_geom attention_geom(int64_t t)
{
    cx_attn_geom g = { .n = 2, .t = t, .s = t, .h = 2, .d = 4, .causal = true, .scale = 0.5f };
    const int64_t st[3] = { t * 8, 8, 4 };   /* (2, t, 2, 4) contiguous */
    int64_t *views[5] = { g.q_strides, g.k_strides, g.v_strides, g.o_strides, g.do_strides };
    for (int i = 0; i < 5; i++) memcpy(views[i], st, sizeof st);
    return g;
}

/* A loaded attention, f32 or bf16, has at least the scratch the route it
 * then takes runs in (one thread's lane): with less, the kernel would
 * write past it. */
Test(bf16_exec, attention_has_its_least_scratch)
{
    cx_attn_geom g = attention_geom(8);
    const int64_t f32 = (int64_t)cx_attention_min_scratch_bytes(&g, false);
    cr_assert(f32 > 0);
    cr_assert(loads(one_attention(CX_F32, f32)), "an f32 attention with one lane of scratch is valid");
    cr_assert(!loads(one_attention(CX_F32, -1)), "an f32 attention without scratch must be refused");
    cr_assert(!loads(one_attention(CX_F32, f32 - 1)), "an f32 attention with too little scratch must be refused");
    const int64_t need = (int64_t)cx_attention_bf16_min_scratch_bytes(&g, false);
    cr_assert(need > 0);
    cr_assert(loads(one_attention(CX_BF16, need)), "a bf16 attention with its least scratch is valid");
    cr_assert(!loads(one_attention(CX_BF16, -1)), "a bf16 attention without scratch must be refused");
    cr_assert(!loads(one_attention(CX_BF16, need - 1)), "a bf16 attention with too little scratch must be refused");
    /* beyond the heads route's 1024 keys: the plans of both long routes
     * load, whichever level planned them */
    cx_attn_geom l = attention_geom(1030);
    for (int r = CX_ATTN_BF16_GEMM; r <= CX_ATTN_BF16_WIDEN; r++) {
        int64_t plan = (int64_t)cx_attention_bf16_route_scratch_bytes(&l, false, (cx_attn_bf16_route)r);
        cr_assert(loads(attention_of(1030, CX_BF16, plan)), "a 1030-key %s plan must load",
                  r == CX_ATTN_BF16_GEMM ? "GEMM" : "widening");
    }
    int64_t least = (int64_t)cx_attention_bf16_min_scratch_bytes(&l, false);
    cr_assert(!loads(attention_of(1030, CX_BF16, least - 1)), "a 1030-key bf16 attention below its least must be refused");
}
