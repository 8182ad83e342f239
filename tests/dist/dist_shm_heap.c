/* The node's heaps (parallel/shm/shm_heap.h), white-box, on every rank:
 * a block one rank writes is what the others read through their mappings
 * and the reverse; a freed block is handed out again for the same size;
 * memory outside the heap is refused; a request larger than the heap gets
 * NULL and cx_comm_alloc then gives ordinary memory; freed blocks keep
 * their pages up to the heap's peak in use, the longest-freed giving theirs
 * back first, and every spare gives them back at cx_dist_finalize.
 * Run with CX_SHM_HEAP_MIB=256. */
#include "dist_check.h"
#include "shm_heap.h"

#include <cxla/comm.h>

#include <mpi.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

/* Each rank fills a block with its rank, every other rank adds its own
 * rank + 1 to one word of it, and the owner checks them all. */
static void check_visible(cx_shm_heap *h, int rank, int world)
{
    size_t n = MIB / sizeof(int64_t);
    int64_t *mine = cx_shm_heap_alloc(MIB);
    CHECK(mine != NULL, "no 1 MiB block");
    if (!mine) return;
    for (size_t i = 0; i < n; i++) mine[i] = rank;
    int64_t at = cx_shm_heap_offset(h, mine, MIB), offs[64];
    CHECK(at >= 0, "a block of the heap is not inside it");
    MPI_Allgather(&at, 1, MPI_INT64_T, offs, 1, MPI_INT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < world; r++) {
        int64_t *theirs = (int64_t *)(cx_shm_heap_base(h, r) + offs[r]);
        CHECK(theirs[n - 1] == r, "rank %d's block reads %lld here", r, (long long)theirs[n - 1]);
        if (r != rank) theirs[rank] = rank + 1000;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int r = 0; r < world; r++)
        if (r != rank) CHECK(mine[r] == r + 1000, "rank %d's write into this block reads %lld", r, (long long)mine[r]);
    CHECK(cx_shm_heap_free(mine), "the heap did not take its block back");
}

static void check_reuse_and_refusals(cx_shm_heap *h)
{
    void *a = cx_shm_heap_alloc(3 * MIB);
    CHECK(a && cx_shm_heap_free(a), "a 3 MiB block");
    void *b = cx_shm_heap_alloc(3 * MIB);
    CHECK(b == a, "a freed block is not handed out again for the same size");
    cx_shm_heap_free(b);
    int64_t word = 0;
    CHECK(cx_shm_heap_offset(h, &word, sizeof word) < 0, "a stack variable lies in the heap");
    CHECK(!cx_shm_heap_free(&word), "the heap took back memory that is not its own");
    CHECK(cx_shm_heap_alloc(300 * MIB) == NULL, "300 MiB out of a 256 MiB heap");
    void *big = cx_comm_alloc(300 * MIB);
    CHECK(big != NULL, "cx_comm_alloc gave nothing when the heap was full: %s", cx_last_error());
    CHECK(!big || cx_shm_heap_offset(h, big, 1) < 0, "a block larger than the heap lies in it");
    if (big) memset(big, 1, 300 * MIB);
    cx_comm_free(big);
}

/* After check_reuse_and_refusals: peak 3 MiB, one 3 MiB spare. */
static void check_pages(cx_shm_heap *h)
{
    void *small = cx_shm_heap_alloc(40 * MIB);
    CHECK(small != NULL, "a 40 MiB block");
    cx_shm_heap_free(small);   /* within the 64 MiB kept at least */
    CHECK(cx_shm_heap_resident(h) >= 43 * MIB, "the freed spares hold %zu bytes, want 43 MiB",
          cx_shm_heap_resident(h));
    void *large = cx_shm_heap_alloc(100 * MIB);   /* no spare is large enough: new pages, peak 100 MiB */
    CHECK(large != NULL, "a 100 MiB block");
    cx_shm_heap_free(large);   /* spares 143 MiB > peak: the 3 and the 40 MiB ones give theirs back */
    size_t resident = cx_shm_heap_resident(h);
    CHECK(resident >= 100 * MIB && resident < 101 * MIB, "the heap holds %zu bytes after trimming, want 100 MiB",
          resident);
    void *again = cx_shm_heap_alloc(100 * MIB);
    CHECK(again == large, "the newest spare is not handed out again");
    cx_shm_heap_free(again);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal(), world = cx_world_size();
    cx_shm_heap *h = cx_shm_heap_get();
    CHECK(h != NULL, "no heaps on one node (CX_SHM_HEAP_MIB=%s)", getenv("CX_SHM_HEAP_MIB"));
    if (h && world <= 64) {
        check_visible(h, rank, world);
        check_reuse_and_refusals(h);
        check_pages(h);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int failures = g_failures;
    cx_dist_finalize();
    if (h) CHECK(cx_shm_heap_resident(h) == 0, "after finalize the heap still holds %zu bytes", cx_shm_heap_resident(h));
    if (g_failures) fprintf(stderr, "dist_shm_heap: rank %d: %d check(s) failed\n", rank, g_failures);
    else if (rank == 0 && !failures) printf("dist_shm_heap: all checks passed on %d ranks\n", world);
    return g_failures ? 1 : 0;
}
