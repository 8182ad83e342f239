/* Device memory: buffers (reference counted; large ones cached when freed
 * and backed by huge pages), and the accounting behind cx_memory_in_use,
 * cx_memory_peak and CX_MEMORY_LIMIT. */
#include "buffer.h"
#include "backend.h"
#include "cx_settings.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sys/mman.h>

/* ---- memory accounting ---------------------------------------------------- */

static _Atomic int64_t g_mem_in_use;
static _Atomic int64_t g_mem_peak;
static int64_t g_mem_limit = -1; /* -1: not parsed yet; 0: none */

static int64_t mem_limit(void)
{
    if (g_mem_limit < 0) g_mem_limit = cx_setting_int("CX_MEMORY_LIMIT");
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
        cx_set_last_error("out of memory: %s needs %lld bytes with %lld in use, over the limit of %lld bytes (CX_MEMORY_LIMIT)",
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
        lim = (size_t)cx_setting_int("CX_BUFFER_CACHE_BYTES");
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

/* Below this a collective's output stays in ordinary memory: small
 * messages gain nothing from in-place writes (the shared-memory
 * all-reduce looks for its buffers from the same size up). */
#define CX_COLLECTIVE_SHARED_MIN ((size_t)256 << 10)

/* Memory for a buffer: from the backend's shared memory when the buffer is
 * a large enough collective output and there is some (*shared set), else
 * from the cache or the allocator. */
static void *buffer_data(size_t bytes, bool collective, bool *shared)
{
    *shared = false;
    if (collective && bytes >= CX_COLLECTIVE_SHARED_MIN) {
        void *p = cx_comm_alloc_shared(bytes);
        if (p) {
            *shared = true;
            return p;
        }
    }
    /* 64-byte alignment keeps vector loads and OpenBLAS happy */
    size_t cap = buffer_cap(bytes);
    void *p = cache_take(cap);
    if (!p) p = buffer_alloc(cap);
    if (!p) {
        /* the cache may hold what we need in other sizes */
        cx_buffer_cache_release();
        p = buffer_alloc(cap);
    }
    return p;
}

static cx_buffer *buffer_new(size_t bytes, bool collective)
{
    if (cx_mem_check((int64_t)bytes, "a device buffer") != CX_OK) return NULL;
    cx_buffer *b = malloc(sizeof *b);
    if (!b) { cx_set_last_error("out of memory: a buffer header"); return NULL; }
    b->data = buffer_data(bytes, collective, &b->shared);
    if (!b->data) {
        cx_set_last_error("out of memory: device buffer of %zu bytes", bytes);
        free(b);
        return NULL;
    }
    b->bytes = bytes;
    b->refs = 1;
    cx_mem_account((int64_t)bytes);
    return b;
}

cx_buffer *cx_buffer_new(size_t bytes) { return buffer_new(bytes, false); }

cx_buffer *cx_buffer_new_collective(size_t bytes) { return buffer_new(bytes, true); }

void cx_buffer_ref(cx_buffer *b) { if (b) b->refs++; }

void cx_buffer_unref(cx_buffer *b)
{
    if (!b || --b->refs > 0) return;
    cx_mem_account(-(int64_t)b->bytes);
    size_t cap = buffer_cap(b->bytes);
    if (b->shared) cx_comm_free(b->data);
    else if (!cache_put(b->data, cap)) free(b->data);
    free(b);
}
