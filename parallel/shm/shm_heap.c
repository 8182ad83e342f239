/* The node's mutually mapped heaps (shm_heap.h). */
#define _GNU_SOURCE   /* fallocate's hole punching */
#include "shm_heap.h"

#include "cx_settings.h"
#include "cx_vec.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_ALIGN ((size_t)4096)
#define SPARE_MIN ((size_t)64 << 20)

typedef struct {
    size_t off, cap;
    bool backed;    /* its pages are reserved (a spare's may have been given back) */
} heap_block;

struct cx_shm_heap {
    int rank, size;
    uint8_t **base;       /* [size]: every rank's heap as mapped here; base[rank] is this rank's */
    size_t reserve;       /* bytes of address space per heap */
    int fd;               /* this rank's file, kept open to reserve pages as blocks go out */
    bool detached;
    pthread_mutex_t mu;
    size_t top;           /* blocks are cut from [top, reserve) */
    size_t used_bytes, peak_bytes, spare_bytes;   /* spare_bytes: spares still backed */
    heap_block *used, *spare;
    int nused, nspare, used_cap, spare_cap;
};

/* Never freed (see shm_heap.h); g_attached is cleared by cx_shm_heap_detach. */
static cx_shm_heap *g_heap;
static bool g_attached;

static size_t reserve_bytes(void)
{
    return (size_t)cx_setting_int("CX_SHM_HEAP_MIB") << 20;
}

/* This rank's file: made empty, sized sparse (tmpfs charges pages only when
 * a block reserves them) and mapped. */
static uint8_t *make_own(cx_shm_heap *h, const char *name, char *why, size_t whyn)
{
    h->fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (h->fd < 0) {
        snprintf(why, whyn, "cannot create %s: %s", name, strerror(errno));
        return NULL;
    }
    void *p = MAP_FAILED;
    bool sized = ftruncate(h->fd, (off_t)h->reserve) == 0;
    if (sized) p = mmap(NULL, h->reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, h->fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, whyn, "cannot %s %zu bytes of %s: %s", sized ? "map" : "size", h->reserve, name, strerror(errno));
        close(h->fd);
        h->fd = -1;
        shm_unlink(name);
        return NULL;
    }
    return p;
}

static uint8_t *map_peer(const cx_shm_heap *h, const char *name, char *why, size_t whyn)
{
    int fd = shm_open(name, O_RDWR, 0600);
    void *p = fd < 0 ? MAP_FAILED
                     : mmap(NULL, h->reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) snprintf(why, whyn, "cannot map %s: %s", name, strerror(errno));
    if (fd >= 0) close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static void heap_name(char *out, size_t n, const char *stem, int rank) { snprintf(out, n, "%s-%d", stem, rank); }

static bool agree(bool mine, MPI_Comm node)
{
    int m = mine, all = 0;
    MPI_Allreduce(&m, &all, 1, MPI_INT, MPI_MIN, node);
    return all;
}

/* The first failing rank's reason, on every rank (collective over node). */
static void first_reason(char *why, size_t whyn, MPI_Comm node)
{
    int rank, first = 0;
    MPI_Comm_rank(node, &rank);
    int mine = why[0] ? rank : INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, node);
    if (first == INT_MAX) snprintf(why, whyn, "a rank could not map them");
    else MPI_Bcast(why, (int)whyn, MPI_CHAR, first, node);
}

static void unmap_peers(cx_shm_heap *h)
{
    for (int r = 0; r < h->size; r++)
        if (r != h->rank && h->base[r]) {
            munmap(h->base[r], h->reserve);
            h->base[r] = NULL;
        }
}

cx_shm_heap *cx_shm_heap_open(MPI_Comm node, char *err, size_t errn)
{
    err[0] = 0;
    int size = 1;
    if (node == MPI_COMM_NULL) return NULL;
    MPI_Comm_size(node, &size);
    /* rank 0's setting decides, so ranks whose environments differ agree */
    long long reserve = (long long)reserve_bytes();
    MPI_Bcast(&reserve, 1, MPI_LONG_LONG, 0, node);
    if (size < 2 || reserve == 0 || g_heap) return NULL;
    char stem[64], name[80], why[200] = "";
    snprintf(stem, sizeof stem, "/cxla-heap-%ld-%ld", (long)getpid(), (long)time(NULL));
    MPI_Bcast(stem, sizeof stem, MPI_CHAR, 0, node);
    cx_shm_heap *h = calloc(1, sizeof *h);
    if (h) h->base = calloc((size_t)size, sizeof *h->base);
    if (h && !h->base) { free(h); h = NULL; }
    if (!h) snprintf(why, sizeof why, "out of memory");
    if (h) {
        MPI_Comm_rank(node, &h->rank);
        h->size = size;
        h->reserve = (size_t)reserve;
        heap_name(name, sizeof name, stem, h->rank);
        h->base[h->rank] = make_own(h, name, why, sizeof why);
    }
    bool ok = agree(h && h->base[h->rank], node);
    if (ok) {   /* the same answer on every rank, so every rank makes the next call */
        for (int r = 0; r < size; r++) {
            char peer[80];
            heap_name(peer, sizeof peer, stem, r);
            if (r != h->rank && !(h->base[r] = map_peer(h, peer, why, sizeof why))) break;
        }
        bool mapped = true;
        for (int r = 0; r < size; r++) mapped = mapped && h->base[r];
        ok = agree(mapped, node);
    }
    /* every rank has mapped every heap (or given up): the names can go */
    if (h && h->fd >= 0 && h->base[h->rank]) shm_unlink(name);
    if (!ok) {
        if (h) {
            unmap_peers(h);
            if (h->base[h->rank]) munmap(h->base[h->rank], h->reserve);
            if (h->fd >= 0) close(h->fd);
            free(h->base);
            free(h);
        }
        first_reason(why, sizeof why, node);
        snprintf(err, errn, "shared-memory heaps off: %s", why);
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    g_heap = h;
    g_attached = true;
    return h;
}

cx_shm_heap *cx_shm_heap_get(void) { return g_attached ? g_heap : NULL; }

/* Spares keep their pages up to as many bytes as the heap has had in use
 * at once (64 MiB at least): a step frees its buffers and asks for the same
 * ones again, so the heap holds at most twice its peak. Beyond that, and all
 * of them once detached, the spares freed longest ago give their pages back
 * to the system (the newest are the likeliest to be asked for again). A
 * spare whose pages cannot be given back keeps them. */
static void trim_spares(cx_shm_heap *h)
{
    size_t budget = h->detached ? 0 : h->peak_bytes > SPARE_MIN ? h->peak_bytes : SPARE_MIN;
    for (int i = 0; i < h->nspare && h->spare_bytes > budget; i++) {
        heap_block *b = &h->spare[i];
        if (!b->backed ||
            fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b->off, (off_t)b->cap) != 0)
            continue;
        b->backed = false;
        h->spare_bytes -= b->cap;
    }
}

void cx_shm_heap_detach(cx_shm_heap *h)
{
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->detached = true;
    unmap_peers(h);
    trim_spares(h);
    pthread_mutex_unlock(&h->mu);
    if (h == g_heap) g_attached = false;
}

/* The smallest spare block that fits without wasting more than its size:
 * its index, or -1. */
static int best_spare(const cx_shm_heap *h, size_t cap)
{
    int best = -1;
    for (int i = 0; i < h->nspare; i++)
        if (h->spare[i].cap >= cap && h->spare[i].cap <= 2 * cap && (best < 0 || h->spare[i].cap < h->spare[best].cap))
            best = i;
    return best;
}

static void *take_block(cx_shm_heap *h, size_t bytes)
{
    size_t cap = (bytes + BLOCK_ALIGN - 1) & ~(BLOCK_ALIGN - 1);
    if (!cap || h->detached || !CX_GROW(h->used, h->used_cap, h->nused + 1)) return NULL;
    heap_block b;
    int i = best_spare(h, cap);
    if (i >= 0) {
        b = h->spare[i];
        if (!b.backed && posix_fallocate(h->fd, (off_t)b.off, (off_t)b.cap) != 0) return NULL;
        if (b.backed) h->spare_bytes -= b.cap;
        b.backed = true;
        /* spares stay in the order they were freed (trim_spares) */
        memmove(&h->spare[i], &h->spare[i + 1], sizeof *h->spare * (size_t)(h->nspare - i - 1));
        h->nspare--;
    } else {
        if (cap > h->reserve - h->top) return NULL;
        /* pages now, or a clean refusal: tmpfs would otherwise hand them out
         * at first touch, and a full /dev/shm would then SIGBUS */
        if (posix_fallocate(h->fd, (off_t)h->top, (off_t)cap) != 0) return NULL;
        b = (heap_block){ h->top, cap, true };
        h->top += cap;
    }
    h->used[h->nused++] = b;
    h->used_bytes += b.cap;
    if (h->used_bytes > h->peak_bytes) h->peak_bytes = h->used_bytes;
    return h->base[h->rank] + b.off;
}

void *cx_shm_heap_alloc(size_t bytes)
{
    cx_shm_heap *h = g_heap;
    if (!h) return NULL;
    pthread_mutex_lock(&h->mu);
    void *p = take_block(h, bytes);
    pthread_mutex_unlock(&h->mu);
    return p;
}

bool cx_shm_heap_free(void *p)
{
    cx_shm_heap *h = g_heap;
    if (!h || cx_shm_heap_offset(h, p, 1) < 0) return false;
    size_t off = (size_t)((uint8_t *)p - h->base[h->rank]);
    pthread_mutex_lock(&h->mu);
    bool found = false;
    for (int i = 0; i < h->nused && !found; i++) {
        if (h->used[i].off != off) continue;
        found = true;
        heap_block b = h->used[i];
        h->used[i] = h->used[--h->nused];
        h->used_bytes -= b.cap;
        if (CX_GROW(h->spare, h->spare_cap, h->nspare + 1)) {
            h->spare[h->nspare++] = b;
            h->spare_bytes += b.cap;
        } else {   /* unrecorded, the range is lost to the heap; its pages need not be */
            (void)fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b.off, (off_t)b.cap);
        }
        trim_spares(h);
    }
    pthread_mutex_unlock(&h->mu);
    return found;
}

int cx_shm_heap_rank(const cx_shm_heap *h) { return h->rank; }

int64_t cx_shm_heap_offset(const cx_shm_heap *h, const void *p, size_t n)
{
    uintptr_t at = (uintptr_t)p, lo = (uintptr_t)h->base[h->rank];
    if (at < lo || at - lo > h->reserve || n > h->reserve - (at - lo)) return -1;
    return (int64_t)(at - lo);
}

uint8_t *cx_shm_heap_base(const cx_shm_heap *h, int node_rank) { return h->base[node_rank]; }

size_t cx_shm_heap_resident(const cx_shm_heap *h)
{
    struct stat st;
    return fstat(h->fd, &st) == 0 ? (size_t)st.st_blocks * 512 : 0;
}
