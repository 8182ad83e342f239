/* Pass 6, memory: the lifetime of every buffer slot in kernel order, and
 * the arena plan that packs every intermediate (and kernel scratch) into one
 * allocation, reusing space whose lifetimes do not overlap. */
#define _GNU_SOURCE   /* qsort_r */
#include "passes.h"

#include <limits.h>
#include <string.h>

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

static int cmp_first_use(const void *a, const void *b, void *ctx)
{
    const cx_slot *s = ctx, *p = &s[*(const int *)a], *q = &s[*(const int *)b];
    if (p->def != q->def) return p->def < q->def ? -1 : 1;
    return cmp_size_desc(a, b, ctx);
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

/* Places the slots in the given order, each at the lowest offset that
 * fits. @return the arena's top. */
static int64_t place(cx_executable *e, const int *order, int n, int *placed)
{
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
    return top;
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
    /* Two greedy orders, the smaller arena kept: largest first packs a
     * step of few sizes tightly (the default gpt's f32 arena is its most
     * bytes live at once), first use first packs one whose big buffers
     * are born in a row better (its bf16-mixed arena: 85.0 MB, not 86.3,
     * over 83.9 live at once). */
    int64_t *by_size = malloc(sizeof(int64_t) * (size_t)(n + 1));   /* the first plan's offsets */
    if (!by_size) { free(order); free(placed); return false; }
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, e->slots);
    int64_t top = place(e, order, n, placed);
    for (int i = 0; i < n; i++) by_size[i] = e->slots[order[i]].offset;
    int *first_use = placed;   /* place() has filled it with order's slots: sort that copy */
    int *scratch = malloc(sizeof(int) * (size_t)(n + 1));
    if (!scratch) { free(by_size); free(order); free(placed); return false; }
    qsort_r(first_use, (size_t)n, sizeof(int), cmp_first_use, e->slots);
    int64_t top_first_use = place(e, first_use, n, scratch);
    free(scratch);
    if (top_first_use < top) top = top_first_use;
    else for (int i = 0; i < n; i++) e->slots[order[i]].offset = by_size[i];
    free(by_size);
    e->arena_bytes = top;
    free(order);
    free(placed);
    return true;
}
