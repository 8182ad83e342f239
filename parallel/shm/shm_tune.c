/* The slot-write tuner (see shm_tune.h). */
#include "shm_tune.h"

cx_shm_way cx_shm_tuner_pick(cx_shm_tuner *t)
{
    t->calls++;
    t->looking = false;
    if (t->cost[CX_SHM_CACHED] == 0) return CX_SHM_CACHED;
    if (t->cost[CX_SHM_STREAMED] == 0) return CX_SHM_STREAMED;
    cx_shm_way best = t->cost[CX_SHM_STREAMED] < t->cost[CX_SHM_CACHED] ? CX_SHM_STREAMED : CX_SHM_CACHED;
    if (t->calls % CX_SHM_TUNE_EVERY != 0) return best;
    t->looking = true;
    return best == CX_SHM_CACHED ? CX_SHM_STREAMED : CX_SHM_CACHED;
}

/* Half the weight on the newest call: the cores move within seconds, and
 * one slow call of the way in use is forgotten after a few. */
void cx_shm_tuner_record(cx_shm_tuner *t, cx_shm_way way, double seconds, size_t bytes)
{
    bool look = t->looking;
    t->looking = false;
    if (bytes == 0 || !(seconds > 0)) return;
    double per_byte = seconds / (double)bytes;
    double *c = &t->cost[way];
    *c = *c == 0 || look ? per_byte : 0.5 * *c + 0.5 * per_byte;
}
