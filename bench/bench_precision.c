/* cxla-bench precision: what bf16 buys on this machine. Each figure is a
 * row of g_figures: a name and a function that measures both sides in the
 * same rounds and emits its line, so a figure is added by writing one
 * function and one row. --figure NAME runs only that one.
 *
 * bf16_gemm_gflops: an n^3 bf16 matmul through the core (a graph of one
 * matmul of two bf16 tensors, synced) against the best GEMM a library on
 * this machine offers for the same product: oneDNN's bf16 matmul (the
 * library PyTorch's CPU path runs on; vdpbf16ps or AMX where the CPU has
 * them) or OpenBLAS's sgemm on the same values in f32, whichever is faster
 * in that round (on a CPU without bf16 instructions oneDNN's bf16 matmul
 * is a reference loop, and f32 is what bf16 storage must not fall below).
 * Both libraries get as many threads as cxla uses.
 *
 * bf16_matmul_vs_f32, cnn_conv_bf16_vs_f32, gpt_attention_bf16_vs_f32: below. */
#include "bench.h"

#include <cxla/cxla.h>
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_gemm_n = 2048;

/* ---- bf16_gemm_gflops -------------------------------------------------------------- */

typedef struct {
    int n;
    uint16_t *a, *b, *c;   /* bf16 host copies, for oneDNN */
    float *af, *bf, *cf;   /* the same values in f32, for sgemm */
    cx_tensor *ta, *tb;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc;
    char dnnl_impl[64];   /* oneDNN's name of the implementation it chose */
    bool have_dnnl;       /* false where oneDNN has no bf16 matmul (below AVX-512) */
} gemm_ctx;

static double core_unit(void *p)
{
    gemm_ctx *g = p;
    double t0 = bench_now();
    cx_tensor *c = cx_matmul(g->ta, g->tb);
    cx_status st = cx_sync_tensors(&c, 1);
    double dt = bench_now() - t0;
    cx_free(c);
    if (st == CX_OK) return dt;
    fprintf(stderr, "cxla-bench precision: bf16 matmul: %s\n", cx_last_error());
    return -1;
}

static double dnnl_unit(void *p)
{
    gemm_ctx *g = p;
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, g->ma }, { DNNL_ARG_WEIGHTS, g->mb }, { DNNL_ARG_DST, g->mc } };
    double t0 = bench_now();
    dnnl_status_t st = dnnl_primitive_execute(g->prim, g->stream, 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(g->stream);
    double dt = bench_now() - t0;
    if (st == dnnl_success) return dt;
    fprintf(stderr, "cxla-bench precision: oneDNN matmul failed (status %d)\n", (int)st);
    return -1;
}

static double sgemm_unit(void *p)
{
    gemm_ctx *g = p;
    int n = g->n;
    bench_openblas_begin();
    double t0 = bench_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, g->af, n, g->bf, n, 0.0f, g->cf, n);
    double dt = bench_now() - t0;
    bench_openblas_end();
    return dt;
}

/* oneDNN's n x n bf16 matmul primitive over g's host buffers. */
static bool dnnl_setup(gemm_ctx *g)
{
    dnnl_dims_t d = { g->n, g->n };
    dnnl_memory_desc_t md;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_desc_t pd = NULL;
    omp_set_num_threads(cx_get_num_threads());
    bool ok = dnnl_engine_create(&g->eng, dnnl_cpu, 0) == dnnl_success &&
              dnnl_stream_create(&g->stream, g->eng, dnnl_stream_default_flags) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&md, 2, d, dnnl_bf16, dnnl_ab) == dnnl_success &&
              dnnl_matmul_desc_init(&mm, &md, &md, NULL, &md) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &mm, NULL, g->eng, NULL) == dnnl_success &&
              dnnl_primitive_create(&g->prim, pd) == dnnl_success &&
              dnnl_memory_create(&g->ma, &md, g->eng, g->a) == dnnl_success &&
              dnnl_memory_create(&g->mb, &md, g->eng, g->b) == dnnl_success &&
              dnnl_memory_create(&g->mc, &md, g->eng, g->c) == dnnl_success;
    const char *impl = NULL;
    if (ok && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = NULL;
    snprintf(g->dnnl_impl, sizeof g->dnnl_impl, "%s", impl ? impl : "?");
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) fprintf(stderr, "bf16_gemm: oneDNN makes no %d^2 bf16 matmul at this CPU level (below AVX-512): the "
                     "reference is OpenBLAS's sgemm alone\n", g->n);
    return ok;
}

static void gemm_free(gemm_ctx *g)
{
    if (g->ma) dnnl_memory_destroy(g->ma);
    if (g->mb) dnnl_memory_destroy(g->mb);
    if (g->mc) dnnl_memory_destroy(g->mc);
    if (g->prim) dnnl_primitive_destroy(g->prim);
    if (g->stream) dnnl_stream_destroy(g->stream);
    if (g->eng) dnnl_engine_destroy(g->eng);
    cx_free(g->ta); cx_free(g->tb);
    free(g->a); free(g->b); free(g->c); free(g->af); free(g->bf); free(g->cf);
}

static bool gemm_setup(gemm_ctx *g, int n)
{
    size_t nn = (size_t)n * (size_t)n;
    g->n = n;
    g->a = malloc(2 * nn); g->b = malloc(2 * nn); g->c = malloc(2 * nn);
    g->af = malloc(4 * nn); g->bf = malloc(4 * nn); g->cf = malloc(4 * nn);
    if (!g->a || !g->b || !g->c || !g->af || !g->bf || !g->cf) {
        fprintf(stderr, "cxla-bench precision: out of memory for the %d^2 operands\n", n);
        return false;
    }
    for (size_t i = 0; i < nn; i++) {
        g->a[i] = cx_f32_to_bf16((float)(i % 13) * 0.1f - 0.6f);
        g->b[i] = cx_f32_to_bf16((float)(i % 7) * 0.1f - 0.3f);
        g->af[i] = cx_bf16_to_f32(g->a[i]);
        g->bf[i] = cx_bf16_to_f32(g->b[i]);
    }
    int64_t s[2] = { n, n };
    g->ta = cx_from_host(g->a, s, 2, CX_BF16);
    g->tb = cx_from_host(g->b, s, 2, CX_BF16);
    if (cx_tensor_error(g->ta) || cx_tensor_error(g->tb)) {
        fprintf(stderr, "cxla-bench precision: bf16 operands: %s\n", cx_last_error());
        return false;
    }
    g->have_dnnl = dnnl_setup(g);
    return true;
}

static int bf16_gemm(const bench_cfg *cfg)
{
    gemm_ctx g = { 0 };
    int rc = 1;
    if (!gemm_setup(&g, g_gemm_n)) goto out;
    /* the first matmul compiles, the first library calls size their buffers */
    if (core_unit(&g) < 0 || (g.have_dnnl && dnnl_unit(&g) < 0) || sgemm_unit(&g) < 0) goto out;
    fprintf(stderr, "bf16_gemm: %d^3; core's bf16 path %s; oneDNN %s; %d thread(s)\n", g.n, cx_bf16_path(),
            g.have_dnnl ? g.dnnl_impl : "none", cx_get_num_threads());
    /* without oneDNN's matmul, OpenBLAS's sgemm is the reference's only side */
    bench_side sides[3] = { { .unit = core_unit, .ctx = &g }, { .unit = sgemm_unit, .ctx = &g },
                            { .unit = dnnl_unit, .ctx = &g } };
    const int nsides = g.have_dnnl ? 3 : 2;
    bench_series fig = { 0 };
    double flop = 2.0 * g.n * (double)g.n * g.n;
    int dnnl_best = 0;
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[3];
        if (!bench_round(cfg, r, sides, nsides, sec)) goto out;
        const bool dnnl_wins = nsides == 3 && sec[2] <= sec[1];
        dnnl_best += dnnl_wins;
        bench_add(&fig, flop / sec[0] / 1e9, flop / sec[dnnl_wins ? 2 : 1] / 1e9);
    }
    fprintf(stderr, "bf16_gemm: the reference was oneDNN's bf16 matmul in %d of %d rounds, OpenBLAS sgemm in the rest\n",
            dnnl_best, cfg->rounds);
    bench_emit("bf16_gemm_gflops", "GFLOP/s", BENCH_HIGHER, &fig);
    rc = 0;
out:
    gemm_free(&g);
    return rc;
}

/* ---- bf16_matmul_vs_f32 -------------------------------------------------------------- */

/* The gpt program's default model's three linear shapes (16 x 128 tokens,
 * n_embd 256: the qkv projection, the MLP's up and down projections), one
 * graph of three matmuls per unit, in bf16 and in f32 through the core:
 * what bf16 storage buys a transformer's GEMMs on this machine (target:
 * >= 1.5 with AVX512_BF16, >= 1.0 without, where tiles are widened for
 * the f32 kernels). */
enum { MM_SHAPES = 3 };
static const int64_t g_mm_shapes[MM_SHAPES][3] = { { 2048, 256, 768 }, { 2048, 256, 1024 }, { 2048, 1024, 256 } };

typedef struct { cx_tensor *a[MM_SHAPES], *b[MM_SHAPES]; } mm_set;

static double mm_unit(void *p)
{
    mm_set *s = p;
    double t0 = bench_now();
    cx_tensor *c[MM_SHAPES];
    for (int i = 0; i < MM_SHAPES; i++) c[i] = cx_matmul(s->a[i], s->b[i]);
    cx_status st = cx_sync_tensors(c, MM_SHAPES);
    double dt = bench_now() - t0;
    for (int i = 0; i < MM_SHAPES; i++) cx_free(c[i]);
    if (st == CX_OK) return dt;
    fprintf(stderr, "cxla-bench precision: linear-shape matmuls: %s\n", cx_last_error());
    return -1;
}

static bool mm_set_make(mm_set *s, cx_dtype dt)
{
    for (int i = 0; i < MM_SHAPES; i++) {
        const int64_t *d = g_mm_shapes[i];
        int64_t sa[2] = { d[0], d[1] }, sb[2] = { d[1], d[2] };
        size_t na = (size_t)(d[0] * d[1]), nb = (size_t)(d[1] * d[2]);
        float *h = malloc(sizeof *h * (na > nb ? na : nb));
        if (!h) { fprintf(stderr, "cxla-bench precision: out of memory\n"); return false; }
        for (size_t e = 0; e < na; e++) h[e] = (float)(e % 11) * 0.05f - 0.25f;
        cx_tensor *a = cx_from_host(h, sa, 2, CX_F32);
        for (size_t e = 0; e < nb; e++) h[e] = (float)(e % 5) * 0.05f - 0.1f;
        cx_tensor *b = cx_from_host(h, sb, 2, CX_F32);
        free(h);
        s->a[i] = cx_persist(cx_cast(a, dt));
        s->b[i] = cx_persist(cx_cast(b, dt));
        cx_free(a); cx_free(b);
        if (cx_tensor_error(s->a[i]) || cx_tensor_error(s->b[i]) || cx_sync_tensors(s->a + i, 1) != CX_OK ||
            cx_sync_tensors(s->b + i, 1) != CX_OK) {
            fprintf(stderr, "cxla-bench precision: %s operands: %s\n", cx_dtype_name(dt), cx_last_error());
            return false;
        }
    }
    return true;
}

static int bf16_matmul_vs_f32(const bench_cfg *cfg)
{
    mm_set h = { 0 }, f = { 0 };
    int rc = 1;
    if (!mm_set_make(&h, CX_BF16) || !mm_set_make(&f, CX_F32)) goto out;
    if (mm_unit(&h) < 0 || mm_unit(&f) < 0) goto out; /* the first of each compiles */
    fprintf(stderr, "bf16_matmul_vs_f32: the gpt's linear shapes (2048x256x768, 2048x256x1024, 2048x1024x256); "
                    "bf16 path %s\n", cx_bf16_path());
    bench_side sides[2] = { { .unit = mm_unit, .ctx = &h }, { .unit = mm_unit, .ctx = &f } };
    bench_series fig = { 0 };
    double flop = 0;
    for (int i = 0; i < MM_SHAPES; i++) flop += 2.0 * g_mm_shapes[i][0] * g_mm_shapes[i][1] * g_mm_shapes[i][2];
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) goto out;
        bench_add(&fig, flop / sec[0] / 1e9, flop / sec[1] / 1e9);
    }
    bench_emit("bf16_matmul_vs_f32", "GFLOP/s", BENCH_HIGHER, &fig);
    rc = 0;
out:
    for (int i = 0; i < MM_SHAPES; i++) { cx_free(h.a[i]); cx_free(h.b[i]); cx_free(f.a[i]); cx_free(f.b[i]); }
    return rc;
}

/* ---- cnn_conv_bf16_vs_f32, gpt_attention_bf16_vs_f32 --------------------------------------
 * One dense op forward and backward (both operands' gradients) through
 * the core, bf16 operands against f32, in the same rounds: the seed cnn's
 * two convs at batch 64 (the second is Winograd's shape, where the bf16
 * conv runs Winograd's f32 transforms and products on the bf16 tensors),
 * and the gpt default's causal
 * attention (batch 16, 4 heads, block 128, head dim 64). The loss is the
 * sum of the output in f32, so each side adds the same small ops. */
enum { DENSE_MAX = 4 };

typedef struct {
    int nin;
    cx_tensor *in[DENSE_MAX];
    cx_tensor *(*build)(cx_tensor **in);   /* the loss, one f32 value */
    const char *what;
} dense_set;

static double dense_unit(void *p)
{
    dense_set *s = p;
    double t0 = bench_now();
    cx_step_begin();
    for (int i = 0; i < s->nin; i++) cx_zero_grad(s->in[i]);
    cx_status st = cx_backward(s->build(s->in));
    cx_tensor *g[DENSE_MAX];
    for (int i = 0; i < s->nin && st == CX_OK; i++) g[i] = cx_grad(s->in[i]);
    if (st == CX_OK) st = cx_sync_tensors(g, s->nin);
    cx_status end = cx_step_end();
    double dt = bench_now() - t0;
    if (st == CX_OK && end == CX_OK) return dt;
    fprintf(stderr, "cxla-bench precision: %s: %s\n", s->what, cx_last_error());
    return -1;
}

/* in[i] of shape shapes[i] (rank 4), values in [-0.5, 0.5), in dtype dt */
static bool dense_make(dense_set *s, cx_dtype dt, const int64_t (*shapes)[4])
{
    for (int i = 0; i < s->nin; i++) {
        size_t n = (size_t)(shapes[i][0] * shapes[i][1] * shapes[i][2] * shapes[i][3]);
        float *h = malloc(sizeof *h * n);
        if (!h) { fprintf(stderr, "cxla-bench precision: out of memory\n"); return false; }
        for (size_t e = 0; e < n; e++) h[e] = (float)((e * 7919 + (size_t)i * 104729) % 1000) * 1e-3f - 0.5f;
        cx_tensor *t = cx_from_host(h, shapes[i], 4, CX_F32);
        free(h);
        s->in[i] = cx_requires_grad(cx_persist(cx_cast(t, dt)), true);
        cx_free(t);
        if (cx_tensor_error(s->in[i]) || cx_sync_tensors(s->in + i, 1) != CX_OK) {
            fprintf(stderr, "cxla-bench precision: %s: %s operands: %s\n", s->what, cx_dtype_name(dt), cx_last_error());
            return false;
        }
    }
    return true;
}

static void dense_free(dense_set *s)
{
    for (int i = 0; i < s->nin; i++) cx_free(s->in[i]);
}

static cx_tensor *f32_sum(cx_tensor *y) { return cx_sum(cx_cast(y, CX_F32), NULL, 0, false); }

/* the two convs side by side (conv2 on its own input, so both run at
 * their shapes in either dtype) */
static cx_tensor *cnn_convs(cx_tensor **in)
{
    return cx_add(f32_sum(cx_conv2d(in[0], in[1], NULL, 1, 1, 0, 0, 1, 1, 1)),
                  f32_sum(cx_conv2d(in[2], in[3], NULL, 1, 1, 0, 0, 1, 1, 1)));
}

static cx_tensor *gpt_attention(cx_tensor **in)
{
    return f32_sum(cx_scaled_dot_product_attention(in[0], in[1], in[2], true, 0));
}

/* the two sides' ratio in one figure; flop: per unit, for the unit */
static int dense_figure(const bench_cfg *cfg, const char *name, dense_set proto, const int64_t (*shapes)[4],
                        double flop)
{
    dense_set h = proto, f = proto;
    int rc = 1;
    if (!dense_make(&h, CX_BF16, shapes) || !dense_make(&f, CX_F32, shapes)) goto out;
    if (dense_unit(&h) < 0 || dense_unit(&f) < 0) goto out; /* the first of each compiles */
    fprintf(stderr, "%s: %s, forward and backward; bf16 path %s\n", name, proto.what, cx_bf16_path());
    bench_side sides[2] = { { .unit = dense_unit, .ctx = &h }, { .unit = dense_unit, .ctx = &f } };
    bench_series fig = { 0 };
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) goto out;
        bench_add(&fig, flop / sec[0] / 1e9, flop / sec[1] / 1e9);
    }
    bench_emit(name, "GFLOP/s", BENCH_HIGHER, &fig);
    rc = 0;
out:
    dense_free(&h);
    dense_free(&f);
    return rc;
}

static int cnn_conv_bf16_vs_f32(const bench_cfg *cfg)
{
    /* x1, w1, x2, w2: conv1 1 -> 32 on 28x28, conv2 32 -> 64 on 26x26, 3x3 */
    static const int64_t shapes[4][4] = { { 64, 1, 28, 28 }, { 32, 1, 3, 3 }, { 64, 32, 26, 26 }, { 64, 32, 3, 3 } };
    dense_set proto = { .nin = 4, .build = cnn_convs, .what = "the seed cnn's conv1 and conv2, batch 64" };
    /* three products (y, dx, dw) of 2 flop per multiply-add each */
    double flop = 3 * 2.0 * 64 * (32.0 * 9 * 26 * 26 + 64.0 * 288 * 24 * 24);
    return dense_figure(cfg, "cnn_conv_bf16_vs_f32", proto, shapes, flop);
}

static int gpt_attention_bf16_vs_f32(const bench_cfg *cfg)
{
    static const int64_t shapes[3][4] = { { 16, 4, 128, 64 }, { 16, 4, 128, 64 }, { 16, 4, 128, 64 } };
    dense_set proto = { .nin = 3, .build = gpt_attention,
                        .what = "the gpt default's causal attention (16 x 4 heads x 128 x 64)" };
    /* the causal half of Q K^T and P V forward, twice that backward */
    double flop = 3 * 2 * 2.0 * 16 * 4 * 128 * 128 * 64 / 2;
    return dense_figure(cfg, "gpt_attention_bf16_vs_f32", proto, shapes, flop);
}

/* ---- the figures ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int (*run)(const bench_cfg *cfg);
    const char *also;   /* a figure the same run gives: --figure takes either name */
} precision_figure;

static const precision_figure g_figures[] = {
    { "bf16_gemm_gflops", bf16_gemm, NULL },
    { "bf16_matmul_vs_f32", bf16_matmul_vs_f32, NULL },
    { "cnn_conv_bf16_vs_f32", cnn_conv_bf16_vs_f32, NULL },
    { "gpt_attention_bf16_vs_f32", gpt_attention_bf16_vs_f32, NULL },
    { "gpt_bf16_tokens_per_s", bench_precision_gpt, "gpt_bf16_peak_bytes" },
    { "cnn_bf16_images_per_s", bench_precision_cnn, NULL },
};
#define N_FIGURES ((int)(sizeof g_figures / sizeof *g_figures))

static bool names_figure(const precision_figure *f, const char *name)
{
    return !strcmp(name, f->name) || (f->also && !strcmp(name, f->also));
}

/* --figure and --gemm-n, read by check_flags before the machine line */
static const char *g_only;
static bool g_gemm_n_given;

static int check_flags(void)
{
    const char *gemm = g_figures[0].name;
    bool found = !g_only;
    for (int i = 0; i < N_FIGURES && !found; i++) found = names_figure(&g_figures[i], g_only);
    if (!found) {
        fprintf(stderr, "cxla-bench precision: unknown figure '%s'; the figures:", g_only);
        for (int i = 0; i < N_FIGURES; i++)
            fprintf(stderr, " %s%s%s", g_figures[i].name, g_figures[i].also ? " " : "",
                    g_figures[i].also ? g_figures[i].also : "");
        fprintf(stderr, "\n");
        return 2;
    }
    if (g_gemm_n_given && g_only && strcmp(g_only, gemm)) {
        fprintf(stderr, "cxla-bench precision: --gemm-n sizes %s, which --figure %s does not run\n", gemm, g_only);
        return 2;
    }
    return -1;
}

int bench_precision(int argc, char **argv, bench_cfg cfg)
{
    g_only = NULL;
    g_gemm_n_given = false;
    cli_flag extra[2] = {
        { .name = "figure", .kind = CLI_STRING, .dest = &g_only, .metavar = "NAME",
          .help = "run only this figure (default: all)" },
        { .name = "gemm-n", .kind = CLI_INT, .dest = &g_gemm_n, .metavar = "N", .given = &g_gemm_n_given,
          .help = "bf16_gemm_gflops' matrices are N x N", .min = 16, .max = 16384 },
    };
    int rc = bench_parse_checked("precision", argc, argv, extra, 2, &cfg, check_flags);
    if (rc >= 0) return rc;
    for (int i = 0; i < N_FIGURES; i++)
        if ((!g_only || names_figure(&g_figures[i], g_only)) && g_figures[i].run(&cfg)) return 1;
    return 0;
}
