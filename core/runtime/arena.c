/* The arena: one block holding every intermediate and kernel scratch of
 * the executable being run (the slots' offsets are planned at compile time),
 * kept across runs and grown to the largest executable, so steady steps
 * take no new memory. Taken from the comm backend's memory so collectives on the node
 * reach buffers in it in place. */
#include "runtime.h"
#include "backend.h"
#include "buffer.h"

static void *g_arena;
static int64_t g_arena_bytes;
static uint64_t g_arena_generation;   /* the backend's, when the arena was taken */

void *cx_arena_get(int64_t bytes)
{
    /* a new backend (cx_dist_init, finalize): the arena is taken again from
     * its memory, where collectives on the node can reach it in place */
    if (g_arena && g_arena_generation != cx_comm_generation()) cx_arena_release();
    if (bytes <= g_arena_bytes) return g_arena;
    if (cx_mem_check(bytes - g_arena_bytes, "the intermediate arena") != CX_OK) return NULL;
    cx_comm_free(g_arena);
    cx_mem_account(-g_arena_bytes);
    g_arena_bytes = 0;
    /* from the backend: a collective whose buffers lie in the arena is then
     * read and written in place by the node's other ranks */
    g_arena = cx_comm_alloc((size_t)bytes);
    g_arena_generation = cx_comm_generation();
    if (!g_arena) { cx_set_last_error("out of memory: arena of %lld bytes", (long long)bytes); return NULL; }
    g_arena_bytes = bytes;
    cx_mem_account(bytes);
    return g_arena;
}

void cx_arena_release(void)
{
    cx_comm_free(g_arena);
    cx_mem_account(-g_arena_bytes);
    g_arena = NULL;
    g_arena_bytes = 0;
}
