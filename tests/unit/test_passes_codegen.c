/* Code generation, epilogues, peephole and coalescing one pass at a time:
 * codegen on hand-built graphs (grouped by the real group pass, as the
 * driver does), the epilogue pass on what codegen made of them and on
 * hand-built conv kernels, peephole and coalescing on hand-built programs.
 * A structure is only right if it computes the right thing, so where a pass
 * produces something runnable the executor runs it on host buffers and the
 * values are compared with ones computed here. (test_passes.c covers the
 * other passes; test_compile.c all of them end to end.) */
#include <criterion/criterion.h>

#include "passes.h"
#include "runtime.h"
#include "graph_builder.h"

#include <math.h>

static const int64_t V8[] = { 8 }, M44[] = { 4, 4 };

/* ---- driving passes 1-2 and the executor ------------------------------------------ */

static void group(const gbuild *b, const char *force_root, char *root)
{
    cx_uses u;
    cr_assert(cx_uses_build(&b->g, &u));
    cr_assert(cx_pass_group(&b->g, &u, force_root, root));
    cx_uses_free(&b->g, &u);
}

/* What cx_lower sets up before codegen, then codegen over `root`.
 * @return codegen's answer: -1 when done, else the node to make a root. */
static int codegen(const gbuild *b, const char *root, cx_executable **out)
{
    cx_executable *e = calloc(1, sizeof *e);
    cr_assert_not_null(e);
    e->n_inputs = b->g.n_inputs;
    e->n_outputs = b->g.n_outputs;
    e->out_slot = calloc((size_t)b->g.n_outputs + 1, sizeof(int));
    e->out_alias = calloc((size_t)b->g.n_outputs + 1, sizeof(int));
    for (int o = 0; o < b->g.n_outputs; o++) e->out_alias[o] = b->g.out_alias[o];
    bool oom;
    int fail = cx_pass_codegen(&b->g, root, e, &oom);
    cr_assert(!oom);
    *out = e;
    return fail;
}

/* Group and generate in one go, which must succeed. */
static cx_executable *lower12(const gbuild *b, char *root)
{
    cx_executable *e;
    group(b, NULL, root);
    int fail = codegen(b, root, &e);
    cr_assert_eq(fail, -1, "codegen asked for node %d to become a root", fail);
    return e;
}

/* Plans the arena and runs e; inputs and outputs by ordinal. */
static void run(cx_executable *e, void *const *in, void *const *out)
{
    cx_pass_liveness(e);
    cr_assert(cx_pass_plan_memory(e));
    cr_assert_eq(cx_execute(e, in, NULL, NULL, out), CX_OK, "%s", cx_last_error());
}

static void fill(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++) x[i] = scale * (float)((i * 7) % 11 - 5);
}

static void assert_close(const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        cr_assert_float_eq(got[i], want[i], 1e-5f * (1.0f + fabsf(want[i])), "[%d]: got %g, expected %g", i,
                           (double)got[i], (double)want[i]);
}

static int count_kind(const cx_program *p, cx_pkind kind)
{
    int c = 0;
    for (int i = 0; i < p->n; i++) c += p->ins[i].kind == kind;
    return c;
}

/* ---- codegen ------------------------------------------------------------------------ */

Test(codegen, an_elementwise_chain_is_one_kernel_over_its_inputs_and_output)
{
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 2, M44, 0, NULL), c = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int add = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ a, c });
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &add);
    int ng = gb_node(&b, OP_NEG, 2, M44, 1, &ex);
    gb_output(&b, ng, -1);
    char root[8];
    cx_executable *e = lower12(&b, root);
    cr_assert_eq(e->nslots, 3, "the two inputs and the output; the chain needs no arena slot (%d slots)", e->nslots);
    cr_assert(e->slots[0].kind == SLOT_INPUT && e->slots[0].index == 0);
    cr_assert(e->slots[1].kind == SLOT_INPUT && e->slots[1].index == 1);
    cr_assert(e->slots[2].kind == SLOT_OUTPUT && e->slots[2].index == 0);
    cr_assert_eq(e->out_slot[0], 2);
    cr_assert_eq(e->nkernels, 1, "%d kernels for one chain", e->nkernels);
    const cx_kernel *k = &e->kernels[0];
    cr_assert_eq(k->kind, K_FUSED);
    cr_assert_eq(k->out_slot, 2);
    cr_assert_eq(k->prog.n, 5, "load, load, add, exp, neg: %d instructions", k->prog.n);
    cr_assert_eq(count_kind(&k->prog, P_LOAD), 2);
    cr_assert(k->prog.ins[0].slot != k->prog.ins[1].slot, "each input is loaded from its own slot");
    cr_assert(k->prog.ins[k->prog.result].kind == P_UN && k->prog.ins[k->prog.result].op == OP_NEG);
    cr_assert(k->ndim == 1 && k->shape[0] == 16, "a contiguous 4x4 loop is one loop of 16");

    float x[16], y[16], out[16], want[16];
    fill(x, 16, 0.1f);
    fill(y, 16, -0.05f);
    for (int i = 0; i < 16; i++) want[i] = -expf(x[i] + y[i]);
    run(e, (void *[]){ x, y }, (void *[]){ out });
    assert_close(out, want, 16);
    cx_executable_free(e);
}

Test(codegen, a_value_used_twice_in_a_kernel_is_computed_once)
{
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 1, V8, 0, NULL);
    int ex = gb_node(&b, OP_EXP, 1, V8, 1, &a);
    int sq = gb_node(&b, OP_MUL, 1, V8, 2, (int[]){ ex, ex });
    gb_output(&b, sq, -1);
    char root[4];
    cx_executable *e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 1);
    const cx_program *p = &e->kernels[0].prog;
    cr_assert_eq(p->n, 3, "load, exp, mul: %d instructions", p->n);
    cr_assert_eq(p->ins[2].a, p->ins[2].b, "both operands are the one exp");
    cx_executable_free(e);
}

Test(codegen, views_become_index_maps_on_the_load_not_copies)
{
    /* out = -transpose(a): a permute is a load with swapped strides */
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int tr = gb_node(&b, OP_PERMUTE, 2, M44, 1, &a);
    gb_attrs(&b, tr, 2, (int64_t[]){ 1, 0 });
    int ng = gb_node(&b, OP_NEG, 2, M44, 1, &tr);
    gb_output(&b, ng, -1);
    char root[4];
    cx_executable *e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 1, "the permute is not a kernel of its own (%d kernels)", e->nkernels);
    const cx_program *p = &e->kernels[0].prog;
    cr_assert_eq(p->n, 2);
    const cx_view *v = &p->views[p->ins[0].view];
    cr_assert_eq(p->ins[0].slot, 0);
    cr_assert(v->offset == 0 && v->strides[0] == 1 && v->strides[1] == 4, "transposed load: strides (%lld, %lld)",
              (long long)v->strides[0], (long long)v->strides[1]);
    cr_assert_eq(e->kernels[0].ndim, 2, "a transposed read cannot be one flat loop");
    float x[16], out[16], want[16];
    fill(x, 16, 1.0f);
    for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) want[i * 4 + j] = -x[j * 4 + i];
    run(e, (void *[]){ x }, (void *[]){ out });
    assert_close(out, want, 16);
    cx_executable_free(e);

    /* a rotation of 3 dims is not its own inverse: out[i][j][k] = a[j][k][i] */
    gb_init(&b);
    a = gb_node(&b, OP_DATA, 3, (int64_t[]){ 2, 3, 4 }, 0, NULL);
    tr = gb_node(&b, OP_PERMUTE, 3, (int64_t[]){ 4, 2, 3 }, 1, &a);
    gb_attrs(&b, tr, 3, (int64_t[]){ 2, 0, 1 });
    ng = gb_node(&b, OP_NEG, 3, (int64_t[]){ 4, 2, 3 }, 1, &tr);
    gb_output(&b, ng, -1);
    e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 1);
    p = &e->kernels[0].prog;
    v = &p->views[p->ins[0].view];
    /* strides (1, 12, 4); (j, k) walk a[j][k] in order, so they coalesce */
    cr_assert_eq(e->kernels[0].ndim, 2);
    cr_assert(v->strides[0] == 1 && v->strides[1] == 4, "rotated load: strides (%lld, %lld)", (long long)v->strides[0],
              (long long)v->strides[1]);
    float r[24], ro[24], rwant[24];
    fill(r, 24, 1.0f);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) rwant[(i * 2 + j) * 3 + k] = -r[(j * 3 + k) * 4 + i];
    run(e, (void *[]){ r }, (void *[]){ ro });
    assert_close(ro, rwant, 24);
    cx_executable_free(e);

    /* out = -a[2::2] over 3 elements: an offset and a stride */
    gb_init(&b);
    a = gb_node(&b, OP_DATA, 1, V8, 0, NULL);
    int sl = gb_node(&b, OP_SLICE, 1, (int64_t[]){ 3 }, 1, &a);
    gb_attrs(&b, sl, 3, (int64_t[]){ 0, 2, 2 });
    ng = gb_node(&b, OP_NEG, 1, (int64_t[]){ 3 }, 1, &sl);
    gb_output(&b, ng, -1);
    e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 1);
    p = &e->kernels[0].prog;
    v = &p->views[p->ins[0].view];
    cr_assert(v->offset == 2 && v->strides[0] == 2, "slice load: offset %lld stride %lld", (long long)v->offset,
              (long long)v->strides[0]);
    float y[8], o3[3];
    fill(y, 8, 1.0f);
    run(e, (void *[]){ y }, (void *[]){ o3 });
    assert_close(o3, (float[]){ -y[2], -y[4], -y[6] }, 3);
    cx_executable_free(e);
}

Test(codegen, a_view_that_is_not_affine_names_its_input_and_the_retry_splits_the_kernel)
{
    /* -flatten(transpose(exp(a)))[3::5]: flattening a transpose carries
     * across dims, so no one stride walks it */
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &a);
    int tr = gb_node(&b, OP_PERMUTE, 2, M44, 1, &ex);
    gb_attrs(&b, tr, 2, (int64_t[]){ 1, 0 });
    int rs = gb_node(&b, OP_RESHAPE, 1, (int64_t[]){ 16 }, 1, &tr);
    int sl = gb_node(&b, OP_SLICE, 1, (int64_t[]){ 2 }, 1, &rs);
    gb_attrs(&b, sl, 3, (int64_t[]){ 0, 3, 5 });
    int ng = gb_node(&b, OP_NEG, 1, (int64_t[]){ 2 }, 1, &sl);
    gb_output(&b, ng, -1);

    char root[8], force[8] = { 0 };
    group(&b, NULL, root);
    cx_executable *e;
    cr_assert_eq(codegen(&b, root, &e), tr, "the reshape's input is the node to materialize");
    cx_executable_free(e);

    force[tr] = 1;
    group(&b, force, root);
    cr_assert_eq(codegen(&b, root, &e), -1);
    cr_assert_eq(e->nkernels, 2, "the transpose's kernel, then the reader's (%d kernels)", e->nkernels);
    const cx_kernel *k0 = &e->kernels[0], *k1 = &e->kernels[1];
    cr_assert_eq(e->slots[k0->out_slot].kind, SLOT_ARENA);
    cr_assert_eq(k1->prog.ins[0].kind, P_LOAD);
    cr_assert_eq(k1->prog.ins[0].slot, k0->out_slot, "the reader loads the materialized transpose");
    const cx_view *v = &k1->prog.views[k1->prog.ins[0].view];
    cr_assert(v->offset == 3 && v->strides[0] == 5, "over its flat buffer: offset %lld stride %lld",
              (long long)v->offset, (long long)v->strides[0]);

    float x[16], out[2], want[2];
    fill(x, 16, 0.2f);
    for (int j = 0; j < 2; j++) {
        int l = 3 + 5 * j;   /* element l of the flattened transpose is a[l % 4][l / 4] */
        want[j] = -expf(x[(l % 4) * 4 + l / 4]);
    }
    run(e, (void *[]){ x }, (void *[]){ out });
    assert_close(out, want, 2);
    cx_executable_free(e);
}

Test(codegen, a_matmul_is_a_kernel_of_its_own_reading_a_transposed_operand_in_place)
{
    /* x @ w^T + bias */
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int bias = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int wt = gb_node(&b, OP_PERMUTE, 2, M44, 1, &w);
    gb_attrs(&b, wt, 2, (int64_t[]){ 1, 0 });
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, wt });
    int add = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias });
    gb_output(&b, add, -1);
    char root[8];
    cx_executable *e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 2, "matmul, then the add (%d kernels)", e->nkernels);
    const cx_kernel *m = &e->kernels[0], *f = &e->kernels[1];
    cr_assert_eq(m->kind, K_MATMUL);
    cr_assert_eq(m->nin, 2);
    cr_assert(m->in[0].slot == 0 && !m->in[0].trans);
    cr_assert(m->in[1].slot == 1 && m->in[1].trans, "w^T is w's own buffer read transposed, not a copy");
    cr_assert_eq(e->slots[m->out_slot].kind, SLOT_ARENA);
    cr_assert_eq(f->kind, K_FUSED);
    cr_assert(cx_kernel_reads(f, m->out_slot) && cx_kernel_reads(f, 2));

    float xv[16], wv[16], bv[16], out[16], want[16];
    fill(xv, 16, 0.1f);
    fill(wv, 16, -0.3f);
    fill(bv, 16, 0.5f);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            float s = bv[i * 4 + j];
            for (int t = 0; t < 4; t++) s += xv[i * 4 + t] * wv[j * 4 + t];
            want[i * 4 + j] = s;
        }
    run(e, (void *[]){ xv, wv, bv }, (void *[]){ out });
    assert_close(out, want, 16);
    cx_executable_free(e);
}

/* Groups and generates as cx_lower does, forcing a root each time codegen
 * names one, until it succeeds. */
static cx_executable *lower_with_retries(const gbuild *b, char *force_root, char *root)
{
    for (int attempt = 0; attempt <= b->g.n; attempt++) {
        cx_executable *e;
        group(b, force_root, root);
        int fail = codegen(b, root, &e);
        if (fail < 0) return e;
        cr_assert(!force_root[fail], "codegen asked twice for node %d", fail);
        force_root[fail] = 1;
        cx_executable_free(e);
    }
    cr_assert_fail("codegen never finished");
    return NULL;
}

Test(codegen, a_zero_stored_for_a_scatter_add_base_stays_an_immediate_for_relu)
{
    /* One zero constant, as the tracer dedups it: relu's zero and a
     * scatter-add's base (a gather's gradient starts from zeros). The
     * base stores the zero once; relu must still see an immediate, or the
     * peephole makes no relu and a conv or matmul epilogue no bias+relu. */
    gbuild b;
    gb_init(&b);
    static const int64_t M41[] = { 4, 1 }, ONES[] = { 1, 1 };
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), ix = gb_node(&b, OP_DATA, 2, M41, 0, NULL);
    int src = gb_node(&b, OP_DATA, 2, M41, 0, NULL);
    b.nodes[ix].dtype = CX_I64;
    int zero = gb_node(&b, OP_CONST, 0, NULL, 0, NULL);
    int zr = gb_node(&b, OP_RESHAPE, 2, ONES, 1, &zero);
    int zeros = gb_node(&b, OP_EXPAND, 2, M44, 1, &zr);
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &x);
    int lt = gb_node(&b, OP_LT, 2, M44, 2, (int[]){ zeros, ex });
    b.nodes[lt].dtype = CX_BOOL;
    gb_output(&b, gb_node(&b, OP_WHERE, 2, M44, 3, (int[]){ lt, ex, zeros }), -1);
    int sa = gb_node(&b, OP_SCATTER_ADD, 2, M44, 3, (int[]){ zeros, ix, src });
    gb_attrs(&b, sa, 1, (int64_t[]){ 1 });
    gb_output(&b, sa, -1);
    char force_root[16] = { 0 }, root[16];
    cx_executable *e = lower_with_retries(&b, force_root, root);
    cr_assert(force_root[zero], "the zero is stored once for the base, not expanded into a buffer");
    const cx_kernel *relu = NULL, *scatter = NULL;
    for (int k = 0; k < e->nkernels; k++) {
        if (e->kernels[k].kind == K_SCATTER_ADD) scatter = &e->kernels[k];
        if (e->kernels[k].out_slot == e->out_slot[0]) relu = &e->kernels[k];
    }
    cr_assert(relu && scatter);
    cr_assert(cx_view_is_broadcast(&scatter->in[0].view, scatter->in[0].shape, 2), "the base is read as one value");
    cr_assert(!cx_kernel_reads(relu, scatter->in[0].slot), "relu loads no stored zero");
    cr_assert_eq(count_kind(&relu->prog, P_RELU), 1, "the where became a relu");

    float xv[16], out[16], want[16], sv[4] = { 1, 2, 3, 4 }, got[16];
    int64_t iv[4] = { 3, 0, 1, 3 };
    fill(xv, 16, 0.1f);
    for (int i = 0; i < 16; i++) want[i] = expf(xv[i]);
    run(e, (void *[]){ xv, iv, sv }, (void *[]){ out, got });
    assert_close(out, want, 16);
    for (int i = 0; i < 16; i++) want[i] = (i % 4 == iv[i / 4]) ? sv[i / 4] : 0.0f;
    assert_close(got, want, 16);
    cx_executable_free(e);
}

/* ---- epilogue ----------------------------------------------------------------------- */

/* relu as autograd records it: where(0 < v, v, 0) */
static int relu_of(gbuild *b, int v, int nd, const int64_t *shape)
{
    int zero = gb_node(b, OP_CONST, nd, shape, 0, NULL);
    int lt = gb_node(b, OP_LT, nd, shape, 2, (int[]){ zero, v });
    b->nodes[lt].dtype = CX_BOOL;
    return gb_node(b, OP_WHERE, nd, shape, 3, (int[]){ lt, v, zero });
}

Test(epilogue, bias_and_relu_after_a_matmul_run_in_place_in_its_kernel)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int bias = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
    int add = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias });
    gb_output(&b, relu_of(&b, add, 2, M44), -1);
    char root[12];
    cx_executable *e = lower12(&b, root);
    cr_assert_eq(e->nkernels, 2);
    int mm_slot = e->kernels[0].out_slot, out = e->out_slot[0];
    cr_assert_eq(count_kind(&e->kernels[1].prog, P_RELU), 1, "codegen's peephole made the where a relu");

    cx_pass_fuse_epilogues(e);
    cr_assert_eq(e->nkernels, 1, "the bias + relu kernel folds into the matmul (%d kernels)", e->nkernels);
    const cx_kernel *k = &e->kernels[0];
    cr_assert_eq(k->kind, K_MATMUL);
    cr_assert(k->has_epilogue);
    cr_assert_eq(k->epi, EPI_PROG, "BLAS cannot apply a bias itself: the program runs after it");
    cr_assert_eq(k->out_slot, out, "the matmul writes the reader's output");
    cr_assert(cx_kernel_reads(k, out), "and the program reads it there, in place");
    cr_assert(!cx_kernel_reads(k, mm_slot), "nothing reads the matmul's old slot");
    cr_assert_eq(e->slots[mm_slot].last, -1, "which takes no arena space");

    float xv[16], wv[16], bv[16], o[16], want[16];
    fill(xv, 16, 0.1f);
    fill(wv, 16, 0.3f);
    fill(bv, 16, -0.2f);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            float s = bv[i * 4 + j];
            for (int t = 0; t < 4; t++) s += xv[i * 4 + t] * wv[t * 4 + j];
            want[i * 4 + j] = s > 0 ? s : 0;
        }
    run(e, (void *[]){ xv, wv, bv }, (void *[]){ o });
    assert_close(o, want, 16);
    cx_executable_free(e);
}

/* Codegen, then the epilogue pass, which must leave every kernel as it was. */
static void assert_not_folded(const gbuild *b, const char *why)
{
    char root[16];
    cx_executable *e = lower12(b, root);
    int n = e->nkernels;
    cx_pass_fuse_epilogues(e);
    cr_assert_eq(e->nkernels, n, "%s: %d kernels became %d", why, n, e->nkernels);
    for (int k = 0; k < e->nkernels; k++) cr_assert(!e->kernels[k].has_epilogue, "%s: kernel %d folded", why, k);
    cx_executable_free(e);
}

/* x @ w with a bias beside it. @return the matmul */
static int matmul_graph(gbuild *b, int *bias)
{
    gb_init(b);
    int x = gb_node(b, OP_DATA, 2, M44, 0, NULL), w = gb_node(b, OP_DATA, 2, M44, 0, NULL);
    *bias = gb_node(b, OP_DATA, 2, M44, 0, NULL);
    return gb_node(b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
}

Test(epilogue, a_matmul_output_read_any_other_way_keeps_its_own_buffer)
{
    gbuild b;
    int bias, mm = matmul_graph(&b, &bias);
    gb_output(&b, gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias }), -1);
    gb_output(&b, gb_node(&b, OP_EXP, 2, M44, 1, &mm), -1);
    assert_not_folded(&b, "two kernels read the product");

    mm = matmul_graph(&b, &bias);
    int tr = gb_node(&b, OP_PERMUTE, 2, M44, 1, &mm);
    gb_attrs(&b, tr, 2, (int64_t[]){ 1, 0 });
    gb_output(&b, gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ tr, bias }), -1);
    assert_not_folded(&b, "the reader reads the product transposed");

    mm = matmul_graph(&b, &bias);
    gb_output(&b, mm, -1);
    gb_output(&b, gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias }), -1);
    assert_not_folded(&b, "the product is an output itself");

    /* the sum replaces the bias (cx_assign): written over it, the matmul
     * would clobber the bias before the program reads it */
    mm = matmul_graph(&b, &bias);
    gb_output(&b, gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias }), b.nodes[bias].input_ordinal);
    assert_not_folded(&b, "the reader's output may take an input's buffer");
}

/* A conv (or conv input gradient) writing slot 3 from slots 0 and 1, and an
 * f32 kernel computing output slot 4 from it and slot 2 with `ins`; the
 * kernels iterate (N, C, H*W) = (2, 3, 16) as codegen coalesces them. */
static cx_executable *conv_then(cx_kkind heavy, int n, const cx_pinstr *ins)
{
    cx_executable *e = calloc(1, sizeof *e);
    cx_exec_add_slot(e, SLOT_INPUT, 0, 4 * 96);
    cx_exec_add_slot(e, SLOT_INPUT, 1, 4 * 27);
    cx_exec_add_slot(e, SLOT_INPUT, 2, 4 * 96);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 4 * 96);
    cx_exec_add_slot(e, SLOT_OUTPUT, 0, 4 * 96);
    e->n_outputs = 1;
    e->out_alias = malloc(sizeof(int));
    e->out_alias[0] = -1;
    cx_kernel *h = cx_exec_add_kernel(e);
    *h = (cx_kernel){ .kind = heavy, .out_slot = 3, .out_dtype = CX_F32, .out_numel = 96, .ndim = 4,
                      .shape = { 2, 3, 4, 4 }, .nin = 2, .scratch_slot = -1, .wait_at = -1 };
    h->in[0].slot = 0;
    h->in[1].slot = 1;
    cx_kernel *f = cx_exec_add_kernel(e);
    f->kind = K_FUSED;
    f->out_slot = 4;
    f->out_dtype = CX_F32;
    f->out_numel = 96;
    f->ndim = 3;
    memcpy(f->shape, (int64_t[]){ 2, 3, 16 }, 3 * sizeof(int64_t));
    /* view 0: the element's own place; view 1: its channel */
    f->prog.views = calloc(2, sizeof(cx_view));
    f->prog.views[0] = (cx_view){ .strides = { 48, 16, 1 } };
    f->prog.views[1] = (cx_view){ .strides = { 0, 1, 0 } };
    f->prog.nviews = f->prog.vcap = 2;
    f->prog.ins = malloc(sizeof(cx_pinstr) * (size_t)n);
    memcpy(f->prog.ins, ins, sizeof(cx_pinstr) * (size_t)n);
    f->prog.n = f->prog.cap = n;
    f->prog.result = n - 1;
    return e;
}

#define LOAD(s, v) ((cx_pinstr){ .kind = P_LOAD, .dtype = CX_F32, .src_dtype = CX_F32, .slot = (s), .view = (v) })
#define BIN(o, x, y) ((cx_pinstr){ .kind = P_BIN, .op = (o), .dtype = CX_F32, .src_dtype = CX_F32, .a = (x), .b = (y) })
#define UN(o, x) ((cx_pinstr){ .kind = P_UN, .op = (o), .dtype = CX_F32, .a = (x) })
#define RELU(x) ((cx_pinstr){ .kind = P_RELU, .dtype = CX_F32, .a = (x) })
#define POSMASK(m, g) ((cx_pinstr){ .kind = P_POSMASK, .dtype = CX_F32, .a = (m), .b = (g) })

/* Folds and returns how the epilogue runs; *load = the bias or mask load. */
static cx_epi fold_conv(cx_kkind heavy, int n, const cx_pinstr *ins, int *load)
{
    cx_executable *e = conv_then(heavy, n, ins);
    cx_pass_fuse_epilogues(e);
    cr_assert_eq(e->nkernels, 1, "the kernel after the conv folds into it");
    const cx_kernel *k = &e->kernels[0];
    cr_assert(k->kind == heavy && k->has_epilogue && k->out_slot == 4);
    cr_assert(cx_kernel_reads(k, 4) && !cx_kernel_reads(k, 3), "the program reads the conv's output in place");
    cx_epi epi = (cx_epi)k->epi;
    *load = k->epi_load;
    cx_executable_free(e);
    return epi;
}

Test(epilogue, a_conv_applies_a_channel_bias_and_relu_itself)
{
    int load;
    cr_assert_eq(fold_conv(K_CONV, 4, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 0, 1), RELU(2) }, &load),
                 EPI_BIAS_RELU);
    cr_assert_eq(load, 1, "the bias is the second load");
    cr_assert_eq(fold_conv(K_CONV, 3, (cx_pinstr[]){ LOAD(2, 1), LOAD(3, 0), BIN(OP_ADD, 0, 1) }, &load), EPI_BIAS);
    cr_assert_eq(load, 0, "bias + out: the bias is the first load");
    /* a residual (one value per element) or another op is the program's */
    cr_assert_eq(fold_conv(K_CONV, 3, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 0), BIN(OP_ADD, 0, 1) }, &load), EPI_PROG);
    cr_assert_eq(fold_conv(K_CONV, 3, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), BIN(OP_MUL, 0, 1) }, &load), EPI_PROG);
    cr_assert_eq(fold_conv(K_CONV, 4, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 0, 1), UN(OP_TANH, 2) }, &load),
                 EPI_PROG);
}

Test(epilogue, a_conv_input_gradient_applies_relus_gradient_mask_itself)
{
    int load;
    /* where(0 < mask, grad, 0) */
    cr_assert_eq(fold_conv(K_CONV_BI, 3, (cx_pinstr[]){ LOAD(2, 0), LOAD(3, 0), POSMASK(0, 1) }, &load), EPI_POSMASK);
    cr_assert_eq(load, 0, "the mask is the first load");
    /* where(0 < grad, mask, 0) keeps the mask's values: not the same thing */
    cr_assert_eq(fold_conv(K_CONV_BI, 3, (cx_pinstr[]){ LOAD(2, 0), LOAD(3, 0), POSMASK(1, 0) }, &load), EPI_PROG);
    /* a mask per channel is not in the output's layout */
    cr_assert_eq(fold_conv(K_CONV_BI, 3, (cx_pinstr[]){ LOAD(2, 1), LOAD(3, 0), POSMASK(0, 1) }, &load), EPI_PROG);
}

/* The same fold in bf16 (autocast): the conv's output and the program
 * are bf16, the f32 bias is cast to bf16 in the program, and the mask is
 * bf16; the bf16 kernels then apply each step rounded as the program
 * would (ops_bf16/conv_and_pool_epilogues_folded_in_bf16 checks the bits). */
static cx_epi fold_bf16(cx_kkind heavy, int n, cx_pinstr *ins, int *load)
{
    cx_executable *e = conv_then(heavy, n, ins);
    e->kernels[0].out_dtype = e->kernels[1].out_dtype = CX_BF16;
    cx_pass_fuse_epilogues(e);
    cr_assert_eq(e->nkernels, 1, "the kernel after the conv folds into it");
    cx_epi epi = (cx_epi)e->kernels[0].epi;
    *load = e->kernels[0].epi_load;
    cx_executable_free(e);
    return epi;
}

#define B16(x) ({ cx_pinstr b16_ = (x); b16_.dtype = CX_BF16; if (b16_.kind == P_LOAD) b16_.src_dtype = CX_BF16; b16_; })
#define CAST16(x) ((cx_pinstr){ .kind = P_CAST, .dtype = CX_BF16, .a = (x) })

Test(epilogue, a_bf16_conv_applies_the_cast_bias_relu_and_mask_itself)
{
    int load;
    cr_assert_eq(fold_bf16(K_CONV, 5, (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), B16(BIN(OP_ADD, 0, 2)), B16(RELU(3)) }, &load),
                 EPI_BIAS_RELU);
    cr_assert_eq(load, 1, "the f32 bias is the second load");
    cr_assert_eq(fold_bf16(K_CONV, 4, (cx_pinstr[]){ LOAD(2, 1), B16(LOAD(3, 0)), CAST16(0), B16(BIN(OP_ADD, 2, 1)) }, &load),
                 EPI_BIAS);
    cr_assert_eq(load, 0);
    /* a bias already bf16 in memory, or added in f32, is the program's */
    cr_assert_eq(fold_bf16(K_CONV, 3, (cx_pinstr[]){ B16(LOAD(3, 0)), B16(LOAD(2, 1)), B16(BIN(OP_ADD, 0, 1)) }, &load),
                 EPI_PROG);
    cr_assert_eq(fold_bf16(K_CONV, 5, (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), BIN(OP_ADD, 0, 2), B16(RELU(3)) }, &load),
                 EPI_PROG);
    /* the cast must be of the bias */
    cr_assert_eq(fold_bf16(K_CONV, 5, (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(0), B16(BIN(OP_ADD, 0, 2)), B16(RELU(3)) }, &load),
                 EPI_PROG);
    cr_assert_eq(fold_bf16(K_CONV_BI, 3, (cx_pinstr[]){ B16(LOAD(2, 0)), B16(LOAD(3, 0)), B16(POSMASK(0, 1)) }, &load),
                 EPI_POSMASK);
    cr_assert_eq(load, 0, "the mask is the first load");
    cr_assert_eq(fold_bf16(K_MAXPOOL_BWD, 3, (cx_pinstr[]){ B16(LOAD(2, 0)), B16(LOAD(3, 0)), B16(POSMASK(0, 1)) }, &load),
                 EPI_POSMASK);
    /* an f32 mask under a bf16 output is the program's */
    cr_assert_eq(fold_bf16(K_CONV_BI, 3, (cx_pinstr[]){ LOAD(2, 0), B16(LOAD(3, 0)), B16(POSMASK(0, 1)) }, &load),
                 EPI_PROG);
}

/* A bf16 matmul (6, 8) x (8, 16) before a bf16 program over its (6, 16)
 * output whose second view reads bias_view's strides; dtype is the
 * matmul's and the program's. */
static cx_epi fold_matmul_view(int dtype, const int64_t *bias_strides, int64_t offset, bool masked, int n,
                               cx_pinstr *ins, int *load)
{
    cx_executable *e = conv_then(K_MATMUL, n, ins);
    cx_kernel *h = &e->kernels[0], *f = &e->kernels[1];
    h->out_dtype = f->out_dtype = dtype;
    h->ndim = 2;
    memcpy(h->shape, (int64_t[]){ 6, 16 }, 2 * sizeof(int64_t));
    h->in[0].ndim = h->in[1].ndim = 2;
    memcpy(h->in[0].shape, (int64_t[]){ 6, 8 }, 2 * sizeof(int64_t));
    memcpy(h->in[1].shape, (int64_t[]){ 8, 16 }, 2 * sizeof(int64_t));
    f->ndim = 2;
    memcpy(f->shape, (int64_t[]){ 6, 16 }, 2 * sizeof(int64_t));
    f->prog.views[0] = (cx_view){ .strides = { 16, 1 } };
    f->prog.views[1] = (cx_view){ .offset = offset, .strides = { bias_strides[0], bias_strides[1] }, .masked = masked,
                                  .hi = { 6, 16 } };
    cx_pass_fuse_epilogues(e);
    cr_assert_eq(e->nkernels, 1, "the kernel after the matmul folds into it");
    cx_epi epi = (cx_epi)e->kernels[0].epi;
    *load = e->kernels[0].epi_load;
    cx_executable_free(e);
    return epi;
}

static cx_epi fold_matmul(int dtype, const int64_t *bias_strides, int n, cx_pinstr *ins, int *load)
{
    return fold_matmul_view(dtype, bias_strides, 0, false, n, ins, load);
}

/* autocast's Linear: a bf16 matmul adds the f32 bias cast to bf16 (and a
 * relu after it) itself; a bias per row or a bias already bf16 stay the
 * program's (ops_bf16/linear_bias_folded_in_bf16 checks the bits) */
Test(epilogue, a_bf16_linear_applies_its_cast_bias_itself)
{
    int load;
    const int64_t col[2] = { 0, 1 }, row[2] = { 1, 0 };
    cr_assert_eq(fold_matmul(CX_BF16, col, 4, (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), B16(BIN(OP_ADD, 0, 2)) }, &load),
                 EPI_BIAS);
    cr_assert_eq(load, 1, "the f32 bias is the second load");
    cr_assert_eq(fold_matmul(CX_BF16, col, 5, (cx_pinstr[]){ LOAD(2, 1), B16(LOAD(3, 0)), CAST16(0), B16(BIN(OP_ADD, 2, 1)), B16(RELU(3)) }, &load),
                 EPI_BIAS_RELU);
    cr_assert_eq(load, 0);
    cr_assert_eq(fold_matmul(CX_BF16, row, 4, (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), B16(BIN(OP_ADD, 0, 2)) }, &load),
                 EPI_PROG);
    cr_assert_eq(fold_matmul(CX_BF16, col, 3, (cx_pinstr[]){ B16(LOAD(3, 0)), B16(LOAD(2, 1)), B16(BIN(OP_ADD, 0, 1)) }, &load),
                 EPI_PROG);
    /* a bias read from an offset or through a mask (padding) is not bias[column] */
    cr_assert_eq(fold_matmul_view(CX_BF16, col, 3, false, 4,
                                  (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), B16(BIN(OP_ADD, 0, 2)) }, &load),
                 EPI_PROG);
    cr_assert_eq(fold_matmul_view(CX_BF16, col, 0, true, 4,
                                  (cx_pinstr[]){ B16(LOAD(3, 0)), LOAD(2, 1), CAST16(1), B16(BIN(OP_ADD, 0, 2)) }, &load),
                 EPI_PROG);
}

/* An f32 Linear: the matmul adds its bias (then a relu, or a residual of
 * the output's shape added after the bias, loaded in any order) itself;
 * a residual added before the bias, or read through another view, stays
 * the program's (ops_bf16/linear_epilogues_folded_in_f32 checks the bits) */
Test(epilogue, an_f32_linear_applies_its_bias_relu_and_residual_itself)
{
    int load;
    const int64_t col[2] = { 0, 1 }, row[2] = { 1, 0 };
    cr_assert_eq(fold_matmul(CX_F32, col, 3, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 0, 1) }, &load), EPI_BIAS);
    cr_assert_eq(load, 1);
    cr_assert_eq(fold_matmul(CX_F32, col, 4, (cx_pinstr[]){ LOAD(2, 1), LOAD(3, 0), BIN(OP_ADD, 1, 0), RELU(2) }, &load),
                 EPI_BIAS_RELU);
    cr_assert_eq(load, 0);
    /* r + (out + bias), r loaded first (the gpt's projections) or last */
    cr_assert_eq(fold_matmul(CX_F32, col, 5, (cx_pinstr[]){ LOAD(0, 0), LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 1, 2), BIN(OP_ADD, 0, 3) }, &load),
                 EPI_BIAS_ADD);
    cr_assert_eq(load, 2, "the bias is the third load");
    cr_assert_eq(fold_matmul(CX_F32, col, 5, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), LOAD(0, 0), BIN(OP_ADD, 0, 1), BIN(OP_ADD, 3, 2) }, &load),
                 EPI_BIAS_ADD);
    cr_assert_eq(load, 1);
    /* (out + r) + bias is another sum */
    cr_assert_eq(fold_matmul(CX_F32, col, 5, (cx_pinstr[]){ LOAD(0, 0), LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 0, 1), BIN(OP_ADD, 3, 2) }, &load),
                 EPI_PROG);
    /* a second bias per column is no residual; a bias per row no bias */
    cr_assert_eq(fold_matmul(CX_F32, col, 5, (cx_pinstr[]){ LOAD(0, 1), LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 1, 2), BIN(OP_ADD, 0, 3) }, &load),
                 EPI_PROG);
    cr_assert_eq(fold_matmul(CX_F32, row, 3, (cx_pinstr[]){ LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 0, 1) }, &load), EPI_PROG);
    cr_assert_eq(fold_matmul(CX_F32, col, 5, (cx_pinstr[]){ LOAD(0, 0), LOAD(3, 0), LOAD(2, 1), BIN(OP_ADD, 1, 2), BIN(OP_MUL, 0, 3) }, &load),
                 EPI_PROG);
}

/* ---- hand-built programs -------------------------------------------------------------- */

#define ZERO ((cx_pinstr){ .kind = P_CONST, .dtype = CX_F32, .f = 0.0 })
#define ONE ((cx_pinstr){ .kind = P_CONST, .dtype = CX_F32, .f = 1.0 })
#define LESS(x, y) ((cx_pinstr){ .kind = P_BIN, .op = OP_LT, .dtype = CX_BOOL, .src_dtype = CX_F32, .a = (x), .b = (y) })
#define WHERE(k, x, y) ((cx_pinstr){ .kind = P_WHERE, .dtype = CX_F32, .a = (k), .b = (x), .c = (y) })

/* Owns copies of ins and views. */
static cx_program prog_of(int n, const cx_pinstr *ins, int result, int nviews, const cx_view *views)
{
    cx_program p = { .n = n, .cap = n, .nviews = nviews, .vcap = nviews, .result = result };
    p.ins = malloc(sizeof *ins * (size_t)n);
    p.views = malloc(sizeof *views * (size_t)nviews);
    memcpy(p.ins, ins, sizeof *ins * (size_t)n);
    memcpy(p.views, views, sizeof *views * (size_t)nviews);
    return p;
}

static void prog_free(cx_program *p)
{
    free(p->ins);
    free(p->views);
}

/* Runs p as the one f32 kernel of an executable over `shape`, reading input
 * ordinal i as slot i. */
static void eval(const cx_program *p, int nd, const int64_t *shape, int nin, void *const *in, float *out)
{
    cx_executable *e = calloc(1, sizeof *e);
    for (int i = 0; i < nin; i++) cx_exec_add_slot(e, SLOT_INPUT, i, 0);
    cx_exec_add_slot(e, SLOT_OUTPUT, 0, 0);
    e->n_inputs = nin;
    e->n_outputs = 1;
    cx_kernel *k = cx_exec_add_kernel(e);
    k->kind = K_FUSED;
    k->out_slot = nin;
    k->out_dtype = CX_F32;
    k->ndim = nd;
    k->out_numel = 1;
    for (int d = 0; d < nd; d++) { k->shape[d] = shape[d]; k->out_numel *= shape[d]; }
    k->prog = prog_of(p->n, p->ins, p->result, p->nviews, p->views);
    run(e, in, (void *[]){ out });
    cx_executable_free(e);
}

static const cx_view FLAT = { .strides = { 1 } };

/* Peephole p and check that it still computes what it did over 16 elements
 * of inputs x and y. */
static void peephole_keeps_values(cx_program *p, const float *want)
{
    float x[16], y[16], before[16], after[16];
    fill(x, 16, 1.0f);   /* negatives, zeros and positives */
    fill(y, 16, -0.5f);
    eval(p, 1, (int64_t[]){ 16 }, 2, (void *[]){ x, y }, before);
    cx_prog_peephole(p);
    eval(p, 1, (int64_t[]){ 16 }, 2, (void *[]){ x, y }, after);
    assert_close(after, before, 16);
    if (want) assert_close(after, want, 16);
}

/* ---- peephole ------------------------------------------------------------------------- */

Test(peephole, where_zero_less_than_x_x_else_zero_is_one_relu)
{
    cx_program p = prog_of(4, (cx_pinstr[]){ LOAD(0, 0), ZERO, LESS(1, 0), WHERE(2, 0, 1) }, 3, 1, &FLAT);
    float x[16], want[16];
    fill(x, 16, 1.0f);
    for (int i = 0; i < 16; i++) want[i] = x[i] > 0 ? x[i] : 0;
    peephole_keeps_values(&p, want);
    cr_assert_eq(p.n, 2, "load, relu; the compare and the constant are dead (%d instructions)", p.n);
    cr_assert_eq(p.result, 1);
    cr_assert_eq(p.ins[1].kind, P_RELU);
    cr_assert_eq(p.ins[1].a, 0);
    prog_free(&p);
}

Test(peephole, where_zero_less_than_m_g_else_zero_is_one_posmask)
{
    /* relu's gradient: g where the forward input m was positive */
    cx_program p = prog_of(5, (cx_pinstr[]){ LOAD(0, 0), LOAD(1, 0), ZERO, LESS(2, 0), WHERE(3, 1, 2) }, 4, 1, &FLAT);
    float m[16], g[16], want[16];
    fill(m, 16, 1.0f);
    fill(g, 16, -0.5f);
    for (int i = 0; i < 16; i++) want[i] = m[i] > 0 ? g[i] : 0;
    peephole_keeps_values(&p, want);
    cr_assert_eq(p.n, 3, "load, load, posmask (%d instructions)", p.n);
    cr_assert_eq(p.ins[2].kind, P_POSMASK);
    cr_assert(p.ins[2].a == 0 && p.ins[2].b == 1, "mask first, then the value kept");
    prog_free(&p);
}

Test(peephole, wheres_that_are_not_relu_stay_wheres)
{
    /* where(0 < x, x, 1): the else is not zero */
    cx_program p = prog_of(5, (cx_pinstr[]){ LOAD(0, 0), ZERO, ONE, LESS(1, 0), WHERE(3, 0, 2) }, 4, 1, &FLAT);
    peephole_keeps_values(&p, NULL);
    cr_assert_eq(p.n, 5);
    cr_assert_eq(p.ins[4].kind, P_WHERE);
    prog_free(&p);
    /* where(x < 0, x, 0) is min(x, 0) */
    p = prog_of(4, (cx_pinstr[]){ LOAD(0, 0), ZERO, LESS(0, 1), WHERE(2, 0, 1) }, 3, 1, &FLAT);
    peephole_keeps_values(&p, NULL);
    cr_assert_eq(p.n, 4);
    cr_assert_eq(p.ins[3].kind, P_WHERE);
    prog_free(&p);
    /* where(0 < x, x, 0) computed in i32 and cast: relu is an f32 instruction */
    cx_pinstr izero = ZERO, iwhere = WHERE(2, 0, 1);
    izero.dtype = iwhere.dtype = CX_I32;
    cx_pinstr iload = LOAD(0, 0), ilt = LESS(1, 0), cast = { .kind = P_CAST, .dtype = CX_F32, .a = 3 };
    iload.dtype = ilt.src_dtype = CX_I32;
    p = prog_of(5, (cx_pinstr[]){ iload, izero, ilt, iwhere, cast }, 4, 1, &FLAT);
    cx_prog_peephole(&p);
    cr_assert_eq(p.n, 5);
    cr_assert_eq(p.ins[3].kind, P_WHERE);
    prog_free(&p);
}

Test(peephole, dead_instructions_go_and_registers_are_renumbered)
{
    /* -(x + y), with an unused exp(x) in the middle and one after the result */
    cx_program p = prog_of(6, (cx_pinstr[]){ LOAD(0, 0), LOAD(1, 0), UN(OP_EXP, 0), BIN(OP_ADD, 0, 1), UN(OP_NEG, 3),
                                             UN(OP_EXP, 4) }, 4, 1, &FLAT);
    float x[16], y[16], want[16];
    fill(x, 16, 1.0f);
    fill(y, 16, -0.5f);
    for (int i = 0; i < 16; i++) want[i] = -(x[i] + y[i]);
    peephole_keeps_values(&p, want);
    cr_assert_eq(p.n, 4, "%d instructions", p.n);
    cr_assert(p.ins[2].kind == P_BIN && p.ins[2].a == 0 && p.ins[2].b == 1);
    cr_assert(p.ins[3].kind == P_UN && p.ins[3].op == OP_NEG && p.ins[3].a == 2, "the neg reads the add's new register");
    cr_assert_eq(p.result, 3);
    prog_free(&p);
}

/* ---- coalesce ------------------------------------------------------------------------- */

/* Coalesces a copy of the views over `shape`; the results come back
 * through shape, views and split. @return the new rank */
static int coalesce(int nd, int64_t *shape, int nviews, cx_view *views, int *split)
{
    cx_program p = prog_of(1, (cx_pinstr[]){ LOAD(0, 0) }, 0, nviews, views);
    int r = cx_prog_coalesce(&p, shape, nd, split);
    memcpy(views, p.views, sizeof *views * (size_t)nviews);
    prog_free(&p);
    return r;
}

Test(coalesce, dims_every_view_reads_linearly_merge_and_others_do_not)
{
    /* x (2, 3, 4) + y (3, 4) broadcast over the first dim: the last two
     * dims are one run for both, the first is not (y does not move) */
    cx_view v[2] = { { .strides = { 12, 4, 1 } }, { .strides = { 0, 4, 1 } } };
    cx_program p = prog_of(3, (cx_pinstr[]){ LOAD(0, 0), LOAD(1, 1), BIN(OP_ADD, 0, 1) }, 2, 2, v);
    float x[24], y[12], before[24], after[24];
    fill(x, 24, 1.0f);
    fill(y, 12, 0.25f);
    int64_t shape[3] = { 2, 3, 4 };
    eval(&p, 3, shape, 2, (void *[]){ x, y }, before);
    int split = 0;
    int nd = cx_prog_coalesce(&p, shape, 3, &split);
    cr_assert_eq(nd, 2, "rank %d", nd);
    cr_assert(shape[0] == 2 && shape[1] == 12);
    cr_assert(p.views[0].strides[0] == 12 && p.views[0].strides[1] == 1);
    cr_assert(p.views[1].strides[0] == 0 && p.views[1].strides[1] == 1);
    eval(&p, nd, shape, 2, (void *[]){ x, y }, after);
    assert_close(after, before, 24);
    prog_free(&p);

    /* alone, x is one run */
    int64_t s2[3] = { 2, 3, 4 };
    cr_assert_eq(coalesce(3, s2, 1, (cx_view[]){ { .strides = { 12, 4, 1 } } }, &split), 1);
    cr_assert_eq(s2[0], 24);

    /* a transposed read never merges */
    int64_t s3[2] = { 4, 4 };
    cx_view t[2] = { { .strides = { 4, 1 } }, { .strides = { 1, 4 } } };
    cr_assert_eq(coalesce(2, s3, 2, t, &split), 2);
    cr_assert(t[1].strides[0] == 1 && t[1].strides[1] == 4);
}

Test(coalesce, size_one_dims_drop_out)
{
    /* (3, 1, 4) read as a broadcast along the middle dim: without it, the
     * rest is one run */
    cx_view v = { .strides = { 4, 0, 1 } };
    cx_program p = prog_of(2, (cx_pinstr[]){ LOAD(0, 0), UN(OP_NEG, 0) }, 1, 1, &v);
    float x[12], before[12], after[12];
    fill(x, 12, 1.0f);
    int64_t shape[3] = { 3, 1, 4 };
    eval(&p, 3, shape, 1, (void *[]){ x }, before);
    int split = 0;
    int nd = cx_prog_coalesce(&p, shape, 3, &split);
    cr_assert_eq(nd, 1, "rank %d", nd);
    cr_assert_eq(shape[0], 12);
    cr_assert_eq(p.views[0].strides[0], 1);
    eval(&p, nd, shape, 1, (void *[]){ x }, after);
    assert_close(after, before, 12);
    prog_free(&p);
}

Test(coalesce, a_reduction_keeps_its_kept_and_reduced_dims_apart)
{
    /* kept (4) | reduced (4), contiguous: merging them would reduce nothing */
    int64_t shape[2] = { 4, 4 };
    int split = 1;
    cr_assert_eq(coalesce(2, shape, 1, (cx_view[]){ { .strides = { 4, 1 } } }, &split), 2);
    cr_assert_eq(split, 1);
    /* kept (1, 4) | reduced (4): the size-1 kept dim goes, the split follows */
    int64_t s3[3] = { 1, 4, 4 };
    split = 2;
    int nd = coalesce(3, s3, 1, (cx_view[]){ { .strides = { 0, 4, 1 } } }, &split);
    cr_assert_eq(nd, 2, "rank %d", nd);
    cr_assert_eq(split, 1, "one kept dim left (split %d)", split);
    cr_assert(s3[0] == 4 && s3[1] == 4);
    /* kept (2) | reduced (3, 4): the reduced dims are one run */
    int64_t s4[3] = { 2, 3, 4 };
    split = 1;
    nd = coalesce(3, s4, 1, (cx_view[]){ { .strides = { 12, 4, 1 } } }, &split);
    cr_assert_eq(nd, 2, "rank %d", nd);
    cr_assert(split == 1 && s4[0] == 2 && s4[1] == 12);
    /* kept (2, 3) | reduced (4): the kept dims are one run, the split follows */
    int64_t s5[3] = { 2, 3, 4 };
    split = 2;
    nd = coalesce(3, s5, 1, (cx_view[]){ { .strides = { 12, 4, 1 } } }, &split);
    cr_assert_eq(nd, 2, "rank %d", nd);
    cr_assert(split == 1 && s5[0] == 6 && s5[1] == 4, "split %d, shape (%lld, %lld)", split, (long long)s5[0],
              (long long)s5[1]);
}

Test(coalesce, a_padded_read_merges_only_where_its_mask_spans_whole_dims)
{
    /* valid columns 1..3 of each row: the rows cannot become one run */
    int64_t shape[2] = { 4, 4 };
    int split = 0;
    cx_view m = { .strides = { 4, 1 }, .masked = true, .lo = { 0, 1 }, .hi = { 4, 3 } };
    cr_assert_eq(coalesce(2, shape, 1, &m, &split), 2);
    /* valid everywhere: one run, its mask over the merged dim */
    m = (cx_view){ .strides = { 4, 1 }, .masked = true, .lo = { 0, 0 }, .hi = { 4, 4 } };
    cr_assert_eq(coalesce(2, shape, 1, &m, &split), 1);
    cr_assert(shape[0] == 16 && m.lo[0] == 0 && m.hi[0] == 16, "mask [%lld, %lld)", (long long)m.lo[0],
              (long long)m.hi[0]);
    /* a size-1 dim with nothing valid in it is not dropped */
    int64_t s2[2] = { 4, 1 };
    m = (cx_view){ .strides = { 1, 1 }, .masked = true, .lo = { 0, 0 }, .hi = { 4, 0 } };
    cr_assert_eq(coalesce(2, s2, 1, &m, &split), 2);
}
