/* The runtime: runs an executable, keeps executables by key, and checks
 * that the ranks run the same collectives. It knows the executable format
 * and nothing of the IR or the compiler. Its files:
 *   exec.c          the executor: binds slots, runs the kernels in order,
 *                   waits for collectives, traces kernels;
 *   exec_program.c  fused kernels and reductions: the block evaluator of
 *                   programs and the hot loops that call it;
 *   exec_heavy.c    dense and data-movement kernels (matmul, conv, pool,
 *                   attention, layer norm, gather/scatter, pad, concat);
 *   exec_coll.c     collectives on the comm backend;
 *   exec_internal.h what those four share (private to them);
 *   arena.c         the block holding a run's intermediates, kept between runs;
 *   exec_cache.c    the in-memory executable cache;
 *   desync.c        the cross-rank check of collectives. */
#ifndef CX_RUNTIME_H
#define CX_RUNTIME_H

#include "executable.h"

/* Runs an executable. inputs: device pointers per input ordinal; rts:
 * runtime scalar values (as double and int64); outputs: pointers per output
 * (aliased outputs equal their input's pointer). @return CX_OK or an error. */
cx_status cx_execute(const cx_executable *e, void *const *inputs, const double *rt_f, const int64_t *rt_i,
                     void *const *outputs);

/* Desync detection (desync.c): before a graph's first collective, every
 * rank compares what it is about to run with every other rank. @return
 * CX_OK, or CX_ERR_COMM with a message naming the ranks that differ and
 * what each would run (on every rank alike). */
typedef struct cx_desync_pending cx_desync_pending;
cx_desync_pending *cx_desync_begin_graph(const cx_executable *e, cx_status *st);
cx_status cx_desync_end_graph(cx_desync_pending *p, const cx_executable *e);

/* Shared arena for intermediates (arena.c; grows; counted as device memory). */
void *cx_arena_get(int64_t bytes);
/* Frees the arena (no executable may be running). */
void cx_arena_release(void);

/* ---- the in-memory executable cache (exec_cache.c) ---- */

/* @return the executable for the key (its last use refreshed), or NULL. */
cx_executable *cx_exec_cache_find(uint64_t key_hi, uint64_t key_lo);
/* Takes e; the least recently used entry goes when the cache is full. */
void cx_exec_cache_insert(cx_executable *e);

#endif
