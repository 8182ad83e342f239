/* The compiler's passes one at a time, on hand-built graphs and
 * executables: which nodes become kernels, what fuses, the order the
 * collectives are issued in, where they wait, which buffers alias, and the
 * arena plan. (End-to-end checks through real steps live in test_compile.c.) */
#include <criterion/criterion.h>

#include "passes.h"
#include "graph_builder.h"

static void group(const gbuild *b, char *root)
{
    cx_uses u;
    cr_assert(cx_uses_build(&b->g, &u));
    cr_assert(cx_pass_group(&b->g, &u, NULL, root));
    cx_uses_free(&b->g, &u);
}

static const int64_t V8[] = { 8 }, M44[] = { 4, 4 };

Test(passes, group_fuses_chains_into_their_consumer)
{
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 1, V8, 0, NULL), c = gb_node(&b, OP_DATA, 1, V8, 0, NULL);
    int add = gb_node(&b, OP_ADD, 1, V8, 2, (int[]){ a, c });
    int ex = gb_node(&b, OP_EXP, 1, V8, 1, &add);
    int64_t one[] = { 1 };
    int sum = gb_node(&b, OP_REDUCE_SUM, 1, one, 1, &ex);
    gb_attrs(&b, sum, 1, (int64_t[]){ 1 });
    gb_output(&b, sum, -1);
    char root[8];
    group(&b, root);
    cr_assert(root[a] && root[c], "data leaves are buffers");
    cr_assert(!root[add] && !root[ex], "an elementwise chain feeding a reduction is its prologue");
    cr_assert(root[sum]);
}

Test(passes, group_materializes_a_value_two_kernels_read)
{
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &a);
    int tr = gb_node(&b, OP_PERMUTE, 2, M44, 1, &ex);
    gb_attrs(&b, tr, 2, (int64_t[]){ 1, 0 });
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ ex, tr });
    int neg = gb_node(&b, OP_NEG, 2, M44, 1, &mm);
    gb_output(&b, neg, -1);
    char root[8];
    group(&b, root);
    cr_assert(root[ex], "exp feeds a matmul (a heavy op reads buffers): it must be a kernel");
    cr_assert(!root[tr], "a view is never a kernel by itself");
    cr_assert(root[mm] && root[neg], "matmul and outputs are kernels");
}

Test(passes, group_recomputes_a_cheap_op_several_kernels_read)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), y = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int h = gb_node(&b, OP_MUL, 2, M44, 2, (int[]){ x, y });
    int e1 = gb_node(&b, OP_EXP, 2, M44, 1, &h), e2 = gb_node(&b, OP_NEG, 2, M44, 1, &h);
    gb_output(&b, e1, -1);
    gb_output(&b, e2, -1);
    /* the same op also read by a matmul, which reads buffers */
    int h2 = gb_node(&b, OP_SUB, 2, M44, 2, (int[]){ x, y });
    int f1 = gb_node(&b, OP_EXP, 2, M44, 1, &h2);
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ h2, w });
    gb_output(&b, f1, -1);
    gb_output(&b, mm, -1);
    /* over a matmul output: the matmul's epilogue */
    int mm2 = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
    int h3 = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm2, y });
    int g1 = gb_node(&b, OP_EXP, 2, M44, 1, &h3), g2 = gb_node(&b, OP_NEG, 2, M44, 1, &h3);
    gb_output(&b, g1, -1);
    gb_output(&b, g2, -1);
    char root[32];
    group(&b, root);
    cr_assert(!root[h], "x*y read by two kernels is computed in each, not stored");
    cr_assert(root[e1] && root[e2]);
    cr_assert(root[h2], "x-y read by a matmul must be a buffer");
    cr_assert(root[h3], "an op over a matmul output stays the matmul's epilogue");
}

Test(passes, group_stores_a_cheap_op_when_recomputing_moves_more)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    /* two buffer operands and four readers: 8 reads against the 7 of storing it */
    int s2 = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ x, w });
    for (int r = 0; r < 4; r++) gb_output(&b, gb_node(&b, r % 2 ? OP_EXP : OP_NEG, 2, M44, 1, &s2), -1);
    char root[8];
    group(&b, root);
    cr_assert(root[s2], "x+w read by four kernels would move more memory recomputed");
}

/* GELU as a transformer's MLP runs it: h = x w + b; u = 1 + erf(h c),
 * which the backward reads again; y = (h / 2) u. u is an expression over
 * one buffer read by two kernels: each computes it, and nothing stores it. */
Test(passes, lower_recomputes_an_erf_expression_two_kernels_read)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int bias = gb_node(&b, OP_DATA, 2, M44, 0, NULL), g = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
    int h = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias });
    int c = gb_node(&b, OP_CONST, 2, M44, 0, NULL), one = gb_node(&b, OP_CONST, 2, M44, 0, NULL);
    b.g.nodes[c].fval = 0.7071067811865476;
    b.g.nodes[one].fval = 1;
    int hc = gb_node(&b, OP_MUL, 2, M44, 2, (int[]){ h, c });
    int er = gb_node(&b, OP_ERF, 2, M44, 1, &hc);
    int u = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ er, one });
    int y = gb_node(&b, OP_MUL, 2, M44, 2, (int[]){ h, u });
    int dz = gb_node(&b, OP_MUL, 2, M44, 2, (int[]){ u, g });
    gb_output(&b, y, -1);
    gb_output(&b, dz, -1);
    char root[32];
    group(&b, root);
    cr_assert(!root[u] && !root[er] && !root[hc], "1 + erf(h c) read by two kernels is computed in each");
    cr_assert(root[h], "h, over a matmul output, stays the matmul's epilogue");
    cx_executable *e = cx_lower(&b.g);
    cr_assert_not_null(e, "%s", cx_last_error());
    cr_assert_eq(e->nkernels, 3, "%d kernels, expected the matmul with its bias and the two readers of u", e->nkernels);
    cx_executable_free(e);
    /* with a tanh instead of the erf (one libm call an element) u is stored */
    b.g.nodes[er].op = OP_TANH;
    group(&b, root);
    cr_assert(root[u], "tanh(h c) + 1 is computed once");
    e = cx_lower(&b.g);
    cr_assert_not_null(e, "%s", cx_last_error());
    cr_assert_eq(e->nkernels, 4, "%d kernels with tanh, expected 4", e->nkernels);
    cx_executable_free(e);
}

Test(passes, lower_counts_kernels_and_fuses_the_matmul_epilogue)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int bias = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
    int add = gb_node(&b, OP_ADD, 2, M44, 2, (int[]){ mm, bias });
    int th = gb_node(&b, OP_TANH, 2, M44, 1, &add);
    gb_output(&b, th, -1);
    cx_executable *e = cx_lower(&b.g);
    cr_assert_not_null(e, "%s", cx_last_error());
    cr_assert_eq(e->nkernels, 1, "matmul + bias + tanh: %d kernels, expected the matmul with its epilogue", e->nkernels);
    cr_assert_eq(e->kernels[0].kind, K_MATMUL);
    cr_assert(e->kernels[0].has_epilogue);
    cr_assert_eq(e->arena_bytes, 0, "the matmul's own output needs no arena slot once fused");
    /* and the persistent cache's check accepts it (its dead slot once lay outside the empty arena) */
    cx_sbuf wire = { 0 };
    cx_exec_serialize(&wire, e);
    cx_executable *d = wire.oom ? NULL : cx_exec_deserialize((const unsigned char *)wire.s, wire.n);
    cr_assert_not_null(d, "the stored form of a program whose only arena slot is dead is refused");
    free(wire.s);
    cx_executable_free(d);
    cx_executable_free(e);
}

/* For dumps and the desync message: a kernel names the graph node it
 * computes and that node's location (XLA_IR_DEBUG); the persistent cache
 * stores neither (they mean nothing in another process). */
Test(passes, kernels_name_their_node_and_location_but_the_stored_form_does_not)
{
    gbuild b;
    gb_init(&b);
    int x = gb_node(&b, OP_DATA, 2, M44, 0, NULL), w = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, M44, 2, (int[]){ x, w });
    int th = gb_node(&b, OP_TANH, 2, M44, 1, &mm);
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &mm);
    gb_output(&b, th, -1);
    gb_output(&b, ex, -1);
    b.g.nodes[mm].loc = 11;
    b.g.nodes[th].loc = 12;
    b.g.nodes[ex].loc = 13;
    cx_executable *e = cx_lower(&b.g);
    cr_assert_not_null(e, "%s", cx_last_error());
    cr_assert_eq(e->nkernels, 3, "the matmul (read twice: no epilogue), tanh, exp: %d kernels", e->nkernels);
    bool seen[5] = { false };
    for (int k = 0; k < e->nkernels; k++) {
        int n = e->kernels[k].node;
        cr_assert(n == mm || n == th || n == ex, "kernel %d names node %d", k, n);
        cr_assert_eq(e->kernels[k].loc, b.g.nodes[n].loc, "kernel %d: its node's location", k);
        seen[n] = true;
    }
    cr_assert(seen[mm] && seen[th] && seen[ex]);
    cx_sbuf wire = { 0 };
    cx_exec_serialize(&wire, e);
    cr_assert(!wire.oom);
    cx_executable *d = cx_exec_deserialize((const unsigned char *)wire.s, wire.n);
    cr_assert_not_null(d);
    for (int k = 0; k < d->nkernels; k++) {
        cr_assert_eq(d->kernels[k].node, -1, "kernel %d: a stored kernel names no node", k);
        cr_assert_eq(d->kernels[k].loc, 0u, "kernel %d: a stored kernel has no location", k);
    }
    free(wire.s);
    cx_executable_free(d);
    cx_executable_free(e);
}

Test(passes, codegen_retries_with_a_root_where_a_view_is_not_affine)
{
    /* reshape (4,4)->(16) of a transposed value is not an affine map of a
     * contiguous buffer: the transpose must be materialized first */
    gbuild b;
    gb_init(&b);
    int a = gb_node(&b, OP_DATA, 2, M44, 0, NULL);
    int ex = gb_node(&b, OP_EXP, 2, M44, 1, &a);
    int tr = gb_node(&b, OP_PERMUTE, 2, M44, 1, &ex);
    gb_attrs(&b, tr, 2, (int64_t[]){ 1, 0 });
    int64_t s16[] = { 16 };
    int rs = gb_node(&b, OP_RESHAPE, 1, s16, 1, &tr);
    int64_t s2[] = { 2 };
    int sl = gb_node(&b, OP_SLICE, 1, s2, 1, &rs);
    gb_attrs(&b, sl, 3, (int64_t[]){ 0, 3, 5 });
    int ng = gb_node(&b, OP_NEG, 1, s2, 1, &sl);
    gb_output(&b, ng, -1);
    cx_executable *e = cx_lower(&b.g);
    cr_assert_not_null(e, "%s", cx_last_error());
    cr_assert_leq(e->nkernels, 2);
    cx_executable_free(e);
}

/* ---- hand-built executables ------------------------------------------------------------ */

static cx_executable *exec_new(int nslots, int64_t bytes)
{
    cx_executable *e = calloc(1, sizeof *e);
    for (int s = 0; s < nslots; s++) cr_assert_geq(cx_exec_add_slot(e, SLOT_ARENA, -1, bytes), 0);
    return e;
}

/* An elementwise kernel writing `out` from the slots in `ins` (identity views). */
static void fused(cx_executable *e, int out, int nin, const int *ins)
{
    cx_kernel *k = cx_exec_add_kernel(e);
    k->kind = K_FUSED;
    k->out_slot = out;
    k->out_dtype = CX_F32;
    k->out_numel = 16;
    k->ndim = 1;
    k->shape[0] = 16;
    k->prog.views = calloc(1, sizeof(cx_view));
    k->prog.views[0].strides[0] = 1;
    k->prog.nviews = k->prog.vcap = 1;
    k->prog.ins = calloc((size_t)nin + 1, sizeof(cx_pinstr));
    for (int i = 0; i < nin; i++) k->prog.ins[i] = (cx_pinstr){ .kind = P_LOAD, .dtype = CX_F32, .src_dtype = CX_F32, .slot = ins[i] };
    k->prog.n = k->prog.cap = nin;
    k->prog.result = nin - 1;
}

static void coll(cx_executable *e, cx_op op, int in, int out)
{
    cx_kernel *k = cx_exec_add_kernel(e);
    k->kind = K_COLL;
    k->coll_op = (uint8_t)op;
    k->out_slot = out;
    k->out_dtype = CX_F32;
    k->out_numel = 16;
    k->nin = 1;
    k->in[0] = (cx_kin){ .slot = in, .dtype = CX_F32, .numel = 16, .ndim = 1, .shape = { 16 } };
    k->nattrs = CX_AT_COLL_COUNT;
}

static int position(const cx_executable *e, int out_slot)
{
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].out_slot == out_slot) return k;
    return -1;
}

Test(passes, overlap_issues_each_gradient_all_reduce_as_soon_as_it_exists)
{
    /* backward computes g1 (slot 1) then g2 (slot 2); the update reads both
     * reduced gradients (slots 3, 4) */
    cx_executable *e = exec_new(6, 64);
    fused(e, 1, 1, (int[]){ 0 });
    fused(e, 2, 1, (int[]){ 1 });
    fused(e, 5, 1, (int[]){ 0 });      /* independent work, e.g. the rest of backward */
    coll(e, OP_ALL_REDUCE, 1, 3);
    coll(e, OP_ALL_REDUCE, 2, 4);
    fused(e, 0, 2, (int[]){ 3, 4 });   /* the update */
    cr_assert(cx_pass_schedule_overlap(e));
    int ar1 = position(e, 3), g2 = position(e, 2), indep = position(e, 5), upd = position(e, 0);
    cr_assert_eq(ar1, 1, "the first all-reduce goes right after its gradient (at %d)", ar1);
    cr_assert_lt(ar1, g2, "it overlaps the computation of the next gradient");
    cr_assert_lt(indep, upd, "work that needs no collective runs before work that waits for one");
    cx_pass_collective_waits(e);
    cr_assert_eq(e->kernels[ar1].wait_at, upd, "a collective is waited for right before its first reader");
    cx_executable_free(e);
}

Test(passes, all_reduce_runs_in_place_over_an_input_only_it_reads)
{
    cx_executable *e = exec_new(3, 64);
    fused(e, 1, 1, (int[]){ 0 });
    coll(e, OP_ALL_REDUCE, 1, 2);
    fused(e, 0, 1, (int[]){ 2 });
    cx_pass_collectives_in_place(e);
    cr_assert_eq(e->kernels[1].out_slot, 1, "the all-reduce writes over its input");
    cr_assert_eq(e->kernels[2].prog.ins[0].slot, 1, "its reader follows the renamed slot");
    cx_executable_free(e);
    /* a second reader of the input keeps the buffers apart */
    e = exec_new(4, 64);
    fused(e, 1, 1, (int[]){ 0 });
    coll(e, OP_ALL_REDUCE, 1, 2);
    fused(e, 3, 2, (int[]){ 1, 2 });
    cx_pass_collectives_in_place(e);
    cr_assert_eq(e->kernels[1].out_slot, 2);
    cx_executable_free(e);
}

Test(passes, memory_plan_reuses_space_of_dead_buffers)
{
    /* a chain s0 -> s1 -> s2 -> s3: s0 and s2 never live at once */
    cx_executable *e = exec_new(4, 1000);
    e->slots[0].kind = SLOT_INPUT;
    e->slots[3].kind = SLOT_OUTPUT;
    fused(e, 1, 1, (int[]){ 0 });
    fused(e, 2, 1, (int[]){ 1 });
    fused(e, 3, 1, (int[]){ 2 });
    cx_pass_liveness(e);
    cr_assert_eq(e->slots[1].def, 0);
    cr_assert_eq(e->slots[1].last, 1);
    cr_assert(cx_pass_plan_memory(e));
    cr_assert_eq(e->intermediate_bytes, 2000);
    cr_assert_eq(e->arena_bytes, 2048, "two 1000-byte intermediates alive together, 64-byte aligned (got %lld)",
                 (long long)e->arena_bytes);
    cr_assert_neq(e->slots[1].offset, e->slots[2].offset, "overlapping lifetimes never share space");
    cx_executable_free(e);
}

/* Lifetimes largest-first packs badly: the 128 of kernels 0-1 and the two
 * 64s of kernel 2 take 0-256, and the 64 alive through kernels 0-3 finds
 * no room under them: 320 bytes. Placed by first use the arena is the
 * most bytes alive at once, 256. */
Test(passes, memory_plan_keeps_the_smaller_of_two_packings)
{
    static const struct { int64_t bytes; int def, last; } lives[] = {
        { 256, 4, 4 }, { 64, 2, 2 }, { 64, 2, 2 }, { 64, 0, 3 }, { 128, 0, 1 },
    };
    cx_executable *e = exec_new(0, 0);
    for (size_t i = 0; i < sizeof lives / sizeof *lives; i++) {
        int sl = cx_exec_add_slot(e, SLOT_ARENA, -1, lives[i].bytes);
        e->slots[sl].def = lives[i].def;
        e->slots[sl].last = lives[i].last;
    }
    cr_assert(cx_pass_plan_memory(e));
    cr_assert_eq(e->arena_bytes, 256, "got %lld", (long long)e->arena_bytes);
    for (int a = 0; a < e->nslots; a++)
        for (int b = a + 1; b < e->nslots; b++) {
            const cx_slot *p = &e->slots[a], *q = &e->slots[b];
            bool together = !(p->last < q->def || q->last < p->def);
            bool overlap = p->offset < q->offset + q->bytes && q->offset < p->offset + p->bytes;
            cr_assert(!(together && overlap), "slots %d and %d alive together share space", a, b);
        }
    cx_executable_free(e);
}

Test(passes, async_collectives_keep_their_buffers_until_the_wait)
{
    cx_executable *e = exec_new(5, 256);
    fused(e, 1, 1, (int[]){ 0 });
    coll(e, OP_ALL_REDUCE, 1, 2);
    fused(e, 3, 1, (int[]){ 0 });
    fused(e, 4, 1, (int[]){ 3 });
    fused(e, 0, 1, (int[]){ 2 });
    cx_pass_collective_waits(e);
    cr_assert_eq(e->kernels[1].wait_at, 4);
    cx_pass_liveness(e);
    cr_assert_eq(e->slots[1].last, 4, "the all-reduce's input stays alive while it is in flight");
    cr_assert(cx_pass_plan_memory(e));
    cr_assert_neq(e->slots[1].offset, e->slots[3].offset);
    cr_assert_neq(e->slots[1].offset, e->slots[4].offset);
    cx_executable_free(e);
}

Test(passes, outputs_alias_their_donor_only_when_every_read_comes_first)
{
    /* out (slot 2) replaces input 0 (slot 0): written by kernel 1, and
     * kernel 2 still reads the old value afterwards */
    cx_executable *e = exec_new(0, 0);
    cr_assert_eq(cx_exec_add_slot(e, SLOT_INPUT, 0, 64), 0);
    cr_assert_eq(cx_exec_add_slot(e, SLOT_ARENA, -1, 64), 1);
    cr_assert_eq(cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64), 2);
    cr_assert_eq(cx_exec_add_slot(e, SLOT_OUTPUT, 1, 64), 3);
    e->n_outputs = 2;
    e->out_slot = (int[]){ 2, 3 };
    fused(e, 1, 1, (int[]){ 0 });
    fused(e, 2, 1, (int[]){ 1 });
    fused(e, 3, 1, (int[]){ 0 });
    cr_assert(cx_pass_alias_outputs(e, (int[]){ 0, -1 }));
    cr_assert_eq(e->num_aliased, 1);
    cr_assert_eq(e->nkernels, 4, "a copy at the end, since the input is read after the output is written");
    cr_assert_eq(e->kernels[3].kind, K_COPY);
    cr_assert_eq(e->kernels[3].out_slot, 2);
    cr_assert_eq(e->slots[e->kernels[1].out_slot].kind, SLOT_ARENA, "the output is computed into the arena first");
    e->out_slot = NULL;
    cx_executable_free(e);

    /* read first, then written: in place, no copy */
    e = exec_new(0, 0);
    cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
    cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    e->n_outputs = 1;
    e->out_slot = (int[]){ 2 };
    fused(e, 1, 1, (int[]){ 0 });
    fused(e, 2, 2, (int[]){ 0, 1 });
    cr_assert(cx_pass_alias_outputs(e, (int[]){ 0 }));
    cr_assert_eq(e->nkernels, 2, "an elementwise writer reading its donor in its own order runs in place");
    e->out_slot = NULL;
    cx_executable_free(e);
}

Test(passes, no_output_takes_the_buffer_of_an_input_a_collective_still_reads)
{
    /* a gather of input 0 (a parameter shard) is waited for only at the
     * end, while kernel 1 writes the shard's new value (output 0, donor
     * input 0): the peers may still be reading the old one, so the output
     * must not be written over it (found as a cross-rank race: ZeRO-3 runs
     * on 3 and 4 ranks differed from run to run) */
    cx_executable *e = exec_new(0, 0);
    cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 256);
    cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    cx_exec_add_slot(e, SLOT_OUTPUT, 1, 256);
    e->n_outputs = 2;
    e->out_slot = (int[]){ 2, 3 };
    coll(e, OP_ALL_GATHER, 0, 1);
    fused(e, 2, 1, (int[]){ 0 });
    fused(e, 3, 1, (int[]){ 1 });
    cx_pass_collective_waits(e);
    cr_assert_eq(e->kernels[0].wait_at, 2);
    cr_assert(cx_pass_alias_outputs(e, (int[]){ 0, -1 }));
    cr_assert_eq(e->slots[e->kernels[1].out_slot].kind, SLOT_ARENA,
                 "the new value goes to the arena while the gather is in flight");
    cr_assert_eq(e->kernels[e->nkernels - 1].kind, K_COPY, "and is copied over the input after the wait");
    e->out_slot = NULL;
    cx_executable_free(e);

    /* waited for before the writer: the output may take the buffer */
    e = exec_new(0, 0);
    cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 256);
    cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    e->n_outputs = 1;
    e->out_slot = (int[]){ 2 };
    coll(e, OP_ALL_GATHER, 0, 1);
    fused(e, 2, 2, (int[]){ 0, 1 });
    cx_pass_collective_waits(e);
    cr_assert(cx_pass_alias_outputs(e, (int[]){ 0 }));
    cr_assert_eq(e->nkernels, 2, "no copy: the gather has completed when the shard is written");
    e->out_slot = NULL;
    cx_executable_free(e);
}

Test(passes, prefetch_moves_each_gather_one_unit_ahead)
{
    /* unit 1: gather (slot 1) then compute; unit 2: gather (slot 3) then compute */
    cx_executable *e = exec_new(6, 64);
    coll(e, OP_ALL_GATHER, 0, 1);
    fused(e, 2, 1, (int[]){ 1 });
    fused(e, 5, 1, (int[]){ 2 });
    coll(e, OP_ALL_GATHER, 0, 3);
    fused(e, 4, 2, (int[]){ 3, 5 });
    cx_pass_prefetch_gathers(e);
    cr_assert_eq(position(e, 3), 1, "the second gather is issued where the first one's result is first used");
    cr_assert_lt(position(e, 1), position(e, 3), "the issue order of the collectives is unchanged");
    cx_executable_free(e);
}

/* A layer's backward as lowering emits it: the input-gradient chain first
 * (dy -> dx -> dx2 -> out), the weight gradient, which reads the layer's
 * big activation and dy, last; and a value of the input alone (z) that
 * only the last kernel reads. */
Test(passes, order_runs_a_weight_gradient_right_after_the_gradient_it_reads)
{
    cx_executable *e = exec_new(0, 0);
    int x = cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    int z = cx_exec_add_slot(e, SLOT_ARENA, -1, 64), act = cx_exec_add_slot(e, SLOT_ARENA, -1, 4096);
    int dy = cx_exec_add_slot(e, SLOT_ARENA, -1, 256), dx = cx_exec_add_slot(e, SLOT_ARENA, -1, 256);
    int dx2 = cx_exec_add_slot(e, SLOT_ARENA, -1, 256);
    int out = cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64), dw = cx_exec_add_slot(e, SLOT_OUTPUT, 1, 64);
    fused(e, z, 1, (int[]){ x });
    fused(e, act, 1, (int[]){ x });
    fused(e, dy, 1, (int[]){ act });
    fused(e, dx, 1, (int[]){ dy });
    fused(e, dx2, 1, (int[]){ dx });
    fused(e, out, 2, (int[]){ dx2, z });
    fused(e, dw, 2, (int[]){ act, dy });
    cr_assert(cx_pass_order_by_memory(e));
    cr_assert_eq(position(e, dw), position(e, dy) + 1, "the weight gradient frees the activation: at once");
    cr_assert_eq(position(e, z), position(e, out) - 1, "a value of the input alone waits for its reader");
    cr_assert_lt(position(e, dx), position(e, dx2), "the chain keeps its order");
    cx_pass_liveness(e);
    cr_assert_eq(e->slots[act].last, position(e, dw));
    cx_executable_free(e);

    /* a kernel never runs before one it depends on, whatever the bytes: the
     * overwrite of a (which frees big) would come first by bytes, before
     * the read of a's first value (which allocates big2) */
    e = exec_new(0, 0);
    x = cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    int a = cx_exec_add_slot(e, SLOT_ARENA, -1, 64), big = cx_exec_add_slot(e, SLOT_ARENA, -1, 1 << 20);
    int big2 = cx_exec_add_slot(e, SLOT_ARENA, -1, 2 << 20), o = cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    fused(e, a, 1, (int[]){ x });
    fused(e, big, 1, (int[]){ a });
    fused(e, big2, 1, (int[]){ a });
    fused(e, a, 1, (int[]){ big });
    fused(e, o, 2, (int[]){ a, big2 });
    cr_assert(cx_pass_order_by_memory(e));
    cr_assert_eq(e->kernels[2].out_slot, big2, "the read of a's first value stays before its overwrite");
    cr_assert_eq(e->kernels[3].out_slot, a);
    cx_executable_free(e);

    /* a loss's end: once the forward (h0 -> h1 -> h) is done, the logits'
     * product waits for its weight's cast, and a chain of the target alone
     * (t1 -> t2 -> t3, longer than the cast) is needed only by the loss's
     * gradient. The cast goes first: the product runs before the target's
     * values exist, and not beside them. */
    e = exec_new(0, 0);
    x = cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    int y = cx_exec_add_slot(e, SLOT_INPUT, 1, 64);
    int h0 = cx_exec_add_slot(e, SLOT_ARENA, -1, 256), h1 = cx_exec_add_slot(e, SLOT_ARENA, -1, 256);
    int h = cx_exec_add_slot(e, SLOT_ARENA, -1, 256), cast = cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
    int logits = cx_exec_add_slot(e, SLOT_ARENA, -1, 1024);
    int t1 = cx_exec_add_slot(e, SLOT_ARENA, -1, 64), t2 = cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
    int t3 = cx_exec_add_slot(e, SLOT_ARENA, -1, 1024), grad = cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    fused(e, t1, 1, (int[]){ y });
    fused(e, t2, 1, (int[]){ t1 });
    fused(e, t3, 1, (int[]){ t2 });
    fused(e, h0, 1, (int[]){ x });   /* the forward: longer than the target's chain, so first */
    fused(e, h1, 1, (int[]){ h0 });
    fused(e, h, 1, (int[]){ h1 });
    fused(e, cast, 1, (int[]){ x });
    fused(e, logits, 2, (int[]){ h, cast });
    fused(e, grad, 2, (int[]){ logits, t3 });
    cr_assert(cx_pass_order_by_memory(e));
    cr_assert_lt(position(e, logits), position(e, t1), "the product before the target's chain");
    cr_assert_eq(position(e, cast), position(e, logits) - 1, "the cast right before its product");
    cx_executable_free(e);
}

/* input 0 (slot 0) -> cast (slot 1), read at once by kernel 1 and again by
 * the last kernel, after `between` kernels each writing a 64-byte slot */
static cx_executable *late_reader(int between)
{
    cx_executable *e = exec_new(0, 0);
    e->n_inputs = 1;
    cx_exec_add_slot(e, SLOT_INPUT, 0, 64);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
    cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
    fused(e, 1, 1, (int[]){ 0 });
    fused(e, 2, 1, (int[]){ 1 });
    int prev = 2;
    for (int i = 0; i < between; i++) {
        int s = cx_exec_add_slot(e, SLOT_ARENA, -1, 64);
        fused(e, s, 1, (int[]){ prev });
        prev = s;
    }
    int out = cx_exec_add_slot(e, SLOT_OUTPUT, 0, 64);
    fused(e, out, 2, (int[]){ prev, 1 });
    e->n_outputs = 1;
    e->out_slot = calloc(1, sizeof(int));
    e->out_slot[0] = out;
    e->out_alias = calloc(1, sizeof(int));
    e->out_alias[0] = -1;
    return e;
}

Test(passes, a_value_of_the_inputs_alone_is_computed_again_for_a_late_reader)
{
    cx_executable *e = late_reader(4);
    cr_assert(cx_pass_recompute_input_values(e));
    cr_assert_eq(e->nkernels, 8, "one copy of the cast (got %d kernels)", e->nkernels);
    const cx_kernel *copy = &e->kernels[6], *last = &e->kernels[7];
    cr_assert_eq(copy->kind, K_FUSED);
    cr_assert_eq(copy->prog.ins[0].slot, 0, "the copy reads the input");
    cr_assert_neq(copy->out_slot, 1, "into a buffer of its own");
    cr_assert_eq(last->prog.ins[1].slot, copy->out_slot, "the late reader reads the copy");
    cr_assert_eq(e->kernels[1].prog.ins[0].slot, 1, "the early reader keeps the first buffer");
    cx_pass_liveness(e);
    cr_assert_eq(e->slots[1].last, 1, "the first buffer dies after its early reader");
    cx_executable_free(e);

    e = late_reader(1);
    cr_assert(cx_pass_recompute_input_values(e));
    cr_assert_eq(e->nkernels, 4, "a reader soon after keeps the buffer: a copy would cost a pass for nothing");
    cx_executable_free(e);

    /* a constant (a program of no loads and no views) is made again too */
    e = late_reader(4);
    cx_kernel *fill = &e->kernels[0];
    free(fill->prog.views);
    fill->prog.views = NULL;
    fill->prog.nviews = fill->prog.vcap = 0;
    fill->prog.ins[0] = (cx_pinstr){ .kind = P_CONST, .dtype = CX_F32, .f = 1.0 };
    cr_assert(cx_pass_recompute_input_values(e));
    cr_assert_eq(e->nkernels, 8);
    cr_assert_eq(e->kernels[6].prog.ins[0].kind, P_CONST);
    cx_executable_free(e);

    /* the input is the donor of an output written before the late reader:
     * a copy there would read the new value */
    e = late_reader(4);
    e->out_alias[0] = 0;
    e->kernels[2].out_slot = e->out_slot[0];
    cr_assert(cx_pass_recompute_input_values(e));
    cr_assert_eq(e->nkernels, 7, "no copy once the donor's output is written");
    cx_executable_free(e);
}
