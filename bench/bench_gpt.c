/* cxla-bench gpt: tokens/s of whole GPT training steps (the gpt program's
 * default config and recipe: forward, backward, gradient-norm clip, AdamW
 * with 2-D-only weight decay; one graph per step) against the GEMM-bound
 * limit, the matmul flops per token over the cblas_sgemm rate measured in
 * the same round. Also the share of a step the attention takes, fused and
 * plain, and the peak device memory against the model state. */
#include "bench.h"

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BATCHES 8
#define WARMUP_STEPS 3

struct bench_gpt_trainer {
    cx_module *m;
    cx_ddp *ddp;
    cx_spmd_fsdp *fsdpv2;
    const cx_mesh *mesh;   /* spmd: the batch over "data", the blocks over "model"; fsdpv2: over "fsdp" */
    cx_spec_entry in_spec[2];
    cx_optimizer *opt;
    cx_named_tensor *ps;
    int nps;
    int64_t *tokens;   /* N_BATCHES x (B, T + 1) */
    int64_t batch, block;
    int next;
    bool autocast;   /* bf16-mixed: the forward under autocast */
};
typedef struct bench_gpt_trainer gpt_trainer;

void bench_gpt_trainer_free(bench_gpt_trainer *t)
{
    if (!t) return;
    cx_optim_free(t->opt);
    free(t->ps);
    cx_spmd_fsdp_free(t->fsdpv2);   /* before the model it unhooks */
    cx_ddp_free(t->ddp);            /* the wrappers borrow the model */
    cx_module_free(t->m);
    free(t->tokens);
    free(t);
}
#define gpt_trainer_free bench_gpt_trainer_free

static void gpt_forward(gpt_trainer *t, cx_tensor **in, cx_tensor **out)
{
    if (t->mesh) {
        cx_mark_sharding(in[0], t->mesh, t->in_spec, 2);
        cx_mark_sharding(in[1], t->mesh, t->in_spec, 2);
    }
    if (t->autocast) cx_autocast_begin(CX_BF16);
    if (t->ddp) cx_ddp_forward_many(t->ddp, in, 2, out, 2);
    else cx_module_forward_many(t->m, in, 2, out, 2);
    if (t->autocast) cx_autocast_end();
}

double bench_gpt_trainer_step(void *p)
{
    gpt_trainer *t = p;
    int64_t b = t->batch, T = t->block, shape[2] = { b, T };
    const int64_t *rows = t->tokens + (size_t)(t->next * b * (T + 1));
    t->next = (t->next + 1) % N_BATCHES;
    int64_t *x = malloc(sizeof *x * (size_t)(2 * b * T));
    if (!x) { fprintf(stderr, "cxla-bench: out of memory\n"); return -1; }
    int64_t *y = x + b * T;
    for (int64_t i = 0; i < b; i++) {
        memcpy(x + i * T, rows + i * (T + 1), sizeof *x * (size_t)T);
        memcpy(y + i * T, rows + i * (T + 1) + 1, sizeof *y * (size_t)T);
    }
    double t0 = bench_now();
    cx_step_begin();
    cx_optim_zero_grad(t->opt);
    cx_tensor *in[2] = { cx_from_host(x, shape, 2, CX_I64), cx_from_host(y, shape, 2, CX_I64) }, *out[2];
    gpt_forward(t, in, out);
    cx_backward(out[1]);
    cx_tensor *params[64];
    for (int i = 0; i < t->nps; i++) params[i] = t->ps[i].tensor;
    cx_clip_grad_norm(params, t->nps, 1.0);
    cx_optim_step(t->opt);
    cx_status st = cx_step_end();
    double dt = bench_now() - t0;
    free(x);
    if (st != CX_OK) {
        fprintf(stderr, "cxla-bench: gpt step: %s\n", cx_last_error());
        return -1;
    }
    return dt;
}
#define gpt_step bench_gpt_trainer_step

/* The model, wrapped or split as par says. @return false after printing why. */
static bool gpt_parallel(gpt_trainer *t, bench_gpt_par par, const cx_mesh *mesh)
{
    bool ok = true;
    if (par == BENCH_GPT_DDP) ok = (t->ddp = cx_ddp_wrap(t->m, cx_ddp_default_opts())) != NULL;
    if (par == BENCH_GPT_FSDPV2) {
        static const char *const blocks[] = { "Block" };
        cx_spmd_fsdp_opts o = cx_spmd_fsdp_default_opts();
        o.auto_wrap_types = blocks;
        o.n_auto_wrap_types = 1;
        t->mesh = mesh;
        t->in_spec[0] = CX_SPEC_NAME("fsdp");
        t->in_spec[1] = CX_SPEC_NONE;
        ok = (t->fsdpv2 = cx_spmd_fsdp_wrap_opts(t->m, mesh, o)) != NULL;
    }
    if (par == BENCH_GPT_SPMD) {
        int shape[CX_MESH_MAX_DIMS];
        t->mesh = mesh;
        t->in_spec[0] = CX_SPEC_NAME("data");
        t->in_spec[1] = CX_SPEC_NONE;
        ok = cx_mesh_shape(mesh, shape) == 2 && (shape[1] == 1 || cx_gpt_tensor_parallel(t->m, mesh, "model") == CX_OK);
    }
    if (!ok)
        fprintf(stderr, "cxla-bench: gpt %s: %s\n", par == BENCH_GPT_DDP ? "ddp" : par == BENCH_GPT_FSDPV2 ? "fsdpv2" : "spmd",
                cx_last_error());
    return ok;
}

bench_gpt_trainer *bench_gpt_trainer_new(cx_gpt_config c, int64_t batch, bench_gpt_par par, const cx_mesh *mesh)
{
    gpt_trainer *t = calloc(1, sizeof *t);
    cx_manual_seed(1);
    if (!t || !(t->m = cx_nn_gpt(c))) {
        fprintf(stderr, "cxla-bench: cannot build the gpt: %s\n", t ? cx_last_error() : "out of memory");
        free(t);
        return NULL;
    }
    t->batch = batch;
    t->block = c.block_size;
    if (!gpt_parallel(t, par, mesh)) { gpt_trainer_free(t); return NULL; }
    t->ps = cx_module_parameters(t->m, &t->nps);
    cx_named_tensor *scratch = t->ps ? malloc(sizeof *scratch * (size_t)t->nps) : NULL;
    cx_param_group groups[2] = { { CX_STRUCT_SIZE(cx_param_group) } };
    cx_adam_opts o = cx_adamw_default_opts();
    o.beta2 = 0.99;
    if (scratch && t->nps <= 64 && cx_param_groups_by_ndim(t->ps, t->nps, 0.1, scratch, groups) == 2)
        t->opt = cx_optim_adamw_groups(groups, 2, o);
    free(scratch);
    size_t n = (size_t)(N_BATCHES * batch * (c.block_size + 1));
    t->tokens = malloc(sizeof *t->tokens * n);
    if (!t->opt || !t->tokens) {
        fprintf(stderr, "cxla-bench: gpt set-up: %s\n", t->opt ? "out of memory" : cx_last_error());
        gpt_trainer_free(t);
        return NULL;
    }
    /* DDP ranks each take their own rows; SPMD ranks all pass the global batch */
    uint64_t salt = par == BENCH_GPT_DDP ? (uint64_t)cx_global_ordinal() * n : 0;
    for (size_t i = 0; i < n; i++) t->tokens[i] = (int64_t)(((i + salt) * 2654435761u >> 7) % (uint64_t)c.vocab_size);
    for (int s = 0; s < WARMUP_STEPS; s++)
        if (gpt_step(t) < 0) { gpt_trainer_free(t); return NULL; }
    return t;
}

bool bench_gpt_trainer_set_autocast(bench_gpt_trainer *t, bool on)
{
    t->autocast = on;
    for (int s = 0; s < WARMUP_STEPS; s++)
        if (gpt_step(t) < 0) return false;
    return true;
}

static int64_t tensor_bytes(cx_tensor *t, bool local)
{
    const cx_mesh *mesh;
    cx_spec_entry spec[CX_MAX_DIMS];
    int64_t shape[CX_MAX_DIMS], n = 1;
    int nd = cx_ndim(t);
    for (int d = 0; d < nd; d++) shape[d] = cx_dim(t, d);
    if (local && cx_get_sharding(t, &mesh, spec, CX_MAX_DIMS) == nd && nd > 0)
        cx_shard_local_shape(mesh, spec, nd, shape, nd, shape);
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n * (int64_t)cx_dtype_size(cx_dtype_of(t));
}

int64_t bench_gpt_trainer_state_bytes(bench_gpt_trainer *t, bool local)
{
    int np = 0, ns = 0;
    cx_named_tensor *ps = cx_optim_params(t->opt, &np), *st = cx_optim_state(t->opt, &ns);
    int64_t total = 0;
    for (int i = 0; ps && i < np; i++) total += tensor_bytes(ps[i].tensor, local);
    for (int i = 0; st && i < ns; i++) total += tensor_bytes(st[i].tensor, local);
    free(ps);
    free(st);
    return total;
}

/* ---- attention alone: the model's n_layer attentions, forward and backward ---- */

#define MAX_LAYERS 64

/* Distinct inputs per layer: identical calls would be one node of the graph. */
typedef struct {
    cx_tensor *q[MAX_LAYERS], *k[MAX_LAYERS], *v[MAX_LAYERS];   /* (B, H, T, D), persistent, requiring grad */
    int layers;
    bool fused;
} attn_case;

/* The reference path: scores, causal mask and softmax as separate ops. */
static cx_tensor *plain_attention(cx_tensor *q, cx_tensor *k, cx_tensor *v)
{
    int64_t t = cx_dim(q, 2), col[2] = { t, 1 }, row[2] = { 1, t };
    cx_tensor *scores = cx_mul_scalar(cx_matmul(q, cx_transpose(k, 2, 3)), 1.0 / sqrt((double)cx_dim(q, 3)));
    cx_tensor *ar = cx_arange(t, CX_I64);
    cx_tensor *allowed = cx_le(cx_reshape(ar, row, 2), cx_reshape(ar, col, 2));
    cx_tensor *masked = cx_where(allowed, scores, cx_full(NULL, 0, -1e30, CX_F32));
    return cx_matmul(cx_softmax(masked, -1), v);
}

static double attn_run(void *p)
{
    attn_case *a = p;
    double t0 = bench_now();
    cx_step_begin();
    cx_tensor *total = NULL;
    for (int l = 0; l < a->layers; l++) {
        cx_tensor *y = a->fused ? cx_scaled_dot_product_attention(a->q[l], a->k[l], a->v[l], true, 0.0)
                                : plain_attention(a->q[l], a->k[l], a->v[l]);
        cx_tensor *s = cx_sum(y, NULL, 0, false);
        total = total ? cx_add(total, s) : s;
    }
    cx_backward(total);
    cx_status st = cx_step_end();
    double dt = bench_now() - t0;
    for (int l = 0; l < a->layers; l++) { cx_zero_grad(a->q[l]); cx_zero_grad(a->k[l]); cx_zero_grad(a->v[l]); }
    if (st != CX_OK) { fprintf(stderr, "cxla-bench: attention: %s\n", cx_last_error()); return -1; }
    return dt;
}

static bool attn_case_init(attn_case *a, cx_gpt_config c, int64_t batch, bool fused)
{
    int64_t shape[4] = { batch, c.n_head, c.block_size, c.n_embd / c.n_head };
    a->layers = c.n_layer < MAX_LAYERS ? c.n_layer : MAX_LAYERS;
    a->fused = fused;
    for (int l = 0; l < a->layers; l++) {
        cx_tensor **t[3] = { &a->q[l], &a->k[l], &a->v[l] };
        for (int i = 0; i < 3; i++) cx_requires_grad(*t[i] = cx_init_normal(shape, 4, 0, 1), true);
    }
    return attn_run(a) >= 0 && attn_run(a) >= 0;
}

static void attn_case_free(attn_case *a)
{
    for (int l = 0; l < a->layers; l++) { cx_free(a->q[l]); cx_free(a->k[l]); cx_free(a->v[l]); }
}

/* ---- the subcommand ------------------------------------------------------------------ */

int bench_gpt(int argc, char **argv, bench_cfg cfg)
{
    int threads = 2;
    int64_t batch = 16;
    cli_flag extra[] = {
        { .name = "threads", .kind = CLI_INT, .dest = &threads, .min = 1, .max = 4096, .help = "compute threads" },
        { .name = "batch-size", .kind = CLI_I64, .dest = &batch, .min = 1, .max = 4096, .help = "batch size" },
    };
    int rc = bench_parse("gpt", argc, argv, extra, 2, &cfg);
    if (rc >= 0) return rc;
    cx_set_num_threads(threads);
    cx_gpt_config c = cx_gpt_default_config();
    double flops = cx_gpt_flops_per_token(c, c.block_size), tokens = (double)(batch * c.block_size);
    bench_sgemm *g = bench_sgemm_new(2048);
    gpt_trainer *tr = g ? bench_gpt_trainer_new(c, batch, BENCH_GPT_ONE, NULL) : NULL;
    attn_case fused = { 0 }, plain = { 0 };
    bench_series speed = { 0 }, share = { 0 }, mem = { 0 };
    rc = 1;
    if (!tr) goto out;
    /* the peak of training steps alone, before the attention cases exist */
    cx_memory_reset_peak();
    if (gpt_step(tr) < 0 || gpt_step(tr) < 0) goto out;
    /* the model state: parameters, gradients and Adam's two moments, f32 */
    bench_add(&mem, (double)cx_memory_peak(), 16.0 * (double)cx_module_num_params(tr->m));
    if (!attn_case_init(&fused, c, batch, true) || !attn_case_init(&plain, c, batch, false)) goto out;
    bench_sgemm_run(g);
    /* sides: the sgemm rate, the step, fused and plain attention */
    bench_side sides[4] = { { .unit = bench_sgemm_run, .ctx = g }, { .unit = gpt_step, .ctx = tr },
                            { .unit = attn_run, .ctx = &fused }, { .unit = attn_run, .ctx = &plain } };
    for (int r = 0; r < cfg.rounds; r++) {
        double sec[4];
        if (!bench_round(&cfg, r, sides, 4, sec)) goto out;
        bench_add(&speed, tokens / sec[1], bench_sgemm_flop(g) / sec[0] / flops);
        /* the same step with the plain attention instead: sec[1] - sec[2] + sec[3] */
        bench_add(&share, sec[2] / sec[1], sec[3] / (sec[1] - sec[2] + sec[3]));
    }
    bench_emit("gpt_tokens_per_s", "tokens/s", BENCH_HIGHER, &speed);
    bench_emit("gpt_attention_share", "fraction of a step (ref: plain attention)", BENCH_LOWER, &share);
    bench_emit("gpt_peak_bytes", "bytes (ref: params + grads + Adam moments)", BENCH_LOWER, &mem);
    rc = 0;
out:
    attn_case_free(&fused);
    attn_case_free(&plain);
    gpt_trainer_free(tr);
    bench_sgemm_free(g);
    return rc;
}
