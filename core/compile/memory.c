/* Pass 6, memory: the lifetime of every buffer slot in kernel order, and
 * the arena plan that packs every intermediate (and kernel scratch) into one
 * allocation, reusing space whose lifetimes do not overlap. */
#define _GNU_SOURCE   /* qsort_r */
#include "passes.h"

#include <limits.h>

typedef struct { cx_executable *e; int k; } live_ctx;
static void mark_read(void *p, int slot)
{
    live_ctx *l = p;
    cx_slot *s = &l->e->slots[slot];
    if (l->k > s->last) s->last = l->k;
    if (l->k < s->def) s->def = l->k;
}

void cx_pass_liveness(cx_executable *e)
{
    for (int s = 0; s < e->nslots; s++) { e->slots[s].def = INT_MAX; e->slots[s].last = -1; }
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        cx_slot *o = &e->slots[kn->out_slot];
        if (k < o->def) o->def = k;
        if (k > o->last) o->last = k;
        live_ctx l = { e, k };
        cx_kernel_each_read(kn, mark_read, &l);
        if (kn->kind == K_COLL && kn->wait_at > k) {
            /* async: the input, output and scratch stay alive until the wait */
            live_ctx w = { e, kn->wait_at };
            mark_read(&w, kn->out_slot);
            cx_kernel_each_read(kn, mark_read, &w);
        }
    }
}

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
    const cx_slot *s = ctx;
    int64_t x = s[*(const int *)a].bytes, y = s[*(const int *)b].bytes;
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

/* The lowest offset for s (size bytes) that overlaps no placed slot alive
 * at the same time, a slot counting as alive for `gap` kernels more at
 * either end. */
static int64_t lowest_offset(const cx_executable *e, const int *placed, int np, const cx_slot *s, int64_t size, int gap)
{
    int64_t off = 0;
    bool moved = true;
    while (moved) {
        moved = false;
        for (int j = 0; j < np; j++) {
            const cx_slot *t = &e->slots[placed[j]];
            int64_t tsize = (t->bytes + 63) & ~(int64_t)63;
            bool live_overlap = !(s->last + gap < t->def || t->last + gap < s->def);
            if (!live_overlap) continue;
            if (off < t->offset + tsize && t->offset < off + size) { off = t->offset + tsize; moved = true; }
        }
    }
    return off;
}

bool cx_pass_plan_memory(cx_executable *e)
{
    int *order = malloc(sizeof(int) * (size_t)(e->nslots + 1));
    int *placed = malloc(sizeof(int) * (size_t)(e->nslots + 1));
    if (!order || !placed) { free(order); free(placed); return false; }
    int n = 0;
    e->intermediate_bytes = 0;
    for (int s = 0; s < e->nslots; s++) {
        if (e->slots[s].kind != SLOT_ARENA) continue;
        if (e->slots[s].last >= 0) {
            order[n++] = s;
            e->intermediate_bytes += e->slots[s].bytes;
        } else {
            /* a dead slot (a heavy kernel's output its epilogue now takes)
             * holds nothing: sized 0 it lies inside any arena, as the
             * persistent cache's check of a loaded program demands */
            e->slots[s].bytes = 0;
            e->slots[s].offset = 0;
        }
    }
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, e->slots);
    int np = 0;
    int64_t top = 0;
    for (int i = 0; i < n; i++) {
        cx_slot *s = &e->slots[order[i]];
        int64_t size = (s->bytes + 63) & ~(int64_t)63;
        /* Where it fits under the arena's top so far, not over a slot
         * freed by the kernel just before this one's first either: a
         * kernel's inputs are read by every thread, so their lines sit in
         * every CPU's cache, and the next kernel's output written over
         * them invalidated each line in the other CPUs first. Where the
         * host put the two vCPUs on different dies (a cache-line round
         * trip of 330 ns, not 60) the seed cnn's bf16 max-pool backward,
         * written over the fc1 weight's bf16 copy its predecessor had
         * just read, took 1.3-1.7 ms, not 0.4. No placement raises the
         * arena's top for it: a DDP bucket's gradients still share one
         * buffer. */
        int64_t off = lowest_offset(e, placed, np, s, size, 1);
        if (off + size > top) off = lowest_offset(e, placed, np, s, size, 0);
        s->offset = off;
        placed[np++] = order[i];
        if (off + size > top) top = off + size;
    }
    e->arena_bytes = top;
    free(order);
    free(placed);
    return true;
}
