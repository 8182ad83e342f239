/* SPMD tensor parallelism (Megatron by annotations alone) on 2 and 4 ranks.
 *
 * - Blocked splits: a host value marked with CX_SPEC_BLOCKS keeps one piece
 *   of every block on each rank; its boxes, its gather back and a tensor
 *   rebuilt from the local shard all agree with the whole value.
 * - A transformer block with its fused q|k|v projection split in 3 blocks
 *   over `model`, the MLP's first Linear split on its outputs and both
 *   output projections on their inputs, equals the unsharded block within
 *   1e-5 over 3 SGD steps, with exactly one all-reduce per block for the
 *   attention and one for the MLP in forward and the same in backward, and
 *   nothing else. On a 2-D (data, model) mesh the data axis adds the loss's
 *   and every gradient's all-reduce, and nothing is gathered.
 * - The same for a GPT (embedding, tied lm_head, cross-entropy). */
#include "dist_check.h"

#include <string.h>

static cx_mesh *g_model_mesh, *g_2d_mesh;

static float pattern(int64_t i, double phase) { return (float)(0.5 * sin(0.37 * (double)i + phase)); }

/* ---- blocked geometry ------------------------------------------------------------------- */

static void blocked_geometry(void)
{
    int n = cx_world_size(), r = cx_global_ordinal();
    enum { ROWS_PER_PART = 4, COLS = 5 };
    int64_t rows = 3 * ROWS_PER_PART * n / 2, shape[2] = { rows, COLS };   /* parts of 2n rows: 2 / n rows per piece */
    int64_t part = rows / 3, piece = part / n, total = rows * COLS;
    float *whole = malloc(sizeof(float) * (size_t)total), *back = malloc(sizeof(float) * (size_t)total);
    float *local = malloc(sizeof(float) * (size_t)(3 * piece * COLS));
    for (int64_t i = 0; i < total; i++) whole[i] = pattern(i, 0.1);
    cx_tensor *t = cx_persist(cx_from_host(whole, shape, 2, CX_F32));
    cx_spec_entry spec[2] = { CX_SPEC_BLOCKS("model", 3), CX_SPEC_NONE };
    CHECK(cx_mark_sharding(t, g_model_mesh, spec, 2) == CX_OK, "blocked mark_sharding: %s", cx_last_error());
    char desc[256];
    CHECK(strstr(cx_sharding_spec(t, desc, sizeof desc), "in 3 blocks") != NULL, "the description names the blocks: %s", desc);
    int64_t lshape[2];
    CHECK(cx_local_shard_to_host(t, local, sizeof(float) * (size_t)(3 * piece * COLS), CX_F32, lshape) == CX_OK,
          "local shard: %s", cx_last_error());
    CHECK(lshape[0] == 3 * piece && lshape[1] == COLS, "local shape (%lld, %lld)", (long long)lshape[0], (long long)lshape[1]);
    for (int b = 0; b < 3; b++)
        for (int64_t i = 0; i < piece * COLS; i++) {
            int64_t g = (b * part + r * piece) * COLS + i;
            CHECK(local[(b * piece) * COLS + i] == whole[g], "block %d element %lld of the local shard", b, (long long)i);
        }
    cx_shard_box boxes[4];
    int nb = cx_shard_boxes(g_model_mesh, spec, 2, shape, 2, r, boxes, 4);
    CHECK(nb == 3, "%d boxes, want one per block", nb);
    for (int b = 0; b < nb && b < 3; b++)
        CHECK(boxes[b].start[0] == b * part + r * piece && boxes[b].count[0] == piece && boxes[b].local_start[0] == b * piece &&
                  boxes[b].start[1] == 0 && boxes[b].count[1] == COLS,
              "box %d: start %lld count %lld local %lld", b, (long long)boxes[b].start[0], (long long)boxes[b].count[0],
              (long long)boxes[b].local_start[0]);
    CHECK(cx_to_host(t, back, CX_F32) == CX_OK && !memcmp(back, whole, sizeof(float) * (size_t)total),
          "a blocked tensor gathered back is the whole value (%s)", cx_last_error());
    cx_tensor *u = cx_persist(cx_from_local_shard(local, shape, 2, CX_F32, g_model_mesh, spec, 2));
    memset(back, 0, sizeof(float) * (size_t)total);
    CHECK(cx_to_host(u, back, CX_F32) == CX_OK && !memcmp(back, whole, sizeof(float) * (size_t)total),
          "a tensor rebuilt from the local shard is the whole value (%s)", cx_last_error());
    /* computed through the graph: twice the blocked tensor, gathered */
    cx_tensor *twice = cx_persist(cx_add(t, u));
    CHECK(cx_to_host(twice, back, CX_F32) == CX_OK, "2t: %s", cx_last_error());
    for (int64_t i = 0; i < total; i++) CHECK(back[i] == 2 * whole[i], "2t element %lld", (long long)i);
    cx_spec_entry odd[2] = { CX_SPEC_BLOCKS("model", 7), CX_SPEC_NONE };
    CHECK(cx_mark_sharding(t, g_model_mesh, odd, 2) == CX_ERR_ARG && strstr(cx_last_error(), "7 blocks"),
          "blocks that do not divide the dimension: %s", cx_last_error());
    cx_free(t); cx_free(u); cx_free(twice);
    free(whole); free(back); free(local);
}

/* ---- a tensor-parallel transformer block ----------------------------------------------- */

typedef struct {
    const char *suffix;
    cx_spec_entry spec[2];
    int nd;
} tp_rule;

/* Megatron's split of a block, by the parameters' names. */
static const tp_rule k_block_rules[] = {
    { "attn.qkv.weight", { CX_SPEC_BLOCKS("model", 3), CX_SPEC_NONE }, 2 },
    { "attn.qkv.bias", { CX_SPEC_BLOCKS("model", 3) }, 1 },
    { "attn.proj.weight", { CX_SPEC_NONE, CX_SPEC_NAME("model") }, 2 },
    { "mlp.0.weight", { CX_SPEC_NAME("model"), CX_SPEC_NONE }, 2 },
    { "mlp.0.bias", { CX_SPEC_NAME("model") }, 1 },
    { "mlp.2.weight", { CX_SPEC_NONE, CX_SPEC_NAME("model") }, 2 },
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int mark_tp(cx_named_tensor *ps, int n, const tp_rule *rules, int nrules, const cx_mesh *mesh)
{
    int marked = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nrules; k++) {
            if (!ends_with(ps[i].name, rules[k].suffix)) continue;
            CHECK(cx_mark_sharding(ps[i].tensor, mesh, rules[k].spec, rules[k].nd) == CX_OK, "mark %s: %s", ps[i].name,
                  cx_last_error());
            marked++;
        }
    return marked;
}

typedef struct {
    float loss[3];
    float *params;
    int64_t nparams;
    int64_t inserted[4];   /* all-reduce, all-gather, reduce-scatter, all-to-all compiling step 1 */
} run;

static void count_inserted(run *out)
{
    out->inserted[0] = cx_counter_value("SpmdAllReduce");
    out->inserted[1] = cx_counter_value("SpmdAllGather");
    out->inserted[2] = cx_counter_value("SpmdReduceScatter");
    out->inserted[3] = cx_counter_value("SpmdAllToAll");
}

static void read_params(cx_named_tensor *ps, int n, run *out)
{
    int64_t total = 0, off = 0;
    for (int i = 0; i < n; i++) total += cx_numel(ps[i].tensor);
    out->params = calloc((size_t)total, sizeof(float));
    out->nparams = total;
    for (int i = 0; i < n; i++) {
        CHECK(cx_to_host(ps[i].tensor, out->params + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
}

enum { D = 24, HEADS = 4, BATCH = 4, T = 8 };

/* mesh NULL: unsharded; with a data axis the batch splits over it too */
static run block_train(const cx_mesh *mesh)
{
    run out;
    memset(&out, 0, sizeof out);
    cx_manual_seed(11);
    cx_module *m = cx_nn_transformer_block(D, HEADS);
    int64_t shape[3] = { BATCH, T, D };
    float xv[BATCH * T * D];
    for (int i = 0; i < BATCH * T * D; i++) xv[i] = pattern(i, 0.4);
    cx_tensor *x = cx_persist(cx_from_host(xv, shape, 3, CX_F32));
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    if (mesh) {
        CHECK(mark_tp(ps, n, k_block_rules, 6, mesh) == 6, "every tensor-parallel parameter found");
        if (mesh == g_2d_mesh) {
            cx_spec_entry spec[3] = { CX_SPEC_NAME("data"), CX_SPEC_NONE, CX_SPEC_NONE };
            CHECK(cx_mark_sharding(x, mesh, spec, 3) == CX_OK, "block input: %s", cx_last_error());
        }
    }
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.1;
    so.momentum = 0.9;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    cx_cache_clear();
    cx_metrics_clear();
    for (int s = 0; s < 3; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *y = cx_module_forward(m, x), *loss = cx_mean(cx_mul(y, y), NULL, 0, false);
        CHECK(cx_backward(loss) == CX_OK && cx_optim_step(opt) == CX_OK, "block step: %s", cx_last_error());
        cx_keep(loss);
        CHECK(cx_step_end() == CX_OK, "block step end: %s", cx_last_error());
        out.loss[s] = (float)cx_item(loss);
        cx_free(loss);
        if (s == 0) count_inserted(&out);
    }
    read_params(ps, n, &out);
    free(ps);
    cx_optim_free(opt);
    cx_free(x);
    cx_module_free(m);
    return out;
}

static void compare(const char *what, const run *got, const run *ref)
{
    for (int s = 0; s < 3; s++)
        CHECK(close_rel(got->loss[s], ref->loss[s], 1e-5), "%s: loss %d: %.8f, unsharded %.8f", what, s, got->loss[s],
              ref->loss[s]);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < ref->nparams; i++)
        if (!close_rel(got->params[i], ref->params[i], 1e-5)) { bad++; if (first < 0) first = i; }
    CHECK(got->nparams == ref->nparams && bad == 0, "%s: %lld parameter elements differ by more than 1e-5 (first %lld: %.8f vs %.8f)",
          what, (long long)bad, (long long)first, first >= 0 ? got->params[first] : 0.f, first >= 0 ? ref->params[first] : 0.f);
}

static void expect_inserted(const char *what, const run *got, int64_t all_reduce)
{
    CHECK(got->inserted[0] == all_reduce && got->inserted[1] == 0 && got->inserted[2] == 0 && got->inserted[3] == 0,
          "%s: the partitioner inserted %lld all-reduce, %lld all-gather, %lld reduce-scatter, %lld all-to-all; want %lld "
          "all-reduce and nothing else", what, (long long)got->inserted[0], (long long)got->inserted[1],
          (long long)got->inserted[2], (long long)got->inserted[3], (long long)all_reduce);
    if (cx_global_ordinal() == 0)
        printf("%-32s loss %.6f -> %.6f; inserted %lld all-reduce, %lld all-gather, %lld reduce-scatter, %lld all-to-all\n",
               what, got->loss[0], got->loss[2], (long long)got->inserted[0], (long long)got->inserted[1],
               (long long)got->inserted[2], (long long)got->inserted[3]);
}

static void tensor_parallel_block(void)
{
    run ref = block_train(NULL), tp = block_train(g_model_mesh);
    compare("tensor-parallel block", &tp, &ref);
    /* forward: attention's and the MLP's output projections; backward: the
     * gradients of their inputs (the two LayerNorms' outputs) */
    expect_inserted("tensor-parallel block", &tp, 4);
    free(tp.params);
    if (g_2d_mesh) {
        run two = block_train(g_2d_mesh);
        compare("2-D mesh (data x model) block", &two, &ref);
        /* plus the data axis: the loss and each of the 12 gradients */
        expect_inserted("2-D mesh (data x model) block", &two, 4 + 1 + 12);
        free(two.params);
    }
    free(ref.params);
}

/* ---- a tensor-parallel GPT ------------------------------------------------------------- */

enum { GPT_LAYERS = 2, GPT_B = 4, GPT_T = 8 };

/* mesh NULL: unsharded. SGD with momentum, and with `clip` the gradients'
 * total norm clipped first (its sum over sharded gradients stays a partial
 * sum until one all-reduce). */
static run gpt_train(const cx_mesh *mesh, bool clip)
{
    run out;
    memset(&out, 0, sizeof out);
    cx_gpt_config cfg = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 61, .block_size = GPT_T, .n_layer = GPT_LAYERS, .n_head = 4, .n_embd = 32 };
    cx_manual_seed(5);
    cx_module *m = cx_nn_gpt(cfg);
    int64_t shape[2] = { GPT_B, GPT_T }, iv[GPT_B * GPT_T], tv[GPT_B * GPT_T];
    for (int i = 0; i < GPT_B * GPT_T; i++) { iv[i] = (i * 7 + 3) % 61; tv[i] = (i * 11 + 5) % 61; }
    cx_tensor *idx = cx_persist(cx_from_host(iv, shape, 2, CX_I64)), *tgt = cx_persist(cx_from_host(tv, shape, 2, CX_I64));
    if (mesh) {
        CHECK(cx_gpt_tensor_parallel(m, mesh, "model") == CX_OK, "gpt tensor parallel: %s", cx_last_error());
        if (mesh == g_2d_mesh) {
            cx_spec_entry spec[2] = { CX_SPEC_NAME("data"), CX_SPEC_NONE };
            CHECK(cx_mark_sharding(idx, mesh, spec, 2) == CX_OK && cx_mark_sharding(tgt, mesh, spec, 2) == CX_OK,
                  "gpt batch: %s", cx_last_error());
        }
    }
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.1;
    so.momentum = 0.9;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    cx_cache_clear();
    cx_metrics_clear();
    for (int s = 0; s < 3; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *in[2] = { idx, tgt }, *o[2] = { NULL, NULL };
        CHECK(cx_module_forward_many(m, in, 2, o, 2) >= 0, "gpt forward: %s", cx_last_error());
        CHECK(cx_backward(o[1]) == CX_OK, "gpt backward: %s", cx_last_error());
        if (clip) cx_drop(cx_optim_clip_grad_norm(opt, 0.5));
        CHECK(cx_optim_step(opt) == CX_OK, "gpt step: %s", cx_last_error());
        cx_keep(o[1]);
        CHECK(cx_step_end() == CX_OK, "gpt step end: %s", cx_last_error());
        out.loss[s] = (float)cx_item(o[1]);
        cx_free(o[1]);
        if (s == 0) count_inserted(&out);
    }
    read_params(ps, n, &out);
    free(ps);
    cx_optim_free(opt);
    cx_free(idx);
    cx_free(tgt);
    cx_module_free(m);
    return out;
}

static void tensor_parallel_gpt(void)
{
    for (int clip = 0; clip < 2; clip++) {
        run ref = gpt_train(NULL, clip), tp = gpt_train(g_model_mesh, clip);
        const char *what = clip ? "tensor-parallel gpt, clipped" : "tensor-parallel gpt";
        compare(what, &tp, &ref);
        /* 4 per block; the clipped norm's sum over sharded gradients adds one */
        expect_inserted(what, &tp, 4 * GPT_LAYERS + clip);
        free(tp.params);
        if (g_2d_mesh) {
            run two = gpt_train(g_2d_mesh, clip);
            what = clip ? "2-D mesh gpt, clipped" : "2-D mesh gpt";
            compare(what, &two, &ref);
            /* plus the data axis: the cross-entropy's two sums (its losses
             * and its count of targets) and each of the 28 gradients */
            expect_inserted(what, &two, 4 * GPT_LAYERS + clip + 2 + (2 + 12 * GPT_LAYERS + 2));
            free(two.params);
        }
        free(ref.params);
    }
    cx_gpt_config cfg = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 61, .block_size = GPT_T, .n_layer = 1, .n_head = 3, .n_embd = 24 };
    cx_module *m = cx_nn_gpt(cfg);
    if (cx_world_size() % 3)
        CHECK(cx_gpt_tensor_parallel(m, g_model_mesh, "model") == CX_ERR_ARG && strstr(cx_last_error(), "3 heads"),
              "3 heads over %d devices: %s", cx_world_size(), cx_last_error());
    CHECK(cx_gpt_tensor_parallel(m, g_model_mesh, "tensor") == CX_ERR_ARG && strstr(cx_last_error(), "'tensor'"),
          "a missing axis: %s", cx_last_error());
    cx_module_free(m);
}

/* A deferred GPT split for tensor parallelism materializes only each
 * rank's shards of the split weights (blocked ones included), and every
 * parameter gathered back equals the eager init bit for bit. */
static void deferred_tensor_parallel_gpt(void)
{
    cx_gpt_config cfg = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 61, .block_size = GPT_T, .n_layer = GPT_LAYERS, .n_head = 4, .n_embd = 32 };
    cx_manual_seed(21);
    cx_module *eager = cx_nn_gpt(cfg);
    cx_manual_seed(21);
    cx_deferred_init_begin();
    cx_module *lazy = cx_nn_gpt(cfg);
    cx_deferred_init_end();
    CHECK(lazy && cx_module_num_deferred(lazy) > 0, "a deferred gpt: %s", cx_last_error());
    CHECK(cx_gpt_tensor_parallel(lazy, g_model_mesh, "model") == CX_OK, "deferred tensor parallel: %s", cx_last_error());
    CHECK(cx_module_materialize(lazy) == CX_OK, "materialize the rest: %s", cx_last_error());
    int ne, nl, sharded = 0;
    cx_named_tensor *pe = cx_module_parameters(eager, &ne), *pl = cx_module_parameters(lazy, &nl);
    CHECK(ne == nl, "%d and %d parameters", ne, nl);
    for (int i = 0; i < ne && i < nl; i++) {
        int64_t n = cx_numel(pe[i].tensor), local[2] = { 0, 0 };
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        CHECK(cx_to_host(pe[i].tensor, a, CX_F32) == CX_OK && cx_to_host(pl[i].tensor, b, CX_F32) == CX_OK, "read %s: %s",
              pl[i].name, cx_last_error());
        CHECK(!memcmp(a, b, sizeof(float) * (size_t)n), "deferred %s: the gathered shards differ from the eager init", pl[i].name);
        CHECK(cx_local_shard_to_host(pl[i].tensor, a, sizeof(float) * (size_t)n, CX_F32, local) == CX_OK, "local %s: %s",
              pl[i].name, cx_last_error());
        int64_t ln = local[0] * (cx_ndim(pl[i].tensor) > 1 ? local[1] : 1);
        if (ln < n) sharded++;
        free(a); free(b);
    }
    CHECK(sharded == 6 * GPT_LAYERS, "%d parameters hold a shard; want the 6 split ones of each block", sharded);
    free(pe); free(pl);
    cx_module_free(eager);
    cx_module_free(lazy);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    cx_use_spmd();
    int n = cx_world_size();
    const char *model_axis[1] = { "model" }, *names2[2] = { "data", "model" };
    g_model_mesh = cx_mesh_new(NULL, 1, &n, model_axis);
    CHECK(g_model_mesh != NULL, "mesh: %s", cx_last_error());
    if (n == 4) {
        int shape2[2] = { 2, 2 };
        g_2d_mesh = cx_mesh_new(NULL, 2, shape2, names2);
        CHECK(g_2d_mesh != NULL, "2-D mesh: %s", cx_last_error());
    }
    blocked_geometry();
    tensor_parallel_block();
    tensor_parallel_gpt();
    deferred_tensor_parallel_gpt();
    return dist_finish("dist_spmd_tp");
}
