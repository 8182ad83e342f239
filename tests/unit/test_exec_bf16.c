/* The rules a loaded executable's dense kernels must meet now that they
 * run in f32 or bf16 (core/executable/serialize.c): every operand in the
 * output's dtype, and a bf16 matmul with at least one thread's scratch.
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
    int64_t off = 0;
    for (int s = 0; s < e->nslots; s++) { e->slots[s].offset = off; off += e->slots[s].bytes; }
    e->arena_bytes = off;
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
}
