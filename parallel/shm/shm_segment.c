/* The shared segment of one communicator: made, mapped by every rank,
 * unlinked at once; and the barrier the collectives order their chunks by. */
#include "shm_internal.h"

#include "cx_settings.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What rank 0 of the communicator tells the others about the segment. */
typedef struct {
    int ok;
    int gathers;     /* CX_SHM_COLLECTIVES=all: all-gathers and broadcasts too */
    int64_t chunk, bytes;
    char name[64];
    char why[160];
} seg_info;

bool cx_shm_wanted(void)
{
    return cx_setting_enum("CX_SHM_COLLECTIVES") != 0;   /* 0|1|all */
}

static size_t chunk_bytes(void)
{
    return (size_t)cx_setting_int("CX_SHM_CHUNK_KIB") << 10;
}

/* Results from this size up are written with streaming stores: measured on
 * a 2-core Xeon (AVX-512), 64 MiB all-reduces gained 20-25 % and 16 MiB
 * ones lost 4 %, so the default sits between. */
static size_t stream_min_bytes(void)
{
    return (size_t)(cx_setting_double("CX_SHM_STREAM_MIB") * 1048576.0);
}

/* CX_SHM_SLOT_WRITES=cached or streamed fixes the way every collective
 * writes its slots (tests use it to reach the streamed path with small
 * messages); anything else leaves it to the timing (shm_tune.h). */
static int slot_writes_setting(void)
{
    switch (cx_setting_enum("CX_SHM_SLOT_WRITES")) {   /* auto|cached|streamed */
    case 1: return CX_SHM_CACHED;
    case 2: return CX_SHM_STREAMED;
    default: return -1;
    }
}

static double collective_timeout(void)
{
    return cx_setting_double("CX_COLLECTIVE_TIMEOUT");
}

static size_t flags_bytes(int size) { return ((size_t)size * sizeof(shm_flag) + 4095) & ~(size_t)4095; }

static size_t segment_bytes(int size, size_t chunk) { return flags_bytes(size) + 2 * ((size_t)size * chunk + 2 * chunk); }

/* Rank 0: a new segment, reserved in full (tmpfs hands out pages lazily, and
 * a full /dev/shm would otherwise kill a rank with SIGBUS mid-collective). */
static void *create_segment(seg_info *si)
{
    static int serial;
    snprintf(si->name, sizeof si->name, "/cxla-shm-%ld-%d-%ld", (long)getpid(), serial++, (long)time(NULL));
    int fd = shm_open(si->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        snprintf(si->why, sizeof si->why, "cannot create %s: %s", si->name, strerror(errno));
        return NULL;
    }
    int rc = posix_fallocate(fd, 0, (off_t)si->bytes);
    void *p = rc ? MAP_FAILED : mmap(NULL, (size_t)si->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rc || p == MAP_FAILED) {
        snprintf(si->why, sizeof si->why, "cannot reserve %lld bytes in /dev/shm: %s", (long long)si->bytes,
                 strerror(rc ? rc : errno));
        close(fd);
        shm_unlink(si->name);
        return NULL;
    }
    close(fd);
    return p;   /* a new tmpfs file reads as zeros: every arrival count starts at 0 */
}

static void *map_segment(const seg_info *si, char *why, size_t whyn)
{
    int fd = shm_open(si->name, O_RDWR, 0600);
    void *p = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)si->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) snprintf(why, whyn, "cannot map %s: %s", si->name, strerror(errno));
    if (fd >= 0) close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static void lay_out(cx_shm *s, uint8_t *base, size_t chunk)
{
    s->base = base;
    s->chunk = chunk;
    s->flags = (shm_flag *)base;
    uint8_t *p = base + flags_bytes(s->size);
    for (int set = 0; set < 2; set++) {
        s->slots[set] = p;
        p += (size_t)s->size * chunk;
        s->result[set] = p;
        p += 2 * chunk;
    }
}

int cx_shm_split_node(MPI_Comm c, MPI_Comm *node)
{
    int rank, world_rank;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    long per = (long)cx_setting_int("CX_SHM_NODE_RANKS");
    if (per > 0) return MPI_Comm_split(c, (int)(world_rank / per), rank, node);
    return MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node);
}

/* Whether every rank of c runs on this node; collective over c. */
static bool one_node(MPI_Comm c, int size)
{
    MPI_Comm node;
    if (cx_shm_split_node(c, &node) != MPI_SUCCESS) return false;
    int n = 0;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    int mine = n == size, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, c);
    return all;
}

/* Each rank's place among the node's heaps, so an all-reduce can find the
 * others' outputs (collective over c, every rank of which is in the heaps'
 * node). Without heaps on every rank, or memory for the table, s gets none. */
static void heap_ranks(cx_shm *s, MPI_Comm c, int size)
{
    cx_shm_heap *heap = cx_shm_heap_get();
    int mine = heap ? cx_shm_heap_rank(heap) : -1;
    int *ranks = malloc(sizeof(int) * (size_t)size);
    int have = ranks != NULL && s != NULL, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, c);
    if (all) MPI_Allgather(&mine, 1, MPI_INT, ranks, 1, MPI_INT, c);
    for (int r = 0; all && r < size; r++) all = ranks[r] >= 0;
    if (!all) {
        free(ranks);
        return;
    }
    s->heap = heap;
    s->heap_rank = ranks;
}

cx_shm *cx_shm_open(MPI_Comm c, char *err, size_t errn)
{
    err[0] = 0;
    int rank, size;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    /* the decision is rank 0's, so ranks whose settings differ still agree */
    seg_info si = { .ok = cx_shm_wanted(), .gathers = cx_setting_enum("CX_SHM_COLLECTIVES") == 2 };
    if (!one_node(c, size)) return NULL;
    /* a reduce-scatter chunk holds a piece for every rank */
    si.chunk = (int64_t)chunk_bytes();
    if (si.chunk < (int64_t)size * 64) si.chunk = (int64_t)size * 64;
    si.bytes = (int64_t)segment_bytes(size, (size_t)si.chunk);
    uint8_t *base = NULL;
    if (rank == 0 && si.ok) si.ok = (base = create_segment(&si)) != NULL;
    MPI_Bcast(&si, (int)sizeof si, MPI_BYTE, 0, c);
    if (!si.ok && !si.why[0]) return NULL;   /* turned off */
    char why[160] = "";
    if (rank != 0 && si.ok) base = map_segment(&si, why, sizeof why);
    int mine = base != NULL || !si.ok, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, c);
    /* every rank has it mapped (or has given up): the name can go */
    if (rank == 0 && si.ok) shm_unlink(si.name);
    cx_shm *s = all && si.ok ? calloc(1, sizeof *s) : NULL;
    if (si.ok && all) heap_ranks(s, c, size);
    if (!s) {
        if (base) munmap(base, (size_t)si.bytes);
        snprintf(err, errn, "shared-memory collectives off, using MPI: %s",
                 si.why[0] ? si.why : why[0] ? why : all ? "out of memory" : "a rank could not map the segment");
        return NULL;
    }
    s->rank = rank;
    s->size = size;
    s->gathers = si.gathers;
    s->bytes = (size_t)si.bytes;
    s->timeout = collective_timeout();
    s->stream_min = stream_min_bytes();
    s->slot_writes = slot_writes_setting();
    lay_out(s, base, (size_t)si.chunk);
    return s;
}

bool cx_shm_takes_gathers(const cx_shm *s) { return s && s->gathers; }

void cx_shm_close(cx_shm *s)
{
    if (!s) return;
    munmap(s->base, s->bytes);
    free(s->heap_rank);
    free(s);
}

double cx_shm_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Spin briefly (the others are usually a few microseconds behind), then
 * yield the core (ranks may outnumber cores), then sleep in short naps. */
static void back_off(unsigned spins)
{
    if (spins < 256) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    } else if (spins < 2048) {
        sched_yield();
    } else {
        struct timespec nap = { 0, 20000 };
        nanosleep(&nap, NULL);
    }
}

cx_status cx_shm_barrier(cx_shm *s, const char *what, char *err, size_t errn)
{
    uint64_t target = ++s->arrivals;
    atomic_store_explicit(&s->flags[s->rank].arrived, target, memory_order_release);
    for (int r = 0; r < s->size; r++) {
        double t0 = 0;
        for (unsigned spins = 0; atomic_load_explicit(&s->flags[r].arrived, memory_order_acquire) < target; spins++) {
            back_off(spins);
            if (s->timeout <= 0 || (spins & 255) != 255) continue;
            if (t0 == 0) t0 = cx_shm_now();
            else if (cx_shm_now() - t0 > s->timeout) {
                snprintf(err, errn, "shared-memory %s: rank %d of this node's group did not arrive within %g s "
                         "(CX_COLLECTIVE_TIMEOUT)", what, r, s->timeout);
                return CX_ERR_COMM;
            }
        }
    }
    return CX_OK;
}
