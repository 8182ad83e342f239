/* Private to the executor's files (exec*.c): what they share. The
 * executor is one pass over the kernels (exec.c) that hands each kernel to
 * the file of its kind, once per kernel; nothing here is called per element
 * or per block (the hot loops and the helpers they inline live together in
 * exec_program.c). */
#ifndef CX_EXEC_INTERNAL_H
#define CX_EXEC_INTERNAL_H

#include "runtime.h"

typedef struct {
    const cx_executable *e;
    void **slot_ptr;
    const double *rt_f;
    const int64_t *rt_i;
} run_ctx;

/* The product of s[a..b): the elements spanned by those dimensions. */
static inline int64_t prod(const int64_t *s, int a, int b)
{
    int64_t p = 1;
    for (int i = a; i < b; i++) p *= s[i];
    return p;
}

/* ---- exec_program.c: fused kernels and reductions ---- */
void cx_run_fused(const run_ctx *rc, const cx_kernel *k);
void cx_run_reduce(const run_ctx *rc, const cx_kernel *k);

/* ---- exec_heavy.c: dense and gather/scatter kernels, with their epilogue ---- */
cx_status cx_run_heavy(const run_ctx *rc, const cx_kernel *k);

/* ---- exec_coll.c: collectives. req_out: the started request when the
 * collective is left in flight (NULL when it completed); now: complete it
 * before returning. ---- */
cx_status cx_run_coll(const run_ctx *rc, const cx_kernel *k, void **req_out, bool now);

#endif
