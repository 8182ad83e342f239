/* Whether a large collective writes what the other ranks read (its slots,
 * and an all-reduce's share of the result) past the caches: a choice each
 * rank makes by timing both ways (parallel/shm only).
 *
 * Which way is faster depends on where the ranks' cores sit, and on a VM
 * that changes while a job runs. Measured on a 2-vCPU AMD EPYC (Zen 4) VM,
 * 16 MiB all-reduces over 2 ranks: with both vCPUs in one core complex
 * (a cache line's round trip 55 ns) cached slot writes moved 6.8-7.6 GB/s
 * and streamed ones 5.5-6.0; with the vCPUs on two complexes (330 ns)
 * cached writes moved 2.3-3.2 GB/s and streamed ones 5.6-6.7, since a line
 * that another complex holds dirty costs its reader more than one in DRAM.
 * Streaming the result shares as well took the second case to 7.9-8.1
 * GB/s (16 MiB) and 6.9-7.7 (64 MiB, against 3.3 with cached results).
 * So each rank keeps the faster way, and tries the other every
 * CX_SHM_TUNE_EVERY calls in case the cores have moved. The ways differ
 * only in speed: ranks that choose differently still agree on every byte. */
#ifndef CX_PARALLEL_SHM_TUNE_H
#define CX_PARALLEL_SHM_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { CX_SHM_CACHED = 0, CX_SHM_STREAMED = 1 } cx_shm_way;

#define CX_SHM_TUNE_EVERY 32

typedef struct {
    double cost[2];    /* per way: seconds per byte, a moving average; 0 until timed */
    uint64_t calls;
    bool looking;      /* the last pick was the look at the other way */
} cx_shm_tuner;

/* The way for the next call: each untimed way first, then the cheaper,
 * and the other one every CX_SHM_TUNE_EVERY calls. */
cx_shm_way cx_shm_tuner_pick(cx_shm_tuner *t);
/* Folds one call's time into its way's average; a look at the other way
 * replaces that way's figure instead, so one slow look (a rank descheduled
 * mid-call) is forgotten at the next. Calls of no bytes or no measurable
 * time are ignored. */
void cx_shm_tuner_record(cx_shm_tuner *t, cx_shm_way way, double seconds, size_t bytes);

#endif
