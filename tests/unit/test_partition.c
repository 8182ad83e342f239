/* The SPMD partitioner (pass 0) alone, on hand-built graphs over a 2 x 2
 * mesh (data, model) of a pretend world of 4 ranks: which collectives it
 * inserts for each rule, the local shapes, the rank's own slice offsets,
 * padding, and the fallback. (Equivalence with unsharded runs, on real
 * ranks, is dist_spmd's.) */
#include <criterion/criterion.h>

#include "capture.h"
#include "graph_builder.h"
#include "sharding.h"

/* ---- a world of 4 in which every rank sends what this one does ---------------------------- */

static int g_rank;
static int four(void *ctx) { (void)ctx; return 4; }
static int rank_of(void *ctx) { (void)ctx; return g_rank; }

static void *echo_start(void *ctx, const cx_comm_op *op)
{
    (void)ctx;
    size_t es = cx_dtype_size(op->dtype);
    int copies = op->kind == CX_COLL_ALL_GATHER ? (op->group_size ? op->group_size : 4) : 1;
    for (int c = 0; c < copies; c++) memcpy((char *)op->out + (size_t)c * (size_t)op->count * es, op->in, (size_t)op->count * es);
    return (void *)1;
}

static cx_status echo_wait(void *ctx, void *req) { (void)ctx; (void)req; return CX_OK; }

static const cx_mesh *g_mesh;

static void setup(void)
{
    static const cx_comm_backend be = { CX_STRUCT_SIZE(cx_comm_backend), .name = "echo-of-4", .world_size = four, .rank = rank_of,
                                        .start = echo_start, .wait = echo_wait };
    cx_comm_register(&be);
    cx_use_spmd();
    int shape[2] = { 2, 2 };
    const char *names[2] = { "data", "model" };
    g_rank = 0;
    g_mesh = cx_mesh_new(NULL, 2, shape, names);
    cr_assert(g_mesh, "mesh: %s", cx_last_error());
}

static void teardown(void) { cx_comm_register(NULL); }

/* dim d over the named axis (-1: replicated) */
static cx_sharding split(int nd, int d0_axis, int d1_axis)
{
    cx_sharding s = cx_sharding_replicated(g_mesh, nd);
    if (d0_axis >= 0) { s.naxes[0] = 1; s.axes[0][0] = (uint8_t)d0_axis; }
    if (d1_axis >= 0) { s.naxes[1] = 1; s.axes[1][0] = (uint8_t)d1_axis; }
    return s;
}

enum { DATA = 0, MODEL = 1, AR = 0, AG = 1, RS = 2, A2A = 3 };

typedef struct {
    cx_graph out;
    cx_sharding osh[8];
    int ins[4];
} parted;

static void partition(const gbuild *b, const cx_sharding *const *ann, int rank, parted *p)
{
    g_rank = rank;
    cr_assert(cx_pass_partition(&b->g, ann, rank, &p->out, p->osh, p->ins, NULL), "partition: %s", cx_last_error());
}

static int count_op(const cx_graph *g, cx_op op)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->nodes[i].op == op;
    return n;
}

static const cx_gnode *output_node(const parted *p, int o) { return &p->out.nodes[p->out.outputs[o]]; }

TestSuite(partition, .init = setup, .fini = teardown);

Test(partition, column_split_matmul_needs_no_collective)
{
    gbuild b;
    gb_init(&b);
    int64_t sa[2] = { 8, 12 }, sw[2] = { 12, 8 }, so[2] = { 8, 8 };
    int a = gb_node(&b, OP_DATA, 2, sa, 0, NULL), w = gb_node(&b, OP_DATA, 2, sw, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w });
    gb_output(&b, mm, -1);
    cx_sharding ws = split(2, -1, MODEL);
    const cx_sharding *ann[3] = { NULL, &ws, NULL };
    parted p;
    partition(&b, ann, 1, &p);
    cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[RS] + p.ins[A2A], 0);
    cr_assert_eq(output_node(&p, 0)->shape[0], 8);
    cr_assert_eq(output_node(&p, 0)->shape[1], 4, "the output keeps its columns' shard");
    cr_assert(cx_sharding_equal(&p.osh[0], &ws), "the output is split like the weight's columns");
    cx_graph_release(&p.out);
}

Test(partition, split_contraction_is_finished_by_one_all_reduce)
{
    gbuild b;
    gb_init(&b);
    int64_t sa[2] = { 8, 12 }, sw[2] = { 12, 8 }, so[2] = { 8, 8 };
    int a = gb_node(&b, OP_DATA, 2, sa, 0, NULL), w = gb_node(&b, OP_DATA, 2, sw, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w });
    int r = gb_node(&b, OP_EXP, 2, so, 1, &mm);   /* a consumer that needs the whole sum */
    gb_output(&b, r, -1);
    cx_sharding as = split(2, -1, MODEL), ws = split(2, MODEL, -1);
    const cx_sharding *ann[4] = { &as, &ws, NULL, NULL };
    parted p;
    partition(&b, ann, 0, &p);
    cr_assert_eq(p.ins[AR], 1);
    cr_assert_eq(p.ins[AG] + p.ins[RS] + p.ins[A2A], 0, "a rule exists: no gather");
    cr_assert_eq(count_op(&p.out, OP_ALL_REDUCE), 1);
    cr_assert(cx_sharding_is_replicated(&p.osh[0]));
    cx_graph_release(&p.out);
}

Test(partition, a_consumer_split_like_the_partial_sum_gets_a_reduce_scatter)
{
    gbuild b;
    gb_init(&b);
    int64_t sa[2] = { 8, 12 }, sw[2] = { 12, 8 }, so[2] = { 8, 8 };
    int a = gb_node(&b, OP_DATA, 2, sa, 0, NULL), w = gb_node(&b, OP_DATA, 2, sw, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w });
    int id = gb_node(&b, OP_RESHAPE, 2, so, 1, &mm);   /* the annotation's identity node */
    gb_output(&b, id, -1);
    cx_sharding as = split(2, -1, MODEL), ws = split(2, MODEL, -1), rows = split(2, MODEL, -1);
    const cx_sharding *ann[4] = { &as, &ws, NULL, &rows };
    parted p;
    partition(&b, ann, 0, &p);
    cr_assert_eq(p.ins[RS], 1);
    cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[A2A], 0);
    cr_assert_eq(output_node(&p, 0)->shape[0], 4);
    cr_assert(cx_sharding_equal(&p.osh[0], &rows));
    cx_graph_release(&p.out);
}

Test(partition, a_replicated_operand_is_sliced_at_this_ranks_offset)
{
    gbuild b;
    gb_init(&b);
    int64_t s[2] = { 8, 6 };
    int x = gb_node(&b, OP_DATA, 2, s, 0, NULL), y = gb_node(&b, OP_DATA, 2, s, 0, NULL);
    int add = gb_node(&b, OP_ADD, 2, s, 2, (int[]){ x, y });
    gb_output(&b, add, -1);
    cx_sharding xs = split(2, DATA, -1);
    const cx_sharding *ann[3] = { &xs, NULL, NULL };
    for (int rank = 0; rank < 4; rank++) {
        parted p;
        partition(&b, ann, rank, &p);
        cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[RS] + p.ins[A2A], 0, "slicing a replicated value is local");
        int slices = 0;
        for (int i = 0; i < p.out.n; i++) {
            const cx_gnode *n = &p.out.nodes[i];
            if (n->op != OP_SLICE) continue;
            slices++;
            /* mesh position of rank r: (r / 2, r % 2); data is axis 0 */
            cr_assert_eq(CX_ATTR(n, CX_AT_SLICE_START), (rank / 2) * 4, "rank %d starts at its data index's rows", rank);
            cr_assert_eq(n->shape[0], 4);
        }
        cr_assert_eq(slices, 1);
        cx_graph_release(&p.out);
    }
}

Test(partition, an_uneven_split_is_padded_and_gathered_back_whole)
{
    gbuild b;
    gb_init(&b);
    int64_t s6[1] = { 6 }, one[1] = { 1 };
    int x = gb_node(&b, OP_DATA, 1, s6, 0, NULL);
    int m = gb_node(&b, OP_REDUCE_MAX, 1, one, 1, &x);   /* a max over the padded split: gathered first */
    gb_attrs(&b, m, 1, (int64_t[]){ 1 });
    gb_output(&b, m, -1);
    cx_sharding xs = cx_sharding_replicated(g_mesh, 1);
    xs.naxes[0] = 2;
    xs.axes[0][0] = DATA;
    xs.axes[0][1] = MODEL;   /* 4 ways: shards of 2, the last one all padding */
    const cx_sharding *ann[2] = { &xs, NULL };
    parted p;
    partition(&b, ann, 3, &p);
    cr_assert_eq(p.out.nodes[0].shape[0], 2, "the leaf holds a shard of ceil(6 / 4)");
    cr_assert_eq(p.ins[AG], 1);
    bool cut = false;
    for (int i = 0; i < p.out.n; i++)
        if (p.out.nodes[i].op == OP_SLICE && p.out.nodes[i].shape[0] == 6) cut = true;
    cr_assert(cut, "the gathered 8 elements are cut back to 6");
    cx_graph_release(&p.out);
}

Test(partition, a_split_moving_between_dimensions_is_one_all_to_all)
{
    gbuild b;
    gb_init(&b);
    int64_t s[2] = { 8, 8 };
    int x = gb_node(&b, OP_DATA, 2, s, 0, NULL);
    int id = gb_node(&b, OP_RESHAPE, 2, s, 1, &x);
    gb_output(&b, id, -1);
    cx_sharding rows = split(2, MODEL, -1), cols = split(2, -1, MODEL);
    const cx_sharding *ann[2] = { &rows, &cols };
    parted p;
    partition(&b, ann, 2, &p);
    cr_assert_eq(p.ins[A2A], 1);
    cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[RS], 0);
    cr_assert_eq(output_node(&p, 0)->shape[0], 8);
    cr_assert_eq(output_node(&p, 0)->shape[1], 4);
    cx_graph_release(&p.out);
}

Test(partition, an_op_without_a_rule_gathers_its_operands)
{
    gbuild b;
    gb_init(&b);
    int64_t s[2] = { 8, 6 }, o[1] = { 8 };
    int x = gb_node(&b, OP_DATA, 2, s, 0, NULL);
    int am = gb_node(&b, OP_ARGMAX, 1, o, 1, &x);
    gb_attrs(&b, am, 1, (int64_t[]){ 1 });
    b.nodes[am].dtype = CX_I64;
    gb_output(&b, am, -1);
    cx_sharding xs = split(2, DATA, MODEL);
    const cx_sharding *ann[2] = { &xs, NULL };
    parted p;
    partition(&b, ann, 0, &p);
    cr_assert_eq(p.ins[AG], 2, "one gather per split dimension");
    cr_assert_eq(output_node(&p, 0)->shape[0], 8, "the fallback computes the whole value");
    cr_assert(cx_sharding_is_replicated(&p.osh[0]));
    cx_graph_release(&p.out);
}

Test(partition, a_collective_beside_shardings_is_refused)
{
    gbuild b;
    gb_init(&b);
    int64_t s[1] = { 8 };
    int x = gb_node(&b, OP_DATA, 1, s, 0, NULL);
    int ar = gb_node(&b, OP_ALL_REDUCE, 1, s, 1, &x);
    gb_attrs(&b, ar, CX_AT_COLL_COUNT, (int64_t[]){ 0, 0, 0, 0 });
    gb_output(&b, ar, -1);
    cx_sharding xs = split(1, DATA, -1);
    const cx_sharding *ann[2] = { &xs, NULL };
    cx_graph out;
    cx_sharding osh[1];
    int ins[4];
    cr_assert_not(cx_pass_partition(&b.g, ann, 0, &out, osh, ins, NULL));
    cr_assert(strstr(cx_last_error(), "all_reduce"), "%s", cx_last_error());
}

/* ---- blocked splits (a fused q|k|v projection under tensor parallelism) --------------------- */

static cx_sharding blocked_cols(int blocks)
{
    cx_sharding s = split(2, -1, MODEL);
    s.blocks[1] = (uint8_t)blocks;
    return s;
}

/* w (12, 6) in 3 blocks of 2 columns over model: model index 1 holds
 * columns 1, 3 and 5; the slice of block 1 (columns 2, 3) is its local
 * column 1, with no collective. */
Test(partition, a_slice_of_one_block_is_that_blocks_split_at_a_local_offset)
{
    gbuild b;
    gb_init(&b);
    int64_t sa[2] = { 8, 12 }, sw[2] = { 12, 6 }, so[2] = { 8, 6 }, ss[2] = { 8, 2 };
    int a = gb_node(&b, OP_DATA, 2, sa, 0, NULL), w = gb_node(&b, OP_DATA, 2, sw, 0, NULL);
    int mm = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w });
    int sl = gb_node(&b, OP_SLICE, 2, ss, 1, &mm);
    gb_attrs(&b, sl, CX_AT_SLICE_COUNT, (int64_t[]){ 1, 2, 1 });
    gb_output(&b, sl, -1);
    cx_sharding ws = blocked_cols(3);
    const cx_sharding *ann[4] = { NULL, &ws, NULL, NULL };
    parted p;
    partition(&b, ann, 1, &p);
    cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[RS] + p.ins[A2A], 0, "blocks carried through matmul and slice");
    const cx_gnode *o = output_node(&p, 0);
    cr_assert_eq(o->op, OP_SLICE);
    cr_assert_eq(o->shape[1], 1);
    cr_assert_eq(CX_ATTR(o, CX_AT_SLICE_START), 1, "block 1's piece sits at local column 1");
    cr_assert_eq(p.osh[0].naxes[1], 1);
    cr_assert_eq(cx_sharding_blocks(&p.osh[0], 1), 1, "a plain split");
    cx_graph_release(&p.out);
}

/* The slice's gradient: a pad by whole parts around an even split is a
 * blocked split, padded locally by whole pieces. */
Test(partition, a_pad_by_whole_parts_makes_blocks)
{
    gbuild b;
    gb_init(&b);
    int64_t sx[2] = { 8, 2 }, so[2] = { 8, 6 };
    int x = gb_node(&b, OP_DATA, 2, sx, 0, NULL);
    int pad = gb_node(&b, OP_PAD, 2, so, 1, &x);
    int64_t at[CX_AT_PAD_COUNT(2)] = { 0 };
    at[CX_AT_PAD_LO(2, 1)] = 2;
    at[CX_AT_PAD_HI(2, 1)] = 2;
    gb_attrs(&b, pad, CX_AT_PAD_COUNT(2), at);
    gb_output(&b, pad, -1);
    cx_sharding xs = split(2, -1, MODEL);
    const cx_sharding *ann[2] = { &xs, NULL };
    parted p;
    partition(&b, ann, 0, &p);
    cr_assert_eq(p.ins[AR] + p.ins[AG] + p.ins[RS] + p.ins[A2A], 0);
    const cx_gnode *o = output_node(&p, 0);
    cr_assert_eq(o->shape[1], 3);
    cr_assert_eq(CX_ATTR(o, CX_AT_PAD_LO(2, 1)), 1);
    cr_assert_eq(CX_ATTR(o, CX_AT_PAD_HI(2, 1)), 1);
    cr_assert_eq(cx_sharding_blocks(&p.osh[0], 1), 3);
    cx_graph_release(&p.out);
}

/* A blocked split needed whole is gathered along its parts: one
 * all-gather over the (blocks, piece) view. */
Test(partition, a_blocked_split_is_gathered_part_by_part)
{
    gbuild b;
    gb_init(&b);
    int64_t sx[2] = { 8, 6 }, o[1] = { 8 };
    int x = gb_node(&b, OP_DATA, 2, sx, 0, NULL);
    int am = gb_node(&b, OP_ARGMAX, 1, o, 1, &x);
    gb_attrs(&b, am, 1, (int64_t[]){ 1 });
    b.nodes[am].dtype = CX_I64;
    gb_output(&b, am, -1);
    cx_sharding xs = blocked_cols(3);
    const cx_sharding *ann[2] = { &xs, NULL };
    parted p;
    partition(&b, ann, 3, &p);
    cr_assert_eq(p.out.nodes[0].shape[1], 3, "the leaf holds one column of each block");
    cr_assert_eq(p.ins[AG], 1);
    int gathers = 0;
    for (int i = 0; i < p.out.n; i++) {
        const cx_gnode *n = &p.out.nodes[i];
        if (n->op != OP_ALL_GATHER) continue;
        gathers++;
        cr_assert_eq(n->ndim, 3);
        cr_assert_eq(n->shape[1], 3);
        cr_assert_eq(n->shape[2], 2, "each block's pieces gathered next to each other");
        cr_assert_eq(CX_ATTR(n, CX_AT_COLL_AXIS), 2);
    }
    cr_assert_eq(gathers, 1);
    cx_graph_release(&p.out);
}

/* Sums are linear: partial sums added together (and a whole value added
 * on one member of each group only) stay partial, so a chain of them (a
 * gradient norm over sharded gradients) is finished by one all-reduce. */
Test(partition, a_chain_of_partial_sums_is_finished_once)
{
    gbuild b;
    gb_init(&b);
    int64_t sa[2] = { 8, 12 }, sw[2] = { 12, 1 }, so[2] = { 8, 1 };
    int a = gb_node(&b, OP_DATA, 2, sa, 0, NULL), w1 = gb_node(&b, OP_DATA, 2, sw, 0, NULL);
    int w2 = gb_node(&b, OP_DATA, 2, sw, 0, NULL), z = gb_node(&b, OP_DATA, 2, so, 0, NULL);
    int m1 = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w1 }), m2 = gb_node(&b, OP_MATMUL, 2, so, 2, (int[]){ a, w2 });
    int s1 = gb_node(&b, OP_ADD, 2, so, 2, (int[]){ m1, m2 }), s2 = gb_node(&b, OP_SUB, 2, so, 2, (int[]){ s1, z });
    int e = gb_node(&b, OP_EXP, 2, so, 1, &s2);
    gb_output(&b, e, -1);
    cx_sharding rows = split(2, MODEL, -1);
    const cx_sharding *ann[9] = { NULL, &rows, &rows, NULL };
    for (int rank = 0; rank < 2; rank++) {
        parted p;
        partition(&b, ann, rank, &p);
        cr_assert_eq(p.ins[AR], 1, "one all-reduce at the end of the chain");
        cr_assert_eq(p.ins[AG] + p.ins[RS] + p.ins[A2A], 0);
        /* rank 1 is the second member of its model group: it adds z times 0,
         * rank 0 z times 1, so both graphs keep z's reader (same schedule) */
        cr_assert_eq(count_op(&p.out, OP_CONST), 1, "rank %d", rank);
        for (int i = 0; i < p.out.n; i++)
            if (p.out.nodes[i].op == OP_CONST)
                cr_assert_eq(p.out.nodes[i].fval, rank == 1 ? 0.0 : 1.0, "rank %d's factor", rank);
        cx_graph_release(&p.out);
    }
}
