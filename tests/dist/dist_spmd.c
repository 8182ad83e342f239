/* SPMD: a small model written once with global shapes, trained 3 steps under
 * each sharding rule of a linear layer (batch, column, row with a
 * replicated and with a split input, uneven column split, a 2-D data x
 * model mesh), equals the same program unsharded within 1e-5 on losses and
 * parameters; so does FSDPv2 (eager and deferred) with AdamW. The
 * partitioner's collectives are counted: data parallelism and the column
 * and row splits must not fall back to gathering, FSDPv2 must
 * reduce-scatter every gradient. A deferred layer marked sharded holds only
 * its shard, equal to the eager init; the FSDPv2 model saves (in the SPMD
 * layout) and loads back bit for bit. Bad specs and meshes that differ
 * between ranks are one clear error on every rank. */
#include "dist_check.h"

#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

enum { B = 8, K = 12 };

typedef enum { NONE, BATCH, COLUMN, COLUMN_UNEVEN, ROW, ROW_SPLIT_INPUT, MESH_2D, NCONFIGS } config;
static const char *const k_names[NCONFIGS] = { "unsharded", "batch", "column", "uneven column", "row",
                                               "row with a split input", "2-D mesh" };

static int out_features(config c) { return c == COLUMN_UNEVEN ? 7 : 8; }

static cx_tensor *host(int64_t d0, int64_t d1, int ndim, double phase, bool grad)
{
    int64_t n = d0 * (ndim > 1 ? d1 : 1), shape[2] = { d0, d1 };
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(0.5 * sin(0.71 * (double)i + phase));
    cx_tensor *t = cx_from_host(v, shape, ndim, CX_F32);
    free(v);
    return grad ? cx_requires_grad(t, true) : t;
}

static cx_mesh *g_mesh1, *g_mesh2;

static void mark(cx_tensor *t, const cx_mesh *m, cx_spec_entry a, cx_spec_entry b, int nd)
{
    cx_spec_entry spec[2] = { a, b };
    cx_status st = cx_mark_sharding(t, m, spec, nd);
    CHECK(st == CX_OK, "mark_sharding: %s", cx_last_error());
}

typedef struct {
    float loss[3];
    float w[K * 8], b[8];
    int64_t all_reduce, all_gather, reduce_scatter, all_to_all;   /* added compiling the first step */
} result;

static void annotate(config c, cx_tensor *x, cx_tensor *y, cx_tensor *w, cx_tensor *b)
{
    cx_spec_entry n = CX_SPEC_NONE, ax = CX_SPEC_NAME("x");
    switch (c) {
    case BATCH: mark(x, g_mesh1, ax, n, 2); mark(y, g_mesh1, ax, n, 2); break;
    case COLUMN: case COLUMN_UNEVEN: mark(w, g_mesh1, n, ax, 2); mark(b, g_mesh1, ax, n, 1); break;
    case ROW: mark(w, g_mesh1, ax, n, 2); break;
    case ROW_SPLIT_INPUT: mark(x, g_mesh1, n, ax, 2); mark(w, g_mesh1, ax, n, 2); break;
    case MESH_2D:
        mark(x, g_mesh2, CX_SPEC_NAME("data"), n, 2); mark(y, g_mesh2, CX_SPEC_NAME("data"), n, 2);
        mark(w, g_mesh2, n, CX_SPEC_NAME("model"), 2); mark(b, g_mesh2, CX_SPEC_NAME("model"), n, 1);
        break;
    default: break;
    }
}

/* loss = mean((tanh(x @ w + b) - y)^2), SGD lr 0.5 */
static result train(config c, bool sharded)
{
    result r;
    memset(&r, 0, sizeof r);
    int nf = out_features(c);
    cx_tensor *x = cx_persist(host(B, K, 2, 0.3, false)), *y = cx_persist(host(B, nf, 2, 1.1, false));
    cx_tensor *w = cx_persist(host(K, nf, 2, 2.0, true)), *b = cx_persist(host(nf, 1, 1, 0.7, true));
    if (sharded) annotate(c, x, y, w, b);
    cx_cache_clear();
    cx_metrics_clear();
    for (int s = 0; s < 3; s++) {
        cx_step_begin();
        cx_tensor *mm = cx_matmul(x, w), *h = cx_add(mm, b), *t = cx_tanh(h), *d = cx_sub(t, y), *sq = cx_mul(d, d);
        cx_tensor *loss = cx_mean(sq, NULL, 0, false);
        CHECK(cx_backward(loss) == CX_OK, "%s: backward: %s", k_names[c], cx_last_error());
        cx_tensor *gw = cx_mul_scalar(cx_grad(w), 0.5), *gb = cx_mul_scalar(cx_grad(b), 0.5);
        cx_tensor *nw = cx_sub(w, gw), *nb = cx_sub(b, gb);
        cx_assign(w, nw);
        cx_assign(b, nb);
        cx_zero_grad(w);
        cx_zero_grad(b);
        CHECK(cx_sync() == CX_OK, "%s: step %d: %s", k_names[c], s, cx_last_error());
        r.loss[s] = (float)cx_item(loss);
        if (s == 0) {
            r.all_reduce = cx_counter_value("SpmdAllReduce");
            r.all_gather = cx_counter_value("SpmdAllGather");
            r.reduce_scatter = cx_counter_value("SpmdReduceScatter");
            r.all_to_all = cx_counter_value("SpmdAllToAll");
        }
        cx_step_end();
    }
    CHECK(cx_to_host(w, r.w, CX_F32) == CX_OK, "%s: read w: %s", k_names[c], cx_last_error());
    CHECK(cx_to_host(b, r.b, CX_F32) == CX_OK, "%s: read b: %s", k_names[c], cx_last_error());
    char spec[256];
    if (sharded && c == COLUMN && cx_global_ordinal() == 0) printf("column-split weight after training: %s\n", cx_sharding_spec(w, spec, sizeof spec));
    if (sharded && c == COLUMN) CHECK(strstr(cx_sharding_spec(w, spec, sizeof spec), "spec=(None, x)") != NULL,
                           "the trained weight lost its sharding: %s", spec);
    cx_drop(x); cx_drop(y); cx_drop(w); cx_drop(b);
    return r;
}

static void equals_unsharded(void)
{
    for (int c = BATCH; c < NCONFIGS; c++) {
        if (c == MESH_2D && !g_mesh2) continue;
        result got = train((config)c, true), ref = train((config)c, false);
        int nf = out_features((config)c);
        for (int s = 0; s < 3; s++)
            CHECK(close_rel(got.loss[s], ref.loss[s], 1e-5), "%s: loss %d: %.8f, unsharded %.8f", k_names[c], s,
                  got.loss[s], ref.loss[s]);
        for (int i = 0; i < K * nf; i++)
            CHECK(close_rel(got.w[i], ref.w[i], 1e-5), "%s: w[%d]: %.8f, unsharded %.8f", k_names[c], i, got.w[i], ref.w[i]);
        for (int i = 0; i < nf; i++)
            CHECK(close_rel(got.b[i], ref.b[i], 1e-5), "%s: b[%d]: %.8f, unsharded %.8f", k_names[c], i, got.b[i], ref.b[i]);
        /* what each rule must insert compiling the first step (loss, weight
         * and bias gradients); any all-gather would be a fallback */
        static const int64_t want_all_reduce[NCONFIGS] = { [BATCH] = 3, [COLUMN] = 1, [ROW] = 1, [ROW_SPLIT_INPUT] = 1,
                                                           [MESH_2D] = 3 };
        if (c != COLUMN_UNEVEN) {
            CHECK(got.all_reduce == want_all_reduce[c] && got.all_gather == 0 && got.reduce_scatter == 0 && got.all_to_all == 0,
                  "%s: the partitioner inserted %lld all-reduce, %lld all-gather, %lld reduce-scatter, %lld all-to-all; "
                  "want %lld all-reduce and nothing else", k_names[c], (long long)got.all_reduce, (long long)got.all_gather,
                  (long long)got.reduce_scatter, (long long)got.all_to_all, (long long)want_all_reduce[c]);
        }
        if (cx_global_ordinal() == 0)
            printf("%-24s loss %.6f -> %.6f; inserted: %lld all-reduce, %lld all-gather, %lld reduce-scatter, %lld all-to-all\n",
                   k_names[c], got.loss[0], got.loss[2], (long long)got.all_reduce, (long long)got.all_gather,
                   (long long)got.reduce_scatter, (long long)got.all_to_all);
    }
}

/* A deferred layer marked sharded materializes only this rank's shard, and
 * the shards gathered back equal an eager init bit for bit (an even and an
 * uneven split). */
static void deferred_shards_equal_eager(void)
{
    for (int out = 8; out >= 7; out--) {
        cx_manual_seed(77);
        cx_module *eager = cx_nn_linear(12, out, true);
        cx_manual_seed(77);
        cx_deferred_init_begin();
        cx_module *lazy = cx_nn_linear(12, out, true);
        cx_deferred_init_end();
        int ne, nl;
        cx_named_tensor *pe = cx_module_parameters(eager, &ne), *pl = cx_module_parameters(lazy, &nl);
        for (int i = 0; i < ne && i < nl; i++) {
            cx_tensor *t = pl[i].tensor;
            int nd = cx_ndim(t);
            cx_spec_entry spec[2] = { CX_SPEC_NAME("x"), CX_SPEC_NONE };   /* (out, in): split the outputs */
            CHECK(cx_mark_sharding(t, g_mesh1, spec, nd) == CX_OK, "deferred %s: %s", pl[i].name, cx_last_error());
            int64_t n = cx_numel(t), local[2] = { 0, 0 };
            float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
            CHECK(cx_to_host(pe[i].tensor, a, CX_F32) == CX_OK && cx_to_host(t, b, CX_F32) == CX_OK, "read: %s", cx_last_error());
            CHECK(!memcmp(a, b, sizeof(float) * (size_t)n), "deferred %s (%d outputs): the gathered shards differ from the eager init",
                  pl[i].name, out);
            CHECK(cx_local_shard_to_host(t, a, sizeof(float) * (size_t)n, CX_F32, local) == CX_OK, "local: %s", cx_last_error());
            int64_t k = cx_world_size();
            CHECK(local[0] == (out + k - 1) / k, "deferred %s: the local shard has %lld rows, not %lld", pl[i].name,
                  (long long)local[0], (long long)((out + k - 1) / k));
            free(a); free(b);
        }
        free(pe); free(pl);
        cx_module_free(eager);
        cx_module_free(lazy);
    }
}

/* FSDPv2 on an mlp (deferred or eager) with AdamW equals the unwrapped model
 * within 1e-5 after 3 steps, and the partitioner gathers weights and
 * reduce-scatters their gradients (ZeRO-3), nothing else but the loss. */
static cx_module *fsdp_mlp(bool deferred)
{
    cx_manual_seed(5);
    if (deferred) cx_deferred_init_begin();
    cx_module *l[3] = { cx_nn_linear(K, 16, true), cx_nn_relu(), cx_nn_linear(16, 8, true) };
    cx_module *m = cx_nn_sequential(l, 3);
    if (deferred) cx_deferred_init_end();
    return m;
}

static void fsdp_train(cx_module *m, cx_spmd_fsdp *f, const cx_mesh *mesh, float *losses, float *params,
                       int64_t *gathers, int64_t *scatters, int64_t *reduces)
{
    cx_tensor *x = cx_persist(host(B, K, 2, 0.3, false)), *y = cx_persist(host(B, 8, 2, 1.1, false));
    if (f) mark(x, mesh, CX_SPEC_NAME("fsdp"), CX_SPEC_NONE, 2);
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_adam_opts ao = cx_adamw_default_opts();
    ao.lr = 0.05;
    cx_optimizer *opt = cx_optim_adamw(ps, n, ao);
    cx_cache_clear();   /* count what this run's first step compiles */
    cx_metrics_clear();
    for (int s = 0; s < 3; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *out = f ? cx_spmd_fsdp_forward(f, x) : cx_module_forward(m, x);
        cx_tensor *d = cx_sub(out, y), *loss = cx_mean(cx_mul(d, d), NULL, 0, false);
        CHECK(cx_backward(loss) == CX_OK, "fsdpv2 backward: %s", cx_last_error());
        CHECK(cx_optim_step(opt) == CX_OK, "fsdpv2 step: %s", cx_last_error());
        cx_keep(loss);
        CHECK(cx_step_end() == CX_OK, "fsdpv2 step end: %s", cx_last_error());
        losses[s] = (float)cx_item(loss);
        cx_free(loss);
        if (s == 0) {
            *gathers = cx_counter_value("SpmdAllGather");
            *scatters = cx_counter_value("SpmdReduceScatter");
            *reduces = cx_counter_value("SpmdAllReduce");
        }
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(cx_to_host(ps[i].tensor, params + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    free(ps);
    cx_optim_free(opt);
    cx_free(x);
    cx_free(y);
}

static void fsdpv2_equals_unwrapped(void)
{
    int n = cx_world_size(), shape[2] = { n, 1 };
    const char *names[2] = { "fsdp", "model" };
    cx_mesh *mesh = cx_mesh_new(NULL, 2, shape, names);
    CHECK(mesh != NULL, "fsdp mesh: %s", cx_last_error());
    enum { NP = K * 16 + 16 + 16 * 8 + 8 };
    float ref_l[3], ref_p[NP];
    int64_t g, rs, ar;
    cx_module *ref = fsdp_mlp(false);
    fsdp_train(ref, NULL, mesh, ref_l, ref_p, &g, &rs, &ar);
    cx_module_free(ref);
    for (int deferred = 0; deferred < 2; deferred++) {
        float got_l[3], got_p[NP];
        cx_module *m = fsdp_mlp(deferred);
        cx_spmd_fsdp *f = cx_spmd_fsdp_wrap(m, mesh, NULL, NULL);
        CHECK(f != NULL, "spmd_fsdp_wrap: %s", cx_last_error());
        if (!f) { cx_module_free(m); continue; }
        fsdp_train(m, f, mesh, got_l, got_p, &g, &rs, &ar);
        for (int s = 0; s < 3; s++)
            CHECK(close_rel(got_l[s], ref_l[s], 1e-5), "fsdpv2%s: loss %d: %.8f, unwrapped %.8f", deferred ? " deferred" : "", s,
                  got_l[s], ref_l[s]);
        for (int i = 0; i < NP; i++)
            CHECK(close_rel(got_p[i], ref_p[i], 1e-5), "fsdpv2%s: parameter element %d: %.8f, unwrapped %.8f",
                  deferred ? " deferred" : "", i, got_p[i], ref_p[i]);
        /* each weight gathered where it is used (2 to 4), each of the 4
         * gradients reduce-scattered into its shard, and one all-reduce:
         * the loss */
        CHECK(g >= 2 && g <= 4 && rs == 4 && ar == 1,
              "fsdpv2: the partitioner inserted %lld all-gather, %lld reduce-scatter, %lld all-reduce; want 2-4, 4 and 1",
              (long long)g, (long long)rs, (long long)ar);
        if (cx_global_ordinal() == 0)
            printf("fsdpv2%-15s loss %.6f -> %.6f; inserted: %lld all-reduce, %lld all-gather, %lld reduce-scatter\n",
                   deferred ? " (deferred)" : "", got_l[0], got_l[2], (long long)ar, (long long)g, (long long)rs);
        cx_spmd_fsdp_free(f);
        cx_module_free(m);
    }
    cx_module *m = fsdp_mlp(false);
    CHECK(cx_spmd_fsdp_wrap(m, g_mesh1, NULL, NULL) == NULL && strstr(cx_last_error(), "'fsdp'"),
          "a mesh without an fsdp axis: %s", cx_last_error());
    /* an FSDPv2 model saved as a DDP one is saved in the SPMD layout (each
     * rank writes its own shards; nothing is gathered) and loads back into
     * the same wrapper, which keeps its shardings */
    cx_spmd_fsdp *f = cx_spmd_fsdp_wrap(m, mesh, NULL, NULL);
    char prefix[64], path[128];
    const char *job = getenv("MASTER_PORT");   /* the same on every rank of one launch */
    snprintf(prefix, sizeof prefix, "/tmp/cx_dist_spmd_ckpt_%s", job ? job : "0");
    int nps = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &nps);
    static float saved[NP], loaded[NP];
    int64_t off = 0;
    for (int i = 0; i < nps; i++) {
        CHECK(cx_to_host(ps[i].tensor, saved + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    CHECK(f && cx_ckpt_save(prefix, cx_ckpt_model_ddp(m), NULL, NULL) == CX_OK, "saving a sharded model: %s",
          cx_last_error());
    for (int i = 0; i < nps; i++) {
        CHECK(cx_assign(ps[i].tensor, cx_mul_scalar(ps[i].tensor, 2.0)) == CX_OK, "assign: %s", cx_last_error());
        CHECK(cx_sync_tensors(&ps[i].tensor, 1) == CX_OK, "sync: %s", cx_last_error());
    }
    CHECK(cx_ckpt_load(prefix, cx_ckpt_model_spmd(m), NULL, NULL) == CX_OK, "loading it back: %s", cx_last_error());
    off = 0;
    for (int i = 0; i < nps; i++) {
        char spec[256];
        CHECK(strcmp(cx_sharding_spec(ps[i].tensor, spec, sizeof spec), "replicated"), "%s lost its sharding",
              ps[i].name);
        CHECK(cx_to_host(ps[i].tensor, loaded + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    CHECK(!memcmp(saved, loaded, sizeof(float) * (size_t)off), "the loaded parameters differ from the saved ones");
    free(ps);
    if (cx_global_ordinal() == 0) {
        for (int r = 0; r < cx_world_size(); r++) {
            snprintf(path, sizeof path, "%s_rank-%d-of-%d.h5", prefix, r, cx_world_size());
            unlink(path);
        }
        snprintf(path, sizeof path, "%s.commit", prefix);
        unlink(path);
    }
    cx_spmd_fsdp_free(f);
    cx_module_free(m);
}

/* A transformer block (fused attention and layer norm) with its batch split
 * equals the unsharded block within 1e-5 over 3 SGD steps, and nothing is
 * gathered: the fused backward ops run on each rank's batch. */
static void block_train(bool sharded, float *losses, float *params, int64_t *gathers, int64_t *reduces)
{
    cx_manual_seed(9);
    cx_module *m = cx_nn_transformer_block(24, 3);
    int64_t shape[3] = { 4, 8, 24 };
    float xv[4 * 8 * 24];
    for (int i = 0; i < 4 * 8 * 24; i++) xv[i] = (float)(0.5 * sin(0.13 * i));
    cx_tensor *x = cx_persist(cx_from_host(xv, shape, 3, CX_F32));
    if (sharded) {
        cx_spec_entry spec[3] = { CX_SPEC_NAME("x"), CX_SPEC_NONE, CX_SPEC_NONE };
        CHECK(cx_mark_sharding(x, g_mesh1, spec, 3) == CX_OK, "block input: %s", cx_last_error());
    }
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.1;
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
        losses[s] = (float)cx_item(loss);
        cx_free(loss);
        if (s == 0) { *gathers = cx_counter_value("SpmdAllGather"); *reduces = cx_counter_value("SpmdAllReduce"); }
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(cx_to_host(ps[i].tensor, params + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    free(ps);
    cx_optim_free(opt);
    cx_free(x);
    cx_module_free(m);
}

static void block_batch_split_equals_unsharded(void)
{
    enum { NP = 24 * 24 * 12 + 24 * 13 + 4 * 24 + 1000 };   /* room for every parameter */
    static float ref_p[NP], got_p[NP];
    float ref_l[3], got_l[3];
    int64_t g, r;
    block_train(false, ref_l, ref_p, &g, &r);
    block_train(true, got_l, got_p, &g, &r);
    for (int s = 0; s < 3; s++)
        CHECK(close_rel(got_l[s], ref_l[s], 1e-5), "block: loss %d: %.8f, unsharded %.8f", s, got_l[s], ref_l[s]);
    for (int i = 0; i < NP; i++)
        CHECK(close_rel(got_p[i], ref_p[i], 1e-5), "block: parameter element %d: %.8f, unsharded %.8f", i, got_p[i], ref_p[i]);
    CHECK(g == 0, "block: the partitioner gathered %lld times (a fallback)", (long long)g);
    if (cx_global_ordinal() == 0)
        printf("transformer block, batch split: loss %.6f -> %.6f; inserted %lld all-reduce, %lld all-gather\n", got_l[0],
               got_l[2], (long long)r, (long long)g);
}

/* A GPT (embedding, fused attention and layer norm, tied lm_head,
 * cross-entropy) with its batch split equals the unsharded GPT within 1e-5
 * over 3 SGD steps, with no all-gather: SPMD data parallelism. */
static void gpt_train(bool sharded, float *losses, float *params, int64_t *gathers)
{
    cx_gpt_config cfg = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 61, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 32 };
    cx_manual_seed(3);
    cx_module *m = cx_nn_gpt(cfg);
    int64_t shape[2] = { 4, 8 }, iv[32], tv[32];
    for (int i = 0; i < 32; i++) { iv[i] = (i * 7 + 3) % 61; tv[i] = (i * 11 + 5) % 61; }
    cx_tensor *idx = cx_persist(cx_from_host(iv, shape, 2, CX_I64)), *tgt = cx_persist(cx_from_host(tv, shape, 2, CX_I64));
    if (sharded) {
        cx_spec_entry spec[2] = { CX_SPEC_NAME("x"), CX_SPEC_NONE };
        CHECK(cx_mark_sharding(idx, g_mesh1, spec, 2) == CX_OK && cx_mark_sharding(tgt, g_mesh1, spec, 2) == CX_OK,
              "gpt batch: %s", cx_last_error());
    }
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    /* SGD: the key biases' gradient is zero but for rounding, which Adam
     * would scale up to whole steps in either run */
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.1;
    so.momentum = 0.9;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    cx_cache_clear();
    cx_metrics_clear();
    for (int s = 0; s < 3; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *in[2] = { idx, tgt }, *out[2] = { NULL, NULL };
        CHECK(cx_module_forward_many(m, in, 2, out, 2) >= 0, "gpt forward: %s", cx_last_error());
        CHECK(cx_backward(out[1]) == CX_OK && cx_optim_step(opt) == CX_OK, "gpt step: %s", cx_last_error());
        cx_keep(out[1]);
        CHECK(cx_step_end() == CX_OK, "gpt step end: %s", cx_last_error());
        losses[s] = (float)cx_item(out[1]);
        cx_free(out[1]);
        if (s == 0) *gathers = cx_counter_value("SpmdAllGather");
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(cx_to_host(ps[i].tensor, params + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    free(ps);
    cx_optim_free(opt);
    cx_free(idx);
    cx_free(tgt);
    cx_module_free(m);
}

static void gpt_batch_split_equals_unsharded(void)
{
    enum { NP = 40000 };   /* room for every parameter of the tiny GPT */
    static float ref_p[NP], got_p[NP];
    float ref_l[3], got_l[3];
    int64_t g = -1;
    memset(ref_p, 0, sizeof ref_p);
    memset(got_p, 0, sizeof got_p);
    gpt_train(false, ref_l, ref_p, &g);
    gpt_train(true, got_l, got_p, &g);
    for (int s = 0; s < 3; s++)
        CHECK(close_rel(got_l[s], ref_l[s], 1e-5), "gpt: loss %d: %.8f, unsharded %.8f", s, got_l[s], ref_l[s]);
    int bad = 0;
    for (int i = 0; i < NP; i++) bad += !close_rel(got_p[i], ref_p[i], 1e-5);
    CHECK(bad == 0, "gpt: %d parameter elements differ from the unsharded run by more than 1e-5", bad);
    CHECK(g == 0, "gpt: the partitioner gathered %lld times (a fallback)", (long long)g);
    if (cx_global_ordinal() == 0) printf("gpt, batch split: loss %.6f -> %.6f; %lld all-gather\n", got_l[0], got_l[2], (long long)g);
}

/* FSDPv2 wrapped per GPT block (the seed's transformer_auto_wrap_policy on
 * "Block", with and without checkpointing each block) equals DDP within
 * 1e-5 over 3 steps, losses and parameters; each rank's parameters and
 * optimizer state (momentum) take at most 1/N of DDP's bytes plus one
 * block's. The default shard_output shards a tuple's first element (the
 * logits of (logits, loss)); a user's runs on every wrapped forward; an
 * output the default cannot shard is an error asking for shard_output. */
enum { GB = 8, GT = 8, GV = 61 };
typedef struct {
    float loss[3];
    float *params;
    int64_t state_bytes;   /* this rank's parameters and optimizer state, as their shards hold them */
    int64_t block_bytes;   /* one block's parameters and state, whole */
    int wrapped;
    int64_t gathers, scatters;   /* inserted by the partitioner compiling the first step */
    int aliased;                 /* outputs of the last step written over their old buffers */
} gpt_run;

static cx_gpt_config tiny_gpt(void)
{
    return (cx_gpt_config){ CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = GV, .block_size = GT, .n_layer = 2, .n_head = 2,
                            .n_embd = 32 };
}

/* bytes t's local shard holds (a replicated tensor: all of it) */
static int64_t local_bytes(cx_tensor *t)
{
    const cx_mesh *mesh;
    cx_spec_entry spec[CX_MAX_DIMS];
    int nd = cx_ndim(t);
    int64_t shape[CX_MAX_DIMS], n = 1;
    for (int d = 0; d < nd; d++) shape[d] = cx_dim(t, d);
    if (nd > 0 && cx_get_sharding(t, &mesh, spec, CX_MAX_DIMS) == nd) cx_shard_local_shape(mesh, spec, nd, shape, nd, shape);
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n * (int64_t)cx_dtype_size(cx_dtype_of(t));
}

static int g_user_calls;
static cx_status user_shard_output(cx_tensor **out, int n, const cx_mesh *mesh, void *arg)
{
    (void)arg;
    g_user_calls++;
    cx_spec_entry spec[3] = { CX_SPEC_NAME("fsdp"), CX_SPEC_NONE, CX_SPEC_NONE };
    return n >= 1 && cx_ndim(out[0]) == 3 ? cx_mark_sharding(out[0], mesh, spec, 3) : CX_ERR_ARG;
}

/* ddp: each rank its rows of the global batch; else FSDPv2 over the global
 * batch split (fsdp, None), per block, as `o` says */
static void gpt_fsdp_train(bool ddp, const cx_spmd_fsdp_opts *o, const cx_mesh *mesh, gpt_run *r)
{
    int nr = cx_world_size(), me = cx_global_ordinal();
    cx_manual_seed(3);
    cx_module *m = cx_nn_gpt(tiny_gpt());
    int64_t iv[GB * GT], tv[GB * GT], rows = ddp ? GB / nr : GB, shape[2] = { rows, GT };
    for (int i = 0; i < GB * GT; i++) { iv[i] = (i * 7 + 3) % GV; tv[i] = (i * 11 + 5) % GV; }
    int64_t off0 = ddp ? (int64_t)me * rows * GT : 0;
    cx_tensor *idx = cx_persist(cx_from_host(iv + off0, shape, 2, CX_I64)), *tgt = cx_persist(cx_from_host(tv + off0, shape, 2, CX_I64));
    cx_ddp *d = ddp ? cx_ddp_wrap(m, cx_ddp_default_opts()) : NULL;
    cx_spmd_fsdp *f = ddp ? NULL : cx_spmd_fsdp_wrap_opts(m, mesh, *o);
    CHECK(ddp ? d != NULL : f != NULL, "gpt %s wrap: %s", ddp ? "ddp" : "fsdpv2", cx_last_error());
    if (f) {
        cx_spec_entry spec[2] = { CX_SPEC_NAME("fsdp"), CX_SPEC_NONE };
        CHECK(cx_mark_sharding(idx, mesh, spec, 2) == CX_OK && cx_mark_sharding(tgt, mesh, spec, 2) == CX_OK,
              "gpt batch: %s", cx_last_error());
        r->wrapped = cx_spmd_fsdp_num_wrapped(f);
        for (int i = 0; i < r->wrapped; i++) {
            char want[32];
            snprintf(want, sizeof want, "transformer.h.%d", i);
            CHECK(!strcmp(cx_spmd_fsdp_wrapped_path(f, i), want), "wrapped %d is %s, not %s", i, cx_spmd_fsdp_wrapped_path(f, i), want);
        }
    }
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();   /* as gpt_train: Adam would scale rounding-level gradients up */
    so.lr = 0.1;
    so.momentum = 0.9;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    cx_cache_clear();   /* count what the first step compiles */
    cx_metrics_clear();
    for (int s = 0; s < 3 && (d || f); s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *in[2] = { idx, tgt }, *out[2] = { NULL, NULL };
        int k = d ? cx_ddp_forward_many(d, in, 2, out, 2) : cx_spmd_fsdp_forward_many(f, in, 2, out, 2);
        CHECK(k == 2, "gpt forward: %s", cx_last_error());
        if (f && s == 0) {
            char spec[256];
            CHECK(strstr(cx_sharding_spec(out[0], spec, sizeof spec), "spec=(fsdp, None, None)") != NULL,
                  "the logits of (logits, loss) are %s, not split on the batch", spec);
        }
        CHECK((d ? cx_ddp_backward(d, out[1]) : cx_backward(out[1])) == CX_OK && cx_optim_step(opt) == CX_OK,
              "gpt step: %s", cx_last_error());
        cx_keep(out[1]);
        CHECK(cx_step_end() == CX_OK, "gpt step end: %s", cx_last_error());
        double mine = cx_item(out[1]), mean = mine;
        if (d) CHECK(cx_mesh_reduce("dist_spmd_gpt_loss", &mine, 1, NULL, &mean) == CX_OK, "loss mean: %s", cx_last_error());
        r->loss[s] = (float)mean;
        cx_free(out[1]);
        if (s == 0) { r->gathers = cx_counter_value("SpmdAllGather"); r->scatters = cx_counter_value("SpmdReduceScatter"); }
        r->aliased = cx_last_exec_info().num_aliased;
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(cx_to_host(ps[i].tensor, r->params + off, CX_F32) == CX_OK, "read %s: %s", ps[i].name, cx_last_error());
        off += cx_numel(ps[i].tensor);
    }
    int ns = 0;
    cx_named_tensor *st = cx_optim_state(opt, &ns);
    r->state_bytes = 0;
    for (int i = 0; i < n; i++) r->state_bytes += local_bytes(ps[i].tensor);
    for (int i = 0; st && i < ns; i++) r->state_bytes += local_bytes(st[i].tensor);
    /* one block's parameters, and a momentum buffer each */
    r->block_bytes = 2 * 4 * cx_module_num_params(cx_module_find(m, "transformer.h.0"));
    free(st);
    free(ps);
    cx_optim_free(opt);
    cx_spmd_fsdp_free(f);
    cx_ddp_free(d);
    cx_free(idx);
    cx_free(tgt);
    cx_module_free(m);
}

/* A model giving (loss, logits): the default shard_output cannot tell the
 * activation and says so. */
static int loss_first_forward(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    if (n_in != 1 || max_out < 2) { cx_set_last_error("LossFirst: one input, two outputs"); return -1; }
    cx_tensor *y = cx_module_forward(cx_module_child(m, 0), in[0]);   // (B, 8)
    out[0] = cx_mean(cx_mul(y, y), NULL, 0, false);
    out[1] = y;
    return 2;
}

static cx_status one_tensor_batch(cx_tensor *out, const cx_mesh *mesh, void *arg)
{
    (void)arg;
    cx_spec_entry spec[2] = { CX_SPEC_NAME("fsdp"), CX_SPEC_NONE };
    return cx_mark_sharding(out, mesh, spec, 2);
}

static void fsdpv2_output_errors(const cx_mesh *mesh)
{
    static const cx_module_type t = { CX_STRUCT_SIZE(cx_module_type), .name = "LossFirst", .forward_many = loss_first_forward };
    cx_module *m = cx_module_new(&t, NULL);
    CHECK(m && cx_module_add_child(m, "fc", cx_nn_linear(K, 8, true)) == 0, "LossFirst: %s", cx_last_error());
    cx_spmd_fsdp *f = cx_spmd_fsdp_wrap_opts(m, mesh, cx_spmd_fsdp_default_opts());
    CHECK(f != NULL, "LossFirst wrap: %s", cx_last_error());
    cx_tensor *x = host(B, K, 2, 0.3, false), *out[2];
    cx_step_begin();
    int k = f ? cx_spmd_fsdp_forward_many(f, &x, 1, out, 2) : 0;
    CHECK(k == -1 && strstr(cx_last_error(), "0-d") && strstr(cx_last_error(), "pass shard_output"),
          "a (loss, logits) tuple under the default shard_output: %d outputs, %s", k, cx_last_error());
    if (cx_global_ordinal() == 0) printf("default shard_output on (loss, logits): %s\n", cx_last_error());
    cx_step_end();
    cx_spmd_fsdp_free(f);
    /* a one-tensor shard_output (cx_spmd_fsdp_wrap's) refuses a tuple */
    f = cx_spmd_fsdp_wrap(m, mesh, one_tensor_batch, NULL);
    cx_step_begin();
    k = f ? cx_spmd_fsdp_forward_many(f, &x, 1, out, 2) : 0;
    CHECK(k == -1 && strstr(cx_last_error(), "takes one tensor; the forward gave 2"), "a one-tensor shard_output given a tuple: %s",
          cx_last_error());
    cx_step_end();
    cx_spmd_fsdp_free(f);
    cx_drop(x);
    cx_spmd_fsdp_opts bad = cx_spmd_fsdp_default_opts();
    bad.auto_wrap_min_params = -1;
    CHECK(cx_spmd_fsdp_wrap_opts(m, mesh, bad) == NULL && strstr(cx_last_error(), "auto_wrap_min_params"),
          "a negative auto_wrap_min_params: %s", cx_last_error());
    cx_module_free(m);
}

/* The size policy picks what the type policy does on a GPT when the bound
 * is one block's parameters (children first: the attention and MLP fall
 * short, and nothing above a block holds that many of its own);
 * shard_maximal splits a weight's largest dimension. */
static void fsdpv2_policies(const cx_mesh *mesh)
{
    cx_manual_seed(3);
    cx_module *m = cx_nn_gpt(tiny_gpt());
    cx_spmd_fsdp_opts o = cx_spmd_fsdp_default_opts();
    o.auto_wrap_min_params = cx_module_num_params(cx_module_find(m, "transformer.h.0"));
    cx_spmd_fsdp *f = cx_spmd_fsdp_wrap_opts(m, mesh, o);
    CHECK(f && cx_spmd_fsdp_num_wrapped(f) == 2 && !strcmp(cx_spmd_fsdp_wrapped_path(f, 0), "transformer.h.0") &&
              !strcmp(cx_spmd_fsdp_wrapped_path(f, 1), "transformer.h.1"),
          "size policy of %lld parameters: %d wrapped (%s, ...): %s", (long long)o.auto_wrap_min_params,
          cx_spmd_fsdp_num_wrapped(f), cx_spmd_fsdp_wrapped_path(f, 0), f ? "" : cx_last_error());
    char spec[256];
    CHECK(strstr(cx_sharding_spec(cx_module_get(m, "transformer.h.0.mlp.c_fc.weight"), spec, sizeof spec), "spec=(fsdp, None)"),
          "c_fc.weight (128, 32) is %s, not split on its first dimension", spec);
    cx_spmd_fsdp_free(f);
    cx_module_free(m);
    cx_module *lin = cx_nn_linear(K, 8, true);   /* weight (8, 12) */
    cx_spmd_fsdp_opts mx = cx_spmd_fsdp_default_opts();
    mx.shard_maximal = true;
    f = cx_spmd_fsdp_wrap_opts(lin, mesh, mx);
    CHECK(f && strstr(cx_sharding_spec(cx_module_get(lin, "weight"), spec, sizeof spec), "spec=(None, fsdp)"),
          "shard_maximal: a (8, 12) weight is %s", f ? spec : cx_last_error());
    cx_spmd_fsdp_free(f);
    cx_module_free(lin);
}

static void fsdpv2_gpt_per_block_equals_ddp(void)
{
    int nr = cx_world_size(), shape[2] = { nr, 1 };
    const char *names[2] = { "fsdp", "model" };
    cx_mesh *mesh = cx_mesh_new(NULL, 2, shape, names);
    CHECK(mesh != NULL, "fsdp mesh: %s", cx_last_error());
    if (!mesh) return;
    enum { NP = 40000 };
    static float pd[NP], pf[NP];
    gpt_run ref = { .params = pd };
    gpt_fsdp_train(true, NULL, NULL, &ref);
    static const char *const types[1] = { "Block" };
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        memset(pf, 0, sizeof pf);
        gpt_run got = { .params = pf };
        cx_spmd_fsdp_opts o = cx_spmd_fsdp_default_opts();
        o.auto_wrap_types = types;
        o.n_auto_wrap_types = 1;
        o.grad_ckpt = ckpt;
        if (ckpt) o.shard_output = user_shard_output;   /* the user's: on each block and the root */
        g_user_calls = 0;
        gpt_fsdp_train(false, &o, mesh, &got);
        const char *what = ckpt ? "fsdpv2 per block, checkpointed, user shard_output" : "fsdpv2 per block";
        CHECK(got.wrapped == 2, "%s: %d blocks wrapped, not 2", what, got.wrapped);
        /* ZeRO-3: the weights are gathered where used, their gradients reduce-scattered into shards */
        CHECK(got.gathers > 0 && got.scatters >= 8, "%s: the partitioner inserted %lld all-gather, %lld reduce-scatter", what,
              (long long)got.gathers, (long long)got.scatters);
        if (ckpt) CHECK(g_user_calls == 3 * 3, "the user's shard_output ran %d times in 3 steps, not 9 (2 blocks + the root)", g_user_calls);
        for (int s = 0; s < 3; s++)
            CHECK(close_rel(got.loss[s], ref.loss[s], 1e-5), "%s: loss %d: %.8f, ddp %.8f", what, s, got.loss[s], ref.loss[s]);
        int bad = 0, first = -1;
        for (int i = 0; i < NP; i++)
            if (!close_rel(pf[i], pd[i], 1e-5) && bad++ == 0) first = i;
        CHECK(bad == 0, "%s: %d parameter elements differ from ddp by more than 1e-5 (first %d: %.8f, ddp %.8f)", what, bad, first,
              first >= 0 ? pf[first] : 0, first >= 0 ? pd[first] : 0);
        /* sharded parameters, gradients and momentum are updated in their own
         * buffers, as DDP's whole ones are (no second copy during the step) */
        CHECK(got.aliased == ref.aliased, "%s: %d outputs of a step take their old buffers, ddp %d", what, got.aliased, ref.aliased);
        CHECK(got.state_bytes <= ref.state_bytes / nr + ref.block_bytes,
              "%s: parameters + momentum hold %lld bytes on this rank; ddp %lld, over %d ranks plus one block (%lld) is %lld", what,
              (long long)got.state_bytes, (long long)ref.state_bytes, nr, (long long)ref.block_bytes,
              (long long)(ref.state_bytes / nr + ref.block_bytes));
        if (cx_global_ordinal() == 0)
            printf("%s: loss %.6f -> %.6f (ddp %.6f -> %.6f); parameters + momentum %lld bytes/rank, ddp %lld (1/%d: %lld, "
                   "one block %lld); inserted %lld all-gather, %lld reduce-scatter\n", what, got.loss[0], got.loss[2], ref.loss[0],
                   ref.loss[2], (long long)got.state_bytes, (long long)ref.state_bytes, nr, (long long)(ref.state_bytes / nr),
                   (long long)ref.block_bytes, (long long)got.gathers, (long long)got.scatters);
    }
    fsdpv2_output_errors(mesh);
    fsdpv2_policies(mesh);
}

/* The loader's input sharding: each rank reads only its rows of every
 * global batch (uneven last batch included), and the sharded batch reads
 * back as the whole batch; also with 2 workers on a concurrent data set. */
static atomic_llong g_items_read;

static cx_status count_get(void *ctx, int64_t index, void *const *item)
{
    (void)ctx;
    g_items_read++;
    for (int j = 0; j < 3; j++) ((float *)item[0])[j] = (float)(index * 10 + j);
    *(int64_t *)item[1] = index;
    return CX_OK;
}

static void loader_reads_its_rows(int workers)
{
    const cx_field fields[2] = { { .name = "x", .dtype = CX_F32, .ndim = 1, .shape = { 3 } },
                                 { .name = "y", .dtype = CX_I64, .ndim = 0 } };
    cx_dataset_desc dd = { CX_STRUCT_SIZE(cx_dataset_desc), .size = 20, .nfields = 2, .fields = fields, .get = count_get,
                           .concurrent = workers > 0 };
    cx_dataset *ds = cx_dataset_new(&dd);
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    so.rank = 0;
    so.world_size = 1;   /* global batches: every rank the same */
    cx_sampler *sp = cx_sampler_new(20, so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 8;
    lo.num_workers = workers;
    cx_spec_entry spec[2] = { CX_SPEC_NAME("x"), CX_SPEC_NONE };
    lo.input_mesh = g_mesh1;
    lo.input_spec = spec;
    lo.input_nspec = 2;
    cx_loader *l = cx_loader_new(ds, sp, lo);
    CHECK(l != NULL, "loader: %s", cx_last_error());
    int64_t k = cx_world_size(), want_reads = 0, batches = 0;
    cx_batch b;
    g_items_read = 0;
    while (l && cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        int64_t n = b.size, rows = (n + k - 1) / k, r0 = cx_global_ordinal() * rows;
        want_reads += r0 >= n ? 0 : (n - r0 < rows ? n - r0 : rows);
        float x[8 * 3];
        int64_t y[8];
        CHECK(cx_to_host(cx_batch_field(&b, "x"), x, CX_F32) == CX_OK && cx_to_host(cx_batch_field(&b, "y"), y, CX_I64) == CX_OK,
              "read a sharded batch: %s", cx_last_error());
        for (int64_t i = 0; i < n; i++) {
            CHECK(y[i] == batches * 8 + i, "batch %lld row %lld: y %lld", (long long)batches, (long long)i, (long long)y[i]);
            CHECK(x[i * 3 + 2] == (float)((batches * 8 + i) * 10 + 2), "batch %lld row %lld: x", (long long)batches, (long long)i);
        }
        batches++;
    }
    CHECK(batches == 3, "the loader gave %lld batches, not 3", (long long)batches);
    CHECK(g_items_read == want_reads, "%d workers: this rank read %lld items; its shards hold %lld", workers,
          (long long)g_items_read, (long long)want_reads);
    cx_loader_free(l);
    cx_spec_entry bad[2] = { CX_SPEC_NAME("nope"), CX_SPEC_NONE };
    lo.input_spec = bad;
    CHECK(cx_loader_new(ds, sp, lo) == NULL && strstr(cx_last_error(), "input sharding") && strstr(cx_last_error(), "'nope'"),
          "a loader sharding over a missing axis: %s", cx_last_error());
    cx_sampler_free(sp);
    cx_dataset_free(ds);
}

/* Every rank gets the same one-line error, and nothing hangs. */
static void bad_specs(void)
{
    int64_t shape[2] = { 4, 4 };
    float v[16] = { 0 };
    cx_tensor *t = cx_from_host(v, shape, 2, CX_F32);
    cx_spec_entry missing[2] = { CX_SPEC_NAME("nope"), CX_SPEC_NONE };
    CHECK(cx_mark_sharding(t, g_mesh1, missing, 2) == CX_ERR_ARG && strstr(cx_last_error(), "'nope'"),
          "a missing axis: %s", cx_last_error());
    cx_spec_entry three[3] = { CX_SPEC_NONE, CX_SPEC_NONE, CX_SPEC_NONE };
    CHECK(cx_mark_sharding(t, g_mesh1, three, 3) == CX_ERR_ARG && strstr(cx_last_error(), "3 entries but the tensor has rank 2"),
          "a spec longer than the rank: %s", cx_last_error());
    cx_spec_entry twice[2] = { CX_SPEC_NAME("x"), CX_SPEC_AXIS(0) };
    CHECK(cx_mark_sharding(t, g_mesh1, twice, 2) == CX_ERR_ARG && strstr(cx_last_error(), "used twice"),
          "an axis used twice: %s", cx_last_error());
    cx_spec_entry out_of_range[2] = { CX_SPEC_AXIS(3), CX_SPEC_NONE };
    CHECK(cx_mark_sharding(t, g_mesh1, out_of_range, 2) == CX_ERR_ARG && strstr(cx_last_error(), "axis 3"),
          "an axis index out of range: %s", cx_last_error());
    char buf[128];
    CHECK(!strcmp(cx_sharding_spec(t, buf, sizeof buf), "replicated"), "a refused spec left %s", buf);
    cx_drop(t);
    /* rank 0 lists the devices in another order than the others */
    int n = cx_world_size(), ids[64];
    for (int i = 0; i < n; i++) ids[i] = cx_global_ordinal() == 0 ? n - 1 - i : i;
    const char *names[1] = { "y" };
    cx_mesh *m = cx_mesh_new(ids, 1, &n, names);
    CHECK(m == NULL && strstr(cx_last_error(), "mesh"), "meshes that differ between ranks were accepted (%s)",
          m ? "no error" : cx_last_error());
    if (cx_global_ordinal() == 0 && !m) printf("differing meshes: %s\n", cx_last_error());
    /* one node (LOCAL_WORLD_SIZE = all ranks): a hybrid mesh of ICI (n/2, 2)
     * and DCN (1, 1) is the plain mesh; an ICI that is not the node is refused */
    if (n % 2 == 0) {
        int ici[2] = { n / 2, 2 }, dcn[2] = { 1, 1 }, got[64];
        const char *hn[2] = { "a", "b" };
        cx_mesh *h = cx_hybrid_mesh_new(2, ici, dcn, hn);
        CHECK(h && cx_mesh_device_ids(h, got, 64) == n, "hybrid mesh: %s", h ? "wrong size" : cx_last_error());
        for (int i = 0; h && i < n; i++) CHECK(got[i] == i, "hybrid mesh: position %d holds device %d", i, got[i]);
        int ici_bad[2] = { n, 2 };
        CHECK(cx_hybrid_mesh_new(2, ici_bad, dcn, hn) == NULL && strstr(cx_last_error(), "per node"), "hybrid mesh of %d per node: %s",
              2 * n, cx_last_error());
    }
    int wrong = n + 1;
    CHECK(cx_mesh_new(NULL, 1, &wrong, names) == NULL && strstr(cx_last_error(), "devices"), "a mesh of %d devices: %s",
          wrong, cx_last_error());
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    cx_use_spmd();
    int n = cx_world_size();
    const char *names1[1] = { "x" }, *names2[2] = { "data", "model" };
    g_mesh1 = cx_mesh_new(NULL, 1, &n, names1);
    CHECK(g_mesh1 != NULL, "mesh: %s", cx_last_error());
    if (n % 2 == 0 && n > 2) {
        int shape2[2] = { n / 2, 2 };
        g_mesh2 = cx_mesh_new(NULL, 2, shape2, names2);
        CHECK(g_mesh2 != NULL, "2-D mesh: %s", cx_last_error());
    }
    equals_unsharded();
    deferred_shards_equal_eager();
    fsdpv2_equals_unwrapped();
    loader_reads_its_rows(0);
    loader_reads_its_rows(2);
    block_batch_split_equals_unsharded();
    gpt_batch_split_equals_unsharded();
    fsdpv2_gpt_per_block_equals_ddp();
    bad_specs();
    return dist_finish("dist_spmd");
}
