/* The in-memory executable cache: an LRU of compiled graphs by key
 * (CachedCompile). The persistent cache behind it is core/obs/disk_cache.c. */
#include "runtime.h"

#include <cxla/cache.h>

#define CX_CACHE_CAP 256

typedef struct {
    cx_executable *e;
    uint64_t last_use;
} cache_entry;

static cache_entry g_cache[CX_CACHE_CAP];
static int g_cache_n;
static uint64_t g_cache_clock;

cx_executable *cx_exec_cache_find(uint64_t hi, uint64_t lo)
{
    for (int i = 0; i < g_cache_n; i++)
        if (g_cache[i].e->key_hi == hi && g_cache[i].e->key_lo == lo) {
            g_cache[i].last_use = ++g_cache_clock;
            return g_cache[i].e;
        }
    return NULL;
}

void cx_exec_cache_insert(cx_executable *e)
{
    if (g_cache_n == CX_CACHE_CAP) {
        int victim = 0;
        for (int i = 1; i < g_cache_n; i++) if (g_cache[i].last_use < g_cache[victim].last_use) victim = i;
        cx_executable_free(g_cache[victim].e);
        g_cache[victim] = g_cache[--g_cache_n];
    }
    g_cache[g_cache_n++] = (cache_entry){ e, ++g_cache_clock };
}

void cx_cache_clear(void)
{
    for (int i = 0; i < g_cache_n; i++) cx_executable_free(g_cache[i].e);
    g_cache_n = 0;
    /* the executables' working memory goes with them: it only grows */
    cx_arena_release();
}
