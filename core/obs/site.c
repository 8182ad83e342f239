/* XLA_IR_DEBUG: the user's line that made each IR node. A node keeps a
 * 32-bit index (cx_node.loc, in padding the node had anyway); the index
 * names a return address, the first frame of the recording thread's stack
 * outside libcxla, interned once per address. Resolving an address to a
 * function, file and line (libdw, frames.c) is the expensive part, so it
 * waits until a dump, the analysis or a desync message prints it.
 *
 * Nothing here runs unless XLA_IR_DEBUG is on: the node maker tests the
 * flag before calling the hook. */
#define _GNU_SOURCE   /* dladdr, dl_iterate_phdr */
#include "obs_internal.h"
#include "frames.h"
#include "cx_vec.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <unwind.h>

typedef struct {
    uintptr_t pc;
    cx_obs_frame *fr;   /* NULL until first printed */
} site;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static site *g_sites;                 /* [0] is "no location" */
static int g_nsites, g_sites_cap;
static uint32_t *g_tab;               /* open addressing: pc -> index */
static size_t g_tab_cap;
typedef struct { uintptr_t lo, hi; } range;
static range g_self, g_libc;   /* libcxla's and libc's loaded segments */

/* ctx: a range whose lo is an address inside the object wanted */
static int find_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    range *r = ctx;
    uintptr_t me = r->lo, lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo) lo = a;
        if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
    }
    if (me < lo || me >= hi) return 0;
    *r = (range){ lo, hi };
    return 1;
}

static void init_ranges(void)
{
    g_self.lo = (uintptr_t)init_ranges;
    g_libc.lo = (uintptr_t)abort;
    if (!dl_iterate_phdr(find_object, &g_self)) g_self = (range){ 0, 0 };
    if (!dl_iterate_phdr(find_object, &g_libc)) g_libc = (range){ 0, 0 };
}

static bool tab_put(uint32_t idx)
{
    if ((size_t)g_nsites * 2 >= g_tab_cap) {
        size_t cap = g_tab_cap ? g_tab_cap * 2 : 1024;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) return false;
        for (size_t i = 0; i < g_tab_cap; i++) {
            if (!g_tab[i]) continue;
            size_t h = (g_sites[g_tab[i]].pc * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1);
            while (t[h]) h = (h + 1) & (cap - 1);
            t[h] = g_tab[i];
        }
        free(g_tab);
        g_tab = t;
        g_tab_cap = cap;
    }
    size_t h = (g_sites[idx].pc * 0x9E3779B97F4A7C15ull >> 17) & (g_tab_cap - 1);
    while (g_tab[h]) h = (h + 1) & (g_tab_cap - 1);
    g_tab[h] = idx;
    return true;
}

/* @return pc's index, 0 when out of memory. Under g_mu. */
static uint32_t intern(uintptr_t pc)
{
    if (g_tab_cap) {
        size_t h = (pc * 0x9E3779B97F4A7C15ull >> 17) & (g_tab_cap - 1);
        for (; g_tab[h]; h = (h + 1) & (g_tab_cap - 1))
            if (g_sites[g_tab[h]].pc == pc) return g_tab[h];
    }
    if (g_nsites == 0 && !CX_GROW(g_sites, g_sites_cap, 1)) return 0;
    if (g_nsites == 0) g_sites[g_nsites++] = (site){ 0, NULL };
    if (g_nsites == INT32_MAX || !CX_GROW(g_sites, g_sites_cap, g_nsites + 1)) return 0;
    g_sites[g_nsites] = (site){ pc, NULL };
    if (!tab_put((uint32_t)g_nsites)) return 0;
    return (uint32_t)g_nsites++;
}

typedef struct { uintptr_t pc; int depth; } walk;

/* stops at the first frame outside libcxla: unwinding costs per frame, and
 * the user's callers, main and libc's start are never needed */
static _Unwind_Reason_Code walk_frame(struct _Unwind_Context *ctx, void *arg)
{
    walk *w = arg;
    uintptr_t a = (uintptr_t)_Unwind_GetIP(ctx);
    if (a == 0 || ++w->depth > 64) return _URC_END_OF_STACK;
    if (a >= g_self.lo && a < g_self.hi) return _URC_NO_REASON;
    w->pc = a;
    return _URC_END_OF_STACK;
}

/* The first return address outside libcxla. A thread the library started
 * (the data loader) has none: its next frame out is libc's thread start. */
static uint32_t site_capture(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_ranges);
    walk w = { 0, 0 };
    _Unwind_Backtrace(walk_frame, &w);
    uintptr_t pc = w.pc;
    if (!pc || (pc >= g_libc.lo && pc < g_libc.hi)) return 0;
    pthread_mutex_lock(&g_mu);
    uint32_t idx = intern(pc);
    pthread_mutex_unlock(&g_mu);
    return idx;
}

/* The frame of a location, resolved on first use. @return NULL for 0, an
 * unknown index, or when out of memory. */
const cx_obs_frame *cx_obs_site(uint32_t loc)
{
    pthread_mutex_lock(&g_mu);
    uintptr_t pc = loc && (int)loc < g_nsites ? g_sites[loc].pc : 0;
    cx_obs_frame *fr = pc ? g_sites[loc].fr : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!pc || fr) return fr;
    cx_obs_frame chain[4];
    const char *sym;
    uintptr_t off;
    /* a return address points after the call; -1 lands in it */
    int n = cx_obs_frame_lookup(pc - 1, chain, 4, &sym, &off);
    if (!(fr = malloc(sizeof *fr))) return NULL;
    if (n > 0) {
        *fr = chain[0];   /* the innermost: the line that called into libcxla */
    } else {
        Dl_info di;
        const char *mod = dladdr((void *)pc, &di) && di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        snprintf(fr->fn, sizeof fr->fn, "%s", sym ? sym : "??");
        snprintf(fr->file, sizeof fr->file, "%s+0x%lx", mod ? mod + 1 : "?",
                 (unsigned long)(pc - 1 - (mod ? (uintptr_t)di.dli_fbase : 0)));
        fr->line = 0;
    }
    pthread_mutex_lock(&g_mu);
    if (g_sites[loc].fr) { free(fr); fr = g_sites[loc].fr; }
    else g_sites[loc].fr = fr;
    pthread_mutex_unlock(&g_mu);
    return fr;
}

void cx_obs_site_str(uint32_t loc, char *buf, size_t cap)
{
    const cx_obs_frame *fr = cx_obs_site(loc);
    if (!fr) snprintf(buf, cap, "?");
    else if (fr->line > 0) snprintf(buf, cap, "%s:%d", fr->file, fr->line);
    else snprintf(buf, cap, "%s (%s)", fr->fn, fr->file);
}

/* "file:line" with the file's last component: desync messages are short */
static void site_short(uint32_t loc, char *buf, size_t cap)
{
    const cx_obs_frame *fr = cx_obs_site(loc);
    const char *base = fr ? strrchr(fr->file, '/') : NULL;
    if (!fr) snprintf(buf, cap, "?");
    else if (fr->line > 0) snprintf(buf, cap, "%s:%d", base ? base + 1 : fr->file, fr->line);
    else snprintf(buf, cap, "%s", fr->fn);
}

__attribute__((constructor)) static void register_site(void)
{
    cx_obs_hooks.site = site_capture;
    cx_obs_hooks.site_str = site_short;
}
