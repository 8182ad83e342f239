/* Errors, allocation, dtypes, timing, memory accounting. */
#include "internal.h"

#include <errno.h>
#include <strings.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>
#include <pthread.h>
#include <sys/mman.h>

static _Thread_local char t_last_error[1024];

const char *cx_last_error(void) { return t_last_error; }
void cx_clear_error(void) { t_last_error[0] = 0; }

void cx_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
    va_end(ap);
}

void cx_set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
    va_end(ap);
}

void *cx_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) cx_set_error("out of memory: malloc of %zu bytes failed", n);
    return p;
}

void *cx_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) cx_set_error("out of memory: calloc of %zu x %zu bytes failed", n, size);
    return p;
}

void *cx_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) cx_set_error("out of memory: realloc to %zu bytes failed", n);
    return q;
}

double cx_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const struct { const char *name; size_t size; bool is_float; } g_dtypes[CX_DTYPE_COUNT] = {
    [CX_F32] = { "f32", 4, true },
    [CX_BF16] = { "bf16", 2, true },
    [CX_I32] = { "i32", 4, false },
    [CX_I64] = { "i64", 8, false },
    [CX_U8] = { "u8", 1, false },
    [CX_BOOL] = { "bool", 1, false },
};

size_t cx_dtype_size(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT ? g_dtypes[dt].size : 0; }
const char *cx_dtype_name(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT ? g_dtypes[dt].name : "?"; }
bool cx_dtype_is_float(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT && g_dtypes[dt].is_float; }

float cx_bf16_to_f32(uint16_t h) { return cx_bf16_to_f32_inline(h); }
uint16_t cx_f32_to_bf16(float f) { return cx_f32_to_bf16_inline(f); }

void cx_bf16_to_f32_row(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_bf16_to_f32_inline(src[i]);
}

void cx_f32_to_bf16_row(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_f32_to_bf16_inline(src[i]);
}

const char *cx_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, cap - off, "(");
    for (int i = 0; i < ndim && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (ndim == 1 && off < cap) off += (size_t)snprintf(buf + off, cap - off, ",");
    if (off < cap) snprintf(buf + off, cap - off, ")");
    return buf;
}

int64_t cx_shape_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* ---- memory accounting ---------------------------------------------------- */

static atomic_llong g_mem_in_use;
static atomic_llong g_mem_peak;
static int64_t g_mem_limit = -1; /* -1: not parsed yet; 0: none */

static int64_t parse_limit(const char *s)
{
    if (!s || !*s) return 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return 0;
    while (*end == ' ') end++;
    double mult = 1;
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kb")) mult = 1e3;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb")) mult = 1e6;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gb")) mult = 1e9;
    else if (!strcasecmp(end, "kib")) mult = 1024.0;
    else if (!strcasecmp(end, "mib")) mult = 1024.0 * 1024;
    else if (!strcasecmp(end, "gib")) mult = 1024.0 * 1024 * 1024;
    else if (*end) return 0;
    return (int64_t)(v * mult);
}

static int64_t mem_limit(void)
{
    if (g_mem_limit < 0) g_mem_limit = parse_limit(getenv("CX_MEMORY_LIMIT"));
    return g_mem_limit;
}

void cx_mem_account(int64_t delta)
{
    int64_t now = atomic_fetch_add(&g_mem_in_use, delta) + delta;
    int64_t peak = atomic_load(&g_mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&g_mem_peak, &peak, now)) {}
}

cx_status cx_mem_check(int64_t request, const char *what)
{
    int64_t lim = mem_limit();
    if (lim > 0 && atomic_load(&g_mem_in_use) + request > lim) {
        cx_set_error("out of memory: %s needs %lld bytes with %lld in use, over the limit of %lld bytes (CX_MEMORY_LIMIT)",
                     what, (long long)request, (long long)atomic_load(&g_mem_in_use), (long long)lim);
        return CX_ERR_OOM;
    }
    return CX_OK;
}

int64_t cx_memory_in_use(void) { return atomic_load(&g_mem_in_use); }
int64_t cx_memory_peak(void) { return atomic_load(&g_mem_peak); }
void cx_memory_reset_peak(void) { atomic_store(&g_mem_peak, atomic_load(&g_mem_in_use)); }

/* Large buffers are cached when freed and handed out again for the same
 * size, as an accelerator's caching allocator does: a training step frees
 * and allocates the same sizes every time, and fresh pages cost a page
 * fault each. Cached bytes do not count as in use. */
#define CX_BUFCACHE_SLOTS 32
#define CX_BUFCACHE_MIN (64 * 1024)
static struct { void *data; size_t cap; } g_bufcache[CX_BUFCACHE_SLOTS];
static int g_bufcache_n;
static size_t g_bufcache_bytes;
static pthread_mutex_t g_bufcache_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t cache_limit(void)
{
    static size_t lim;
    if (!lim) {
        const char *e = getenv("CX_BUFFER_CACHE_BYTES");
        lim = e ? (size_t)strtoull(e, NULL, 10) : (size_t)2 << 30;
        if (!lim) lim = 1;
    }
    return lim;
}

static void *cache_take(size_t cap)
{
    void *p = NULL;
    pthread_mutex_lock(&g_bufcache_mu);
    for (int i = 0; i < g_bufcache_n; i++)
        if (g_bufcache[i].cap == cap) {
            p = g_bufcache[i].data;
            g_bufcache_bytes -= cap;
            g_bufcache[i] = g_bufcache[--g_bufcache_n];
            break;
        }
    pthread_mutex_unlock(&g_bufcache_mu);
    return p;
}

static bool cache_put(void *p, size_t cap)
{
    bool kept = false;
    pthread_mutex_lock(&g_bufcache_mu);
    if (cap >= CX_BUFCACHE_MIN && g_bufcache_n < CX_BUFCACHE_SLOTS && g_bufcache_bytes + cap <= cache_limit()) {
        g_bufcache[g_bufcache_n].data = p;
        g_bufcache[g_bufcache_n].cap = cap;
        g_bufcache_n++;
        g_bufcache_bytes += cap;
        kept = true;
    }
    pthread_mutex_unlock(&g_bufcache_mu);
    return kept;
}

void cx_buffer_cache_release(void)
{
    pthread_mutex_lock(&g_bufcache_mu);
    for (int i = 0; i < g_bufcache_n; i++) free(g_bufcache[i].data);
    g_bufcache_n = 0;
    g_bufcache_bytes = 0;
    pthread_mutex_unlock(&g_bufcache_mu);
}

/* Buffers from 2 MiB up are backed by transparent huge pages where the
 * kernel offers them on request (THP "madvise" mode, Debian's default):
 * first touch of a fresh 100 MB tensor (a checkpoint load, a new
 * parameter) then takes 50 page faults instead of 25,000, which on a VM
 * costs more than reading the data. */
#define CX_HUGE ((size_t)2 << 20)

static size_t buffer_cap(size_t bytes)
{
    size_t cap = (bytes + 63) & ~(size_t)63;
    return cap ? cap : 64;
}

/* A 2 MiB-aligned start is enough: the kernel backs every whole 2 MiB
 * stretch with a huge page, and a tail shorter than that with small ones,
 * so the size is not rounded up. */
static void *buffer_alloc(size_t cap)
{
    if (cap < CX_HUGE) return aligned_alloc(64, cap);
    void *p = NULL;
    if (posix_memalign(&p, CX_HUGE, cap) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, cap, MADV_HUGEPAGE);
#endif
    return p;
}

cx_buffer *cx_buffer_new(size_t bytes)
{
    if (cx_mem_check((int64_t)bytes, "a device buffer") != CX_OK) return NULL;
    cx_buffer *b = cx_xmalloc(sizeof *b);
    if (!b) return NULL;
    /* 64-byte alignment keeps vector loads and OpenBLAS happy */
    size_t cap = buffer_cap(bytes);
    b->data = cache_take(cap);
    if (!b->data) b->data = buffer_alloc(cap);
    if (!b->data) {
        /* the cache may hold what we need in other sizes */
        cx_buffer_cache_release();
        b->data = buffer_alloc(cap);
    }
    if (!b->data) {
        cx_set_error("out of memory: device buffer of %zu bytes", bytes);
        free(b);
        return NULL;
    }
    b->bytes = bytes;
    b->refs = 1;
    cx_mem_account((int64_t)bytes);
    return b;
}

void cx_buffer_ref(cx_buffer *b) { if (b) b->refs++; }

void cx_buffer_unref(cx_buffer *b)
{
    if (!b || --b->refs > 0) return;
    cx_mem_account(-(int64_t)b->bytes);
    size_t cap = buffer_cap(b->bytes);
    if (!cache_put(b->data, cap)) free(b->data);
    free(b);
}
