/* The bf16 matmul kernel against a reference summed in double over the
 * same bf16 inputs, and the bf16 attention against the f32 kernel. ctest runs this binary once per CX_CPU_ISA level
 * (tests/CMakeLists.txt); each run checks that the level it asked for is
 * the one running, or skips, saying why, where the CPU lacks it.
 *
 * Tolerance: the kernel sums exact products in f32 and rounds once to
 * bf16, so |c - ref| <= 2^-9 |ref| (the rounding) + K 2^-24 sum |a b|
 * (the f32 sums, bounded loosely); we allow twice the rounding and
 * 4e-6 sum |a b|. A wrong or missing term is of the size of one |a b|,
 * far above that. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <stdio.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cx_bf16.h"
#include "cx_hash.h"
#include "kernels.h"
#include <cxla/core.h>
#include <oneapi/dnnl/dnnl.h>

#define GUARD 32
#define GUARD_BITS 0x7e11

static uint64_t rng_state;

static float rng_uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static uint16_t *bf16_random(size_t n)
{
    uint16_t *p = malloc(sizeof *p * n);
    cr_assert(p);
    for (size_t i = 0; i < n; i++) p[i] = cx_f32_to_bf16(rng_uniform());
    return p;
}

/* The level CX_CPU_ISA names, or -1 for none (unset, auto or unknown). */
static int requested_isa(const char *want)
{
    if (!want || !strcmp(want, "auto")) return -1;
    for (int l = CX_ISA_BASELINE; l <= CX_ISA_AMX; l++)
        if (!strcmp(want, cx_isa_name((cx_isa)l))) return l;
    return -1;
}

/* A run at a level the CPU lacks says why once, after every test has
 * skipped: Criterion prints a skip's reason only with --verbose. ctest
 * marks such a run skipped by this line (tests/CMakeLists.txt), so it is
 * printed only when no test ran: a test that ran and failed is not
 * hidden under it. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    const char *want = getenv("CX_CPU_ISA");
    if (requested_isa(want) > (int)cx_isa_detected() && stats->nb_tests > 0 && stats->tests_skipped == stats->nb_tests)
        fprintf(stderr, "test_kernels_bf16: every test skips: CX_CPU_ISA=%s, and this CPU has only %s\n", want,
                cx_isa_name(cx_isa_detected()));
}

/* The level this run was asked for (CX_CPU_ISA), or skip if the CPU lacks it. */
static void expect_requested_isa(void)
{
    const char *want = getenv("CX_CPU_ISA");
    const int l = requested_isa(want);
    if (l < 0) {
        if (want && strcmp(want, "auto")) cr_assert_fail("unknown CX_CPU_ISA '%s' in the test's environment", want);
        return;
    }
    cx_isa have = cx_isa_detected();
    if (l > (int)have)
        cr_skip_test("CX_CPU_ISA=%s: this CPU has only %s, so that path cannot run here", want, cx_isa_name(have));
    cr_assert_eq(cx_isa_active(), (cx_isa)l, "asked for %s, running %s", want, cx_isa_name(cx_isa_active()));
}

/* CX_CPU_ISA below the CPU's level caps oneDNN's kernels too, so the
 * fallback's f32 products run as on that CPU (isa.c); at the CPU's own
 * level oneDNN keeps at least the level's instructions. oneDNN's levels
 * are bit sets, each holding the bits of those below it. */
Test(isa, a_cap_below_the_cpu_holds_onednn_too)
{
    expect_requested_isa();
    static const dnnl_cpu_isa_t as_dnnl[] = { dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
                                              dnnl_cpu_isa_avx512_core_bf16, dnnl_cpu_isa_avx512_core_amx };
    const cx_isa active = cx_isa_active();
    const unsigned level = (unsigned)as_dnnl[active], got = (unsigned)dnnl_get_effective_cpu_isa();
    if (active < cx_isa_detected())
        cr_expect_eq(got & ~level, 0u, "CX_CPU_ISA=%s, yet oneDNN's level is %#x (above %#x)", cx_isa_name(active),
                     got, level);
    else
        cr_expect_eq(got & level, level, "at the CPU's own level (%s) oneDNN's is %#x, without all of %#x",
                     cx_isa_name(active), got, level);
}

typedef struct {
    int64_t batch, m, n, k;
    bool ta, tb;
    bool bcast_a, bcast_b; /* stride 0 */
} mm_case;

static double at_a(const uint16_t *a, const mm_case *c, int64_t bi, int64_t i, int64_t kk)
{
    const uint16_t *p = a + (c->bcast_a ? 0 : bi * c->m * c->k);
    return cx_bf16_to_f32(c->ta ? p[kk * c->m + i] : p[i * c->k + kk]);
}

static double at_b(const uint16_t *b, const mm_case *c, int64_t bi, int64_t kk, int64_t j)
{
    const uint16_t *p = b + (c->bcast_b ? 0 : bi * c->k * c->n);
    return cx_bf16_to_f32(c->tb ? p[j * c->k + kk] : p[kk * c->n + j]);
}

static void check_case_route(const mm_case *c, int route, bool f32_out);

static void check_case(const mm_case *c) { check_case_route(c, -1, false); }

/* c's values at bi, i, j (bf16 out, or f32 sums out) */
static double c_at(const mm_case *c, const uint16_t *cg, const float *cf, int64_t bi, int64_t i, int64_t j)
{
    const size_t at = (size_t)((bi * c->m + i) * c->n + j);
    return cf ? cf[at] : cx_bf16_to_f32(cg[at]);
}

/* route -1: the scratch this process plans; 0 or 1: the scratch the f32
 * or the AVX512_BF16 route plans, whichever route runs. f32_out: the
 * sums unrounded (cx_matmul_bf16_f32), each within the f32 bound of a
 * sum of k exact products, k u sum|t|; bf16 out, within one rounding
 * more. Guard words on either side catch writes outside C; C starts as
 * the guard value (bf16 0x7e11, about 4.8e37), so a sum never stored
 * fails too. */
static void check_case_route(const mm_case *c, int route, bool f32_out)
{
    size_t na = (size_t)((c->bcast_a ? 1 : c->batch) * c->m * c->k), nb = (size_t)((c->bcast_b ? 1 : c->batch) * c->k * c->n);
    size_t nc = (size_t)(c->batch * c->m * c->n);
    uint16_t *a = bf16_random(na), *b = bf16_random(nb);
    uint16_t *cg = malloc(sizeof *cg * (nc + 2 * GUARD));
    float *cf = malloc(sizeof *cf * (nc + 2 * GUARD));
    cr_assert(cg && cf);
    const float guard_f = cx_bf16_to_f32(GUARD_BITS);
    for (size_t i = 0; i < nc + 2 * GUARD; i++) {
        cg[i] = GUARD_BITS;
        cf[i] = guard_f;
    }
    size_t sb = route < 0 ? cx_matmul_bf16_scratch_bytes(c->batch, c->m, c->n, c->k)
                          : cx_matmul_bf16_route_scratch_bytes(c->batch, c->m, c->n, c->k, route == 1);
    void *scratch = sb ? malloc(sb) : NULL;
    cr_assert(!sb || scratch);
    const int64_t sa = c->bcast_a ? 0 : c->m * c->k, sbb = c->bcast_b ? 0 : c->k * c->n;
    if (f32_out)
        cx_matmul_bf16_f32(cf + GUARD, false, a, b, c->batch, c->m, c->n, c->k, c->ta, c->tb, sa, sbb, scratch, sb);
    else cx_matmul_bf16(cg + GUARD, a, b, c->batch, c->m, c->n, c->k, c->ta, c->tb, sa, sbb, scratch, sb);
    for (int g = 0; g < GUARD; g++) {
        const size_t past = GUARD + nc + (size_t)g;
        cr_assert(cg[g] == GUARD_BITS && cg[past] == GUARD_BITS, "write outside the bf16 c");
        cr_assert(cf[g] == guard_f && cf[past] == guard_f, "write outside the f32 c");
    }
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double ref = 0, mag = 0;
                for (int64_t kk = 0; kk < c->k; kk++) {
                    double t = at_a(a, c, bi, i, kk) * at_b(b, c, bi, kk, j);
                    ref += t;
                    mag += fabs(t);
                }
                double got = c_at(c, cg + GUARD, f32_out ? cf + GUARD : NULL, bi, i, j);
                double tol = (f32_out ? 0 : ldexp(fabs(ref), -8)) + fmax(4e-6, ldexp((double)c->k, -24)) * mag;
                if (!(fabs(got - ref) <= tol))
                    cr_assert_fail("%s, %s out: batch %lld m %lld n %lld k %lld ta %d tb %d: c[%lld][%lld][%lld] = "
                                   "%g, want %g (tol %g)", cx_isa_name(cx_isa_active()), f32_out ? "f32" : "bf16",
                                   (long long)c->batch, (long long)c->m, (long long)c->n, (long long)c->k, c->ta,
                                   c->tb, (long long)bi, (long long)i, (long long)j, got, ref, tol);
            }
    free(a); free(b); free(cg); free(cf); free(scratch);
}

TestSuite(bf16_gemm, .init = expect_requested_isa);
TestSuite(bf16_attention, .init = expect_requested_isa);

/* edges of every blocking: MR 12, NR 32, MC 96, NC 256, KC 512, MCH 768;
 * odd K; the FMA route's 6-row tiles and K blocks of 256, and its wide
 * tasks (one K block: up to 1024 columns, ragged micro-tiles through a
 * tile of one) */
static const mm_case k_edge_cases[] = {
    { 1, 1, 1, 1, false, false, false, false },
    { 1, 13, 33, 7, false, false, false, false },
    { 1, 97, 257, 513, false, false, false, false },
    { 1, 50, 70, 1100, true, false, false, false },
    { 1, 45, 31, 64, false, true, false, false },
    { 1, 29, 40, 77, true, true, false, false },
    { 1, 800, 40, 24, false, false, false, false },
    { 1, 96, 64, 600, true, false, false, false },
    { 3, 17, 19, 9, false, false, false, false },
    { 4, 12, 32, 6, false, true, false, true },
    { 2, 25, 9, 15, true, false, true, false },
    { 1, 5, 300, 2, false, false, false, false },
    { 1, 31, 1100, 40, false, true, false, false },
    { 1, 50, 700, 256, true, false, false, false },
    /* rows of A 4 KiB apart: packed, not read in place */
    { 1, 30, 40, 2048, false, false, false, false },
    /* a shared B: folded into one tall product unless A is transposed */
    { 5, 40, 70, 33, false, false, false, true },
    { 3, 20, 10, 8, true, false, false, true },
};

Test(bf16_gemm, shapes_and_edges)
{
    rng_state = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < sizeof k_edge_cases / sizeof *k_edge_cases; i++) check_case(&k_edge_cases[i]);
}

/* The same edges with the f32 sums out (the graph's weight gradients
 * under autocast), over one K block or several: each route's tiles,
 * whole and ragged, reach C, and nothing past it. Until this test only
 * the bf16 outputs were checked against a reference here. */
Test(bf16_gemm, f32_sums_out_shapes_and_edges)
{
    rng_state = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < sizeof k_edge_cases / sizeof *k_edge_cases; i++)
        check_case_route(&k_edge_cases[i], -1, true);
}

/* an executable planned under the other route (the persistent cache
 * shares executables between processes with different CX_CPU_ISA) */
Test(bf16_gemm, scratch_planned_for_either_route)
{
    rng_state = 0x1234567887654321ull;
    static const mm_case cases[] = {
        { 1, 100, 600, 64, false, false, false, false },
        { 1, 900, 40, 30, false, false, false, false },
        { 2, 300, 90, 40, true, true, false, false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int route = 0; route < 2; route++) check_case_route(&cases[i], route, false);
}

/* the bits depend neither on the thread count nor on the library the f32
 * route hands its widened blocks to (oneDNN for these shapes): two column
 * blocks and two K blocks, rows split 1 and 3 ways */
Test(bf16_gemm, thread_count_free)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    static const mm_case cases[] = {
        { 1, 1030, 1100, 600, false, false, false, false },
        { 1, 300, 1100, 520, true, true, false, false },
        { 1, 700, 1100, 200, false, true, false, false },
    };
    const int saved = cx_get_num_threads();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mm_case *c = &cases[i];
        size_t nc = (size_t)(c->m * c->n);
        uint16_t *a = bf16_random((size_t)(c->m * c->k)), *b = bf16_random((size_t)(c->k * c->n));
        uint16_t *out[2] = { malloc(sizeof(uint16_t) * nc), malloc(sizeof(uint16_t) * nc) };
        cr_assert(out[0] && out[1]);
        for (int run = 0; run < 2; run++) {
            cx_set_num_threads(run ? 3 : 1);
            size_t sb = cx_matmul_bf16_scratch_bytes(1, c->m, c->n, c->k);
            void *scratch = malloc(sb);
            cr_assert(scratch);
            cx_matmul_bf16(out[run], a, b, 1, c->m, c->n, c->k, c->ta, c->tb, c->m * c->k, c->k * c->n, scratch, sb);
            free(scratch);
        }
        size_t diff = 0;
        while (diff < nc && out[0][diff] == out[1][diff]) diff++;
        cr_assert(diff == nc, "%s: (%lld, %lld, %lld): 1 vs 3 threads differ first at [%lld][%lld]: %g vs %g",
                  cx_isa_name(cx_isa_active()), (long long)c->m, (long long)c->n, (long long)c->k,
                  (long long)(diff / (size_t)c->n), (long long)(diff % (size_t)c->n), cx_bf16_to_f32(out[0][diff]),
                  cx_bf16_to_f32(out[1][diff]));
        free(a); free(b); free(out[0]); free(out[1]);
    }
    cx_set_num_threads(saved);
}

/* A product whose K is one block rounds each full micro-tile straight
 * into C; with more K blocks the sums go through the f32 tile. Both must
 * round as cx_f32_to_bf16 does, ties to even, overflow to inf and NaN
 * included: C = A (m, 2) . ones (2, n) against the same A padded with
 * zero columns past the first K block (adding zeros to a sum that is not
 * -0 leaves its bits). Rows 13 and columns 33 give ragged tiles too. */
static void rounded_sums(uint16_t *c, const uint16_t *pair, int64_t m, int64_t n, int64_t k)
{
    uint16_t *a = calloc((size_t)(m * k), sizeof *a), *b = calloc((size_t)(k * n), sizeof *b);
    cr_assert(a && b);
    for (int64_t i = 0; i < m; i++) memcpy(a + i * k, pair + 2 * i, 2 * sizeof *a);
    for (int64_t j = 0; j < 2 * n; j++) b[j] = cx_f32_to_bf16(1.0f);
    size_t sb = cx_matmul_bf16_scratch_bytes(1, m, n, k);
    void *scratch = malloc(sb);
    cr_assert(scratch);
    cx_matmul_bf16(c, a, b, 1, m, n, k, false, false, m * k, k * n, scratch, sb);
    free(a); free(b); free(scratch);
}

Test(bf16_gemm, one_k_block_rounds_as_the_tile_does)
{
    /* 0x1.fep127 + 2^119 is finite in f32 and rounds up to bf16's inf */
    const float hi[] = { 1.0f, 1.0f, 1.0f + 0x1p-7f, -3.0f, 0x1.fep127f, INFINITY, NAN, 5.0f, -0x1p-120f, 1.0f, 0x1.fep127f };
    const float lo[] = { 0x1p-8f, 0x1.8p-8f, 0x1p-8f, 0x1p-9f, 0x1p119f, 1.0f, 1.0f, -5.0f, -0x1p-122f, -0x1p-9f, 0x1p118f };
    enum { M = 25, N = 33, NV = sizeof hi / sizeof *hi };
    uint16_t pair[2 * M], direct[M * N], tiled[M * N];
    for (int i = 0; i < M; i++) {
        pair[2 * i] = cx_f32_to_bf16(hi[i % NV]);
        pair[2 * i + 1] = cx_f32_to_bf16(lo[i % NV] * (float)(1 + i / NV));
    }
    rounded_sums(direct, pair, M, N, 2);
    rounded_sums(tiled, pair, M, N, 514);
    for (int i = 0; i < M * N; i++) {
        float want = cx_bf16_to_f32(pair[2 * (i / N)]) + cx_bf16_to_f32(pair[2 * (i / N) + 1]);
        cr_assert_eq(direct[i], tiled[i], "%s: C[%d][%d]: one K block gives %#06x, two give %#06x (sum %a)",
                     cx_isa_name(cx_isa_active()), i / N, i % N, direct[i], tiled[i], want);
        if (want == want) cr_assert_eq(direct[i], cx_f32_to_bf16(want), "C[%d][%d] = %#06x, want %#06x", i / N,
                                       i % N, direct[i], cx_f32_to_bf16(want));
    }
}

Test(bf16_gemm, empty_k_gives_zeros)
{
    uint16_t c[6] = { 1, 2, 3, 4, 5, 6 }, a[1] = { 0 }, b[1] = { 0 };
    cx_matmul_bf16(c, a, b, 1, 2, 3, 0, false, false, 0, 0, NULL, 0);
    for (int i = 0; i < 6; i++) cr_assert_eq(c[i], 0);
}

/* an empty sum with a folded bias: the bias rounded to bf16, then relu */
Test(bf16_gemm, empty_k_with_bias_gives_the_bias)
{
    uint16_t c[6] = { 1, 2, 3, 4, 5, 6 }, a[1] = { 0 }, b[1] = { 0 };
    const float bias[3] = { 1.00390625f, -2.0f, 0.5f };
    for (int relu = 0; relu < 2; relu++) {
        const cx_bf16_epi e = { .bias = bias, .relu = relu };
        cx_matmul_bf16_epi(c, &e, a, b, 1, 2, 3, 0, false, false, 0, 0, NULL, 0);
        for (int i = 0; i < 6; i++) {
            float want = relu && bias[i % 3] <= 0 ? 0.0f : bias[i % 3];
            cr_assert_eq(c[i], cx_f32_to_bf16(want), "relu %d: c[%d] = %#x, want %#x", relu, i, c[i],
                         cx_f32_to_bf16(want));
        }
    }
}

/* A folded bias (and relu) gives the plain product's rounded sums plus
 * the bias rounded, rounded again, as the unfolded program would, on every
 * route: whole micro-tiles that round straight into C (K one block) and
 * ragged ones through the tile (13 rows, 35 columns), and sums that go
 * through the tile (K past one block). The sums with the bias include
 * ties, a NaN column and an inf one. */
Test(bf16_gemm, folded_bias_matches_the_plain_product)
{
    rng_state = 0x6a09e667f3bcc908ull;
    static const int64_t shapes[][3] = { { 13, 35, 64 }, { 24, 64, 256 }, { 30, 48, 600 }, { 19, 1050, 100 } };
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        uint16_t *a = bf16_random((size_t)(m * k)), *b = bf16_random((size_t)(k * n));
        uint16_t *plain = malloc(sizeof *plain * (size_t)(m * n)), *folded = malloc(sizeof *folded * (size_t)(m * n));
        float *bias = malloc(sizeof *bias * (size_t)n);
        cr_assert(plain && folded && bias);
        for (int64_t j = 0; j < n; j++) bias[j] = (float)rng_uniform() * 4.0f - 2.0f + 0x1p-9f;
        bias[1] = NAN;
        bias[2] = INFINITY;
        size_t sb = cx_matmul_bf16_scratch_bytes(1, m, n, k);
        void *scratch = malloc(sb);
        cr_assert(scratch);
        cx_matmul_bf16(plain, a, b, 1, m, n, k, false, false, m * k, k * n, scratch, sb);
        for (int relu = 0; relu < 2; relu++) {
            const cx_bf16_epi e = { .bias = bias, .relu = relu };
            cx_matmul_bf16_epi(folded, &e, a, b, 1, m, n, k, false, false, m * k, k * n, scratch, sb);
            for (int64_t i = 0; i < m * n; i++) {
                uint16_t want = cx_bf16_add_bias_inline(plain[i], cx_bf16_to_f32(cx_f32_to_bf16(bias[i % n])), relu);
                cr_assert_eq(folded[i], want, "%s: (%lld, %lld, %lld) relu %d: c[%lld][%lld] = %#06x, want %#06x",
                             cx_isa_name(cx_isa_active()), (long long)m, (long long)n, (long long)k, relu,
                             (long long)(i / n), (long long)(i % n), folded[i], want);
            }
        }
        free(a); free(b); free(plain); free(folded); free(bias); free(scratch);
    }
}

/* cxla-bench's machine line names the path through cx_bf16_path: it must
 * be the one the kernel takes at this level, and with CX_BF16_GEMM. */
Test(bf16_gemm, path_name_matches_level)
{
    const char *p = cx_bf16_path(), *lib = getenv("CX_BF16_GEMM");
    const cx_isa level = cx_isa_active();
    const bool onednn = level >= CX_ISA_AVX512_BF16 && lib && !strcmp(lib, "onednn");
    const bool amx = level >= CX_ISA_AMX && !(lib && !strcmp(lib, "cxla"));
    cr_assert_eq(cx_bf16_gemm_on_dnnl(), onednn || amx, "CX_BF16_GEMM=%s at %s", lib ? lib : "(unset)",
                 cx_isa_name(level));
    if (amx) cr_assert_str_eq(p, "amx");
    else if (onednn) cr_assert_str_eq(p, "avx512_bf16 (oneDNN)");
    else if (level >= CX_ISA_AVX512_BF16) cr_assert_str_eq(p, "avx512_bf16");
    else cr_assert_str_eq(p, "none (converted to f32)");
}

/* The oneDNN route gives cxla's route's bits where the sums are exact
 * (operands of a few bits: every order of the f32 adds gives the same
 * sum), so a wrong layout, stride, block or batch offset shows. Each cut:
 * row blocks of 512 with a ragged last one, and two halves of a shorter
 * product; K blocks of a transposed A (257 and a ragged 256); a
 * transposed A copied untransposed (K too short, or B transposed too);
 * batch entries with broadcasts; one call (29 rows, or tiny); each with
 * bf16 out, the linear epilogue, and f32 sums out. It runs wherever the
 * level has bf16 instructions (oneDNN's brgemm kernels there, AMX's at the
 * amx level); below, the route declines. */
Test(bf16_gemm, onednn_route_gives_cxla_bits_on_exact_sums)
{
    expect_requested_isa();
    rng_state = 0x510e527fade682d1ull;
    static const mm_case cases[] = {
        { 1, 1030, 100, 60, false, false, false, false },
        { 1, 1100, 70, 33, false, true, false, false },
        { 1, 64, 50, 300, false, true, false, false },
        { 1, 300, 90, 513, true, false, false, false },
        { 1, 128, 300, 64, true, false, false, false },
        { 1, 70, 50, 600, true, true, false, false },
        { 1, 29, 40, 77, true, true, false, false },
        { 3, 17, 19, 9, false, false, false, false },
        { 4, 12, 32, 6, false, true, false, true },
        { 2, 25, 9, 15, true, false, true, false },
        { 1, 1, 1, 1, false, false, false, false },
    };
    const bool hw = cx_isa_active() >= CX_ISA_AVX512_BF16;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const mm_case *c = &cases[ci];
        size_t na = (size_t)((c->bcast_a ? 1 : c->batch) * c->m * c->k);
        size_t nb = (size_t)((c->bcast_b ? 1 : c->batch) * c->k * c->n), nc = (size_t)(c->batch * c->m * c->n);
        uint16_t *a = malloc(na * 2), *b = malloc(nb * 2), *want = malloc(nc * 2), *got = malloc((nc + 2 * GUARD) * 2);
        float *bias = malloc(sizeof *bias * (size_t)c->n), *want_f = malloc(nc * 4), *got_f = malloc(nc * 4);
        cr_assert(a && b && want && got && bias && want_f && got_f);
        /* multiples of 1/8 and 1/16 up to 1: each product a multiple of 2^-7, sums far below 2^17 */
        for (size_t i = 0; i < na; i++) a[i] = cx_f32_to_bf16((float)((int)(rng_uniform() * 17) - 8) / 8);
        for (size_t i = 0; i < nb; i++) b[i] = cx_f32_to_bf16((float)((int)(rng_uniform() * 33) - 16) / 16);
        for (int64_t j = 0; j < c->n; j++) bias[j] = (float)rng_uniform() * 4.0f - 2.0f + 0x1p-9f;
        const int64_t sa = c->bcast_a ? 0 : c->m * c->k, sb = c->bcast_b ? 0 : c->k * c->n;
        for (int form = 0; form < 3; form++) {   /* bf16 out, with the epilogue, f32 sums out */
            const float *bi = form == 1 ? bias : NULL;
            size_t bytes = cx_matmul_bf16_route_scratch_bytes(c->batch, c->m, c->n, c->k, hw);
            void *scratch = malloc(bytes ? bytes : 1);
            cr_assert(scratch);
            const cx_bf16_epi e = { .bias = bi, .relu = form == 1 };
            for (size_t i = 0; i < nc + 2 * GUARD; i++) got[i] = GUARD_BITS;
            bool took;
            if (form < 2) {
                cx_matmul_bf16_cxla(want, NULL, &e, a, b, c->batch, c->m, c->n, c->k, c->ta, c->tb, sa, sb, scratch,
                                    bytes);
                took = cx_matmul_bf16_dnnl(got + GUARD, NULL, bi, form == 1, a, b, c->batch, c->m, c->n, c->k, c->ta,
                                           c->tb, sa, sb);
            } else {
                cx_matmul_bf16_cxla(NULL, want_f, NULL, a, b, c->batch, c->m, c->n, c->k, c->ta, c->tb, sa, sb,
                                    scratch, bytes);
                took = cx_matmul_bf16_dnnl(NULL, got_f, NULL, false, a, b, c->batch, c->m, c->n, c->k, c->ta, c->tb,
                                           sa, sb);
            }
            free(scratch);
            cr_assert_eq(took, hw, "%s: case %zu: the oneDNN route %s", cx_isa_name(cx_isa_active()), ci,
                         took ? "ran below bf16 instructions" : "declined");
            if (!took) continue;
            for (int g = 0; g < GUARD && form < 2; g++) {
                cr_assert_eq(got[g], GUARD_BITS, "case %zu: write before c", ci);
                cr_assert_eq(got[GUARD + nc + (size_t)g], GUARD_BITS, "case %zu: write after c", ci);
            }
            for (size_t i = 0; i < nc; i++) {
                if (form == 2)
                    cr_assert_eq(got_f[i], want_f[i], "case %zu f32 sums: c[%zu] = %g, cxla's %g", ci, i, got_f[i],
                                 want_f[i]);
                else
                    cr_assert_eq(got[GUARD + i], want[i], "case %zu form %d: c[%zu] = %#06x, cxla's %#06x", ci, form,
                                 i, got[GUARD + i], want[i]);
            }
        }
        free(a); free(b); free(want); free(got); free(bias); free(want_f); free(got_f);
    }
}

/* ---- attention ---------------------------------------------------------------------- */

/* The bf16 attention widens its operands and runs the f32 kernels, so it
 * must give exactly the f32 kernel's result on the widened values, rounded
 * once to bf16. q, k, v here are column blocks of one (N, T, 3, H, D)
 * projection, as the gpt's are: strided views. */
static float *widened(const uint16_t *h, size_t n)
{
    float *f = malloc(sizeof *f * n);
    cr_assert(f);
    for (size_t i = 0; i < n; i++) f[i] = cx_bf16_to_f32(h[i]);
    return f;
}

static void *scratch_of(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p);
    return p;
}

static void check_rounded(const char *what, const uint16_t *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], cx_f32_to_bf16(want[i]), "%s[%zu]: 0x%04x, want round(%g) = 0x%04x", what, i, got[i],
                     want[i], cx_f32_to_bf16(want[i]));
}

/* The GEMM route rounds P (and dS) to bf16 for its products, as
 * PyTorch's bf16 attention does, and sums in another order than the f32
 * kernel: each value within two bf16 roundings of its own size plus 2^-7
 * of the largest value of its tensor (P's rounding moves an output by at
 * most 2^-9 of the largest |v|, dS's likewise). A wrong or missing term
 * is of the size of the values themselves. */
static void check_near(const char *what, const uint16_t *got, const float *want, size_t n)
{
    double big = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double g = cx_bf16_to_f32(got[i]);
        cr_assert(fabs(g - want[i]) <= ldexp(fabs(want[i]), -8) + ldexp(big, -7), "%s[%zu] = %g, f32 kernel %g", what,
                  i, g, want[i]);
    }
}

typedef struct {
    cx_attn_geom g;
    uint16_t *qkv, *dout;
    const uint16_t *q, *k, *v;   /* within qkv */
    float *qkvf, *doutf, *of, *g32;
    size_t no, nk;               /* elements of q (and out, dout, dq); of k (and v, dk, dv) */
} attn_case;

/* The f32 kernel's output and gradients (dq | dk | dv, packed) on the
 * widened values qf, kf, vf (within c->qkvf, at q, k, v's places), the
 * backward given the bf16 output, as the graph saves it. */
static void attn_reference(attn_case *c, const float *qf, const float *kf, const float *vf)
{
    c->of = malloc(sizeof *c->of * c->no);
    c->g32 = malloc(sizeof *c->g32 * (c->no + 2 * c->nk));
    cr_assert(c->of && c->g32);
    size_t b = cx_attention_scratch_bytes(&c->g);
    void *s = scratch_of(b);
    cx_attention_fwd(c->of, qf, kf, vf, &c->g, s, b);
    free(s);
    uint16_t *o16 = malloc(sizeof *o16 * c->no);
    cr_assert(o16);
    for (size_t i = 0; i < c->no; i++) o16[i] = cx_f32_to_bf16(c->of[i]);
    float *o_used = widened(o16, c->no);
    b = cx_attention_bwd_scratch_bytes(&c->g);
    s = scratch_of(b);
    cx_attention_bwd(c->g32, qf, kf, vf, o_used, c->doutf, &c->g, s, b);
    free(s); free(o16); free(o_used);
}

/* q, k, v are column blocks of one (N, T, 3, H, D) projection, as the
 * gpt's are: strided views, so s == t */
static attn_case attn_make_as(int64_t N, int64_t T, int64_t H, int64_t D, bool causal)
{
    attn_case c = { .g = { .n = N, .t = T, .s = T, .h = H, .d = D, .causal = causal, .scale = 0.25f } };
    const int64_t proj[3] = { T * 3 * H * D, 3 * H * D, D }, plain[3] = { T * H * D, H * D, D };
    memcpy(c.g.q_strides, proj, sizeof proj);
    memcpy(c.g.k_strides, proj, sizeof proj);
    memcpy(c.g.v_strides, proj, sizeof proj);
    memcpy(c.g.o_strides, plain, sizeof plain);
    memcpy(c.g.do_strides, plain, sizeof plain);
    size_t nqkv = (size_t)(N * T * 3 * H * D);
    c.no = c.nk = (size_t)(N * T * H * D);
    c.qkv = bf16_random(nqkv);
    c.dout = bf16_random(c.no);
    c.q = c.qkv;
    c.k = c.qkv + H * D;
    c.v = c.qkv + 2 * H * D;
    c.qkvf = widened(c.qkv, nqkv);
    c.doutf = widened(c.dout, c.no);
    attn_reference(&c, c.qkvf, c.qkvf + H * D, c.qkvf + 2 * H * D);
    return c;
}

/* T query rows against S keys (a decoder's cross attention, or queries
 * against a cache of keys): q (N, T, H, D), k and v (N, S, H, D), each
 * plain, held back to back in qkv. */
static attn_case attn_make_ts(int64_t N, int64_t T, int64_t S, int64_t H, int64_t D, bool causal)
{
    attn_case c = { .g = { .n = N, .t = T, .s = S, .h = H, .d = D, .causal = causal, .scale = 0.25f } };
    const int64_t qs[3] = { T * H * D, H * D, D }, ks[3] = { S * H * D, H * D, D };
    memcpy(c.g.q_strides, qs, sizeof qs);
    memcpy(c.g.k_strides, ks, sizeof ks);
    memcpy(c.g.v_strides, ks, sizeof ks);
    memcpy(c.g.o_strides, qs, sizeof qs);
    memcpy(c.g.do_strides, qs, sizeof qs);
    c.no = (size_t)(N * T * H * D);
    c.nk = (size_t)(N * S * H * D);
    c.qkv = bf16_random(c.no + 2 * c.nk);
    c.dout = bf16_random(c.no);
    c.q = c.qkv;
    c.k = c.q + c.no;
    c.v = c.k + c.nk;
    c.qkvf = widened(c.qkv, c.no + 2 * c.nk);
    c.doutf = widened(c.dout, c.no);
    attn_reference(&c, c.qkvf, c.qkvf + c.no, c.qkvf + c.no + c.nk);
    return c;
}

static attn_case attn_make(int64_t N, int64_t T, int64_t H, int64_t D) { return attn_make_as(N, T, H, D, true); }

static void attn_free(attn_case *c)
{
    free(c->qkv); free(c->dout); free(c->qkvf); free(c->doutf); free(c->of); free(c->g32);
}

/* How attn_check runs the bf16 attention: a route by name, or
 * cx_attention_bf16's own choice given the scratch it plans (AUTO) or the
 * scratch of the long-sequence route this level does not plan (OTHER, as
 * an executable planned under another CX_CPU_ISA is). */
enum { HEADS = CX_ATTN_BF16_HEADS, GEMM = CX_ATTN_BF16_GEMM, WIDEN = CX_ATTN_BF16_WIDEN, AUTO, OTHER };

static void attn_run(const attn_case *c, int how, const cx_attn_geom *g, uint16_t *o, uint16_t *g16, bool bwd)
{
    const uint16_t *q = c->q, *k = c->k, *v = c->v;
    const bool hw = cx_isa_active() >= CX_ISA_AVX512_BF16;
    size_t n = how < AUTO ? cx_attention_bf16_route_scratch_bytes(g, bwd, (cx_attn_bf16_route)how)
               : how == AUTO ? (bwd ? cx_attention_bf16_bwd_scratch_bytes(g) : cx_attention_bf16_scratch_bytes(g))
                             : cx_attention_bf16_route_scratch_bytes(g, bwd, hw ? CX_ATTN_BF16_WIDEN : CX_ATTN_BF16_GEMM);
    void *s = scratch_of(n);
    if (!bwd && how < AUTO) cx_attention_bf16_route_fwd(o, q, k, v, g, s, n, (cx_attn_bf16_route)how);
    else if (!bwd) cx_attention_bf16_fwd(o, q, k, v, g, s, n);
    else if (how < AUTO) cx_attention_bf16_route_bwd(g16, q, k, v, o, c->dout, g, s, n, (cx_attn_bf16_route)how);
    else cx_attention_bf16_bwd(g16, q, k, v, o, c->dout, g, s, n);
    free(s);
}

/* A query row that sees no key (causal with t > s: the first t - s rows,
 * bottom-right aligned) gives 0 (kernels.h), as flash attention does, not
 * NaN as a softmax over no scores would: its out (N, T, H, D) and dq
 * exactly 0 (either sign), bf16 h or f32 f. */
static void check_unseen(const attn_case *c, const char *what, const uint16_t *h, const float *f)
{
    const int64_t hd = c->g.h * c->g.d;
    for (int64_t n = 0; n < c->g.n; n++)
        for (int64_t i = 0; i < c->g.t && cx_attn_visible_keys(&c->g, i) == 0; i++)
            for (int64_t e = 0; e < hd; e++) {
                const size_t at = (size_t)((n * c->g.t + i) * hd + e);
                const float x = h ? cx_bf16_to_f32(h[at]) : f[at];
                cr_assert(x == 0.0f, "%s[%zu] = %g: image %lld's query row %lld sees no key, want 0", what, at, x,
                          (long long)n, (long long)i);
            }
}

/* The backward interleaved ((N, T, 3, H, D), the gradient of the one
 * projection q, k and v are sliced from, t == s), given o: the same bits
 * as packed (g16), each row's parts side by side. */
static void check_interleaved(const attn_case *c, int how, uint16_t *o, const uint16_t *g16)
{
    static const char *const names[3] = { "dq", "dk", "dv" };
    const int64_t hd = c->g.h * c->g.d;
    cx_attn_geom gi = c->g;
    gi.interleaved = true;
    uint16_t *g16i = malloc(sizeof *g16i * 3 * c->no);
    cr_assert(g16i);
    attn_run(c, how, &gi, o, g16i, true);
    const size_t rows = c->no / (size_t)hd;
    for (int t = 0; t < 3; t++)
        for (size_t r = 0; r < rows; r++)
            cr_assert(memcmp(g16i + (r * 3 + (size_t)t) * (size_t)hd, g16 + (size_t)t * c->no + r * (size_t)hd,
                             sizeof *g16i * (size_t)hd) == 0,
                      "%s row %zu: interleaved differs from packed", names[t], r);
    free(g16i);
}

/* One way of running it against the f32 kernel: widening, and the heads
 * route without AVX512_BF16, run the f32 kernels on the widened values,
 * so they give exactly their result rounded once; the GEMM route, and the
 * heads route's bf16 products with AVX512_BF16, within check_near's
 * tolerance. */
static void attn_check(const attn_case *c, int how)
{
    uint16_t *o = malloc(sizeof *o * c->no), *g16 = malloc(sizeof *g16 * (c->no + 2 * c->nk));
    cr_assert(o && g16);
    const bool hw = cx_isa_active() >= CX_ISA_AVX512_BF16, fits = c->g.s <= 1024;
    const bool near = how == GEMM || (hw && fits && how != WIDEN) || (!fits && (how == OTHER || (how == AUTO && hw)));
    attn_run(c, how, &c->g, o, g16, false);
    if (near) check_near("out", o, c->of, c->no);
    else check_rounded("out", o, c->of, c->no);
    check_unseen(c, "out", o, NULL);
    /* the backward is given the f32 kernel's output rounded, as attn_make's
     * reference was */
    for (size_t i = 0; i < c->no; i++) o[i] = cx_f32_to_bf16(c->of[i]);
    attn_run(c, how, &c->g, o, g16, true);
    /* packed: dq (N, T, H, D), then dk and dv (N, S, H, D) */
    static const char *const names[3] = { "dq", "dk", "dv" };
    const size_t at[3] = { 0, c->no, c->no + c->nk }, len[3] = { c->no, c->nk, c->nk };
    for (int t = 0; t < 3; t++) {
        if (near) check_near(names[t], g16 + at[t], c->g32 + at[t], len[t]);
        else check_rounded(names[t], g16 + at[t], c->g32 + at[t], len[t]);
    }
    check_unseen(c, "dq", g16, NULL);
    /* interleaved only where t == s (kernels.h) */
    if (c->g.t == c->g.s) check_interleaved(c, how, o, g16);
    free(o); free(g16);
}

/* Every route by name on every level, and cx_attention_bf16's own choice:
 * heads up to 1024 keys (bf16 products with AVX512_BF16, else exactly the
 * f32 kernel's result rounded once); beyond, the GEMM route with
 * AVX512_BF16 and widening without, and each given the other's scratch.
 * 9 images of 2 heads: widening's and the GEMM route's chunks of 8 images
 * and 1, and 37 queries: blocks of query rows with a ragged last one; a
 * longer sequence of 1030 keys. */
Test(bf16_attention, every_route_against_the_f32_kernel)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    attn_case c = attn_make(9, 37, 2, 16);
    for (int how = HEADS; how <= OTHER; how++) attn_check(&c, how);
    attn_free(&c);
    attn_case l = attn_make(1, 1030, 1, 8);
    attn_check(&l, AUTO);
    attn_check(&l, OTHER);
    attn_free(&l);
    /* not causal; and one (image, head) task, fewer than the threads */
    attn_case u = attn_make_as(3, 21, 2, 8, false), one = attn_make(1, 40, 1, 16);
    attn_check(&u, HEADS);
    attn_check(&one, HEADS);
    attn_free(&u);
    attn_free(&one);
    /* an odd head size: the products' last pair half padding */
    attn_case odd = attn_make(2, 29, 3, 7);
    attn_check(&odd, HEADS);
    attn_check(&odd, AUTO);
    attn_free(&odd);
}

/* t query rows against s != t keys, q and k, v separate tensors: every
 * route, each backward's dk and dv (N, S, H, D) apart from dq (N, T, H,
 * D). Causal is bottom-right aligned (row i sees keys j <= i + s - t):
 * with t = 37 against 11 the first 26 rows see no key, which skips whole
 * blocks of query rows and masks rows within one (the bf16 products'
 * causal blocks of 12 rows: the first two whole, two rows of the third;
 * the f32 rows route's first block of 32: 26 of its rows); with 13
 * against 37 every row sees at least 25 keys. Not causal, each row sees
 * all s. An odd head size (7) as well. */
Test(bf16_attention, queries_and_keys_of_other_lengths)
{
    rng_state = 0x243f6a8885a308d3ull;
    static const struct { int64_t n, t, s, d; bool causal; } cases[] = {
        { 2, 37, 11, 16, true }, { 3, 13, 37, 16, true }, { 2, 37, 13, 16, false },
        { 3, 13, 37, 16, false }, { 2, 37, 11, 7, true }, { 2, 13, 37, 7, false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        attn_case c = attn_make_ts(cases[i].n, cases[i].t, cases[i].s, 2, cases[i].d, cases[i].causal);
        /* the f32 kernel, the reference, holds to it too */
        check_unseen(&c, "f32 out", NULL, c.of);
        check_unseen(&c, "f32 dq", NULL, c.g32);
        const int64_t first_seeing = c.g.t - c.g.s;   /* bottom-right: the last row sees every key */
        if (c.g.causal && first_seeing > 0)
            cr_assert(cx_attn_visible_keys(&c.g, first_seeing - 1) == 0
                          && cx_attn_visible_keys(&c.g, first_seeing) == 1,
                      "causal, t > s: the first t - s query rows see no key");
        for (int how = HEADS; how <= OTHER; how++) attn_check(&c, how);
        attn_free(&c);
    }
}

/* ---- convolution -------------------------------------------------------------------- */

/* The widening route's weight gradient of a batch split into chunks of
 * images (the f32 copies of a chunk within 4 MB) is summed over the
 * chunks in f32, in another order than the f32 kernel's over the whole
 * batch: within one bf16 rounding of it, plus f32 sums' error on the
 * largest value. */
static void check_summed(const char *what, const uint16_t *got, const float *want, size_t n)
{
    double big = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double g = cx_bf16_to_f32(got[i]);
        cr_assert(fabs(g - want[i]) <= ldexp(fabs(want[i]), -8) + 1e-5 * big, "%s[%zu] = %g, f32 kernel %g", what, i,
                  g, want[i]);
    }
}

/* One direction's bf16 result against the f32 kernel's on the widened
 * operands. Winograd on bf16 and the widening route run those kernels'
 * sums, so they must match them rounded once (bit for bit; the widening
 * route on one chunk of images); the GEMM route sums the same products
 * in another order (and Winograd's f32 transforms round on their own),
 * so it must lie within one bf16 rounding plus f32 sums' error on the
 * largest value (check_summed). */
static void check_dir(int dir, bool gemm, const uint16_t *got, const float *want, size_t n, const cx_conv_geom *g)
{
    static const char *const names[3] = { "y", "dx", "dw" };
    /* the widening route's chunks depend on the planes' size: any batch may be split */
    if (gemm || (dir == 2 && g->n > 1 && !cx_wino_applies(g))) check_summed(names[dir], got, want, n);
    else check_rounded(names[dir], got, want, n);
}

/* The folded epilogue on the route that does not take the GEMM, against
 * the unfolded program's steps on the same kernel's output without it
 * (plain, the rounded sums): y = relu(round(plain + bf16(bias[o]))), dx =
 * plain where posmask > 0. */
static void check_epilogue(int dir, bool relu, const uint16_t *in0, const uint16_t *in1, const uint16_t *plain,
                           const cx_conv_geom *g, void *scratch, size_t bytes)
{
    const int64_t ch = dir == 0 ? g->o : g->c, plane = dir == 0 ? g->oh * g->ow : g->h * g->w;
    const size_t n = (size_t)(g->n * ch * plane);
    float *bias = malloc(sizeof *bias * (size_t)g->o);
    uint16_t *mask = bf16_random(n), *h = malloc(sizeof *h * n);
    cr_assert(bias && h);
    for (int64_t o = 0; o < g->o; o++) bias[o] = rng_uniform() - 0.5f;
    cx_bf16_epi e = { .bias = dir == 0 ? bias : NULL, .relu = relu, .posmask = dir == 1 ? mask : NULL };
    cx_conv2d_bf16(dir, h, in0, in1, g, &e, scratch, bytes);
    for (size_t i = 0; i < n; i++) {
        uint16_t want = plain[i];
        if (dir == 0) want = cx_bf16_add_bias_inline(want, cx_bf16_to_f32(cx_f32_to_bf16(bias[(int64_t)i / plane % ch])), relu);
        else want = cx_bf16_to_f32(mask[i]) > 0.0f ? want : 0;
        cr_assert_eq(h[i], want, "%s[%zu] with its epilogue: 0x%04x, want 0x%04x", dir ? "dx" : "y", i, h[i], want);
    }
    free(bias); free(mask); free(h);
}

/* ---- Winograd's bf16 products, emulated -------------------------------------------------
 * With AVX512_BF16 a bf16 conv of Winograd's shape rounds the transformed
 * operands to bf16 for vdpbf16ps: U = G g G^T and V = B^T d B (the
 * forward, and the input gradient as a forward of dy with the kernels
 * rotated and transposed, padding 2 - pad), Z = A dy A^T and V for the
 * weight gradient, dw = G^T (sum Z V) G. This computes the same in
 * double, with the same roundings (of values that are exact in f32 here:
 * sums of a few bf16 values), and the sum of the terms' magnitudes: the
 * kernel's f32 sums and final rounding lie within 2^-8 of the value plus
 * 2^-14 of that magnitude, while a lost or misplaced product moves a
 * value by about 2^-8 of it or more. */

static double bf16_rounded(double v) { return cx_bf16_to_f32(cx_f32_to_bf16((float)v)); }

/* U (16) of the 3x3 kernel k, as transform_weights computes it */
static void wino_u(double u[16], const float k[9])
{
    double t[4][3];
    for (int b = 0; b < 3; b++) {
        t[0][b] = k[b];
        t[1][b] = 0.5 * (k[b] + k[3 + b] + k[6 + b]);
        t[2][b] = 0.5 * (k[b] - k[3 + b] + k[6 + b]);
        t[3][b] = k[6 + b];
    }
    for (int a = 0; a < 4; a++) {
        u[a * 4 + 0] = t[a][0];
        u[a * 4 + 1] = 0.5 * (t[a][0] + t[a][1] + t[a][2]);
        u[a * 4 + 2] = 0.5 * (t[a][0] - t[a][1] + t[a][2]);
        u[a * 4 + 3] = t[a][2];
    }
}

/* V (16) = B^T d B of the 4x4 tile at (r0, c0) of plane p (h, w), zero outside */
static void wino_v(double v[16], const float *p, int64_t h, int64_t w, int64_t r0, int64_t c0)
{
    double d[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            int64_t y = r0 + r, x = c0 + c;
            d[r][c] = y >= 0 && y < h && x >= 0 && x < w ? p[y * w + x] : 0.0;
        }
    double t[4][4];
    for (int c = 0; c < 4; c++) {
        t[0][c] = d[0][c] - d[2][c];
        t[1][c] = d[1][c] + d[2][c];
        t[2][c] = d[2][c] - d[1][c];
        t[3][c] = d[1][c] - d[3][c];
    }
    for (int a = 0; a < 4; a++) {
        v[a * 4 + 0] = t[a][0] - t[a][2];
        v[a * 4 + 1] = t[a][1] + t[a][2];
        v[a * 4 + 2] = t[a][2] - t[a][1];
        v[a * 4 + 3] = t[a][1] - t[a][3];
    }
}

/* out (2x2) = A^T m A */
static void wino_out(double out[2][2], const double m[16])
{
    double t[2][4];
    for (int k = 0; k < 4; k++) {
        t[0][k] = m[k] + m[4 + k] + m[8 + k];
        t[1][k] = m[4 + k] - m[8 + k] - m[12 + k];
    }
    for (int r = 0; r < 2; r++) {
        out[r][0] = t[r][0] + t[r][1] + t[r][2];
        out[r][1] = t[r][1] - t[r][2] - t[r][3];
    }
}

/* y (n, co, oh, ow) from x (n, ci, h, w) and kernels k(o, c) (9 floats
 * at kern + (o * ci + c) * 9, rotated with flip): want and the bound */
static void emulate_fwd(double *want, double *mag, const float *x, int64_t n, int64_t ci, int64_t h, int64_t w,
                        const float *kern, bool flip, int64_t co, int64_t pad_h, int64_t pad_w, int64_t oh, int64_t ow)
{
    for (int64_t b = 0; b < n; b++)
        for (int64_t ti = 0; ti < (oh + 1) / 2; ti++)
            for (int64_t tj = 0; tj < (ow + 1) / 2; tj++)
                for (int64_t o = 0; o < co; o++) {
                    double m[16] = { 0 }, ma[16] = { 0 };
                    for (int64_t c = 0; c < ci; c++) {
                        float k[9];
                        const float *src = flip ? kern + (c * co + o) * 9 : kern + (o * ci + c) * 9;
                        for (int e = 0; e < 9; e++) k[e] = flip ? src[8 - e] : src[e];
                        double u[16], v[16];
                        wino_u(u, k);
                        wino_v(v, x + (b * ci + c) * h * w, h, w, 2 * ti - pad_h, 2 * tj - pad_w);
                        for (int e = 0; e < 16; e++) {
                            double t = bf16_rounded(u[e]) * bf16_rounded(v[e]);
                            m[e] += t;
                            ma[e] += fabs(t);
                        }
                    }
                    double out[2][2], oa[2][2];
                    wino_out(out, m);
                    /* A's coefficients are 0 and +-1: its sum of magnitudes */
                    for (int r = 0; r < 2; r++)
                        for (int c = 0; c < 2; c++) {
                            oa[r][c] = 0;
                            for (int a = 0; a < 4; a++)
                                for (int q = 0; q < 4; q++)
                                    if ((r ? a >= 1 : a <= 2) && (c ? q >= 1 : q <= 2)) oa[r][c] += ma[a * 4 + q];
                        }
                    for (int r = 0; r < 2; r++)
                        for (int c = 0; c < 2; c++) {
                            int64_t y = 2 * ti + r, xx = 2 * tj + c;
                            if (y >= oh || xx >= ow) continue;
                            want[((b * co + o) * oh + y) * ow + xx] = out[r][c];
                            mag[((b * co + o) * oh + y) * ow + xx] = oa[r][c];
                        }
                }
}

/* dw (o, c, 3, 3) from x and dy */
static void emulate_dw(double *want, double *mag, const float *x, const float *dy, const cx_conv_geom *g)
{
    const int64_t th = (g->oh + 1) / 2, tw = (g->ow + 1) / 2;
    for (int64_t o = 0; o < g->o; o++)
        for (int64_t c = 0; c < g->c; c++) {
            double du[16] = { 0 }, da[16] = { 0 };
            for (int64_t b = 0; b < g->n; b++)
                for (int64_t ti = 0; ti < th; ti++)
                    for (int64_t tj = 0; tj < tw; tj++) {
                        const float *p = dy + (b * g->o + o) * g->oh * g->ow;
                        double e[2][2];
                        for (int r = 0; r < 2; r++)
                            for (int q = 0; q < 2; q++) {
                                int64_t y = 2 * ti + r, xx = 2 * tj + q;
                                e[r][q] = y < g->oh && xx < g->ow ? p[y * g->ow + xx] : 0.0;
                            }
                        const double t[4][2] = { { e[0][0], e[0][1] }, { e[0][0] + e[1][0], e[0][1] + e[1][1] },
                                                 { e[0][0] - e[1][0], e[0][1] - e[1][1] }, { -e[1][0], -e[1][1] } };
                        double z[16], v[16];
                        for (int a = 0; a < 4; a++) {
                            z[a * 4 + 0] = t[a][0];
                            z[a * 4 + 1] = t[a][0] + t[a][1];
                            z[a * 4 + 2] = t[a][0] - t[a][1];
                            z[a * 4 + 3] = -t[a][1];
                        }
                        wino_v(v, x + (b * g->c + c) * g->h * g->w, g->h, g->w, 2 * ti - g->pad_h, 2 * tj - g->pad_w);
                        for (int q = 0; q < 16; q++) {
                            double term = bf16_rounded(z[q]) * bf16_rounded(v[q]);
                            du[q] += term;
                            da[q] += fabs(term);
                        }
                    }
            /* G^T dU G, G's coefficients 1 and 0.5: magnitudes through |G| */
            double *out = want + (o * g->c + c) * 9, *oa = mag + (o * g->c + c) * 9;
            for (int pass = 0; pass < 2; pass++) {
                const double *d = pass ? da : du;
                double t[3][4], *res = pass ? oa : out;
                for (int k = 0; k < 4; k++) {
                    t[0][k] = d[k] + 0.5 * (d[4 + k] + d[8 + k]);
                    t[1][k] = 0.5 * (pass ? d[4 + k] + d[8 + k] : d[4 + k] - d[8 + k]);
                    t[2][k] = 0.5 * (d[4 + k] + d[8 + k]) + d[12 + k];
                }
                for (int a = 0; a < 3; a++) {
                    res[a * 3 + 0] = t[a][0] + 0.5 * (t[a][1] + t[a][2]);
                    res[a * 3 + 1] = 0.5 * (pass ? t[a][1] + t[a][2] : t[a][1] - t[a][2]);
                    res[a * 3 + 2] = 0.5 * (t[a][1] + t[a][2]) + t[a][3];
                }
            }
        }
}

/* One direction of a bf16 conv of Winograd's shape with AVX512_BF16
 * against the emulation (dw is rounded once from its f32 sums too). */
static void check_wino_products(int dir, const uint16_t *got, const float *xf, const float *wf, const float *dyf,
                                const cx_conv_geom *g, size_t n)
{
    double *want = malloc(sizeof *want * n), *mag = malloc(sizeof *mag * n);
    cr_assert(want && mag);
    if (dir == 0)
        emulate_fwd(want, mag, xf, g->n, g->c, g->h, g->w, wf, false, g->o, g->pad_h, g->pad_w, g->oh, g->ow);
    else if (dir == 1)
        emulate_fwd(want, mag, dyf, g->n, g->o, g->oh, g->ow, wf, true, g->c, 2 - g->pad_h, 2 - g->pad_w, g->h, g->w);
    else emulate_dw(want, mag, xf, dyf, g);
    static const char *const names[3] = { "y", "dx", "dw" };
    for (size_t i = 0; i < n; i++) {
        double v = cx_bf16_to_f32(got[i]);
        cr_assert(fabs(v - want[i]) <= ldexp(fabs(want[i]), -8) + ldexp(mag[i], -14),
                  "%s[%zu] = %.6g, the bf16 products emulated %.6g (terms' magnitude %.3g)", names[dir], i, v,
                  want[i], mag[i]);
    }
    free(want);
    free(mag);
}

/* For every direction, through Winograd (3x3, stride 1) and through the
 * direct kernels (strided, dilated, grouped), on one chunk of images and
 * on several: cx_conv2d_bf16 on the route this level takes (Winograd's
 * shape with AVX512_BF16 against the emulation of its bf16 products,
 * every other against the f32 kernel), and the GEMM route itself on every
 * level (without AVX512_BF16 its GEMM widens its tiles). */
static void check_conv(cx_conv_geom g)
{
    cr_assert(cx_conv_geom_finish(&g));
    size_t nx = (size_t)(g.n * g.c * g.h * g.w), nw = (size_t)(g.o * (g.c / g.groups) * g.kh * g.kw);
    size_t ny = (size_t)(g.n * g.o * g.oh * g.ow);
    uint16_t *x = bf16_random(nx), *w = bf16_random(nw), *dy = bf16_random(ny);
    float *xf = widened(x, nx), *wf = widened(w, nw), *dyf = widened(dy, ny);
    size_t most = nx > nw ? nx : nw;
    most = most > ny ? most : ny;
    float *f = malloc(sizeof *f * most);
    uint16_t *h = malloc(sizeof *h * most);
    cr_assert(f && h);
    const bool hw = cx_isa_active() >= CX_ISA_AVX512_BF16;
    for (int dir = 0; dir < 3; dir++) {
        size_t b32 = dir == 0 ? cx_conv2d_scratch_bytes(&g) : dir == 1 ? cx_conv2d_bwd_input_scratch_bytes(&g)
                                                                        : cx_conv2d_bwd_weight_scratch_bytes(&g);
        size_t b16 = cx_conv2d_bf16_scratch_bytes(&g, dir), bg = cx_conv2d_bf16_route_scratch_bytes(&g, dir, true);
        cr_assert(b16 == cx_conv2d_bf16_route_scratch_bytes(&g, dir, false) || (hw && b16 == bg),
                  "the scratch is planned for a route this level runs");
        void *s32 = scratch_of(b32), *s16 = scratch_of(b16), *sg = scratch_of(bg);
        if (dir == 0) cx_conv2d_fwd(f, xf, wf, NULL, false, &g, s32, b32);
        else if (dir == 1) cx_conv2d_bwd_input(f, dyf, wf, NULL, &g, s32, b32);
        else cx_conv2d_bwd_weight(f, xf, dyf, &g, s32, b32);
        size_t n = dir == 0 ? ny : dir == 1 ? nx : nw;
        const uint16_t *in0 = dir == 1 ? dy : x, *in1 = dir == 2 ? dy : w;
        cx_conv2d_bf16(dir, h, in0, in1, &g, NULL, s16, b16);
        /* the GEMM route's looser check only where that route ran: with
         * AVX512_BF16 a shape it does not win still widens, rounded once */
        bool took_gemm = cx_conv2d_bf16_takes_gemm(&g, dir, b16);
        cr_assert_eq(took_gemm, hw && b16 != cx_conv2d_bf16_route_scratch_bytes(&g, dir, false),
                     "the planned route is the one taken");
        /* the direct kernels sum in their own order, as the GEMM does */
        bool direct = !took_gemm && cx_conv2d_bf16_direct_applies(&g, dir);
        if (hw && cx_wino_applies(&g)) check_wino_products(dir, h, xf, wf, dyf, &g, n);
        else check_dir(dir, took_gemm || direct, h, f, n, &g);
        if (dir < 2 && !took_gemm) check_epilogue(dir, dir == 0, in0, in1, h, &g, s16, b16);
        if (dir == 0 && !took_gemm) check_epilogue(0, false, in0, in1, h, &g, s16, b16);
        memset(h, 0xff, sizeof *h * n);
        cx_conv2d_bf16_gemm(dir, h, in0, in1, &g, NULL, sg, bg);
        check_dir(dir, true, h, f, n, &g);
        /* given the scratch of the route this level did not plan for, as an
         * executable planned under another CX_CPU_ISA is, it still runs */
        size_t bo = b16 == bg ? cx_conv2d_bf16_route_scratch_bytes(&g, dir, false) : bg;
        void *so = scratch_of(bo);
        memset(h, 0xff, sizeof *h * n);
        cx_conv2d_bf16(dir, h, in0, in1, &g, NULL, so, bo);
        /* Winograd's shape takes the GEMM route only in a scratch too small for its own */
        if (hw && cx_wino_applies(&g) && !cx_conv2d_bf16_takes_gemm(&g, dir, bo))
            check_wino_products(dir, h, xf, wf, dyf, &g, n);
        else check_dir(dir, true, h, f, n, &g);
        free(s32); free(s16); free(sg); free(so);
    }
    free(x); free(w); free(dy); free(xf); free(wf); free(dyf); free(f); free(h);
}

TestSuite(bf16_conv, .init = expect_requested_isa);

Test(bf16_conv, every_direction_is_the_f32_kernel_rounded)
{
    rng_state = 0x51afd7ed558ccdull;
    cx_conv_geom wino = { .n = 2, .c = 8, .h = 9, .w = 11, .o = 16, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                          .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&wino) && cx_wino_applies(&wino), "the first geometry must take Winograd");
    check_conv(wino);
    cx_conv_geom direct = { .n = 3, .c = 6, .h = 10, .w = 7, .o = 4, .kh = 5, .kw = 3, .stride_h = 2, .stride_w = 1,
                            .pad_h = 2, .pad_w = 0, .dil_h = 1, .dil_w = 2, .groups = 2 };
    check_conv(direct);
    wino.n = 11; /* on bf16 in one call, the weight gradient summed as the f32 kernel's */
    check_conv(wino);
    /* no padding (the f32 kernel reads rows in place, bf16 copies them
     * widened), and a row wide enough for the 8-tile vectors with an
     * overlapping 8-tile end (19 tiles), and an odd output row (37) whose
     * output transform ends on 4-tile and single-tile vectors instead */
    cx_conv_geom wide = { .n = 3, .c = 9, .h = 12, .w = 39, .o = 10, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                          .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&wide) && cx_wino_applies(&wide), "the wide geometry must take Winograd");
    check_conv(wide);
    wide.pad_h = 2; wide.pad_w = 2; /* dx's padding 0 */
    check_conv(wide);
    wide.pad_h = 0; wide.pad_w = 1; /* a padding per axis */
    check_conv(wide);
    /* 64 channels each way on 32x32: two blocks of tile rows per image
     * (12 and 4), the second one's M and Z narrower */
    cx_conv_geom deep = { .n = 2, .c = 64, .h = 32, .w = 32, .o = 64, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                          .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&deep) && cx_wino_applies(&deep));
    check_conv(deep);
    /* 7 tiles a row, even channels: with AVX512_BF16 a pair of channels
     * goes into the panels 4 tiles at a time, and tile row 9's step
     * (tiles 63..66) crosses from one 32-column panel into the next */
    cx_conv_geom seven = { .n = 2, .c = 8, .h = 22, .w = 14, .o = 8, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                           .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&seven) && cx_wino_applies(&seven));
    check_conv(seven);
    direct.n = 17;
    check_conv(direct);
    /* planes large enough for the widening route to split 17 images into
     * chunks (9 and 8) */
    direct.h = 96;
    direct.w = 96;
    check_conv(direct);
    /* the seed cnn's first conv: one channel, so K = 9, odd (the GEMM pads
     * its pairs); its forward and weight gradient take the direct kernels */
    cx_conv_geom cnn1 = { .n = 5, .c = 1, .h = 14, .w = 13, .o = 32, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                          .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&cnn1) && cx_conv2d_bf16_direct_applies(&cnn1, 0) &&
              cx_conv2d_bf16_direct_applies(&cnn1, 2) && !cx_conv2d_bf16_direct_applies(&cnn1, 1));
    check_conv(cnn1);
    /* direct with padding, rows of more than one vector and a ragged end,
     * and several channels: K = 4 * 2 * 2 = 16, the most it takes */
    cx_conv_geom few = { .n = 3, .c = 4, .h = 9, .w = 37, .o = 5, .kh = 2, .kw = 2, .stride_h = 1, .stride_w = 1,
                         .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&few) && cx_conv2d_bf16_direct_applies(&few, 0));
    check_conv(few);
    /* rows narrower than a vector: a row's whole-vector store spills over
     * the rows after it, never past its plane */
    cx_conv_geom narrow = { .n = 4, .c = 1, .h = 5, .w = 5, .o = 9, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                            .dil_h = 1, .dil_w = 1, .groups = 1 };
    check_conv(narrow);
    few.kw = 3; /* K = 24: the widening route again */
    cr_assert(cx_conv_geom_finish(&few) && !cx_conv2d_bf16_direct_applies(&few, 0));
    check_conv(few);
    /* enough output channels and K, not Winograd's: the GEMM route with
     * AVX512_BF16; 11 images in chunks */
    cx_conv_geom strided = { .n = 11, .c = 8, .h = 9, .w = 10, .o = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                             .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    check_conv(strided);
}

/* The direct weight gradient splits the output channels between lanes,
 * each summing every image in order: the same bits in a scratch of 1 lane
 * (the least), 2 and 3, run by 3 threads. */
Test(bf16_conv, direct_weight_gradient_is_thread_count_free)
{
    rng_state = 0x9d2c5680a5c1e3b7ull;
    cx_conv_geom g = { .n = 7, .c = 1, .h = 12, .w = 21, .o = 9, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                       .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&g) && cx_conv2d_bf16_direct_applies(&g, 2));
    size_t nx = (size_t)(g.n * g.h * g.w), ny = (size_t)(g.n * g.o * g.oh * g.ow), nw = (size_t)(g.o * 9);
    uint16_t *x = bf16_random(nx), *dy = bf16_random(ny), *dw[3];
    const int saved = cx_get_num_threads();
    for (int run = 0; run < 3; run++) {
        cx_set_num_threads(run + 1);   /* sized for 1 (the least), 2 and 3 lanes */
        size_t bytes = cx_conv2d_bf16_direct_scratch_bytes(&g, 2, run == 0);
        void *s = scratch_of(bytes);
        dw[run] = malloc(sizeof *dw[run] * nw);
        cr_assert(dw[run]);
        cx_set_num_threads(3);   /* more threads than a one-lane scratch holds */
        cx_conv2d_bf16(2, dw[run], x, dy, &g, NULL, s, bytes);
        free(s);
    }
    cx_set_num_threads(saved);
    for (int run = 1; run < 3; run++)
        cr_assert(memcmp(dw[0], dw[run], sizeof *dw[0] * nw) == 0, "dw on %d lanes differs from one lane's", run + 1);
    free(x); free(dy); free(dw[0]); free(dw[1]); free(dw[2]);
}

/* An inf in an image: the direct weight gradient's lanes past a row's end
 * read the next row, and there a zero dy times the inf would make a NaN
 * in terms that never read it (jj >= 1 never reads column 0). Each dw is
 * the f32 kernel's: finite where it is, within the summed bound. */
Test(bf16_conv, direct_weight_gradient_with_an_inf)
{
    rng_state = 0x7f4a7c15e3779b97ull;
    cx_conv_geom g = { .n = 3, .c = 1, .h = 10, .w = 12, .o = 4, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                       .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&g) && cx_conv2d_bf16_direct_applies(&g, 2));
    size_t nx = (size_t)(g.n * g.h * g.w), ny = (size_t)(g.n * g.o * g.oh * g.ow), nw = (size_t)(g.o * 9);
    uint16_t *x = bf16_random(nx), *dy = bf16_random(ny), *dw = malloc(sizeof *dw * nw);
    x[1 * g.h * g.w + 4 * g.w] = 0x7f80;   /* +inf, image 1, row 4, column 0 */
    float *xf = widened(x, nx), *dyf = widened(dy, ny), *want = malloc(sizeof *want * nw);
    cr_assert(dw && want);
    size_t b32 = cx_conv2d_bwd_weight_scratch_bytes(&g), b16 = cx_conv2d_bf16_scratch_bytes(&g, 2);
    void *s32 = scratch_of(b32), *s16 = scratch_of(b16);
    cx_conv2d_bwd_weight(want, xf, dyf, &g, s32, b32);
    cx_conv2d_bf16(2, dw, x, dy, &g, NULL, s16, b16);
    int finite = 0;
    for (size_t i = 0; i < nw; i++) {
        double got = cx_bf16_to_f32(dw[i]);
        if (!isfinite(want[i])) {
            cr_assert(!isfinite(got), "dw[%zu] = %g, the f32 kernel's %g", i, got, want[i]);
            continue;
        }
        finite++;
        cr_assert(isfinite(got) && fabs(got - want[i]) <= ldexp(fabs(want[i]), -8) + 1e-3,
                  "dw[%zu] = %g, the f32 kernel's %g", i, got, want[i]);
    }
    cr_assert_geq(finite, (int)nw / 2, "the inf reached %d of %zu terms", (int)nw - finite, nw);
    free(x); free(dy); free(dw); free(xf); free(dyf); free(want); free(s32); free(s16);
}

/* a bf16 value of few bits (k / 8, |k| <= 16: products and sums of a
 * window exact in f32 whatever the order, with or without FMA), or now
 * and then one of the specials: infs, quiet and signaling NaNs of either
 * sign, -0 (no overflowing finite values: an FMA's sum may not overflow
 * where a product alone does) */
static uint16_t exact_or_special(void)
{
    static const uint16_t specials[] = { 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x8000 };
    float u = rng_uniform();
    if (u > 0.96f) return specials[(int)((u - 0.96f) * 175.0f) % 7];
    return cx_f32_to_bf16((float)(int)(rng_uniform() * 16.0f) / 8.0f);
}

/* out[n, o, :, :] of the direct forward as the scalar steps give it: the
 * window's terms in the kernel's order (channel, row, column; a padded
 * input is a 0 that still multiplies its weight), the sum rounded once,
 * then cx_bf16_add_bias_inline's bias and relu */
static uint16_t direct_forward_want(const cx_conv_geom *g, const uint16_t *x, const uint16_t *w, const float *bias,
                                    bool relu, int64_t n, int64_t o, int64_t r, int64_t q)
{
    float sum = 0.0f;
    for (int64_t c = 0; c < g->c; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t jj = 0; jj < g->kw; jj++) {
                const int64_t row = r + i - g->pad_h, col = q + jj - g->pad_w;
                const bool inside = row >= 0 && row < g->h && col >= 0 && col < g->w;
                const float xv = inside ? cx_bf16_to_f32(x[((n * g->c + c) * g->h + row) * g->w + col]) : 0.0f;
                sum += cx_bf16_to_f32(w[((o * g->c + c) * g->kh + i) * g->kw + jj]) * xv;
            }
    const uint16_t y = cx_f32_to_bf16(sum);
    return bias ? cx_bf16_add_bias_inline(y, bias[o], relu) : y;
}

/* The direct forward at this level's vector width, bit for bit against
 * the scalar steps (a NaN: a quiet NaN), with infs and NaNs in the image,
 * the weights and the bias: its vector rounding has no NaN case
 * (conv_direct_bf16_width.h says why), so every NaN it meets must come
 * out a quiet NaN and no NaN an inf or a number. Rows of 19 and 37
 * outputs end inside a vector at every width; 11 and 5 channels leave a
 * part block. */
Test(bf16_conv, direct_forward_is_the_scalar_sum_bit_for_bit)
{
    rng_state = 0x3c6ef372fe94f82bull;
    const cx_conv_geom geoms[] = {
        { .n = 3, .c = 1, .h = 9, .w = 19, .o = 11, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1, .pad_h = 1,
          .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 },
        { .n = 2, .c = 2, .h = 6, .w = 38, .o = 5, .kh = 2, .kw = 2, .stride_h = 1, .stride_w = 1, .pad_h = 0,
          .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1 },
    };
    int nan = 0, inf = 0, zero_by_relu = 0, finite = 0;
    for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
        cx_conv_geom g = geoms[gi];
        cr_assert(cx_conv_geom_finish(&g) && cx_conv2d_bf16_direct_applies(&g, 0));
        const size_t nx = (size_t)(g.n * g.c * g.h * g.w), nw = (size_t)(g.o * g.c * g.kh * g.kw);
        const size_t ny = (size_t)(g.n * g.o * g.oh * g.ow);
        uint16_t *x = malloc(sizeof *x * nx), *w = malloc(sizeof *w * nw), *y = malloc(sizeof *y * ny);
        float *bias = malloc(sizeof *bias * (size_t)g.o);
        cr_assert(x && w && y && bias);
        for (size_t i = 0; i < nx; i++) x[i] = exact_or_special();
        for (size_t i = 0; i < nw; i++) w[i] = exact_or_special();
        for (int64_t o = 0; o < g.o; o++) bias[o] = cx_bf16_to_f32(exact_or_special());
        const size_t bytes = cx_conv2d_bf16_direct_scratch_bytes(&g, 0, false);
        void *s = scratch_of(bytes);
        for (int epi = 0; epi < 3; epi++) {   /* none, bias, bias + relu */
            const cx_bf16_epi e = { .bias = bias, .relu = epi == 2 };
            memset(y, 0xff, sizeof *y * ny);
            cx_conv2d_bf16_direct(0, y, x, w, &g, epi ? &e : NULL, s, bytes);
            for (int64_t n = 0; n < g.n; n++)
                for (int64_t o = 0; o < g.o; o++)
                    for (int64_t r = 0; r < g.oh; r++)
                        for (int64_t q = 0; q < g.ow; q++) {
                            const size_t i = (size_t)(((n * g.o + o) * g.oh + r) * g.ow + q);
                            const uint16_t want = direct_forward_want(&g, x, w, epi ? bias : NULL, epi == 2, n, o, r, q);
                            const float v = cx_bf16_to_f32(want);
                            /* which NaN operand's payload and sign a sum keeps
                             * depends on the order the compiler gave its operands */
                            if (isnan(v))
                                cr_assert(isnan(cx_bf16_to_f32(y[i])) && (y[i] & 0x40),
                                          "geometry %zu, epilogue %d: y[%ld, %ld, %ld, %ld] = 0x%04x, want a quiet NaN",
                                          gi, epi, (long)n, (long)o, (long)r, (long)q, y[i]);
                            else
                                cr_assert_eq(y[i], want,
                                             "geometry %zu, epilogue %d: y[%ld, %ld, %ld, %ld] = 0x%04x, want 0x%04x", gi,
                                             epi, (long)n, (long)o, (long)r, (long)q, y[i], want);
                            nan += isnan(v);
                            inf += isinf(v);
                            finite += isfinite(v) && v != 0.0f;
                            zero_by_relu += epi == 2 && want == 0 &&
                                            direct_forward_want(&g, x, w, bias, false, n, o, r, q) != 0;
                        }
        }
        free(x); free(w); free(y); free(bias); free(s);
    }
    cr_assert(nan > 0 && inf > 0 && zero_by_relu > 0 && finite > nan + inf,
              "the operands reach every case: %d NaN, %d inf, %d zeroed by relu, %d finite", nan, inf, zero_by_relu,
              finite);
}

/* The direct kernels add in one order at every vector width (16, 8, 4
 * floats: conv_direct_bf16_width.h), so each level's test entry must find
 * the same bits: the forward with its bias and relu, and the weight
 * gradient (whose sums below round differently in any other order). The
 * hashes are the bits the 16-float loops gave; the _avx2 and _baseline
 * entries hold the 8- and 4-float loops to them. */
Test(bf16_conv, direct_bits_are_the_same_at_every_width)
{
    rng_state = 0xbb67ae8584caa73bull;
    cx_conv_geom g = { .n = 5, .c = 1, .h = 11, .w = 19, .o = 11, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                       .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&g) && cx_conv2d_bf16_direct_applies(&g, 0) && cx_conv2d_bf16_direct_applies(&g, 2));
    const size_t nx = (size_t)(g.n * g.h * g.w), nw = (size_t)(g.o * 9), ny = (size_t)(g.n * g.o * g.oh * g.ow);
    uint16_t *x = bf16_random(nx), *w = bf16_random(nw), *dy = bf16_random(ny);
    /* in each image and channel, dy's +2^24 at (3, 3) and -2^24 at (3, 8)
     * over windows of ones: every term of dw holds two lanes' sums that
     * cancel, and what is left is the small terms each absorbed or not,
     * which the order decides (on random values alone the bf16 rounding
     * hid an order reversed) */
    for (int64_t n = 0; n < g.n; n++) {
        for (int64_t r = 2; r <= 4; r++)
            for (int64_t q = 2; q <= 9; q++) x[(n * g.h + r) * g.w + q] = 0x3f80;
        for (int64_t o = 0; o < g.o; o++) {
            dy[((n * g.o + o) * g.oh + 3) * g.ow + 3] = 0x4b80;
            dy[((n * g.o + o) * g.oh + 3) * g.ow + 8] = 0xcb80;
        }
    }
    uint16_t *y = malloc(sizeof *y * ny), *dw = malloc(sizeof *dw * nw);
    float bias[11];
    cr_assert(y && dw);
    for (int o = 0; o < 11; o++) bias[o] = rng_uniform();
    const cx_bf16_epi e = { .bias = bias, .relu = true };
    size_t bytes = cx_conv2d_bf16_direct_scratch_bytes(&g, 0, false);
    void *s = scratch_of(bytes);
    cx_conv2d_bf16_direct(0, y, x, w, &g, &e, s, bytes);
    free(s);
    bytes = cx_conv2d_bf16_direct_scratch_bytes(&g, 2, false);
    s = scratch_of(bytes);
    cx_conv2d_bf16_direct(2, dw, x, dy, &g, NULL, s, bytes);
    free(s);
    cr_assert_eq(cx_hash64(y, sizeof *y * ny), 0x5e20ade3dc1bfbe1ull, "the forward's bits at %s: %#018llx", cx_isa_name(cx_isa_active()),
                 (unsigned long long)cx_hash64(y, sizeof *y * ny));
    cr_assert_eq(cx_hash64(dw, sizeof *dw * nw), 0xfd2fb776f526e95full, "the weight gradient's bits at %s: %#018llx", cx_isa_name(cx_isa_active()),
                 (unsigned long long)cx_hash64(dw, sizeof *dw * nw));
    free(x); free(w); free(dy); free(y); free(dw);
}

/* A plan made while fewer threads ran (a smaller Winograd scratch: its
 * lanes are the threads') still runs Winograd, in fewer lanes, once more
 * threads run: the GEMM route is for a scratch too small for one lane. */
Test(bf16_conv, a_plan_for_fewer_threads_runs_winograd)
{
    rng_state = 0x2545f4914f6cdd1dull;
    cx_conv_geom g = { .n = 4, .c = 8, .h = 10, .w = 10, .o = 16, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                       .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&g) && cx_wino_applies(&g));
    const int saved = cx_get_num_threads();
    cx_set_num_threads(1);
    size_t one = cx_conv2d_bf16_scratch_bytes(&g, 0);
    cx_set_num_threads(2);
    size_t two = cx_conv2d_bf16_scratch_bytes(&g, 0);
    cr_assert_lt(one, two, "the plan grows with the threads");
    cr_assert_not(cx_conv2d_bf16_takes_gemm(&g, 0, one), "the one-thread plan runs Winograd");
    size_t nx = (size_t)(g.n * g.c * g.h * g.w), nw = (size_t)(g.o * g.c * 9), ny = (size_t)(g.n * g.o * g.oh * g.ow);
    uint16_t *x = bf16_random(nx), *w = bf16_random(nw), *y[2] = { malloc(2 * ny), malloc(2 * ny) };
    void *s1 = scratch_of(one), *s2 = scratch_of(two);
    cr_assert(y[0] && y[1]);
    cx_conv2d_bf16(0, y[0], x, w, &g, NULL, s1, one);
    cx_conv2d_bf16(0, y[1], x, w, &g, NULL, s2, two);
    cr_assert(!memcmp(y[0], y[1], 2 * ny), "one lane or two, the same bits");
    cx_set_num_threads(saved);
    free(x); free(w); free(y[0]); free(y[1]); free(s1); free(s2);
}

/* ---- pools ------------------------------------------------------------------------------- */

TestSuite(bf16_pool, .init = expect_requested_isa);

/* out (n values) against the f32 result rounded once */
static void expect_rounded(const uint16_t *out, const float *ref, size_t n, const char *what, const cx_pool_geom *g)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(out[i], cx_f32_to_bf16(ref[i]), "%s %dx%d stride %d pad %d on %lldx%lld: [%zu] = %g, want %g", what,
                     g->kh, g->kw, g->sh, g->ph, (long long)g->h, (long long)g->w, i, cx_bf16_to_f32(out[i]),
                     cx_bf16_to_f32(cx_f32_to_bf16(ref[i])));
}

/* Every pool and gradient gives the bits of casting around the f32
 * kernels, which is what the graph computed before the pools took bf16:
 * 2x2 windows (the vector path), overlapping and padded windows (the
 * gradient's sums), ties (values from a few levels) */
Test(bf16_pool, each_pool_is_the_f32_kernel_rounded)
{
    rng_state = 0x51ed270b27d3a1c5ull;
    /* the last: stride 1 with padding, an output plane larger than its input */
    static const int geoms[][5] = { { 2, 2, 2, 2, 0 }, { 3, 3, 2, 2, 1 }, { 3, 3, 1, 1, 1 }, { 2, 3, 1, 2, 0 },
                                    { 2, 2, 1, 1, 1 } };
    const int64_t sizes[][2] = { { 24, 24 }, { 13, 17 } };
    for (size_t gi = 0; gi < sizeof geoms / sizeof *geoms; gi++)
        for (size_t si = 0; si < 2; si++) {
            cx_pool_geom g = { .n = 3, .c = 5, .h = sizes[si][0], .w = sizes[si][1], .kh = geoms[gi][0],
                               .kw = geoms[gi][1], .sh = geoms[gi][2], .sw = geoms[gi][3], .ph = geoms[gi][4],
                               .pw = geoms[gi][4] };
            cr_assert(cx_pool_geom_finish(&g));
            size_t nin = (size_t)(g.n * g.c * g.h * g.w), nout = (size_t)(g.n * g.c * g.oh * g.ow);
            uint16_t *x = malloc(sizeof *x * nin), *dy = bf16_random(nout);
            cr_assert(x);
            for (size_t i = 0; i < nin; i++) x[i] = cx_f32_to_bf16((float)(int)(rng_uniform() * 4.0f) * 0.75f);
            float *xf = widened(x, nin), *dyf = widened(dy, nout);
            const size_t most = nin > nout ? nin : nout;
            float *ref = malloc(sizeof *ref * most);
            uint16_t *out = malloc(sizeof *out * most);
            size_t sb = cx_pool2d_bf16_scratch_bytes(&g);
            void *scratch = malloc(sb);
            cr_assert(ref && out && scratch);
            cx_max_pool2d_fwd(ref, xf, &g);
            cx_pool2d_bf16(CX_POOL_BF16_MAX, out, x, NULL, NULL, &g, scratch, sb);
            expect_rounded(out, ref, nout, "max pool", &g);
            cx_avg_pool2d_fwd(ref, xf, &g);
            cx_pool2d_bf16(CX_POOL_BF16_AVG, out, x, NULL, NULL, &g, scratch, sb);
            expect_rounded(out, ref, nout, "avg pool", &g);
            cx_max_pool2d_bwd(ref, xf, dyf, NULL, &g);
            cx_pool2d_bf16(CX_POOL_BF16_MAX_BWD, out, x, dy, NULL, &g, scratch, sb);
            expect_rounded(out, ref, nin, "max pool gradient", &g);
            cx_avg_pool2d_bwd(ref, dyf, &g);
            cx_pool2d_bf16(CX_POOL_BF16_AVG_BWD, out, NULL, dy, NULL, &g, scratch, sb);
            expect_rounded(out, ref, nin, "avg pool gradient", &g);
            /* one thread's share of the scratch is enough, and no kernel
             * writes past it */
            const size_t one = cx_pool2d_bf16_min_scratch_bytes(&g);
            unsigned char *lane = malloc(one + 256);
            cr_assert(lane);
            memset(lane + one, 0xa5, 256);
            cx_pool2d_bf16(CX_POOL_BF16_MAX_BWD, out, x, dy, NULL, &g, lane, one);
            cx_max_pool2d_bwd(ref, xf, dyf, NULL, &g);
            expect_rounded(out, ref, nin, "max pool gradient on one lane", &g);
            cx_pool2d_bf16(CX_POOL_BF16_MAX, out, x, NULL, NULL, &g, lane, one);
            cx_max_pool2d_fwd(ref, xf, &g);
            expect_rounded(out, ref, nout, "max pool on one lane", &g);
            for (int b = 0; b < 256; b++) cr_assert_eq(lane[one + (size_t)b], 0xa5, "a write past the scratch");
            free(lane);
            free(x); free(dy); free(xf); free(dyf); free(ref); free(out); free(scratch);
        }
}

/* The 2x2 max pool and its gradient work on the bf16 bits in place: every
 * width class of their loops (8, 4 and 1 windows; an odd last row and
 * column), the special values (a signalling NaN made quiet, -0, the
 * infinities, NaN dy) and relu's mask, folded (the mask is x) or not,
 * give the bits of the f32 kernels rounded and masked. */
Test(bf16_pool, max_2x2_on_special_values_and_masks)
{
    rng_state = 0x6a09e667f3bcc908ull;
    static const uint16_t special[] = { 0xff80, 0xbfc0, 0x8000, 0x0000, 0x3f40, 0x3fc0, 0x7f80, 0x7fc0, 0x7f81, 0xffc1 };
    const int64_t sizes[][2] = { { 4, 26 }, { 7, 27 }, { 5, 3 } };   /* 13 windows a row: 8 + 4 + 1 */
    for (size_t si = 0; si < 3; si++) {
        cx_pool_geom g = { .n = 2, .c = 3, .h = sizes[si][0], .w = sizes[si][1], .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
        cr_assert(cx_pool_geom_finish(&g));
        size_t nin = (size_t)(g.n * g.c * g.h * g.w), nout = (size_t)(g.n * g.c * g.oh * g.ow);
        uint16_t *x = malloc(sizeof *x * nin), *mask = malloc(sizeof *mask * nin), *dy = bf16_random(nout);
        uint16_t *out = malloc(sizeof *out * nin);
        float *ref = malloc(sizeof *ref * nin);
        cr_assert(x && mask && out && ref);
        for (size_t i = 0; i < nin; i++) {
            x[i] = special[(size_t)((rng_uniform() + 1.0f) * 5.0f) % 10];
            mask[i] = special[(size_t)((rng_uniform() + 1.0f) * 5.0f) % 10];
        }
        for (size_t i = 0; i < nout; i += 7) dy[i] = i % 2 ? 0x7f81 : 0x8000;
        float *xf = widened(x, nin), *dyf = widened(dy, nout);
        size_t sb = cx_pool2d_bf16_scratch_bytes(&g);
        void *scratch = malloc(sb);
        cr_assert(scratch);
        cx_max_pool2d_fwd(ref, xf, &g);
        cx_pool2d_bf16(CX_POOL_BF16_MAX, out, x, NULL, NULL, &g, scratch, sb);
        expect_rounded(out, ref, nout, "max pool of special values", &g);
        cx_max_pool2d_bwd(ref, xf, dyf, xf, &g);
        cx_pool2d_bf16(CX_POOL_BF16_MAX_BWD, out, x, dy, x, &g, scratch, sb);
        expect_rounded(out, ref, nin, "max pool gradient, relu folded", &g);
        cx_max_pool2d_bwd(ref, xf, dyf, NULL, &g);
        for (size_t i = 0; i < nin; i++)
            if (!(cx_bf16_to_f32(mask[i]) > 0.0f)) ref[i] = 0.0f;
        cx_pool2d_bf16(CX_POOL_BF16_MAX_BWD, out, x, dy, mask, &g, scratch, sb);
        expect_rounded(out, ref, nin, "max pool gradient, another mask", &g);
        free(x); free(mask); free(dy); free(out); free(ref); free(xf); free(dyf); free(scratch);
    }
}
