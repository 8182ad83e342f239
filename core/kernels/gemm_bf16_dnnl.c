/* bf16 matmuls on oneDNN's matmul primitive: the route cx_matmul_bf16*
 * takes at the amx level (CX_BF16_GEMM=auto), where oneDNN's brgemm
 * kernels run on AMX tiles (oneDNN asks the kernel for the tile state
 * itself), or wherever CX_BF16_GEMM=onednn asks for it and the level has
 * bf16 instructions (on AVX512_BF16 its brgemm kernels use vdpbf16ps: that
 * is how CI runs this route on a CPU without AMX).
 *
 * oneDNN's brgemm takes only dense operands: a block of a matrix with a
 * longer leading dimension (rows of a transposed A, columns of B) goes to
 * its plain gemm kernels, which have no AMX. So the work is cut where every
 * part stays dense (cut_kind), each part one single-threaded call on a
 * pool thread: the pool stays the only owner of the compute threads (a
 * call threaded by oneDNN left libgomp's team spinning against the pool's
 * next kernel: 5 % of a gpt step's samples), and the cuts read the shape
 * alone, so the bits do not depend on the thread count.
 * The sums are f32 and C is rounded once, as on the other routes; the
 * linear epilogue (bias, relu) is applied to the rounded rows, as the other
 * routes do. A call that fails (oneDNN could not allocate its scratchpad)
 * leaves the product to the caller's own route, which writes all of C
 * again: so products that add into C (the conv GEMM route's weight
 * gradient over chunks of images) do not come here. */
#include "kernels.h"
#include <cxla/core.h>
#include "pool.h"
#include "bf16_simd.h"
#include "cx_bf16.h"
#include "cx_log.h"
#include "cx_settings.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* rows of one part of an untransposed product: ~8 parts of a gpt's
 * 2048-row activations, each large enough that packing B once per part
 * stays a small share of it */
enum { PART_ROWS = 512, MIN_ROWS = 16, CACHE_SLOTS = 64 };
/* K of a weight gradient's block: at least this */
enum { PART_K = 256 };

typedef struct {
    int64_t rows, n, k;
    bool ta, tb, f32_out;
} prim_key;

typedef struct {
    prim_key key;
    dnnl_primitive_t prim;   /* NULL: oneDNN has no brgemm kernel for it */
    dnnl_memory_desc_t scratch_md;
    size_t scratch_bytes;
    bool settled;            /* a primitive, or a certain none: worth keeping */
} prim_slot;

static struct {
    pthread_mutex_t lock;
    prim_slot slot[CACHE_SLOTS];
    int used;
} g_prims = { .lock = PTHREAD_MUTEX_INITIALIZER };

static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

/* Each thread's buffers: the scratchpads of its calls, and (the calling
 * thread's) CUT_K's block sums. oneDNN 2.6 (as Debian builds it) gives
 * every call of a primitive the same scratchpad otherwise, and calls of
 * one primitive on two threads at once wrote over each other's packed
 * blocks. Freed when their thread ends. */
enum { SCRATCH_PAD, SCRATCH_SUMS, SCRATCH_A, SCRATCH_KINDS };
static pthread_key_t g_scratch_key;

typedef struct {
    void *p[SCRATCH_KINDS];
    size_t bytes[SCRATCH_KINDS];
} thread_scratch;

static void free_thread_scratch(void *p)
{
    thread_scratch *t = p;
    for (int i = 0; i < SCRATCH_KINDS; i++) free(t->p[i]);
    free(t);
}

static void make_engine(void)
{
    if (pthread_key_create(&g_scratch_key, free_thread_scratch) != 0) return;
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
}

/* this thread's buffer of a kind, of at least bytes; NULL if out of memory */
static void *scratch_of_thread(int kind, size_t bytes)
{
    thread_scratch *t = pthread_getspecific(g_scratch_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        if (pthread_setspecific(g_scratch_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    if (t->bytes[kind] < bytes) {
        void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!p) return NULL;
        free(t->p[kind]);
        t->p[kind] = p;
        t->bytes[kind] = bytes;
    }
    return t->p[kind];
}

bool cx_bf16_gemm_on_dnnl(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return v;
    /* CX_BF16_GEMM's values in the table's order: auto, cxla, onednn */
    int want = cx_setting_enum("CX_BF16_GEMM");
    cx_isa level = cx_isa_active();
    const bool amx = want != 1 && level >= CX_ISA_AMX && cx_amx_permitted();
    v = want == 2 ? level >= CX_ISA_AVX512_BF16 : want == 0 && amx;
    if (want == 2 && !v)
        cx_logf(CX_LOG_WARNING, "kernels",
                "CX_BF16_GEMM=onednn: this level (%s) has no bf16 instructions, so cxla's widening route runs",
                cx_isa_name(level));
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

/* the public name of the path bf16 matmuls take, which the route decides
 * (include/cxla/core.h) */
const char *cx_bf16_path(void)
{
    cx_isa level = cx_isa_active();
    if (level < CX_ISA_AVX512_BF16) return "none (converted to f32)";
    if (!cx_bf16_gemm_on_dnnl()) return "avx512_bf16";
    return cx_bf16_gemm_on_amx() ? "amx" : "avx512_bf16 (oneDNN)";
}

bool cx_bf16_gemm_on_amx(void)
{
    return cx_bf16_gemm_on_dnnl() && cx_isa_active() >= CX_ISA_AMX && cx_amx_permitted();
}

static void plain_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, bool transposed, dnnl_data_type_t type)
{
    /* (rows, cols) stored row-major, or its transpose stored (cols, rows) */
    dnnl_dims_t dims = { rows, cols }, strides = { transposed ? 1 : cols, transposed ? rows : 1 };
    dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

/* The three operands' descriptors of a key: A (rows, k), B (k, n), C (rows, n). */
static void key_mds(const prim_key *key, dnnl_memory_desc_t *a, dnnl_memory_desc_t *b, dnnl_memory_desc_t *c)
{
    plain_md(a, key->rows, key->k, key->ta, dnnl_bf16);
    plain_md(b, key->k, key->n, key->tb, dnnl_bf16);
    plain_md(c, key->rows, key->n, false, key->f32_out ? dnnl_f32 : dnnl_bf16);
}

/* A new primitive for key, its prim NULL where oneDNN would run it on
 * anything but its brgemm kernels (a reference loop, or plain gemm without
 * AMX). Created on one OpenMP thread, which sizes its scratchpad for the
 * one thread each call runs on. */
static prim_slot create_prim(const prim_key *key)
{
    prim_slot slot = { .key = *key };
    dnnl_memory_desc_t a, b, c;
    key_mds(key, &a, &b, &c);
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    cx_dnnl_call call;
    cx_dnnl_enter(&call);
    bool ok = dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    dnnl_status_t made = ok ? dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL) : dnnl_runtime_error;
    const char *impl = NULL;
    ok = made == dnnl_success && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
         impl;
    /* no kernel for the shape at this level is an answer to keep; a
     * failure (memory) is not */
    slot.settled = made == dnnl_unimplemented || (ok && strncmp(impl, "brg", 3) != 0);
    const dnnl_memory_desc_t *scratch = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    if (ok && scratch && strncmp(impl, "brg", 3) == 0 && dnnl_primitive_create(&slot.prim, pd) == dnnl_success) {
        slot.scratch_md = *scratch;
        slot.scratch_bytes = dnnl_memory_desc_get_size(scratch);
        slot.settled = true;
    }
    cx_dnnl_leave(&call);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return slot;
}

static bool same_key(const prim_key *x, const prim_key *y)
{
    return x->rows == y->rows && x->n == y->n && x->k == y->k && x->ta == y->ta && x->tb == y->tb &&
           x->f32_out == y->f32_out;
}

/* The cached primitive for key (created on first use; its prim NULL:
 * none). *owned says the caller must destroy it: the cache was full. */
static prim_slot prim_for(const prim_key *key, bool *owned)
{
    *owned = false;
    pthread_mutex_lock(&g_prims.lock);
    for (int i = 0; i < g_prims.used; i++)
        if (same_key(&g_prims.slot[i].key, key)) {
            prim_slot s = g_prims.slot[i];
            pthread_mutex_unlock(&g_prims.lock);
            return s;
        }
    pthread_mutex_unlock(&g_prims.lock);
    /* created unlocked (milliseconds of JIT); a race makes one twice and
     * keeps the first */
    prim_slot made = create_prim(key);
    pthread_mutex_lock(&g_prims.lock);
    for (int i = 0; i < g_prims.used; i++)
        if (same_key(&g_prims.slot[i].key, key)) {
            prim_slot kept = g_prims.slot[i];
            pthread_mutex_unlock(&g_prims.lock);
            if (made.prim) dnnl_primitive_destroy(made.prim);
            return kept;
        }
    if (made.settled && g_prims.used < CACHE_SLOTS) g_prims.slot[g_prims.used++] = made;
    else *owned = made.prim != NULL;
    pthread_mutex_unlock(&g_prims.lock);
    return made;
}

/* How a product is cut into single-threaded calls, each on dense
 * operands; the cuts read the shape alone. */
typedef enum {
    CUT_ENTRIES,   /* a batch: each entry whole */
    CUT_ROWS,      /* A untransposed: row blocks of A and C */
    CUT_K,         /* A transposed, B not (a weight gradient): K blocks, each summed into its own f32 C,
                    * then the blocks' sums added in order and rounded once */
    CUT_NONE,      /* one call (fewer than 32 rows; a transposed A that cannot take CUT_K is copied
                    * untransposed first, and cut by rows) */
} cut_kind;

typedef struct {
    void *c;
    bool f32_out;
    const uint16_t *a, *b;
    int64_t batch, m, n, k, sa, sb;
    bool ta, tb;
    const float *bias;
    bool relu;
    cut_kind cut;
    int64_t parts, step;      /* parts of each entry, and their rows (CUT_ROWS) or K (CUT_K) */
    prim_slot whole;          /* a whole part's (an entry's, a full row or K block's) */
    prim_slot ragged;         /* the last block's, when shorter */
    float *sums;              /* CUT_K: parts x (m, n) f32 block sums */
    _Atomic bool failed;
} dnnl_job;

/* Rows of C from the sums: rounded, with the linear epilogue
 * (round(round(sum) + bf16(bias[col])), then relu) where bias is not NULL,
 * as the other routes' micro-tiles round. sums: np blocks of (rows, n) f32
 * added in order (CUT_K), or NULL: C holds the rounded sums already. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void epilogue_rows(uint16_t *c, float *cf, const float *sums, int64_t np, int64_t block, const float *bias,
                          bool relu, int64_t rows, int64_t n)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t q = 0; q < n; q += 16) {
            const __mmask16 m = q + 16 <= n ? (__mmask16)0xffff : (__mmask16)((1u << (n - q)) - 1);
            const int64_t at = r * n + q;
            __m512 v;
            if (sums) {
                v = _mm512_maskz_loadu_ps(m, sums + at);
                for (int64_t p = 1; p < np; p++) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, sums + p * block + at));
                if (cf) {
                    _mm512_mask_storeu_ps(cf + at, m, v);
                    continue;
                }
            } else {
                v = cx_widen_bf16x16(_mm256_maskz_loadu_epi16(m, c + at));
            }
            if (bias) {
                const __m512 b = cx_widen_bf16x16(cx_round_bf16x16(_mm512_maskz_loadu_ps(m, bias + q)));
                v = cx_widen_bf16x16(cx_round_bf16x16(_mm512_add_ps(cx_widen_bf16x16(cx_round_bf16x16(v)), b)));
                if (relu) v = cx_relu_ps16(v);
            }
            _mm256_mask_storeu_epi16(c + at, m, cx_round_bf16x16(v));
        }
}

/* Part t's call: its operands, its output (C's rows, or its block of
 * sums), the primitive for its size. */
static bool exec_part(const dnnl_job *j, dnnl_stream_t stream, int64_t t)
{
    const int64_t entry = t / j->parts, part = t % j->parts, at = part * j->step;
    const prim_slot *prim = &j->whole;
    int64_t rows = j->m, k = j->k;
    const uint16_t *a = j->a + entry * j->sa, *b = j->b + entry * j->sb;
    const size_t out_size = j->f32_out || j->cut == CUT_K ? sizeof(float) : sizeof(uint16_t);
    void *c = (char *)j->c + (size_t)(entry * j->m * j->n) * out_size;
    if (j->cut == CUT_ROWS) {
        rows = j->m - at < j->step ? j->m - at : j->step;
        a += at * j->k;
        c = (char *)c + (size_t)(at * j->n) * out_size;
    } else if (j->cut == CUT_K) {
        k = j->k - at < j->step ? j->k - at : j->step;
        a += at * j->m;   /* rows [at, at + k) of the stored (K, M) A */
        b += at * j->n;
        c = j->sums + part * j->m * j->n;
    }
    if ((j->cut == CUT_ROWS && rows < j->step) || (j->cut == CUT_K && k < j->step)) prim = &j->ragged;
    prim_key key = { rows, j->n, k, j->ta, j->tb, j->f32_out || j->cut == CUT_K };
    dnnl_memory_desc_t amd, bmd, cmd;
    key_mds(&key, &amd, &bmd, &cmd);
    void *scratch = scratch_of_thread(SCRATCH_PAD, prim->scratch_bytes);
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    bool ok = scratch && dnnl_memory_create(&ma, &amd, g_engine, (void *)a) == dnnl_success &&
              dnnl_memory_create(&mb, &bmd, g_engine, (void *)b) == dnnl_success &&
              dnnl_memory_create(&mc, &cmd, g_engine, c) == dnnl_success &&
              dnnl_memory_create(&ms, &prim->scratch_md, g_engine, scratch) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = { { DNNL_ARG_SRC, ma }, { DNNL_ARG_WEIGHTS, mb }, { DNNL_ARG_DST, mc },
                                    { DNNL_ARG_SCRATCHPAD, ms } };
        ok = dnnl_primitive_execute(prim->prim, stream, 4, args) == dnnl_success &&
             dnnl_stream_wait(stream) == dnnl_success;
    }
    if (ms) dnnl_memory_destroy(ms);
    if (mc) dnnl_memory_destroy(mc);
    if (mb) dnnl_memory_destroy(mb);
    if (ma) dnnl_memory_destroy(ma);
    if (ok && j->bias && j->cut != CUT_K) epilogue_rows(c, NULL, NULL, 0, 0, j->bias, j->relu, rows, j->n);
    return ok;
}

static void run_parts(void *ctx, int64_t lo, int64_t hi)
{
    dnnl_job *j = ctx;
    cx_dnnl_call call;
    cx_dnnl_enter(&call);
    dnnl_stream_t stream = NULL;
    bool ok = dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags) == dnnl_success;
    for (int64_t t = lo; ok && t < hi; t++) ok = exec_part(j, stream, t);
    if (stream) dnnl_stream_destroy(stream);
    cx_dnnl_leave(&call);
    if (!ok) atomic_store(&j->failed, true);
}

/* CUT_K's last step: C's rows [lo, hi) from the blocks' sums */
static void add_sums(void *ctx, int64_t lo, int64_t hi)
{
    const dnnl_job *j = ctx;
    const int64_t at = lo * j->n;
    epilogue_rows(j->f32_out ? NULL : (uint16_t *)j->c + at, j->f32_out ? (float *)j->c + at : NULL, j->sums + at,
                  j->parts, j->m * j->n, j->bias, j->relu, hi - lo, j->n);
}

/* dst (cols, rows) = src (rows, cols) transposed, in 32 x 32 blocks */
static void transpose_bf16(uint16_t *dst, const uint16_t *src, int64_t rows, int64_t cols)
{
    enum { BLK = 32 };
    for (int64_t r0 = 0; r0 < rows; r0 += BLK)
        for (int64_t c0 = 0; c0 < cols; c0 += BLK) {
            const int64_t r1 = r0 + BLK < rows ? r0 + BLK : rows, c1 = c0 + BLK < cols ? c0 + BLK : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) dst[c * rows + r] = src[r * cols + c];
        }
}

/* The cut of a product and its step (see cut_kind) */
static void choose_cut(dnnl_job *j)
{
    j->parts = 1;
    if (j->batch > 1) j->cut = CUT_ENTRIES;
    else if (!j->ta && j->m >= 2 * MIN_ROWS) {
        /* blocks of PART_ROWS, or two halves of a shorter product (the
         * cnn's linear layers, 64 rows) */
        j->cut = CUT_ROWS;
        j->step = j->m > 2 * PART_ROWS ? PART_ROWS : (j->m + 1) / 2;
        j->parts = (j->m + j->step - 1) / j->step;
    } else if (j->ta && !j->tb && j->k >= 2 * PART_K) {
        /* 2 to 4 blocks: more would add more sums to write and read
         * than they spread */
        j->cut = CUT_K;
        j->parts = j->k / PART_K < 4 ? j->k / PART_K : 4;
        j->step = (j->k + j->parts - 1) / j->parts;
    } else {
        j->cut = CUT_NONE;
    }
}

bool cx_matmul_bf16_dnnl(uint16_t *c, float *cf, const float *bias, bool relu, const uint16_t *a, const uint16_t *b,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a,
                         int64_t stride_b)
{
    /* the epilogue's vectors are AVX-512's, and below bf16 instructions
     * oneDNN has no brgemm kernel for bf16 */
    if (cx_isa_active() < CX_ISA_AVX512_BF16 || batch <= 0 || m <= 0 || n <= 0 || k <= 0) return false;
    pthread_once(&g_engine_once, make_engine);
    if (!g_engine) return false;
    dnnl_job j = { .c = cf ? (void *)cf : (void *)c, .f32_out = cf != NULL, .a = a, .b = b, .batch = batch, .m = m,
                   .n = n, .k = k, .sa = stride_a, .sb = stride_b, .ta = trans_a, .tb = trans_b,
                   .bias = c ? bias : NULL, .relu = c && bias && relu };
    choose_cut(&j);
    if (j.cut == CUT_NONE && trans_a && m >= 2 * MIN_ROWS) {
        /* a transposed A too short in K for its own cut (the cnn's linear
         * weight gradients, K = the batch), or with B transposed too: A
         * copied untransposed, K x M values, and cut by rows */
        uint16_t *t = scratch_of_thread(SCRATCH_A, sizeof *t * (size_t)(m * k));
        if (!t) return false;
        transpose_bf16(t, a, k, m);
        j.a = t;
        j.ta = false;
        choose_cut(&j);
    }
    const bool sums_out = cf != NULL || j.cut == CUT_K;
    prim_key key = { j.cut == CUT_ROWS ? j.step : m, n, j.cut == CUT_K ? j.step : k, j.ta, trans_b, sums_out };
    bool own_whole, own_ragged = false;
    j.whole = prim_for(&key, &own_whole);
    const int64_t last = j.cut == CUT_ROWS ? m - (j.parts - 1) * j.step : j.cut == CUT_K ? k - (j.parts - 1) * j.step : 0;
    const bool ragged = (j.cut == CUT_ROWS || j.cut == CUT_K) && last < j.step;
    if (j.whole.prim && ragged) {
        if (j.cut == CUT_ROWS) key.rows = last;
        else key.k = last;
        j.ragged = prim_for(&key, &own_ragged);
    }
    bool ok = j.whole.prim && (!ragged || j.ragged.prim);
    if (ok && j.cut == CUT_K) {
        j.sums = scratch_of_thread(SCRATCH_SUMS, sizeof(float) * (size_t)(j.parts * m * n));
        ok = j.sums != NULL;
    }
    if (ok) {
        const int64_t tasks = batch * j.parts;
        if (tasks == 1) run_parts(&j, 0, 1);
        else cx_pool_parallel_for(tasks, 1, run_parts, &j);
        ok = !atomic_load(&j.failed);
    }
    if (ok && j.cut == CUT_K) cx_pool_parallel_for(m, 16, add_sums, &j);
    if (own_whole) dnnl_primitive_destroy(j.whole.prim);
    if (own_ragged) dnnl_primitive_destroy(j.ragged.prim);
    return ok;
}
