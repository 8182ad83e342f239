/* The four shared-memory collectives, chunk by chunk (see shm.h for why a
 * slot may be rewritten after one barrier). */
#include "shm_internal.h"

#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The buffer set of the next chunk. */
static int next_set(cx_shm *s) { return (int)(s->chunks++ & 1); }

/* Messages from this size up choose how they write their slots (shm_tune.h);
 * smaller ones stay in the caches, where the others find them soonest. */
#define TUNE_MIN_BYTES ((size_t)512 << 10)

/* How one call writes its slots, and the tuner that learns how it went
 * (NULL: a fixed way). */
typedef struct {
    cx_shm_way way;
    cx_shm_tuner *tuner;
    double t0;
    size_t bytes;
    bool arrived;   /* past the call's first barrier */
} slot_plan;

static slot_plan plan_slots(cx_shm *s, int kind, size_t bytes)
{
    slot_plan p = { .way = CX_SHM_CACHED, .bytes = bytes };
    if (s->slot_writes >= 0) {
        p.way = (cx_shm_way)s->slot_writes;
        return p;
    }
    if (bytes < TUNE_MIN_BYTES) return p;
    int size_class = bytes < ((size_t)4 << 20) ? 0 : bytes < ((size_t)32 << 20) ? 1 : 2;
    p.tuner = &s->tune[kind][size_class];
    p.way = cx_shm_tuner_pick(p.tuner);
    p.t0 = cx_shm_now();
    return p;
}

static void slots_done(const slot_plan *p)
{
    if (p->tuner) cx_shm_tuner_record(p->tuner, p->way, cx_shm_now() - p->t0, p->bytes);
}

/* The barrier after a chunk's slot writes, which fences streamed ones once
 * for all of the chunk's pieces. The first one's wait is left out of the
 * call's time: it measures how late the other ranks came to the
 * collective, which neither way changes, and would drown the difference. */
static cx_status slot_barrier(cx_shm *s, slot_plan *p, const char *what, char *err, size_t errn)
{
    if (p->way == CX_SHM_STREAMED) cx_shm_stream_fence();
    double before = p->tuner && !p->arrived ? cx_shm_now() : 0;
    cx_status st = cx_shm_barrier(s, what, err, errn);
    if (before > 0) p->t0 += cx_shm_now() - before;
    p->arrived = true;
    return st;
}

/* Streamed writes are left unfenced: slot_barrier fences them. */
static void slot_write(void *slot, const void *src, size_t n, cx_shm_way way)
{
    if (way == CX_SHM_STREAMED) cx_shm_copy_stream_unfenced(slot, src, n);
    else memcpy(slot, src, n);
}

/* The streamed way's reduction of this rank's share: written past the
 * caches to the result area, which the other ranks read, and through them
 * to this rank's output. Reduced straight into the output when that is not
 * the rank's own input (15 % faster than the scratch below, measured at 16
 * and 64 MiB); in place, a block at a time into scratch that stays in L1,
 * since the kernel writes its first source's sum before it reads the rest. */
static void reduce_share_streamed(int n, uint8_t *out, uint8_t *res, const void *const *src, int64_t m, cx_dtype dt,
                                  cx_reduce_op red, double scale, bool in_place)
{
    size_t es = cx_dtype_size(dt), rs = cx_shm_result_size(dt);
    if (!in_place && rs == es) {
        cx_shm_reduce(out, src, n, m, dt, red);
        cx_shm_copy_stream(res, out, (size_t)m * es);
        if (scale != 1.0) cx_shm_copy_out(out, out, m, dt, scale, false);
        return;
    }
    _Alignas(64) uint8_t scratch[16384];
    int64_t per = (int64_t)(sizeof scratch / rs);
    const void *block[n];
    for (int64_t b = 0; b < m; b += per) {
        int64_t e = min64(per, m - b);
        for (int r = 0; r < n; r++) block[r] = (const uint8_t *)src[r] + (size_t)b * es;
        cx_shm_reduce(scratch, block, n, e, dt, red);
        cx_shm_copy_stream_unfenced(res + (size_t)b * rs, scratch, (size_t)e * rs);
        cx_shm_copy_out(out + (size_t)b * es, scratch, e, dt, scale, false);
    }
    cx_shm_stream_fence();
}

/* Rank r's share [*lo, *hi) of m elements, in whole cache lines of 64
 * bytes where the count allows, so no two ranks write one line. */
static void share_of(int64_t m, size_t res_size, int size, int r, int64_t *lo, int64_t *hi)
{
    int64_t line = (int64_t)(64 / res_size);
    int64_t per = (m + size - 1) / size;
    per = (per + line - 1) / line * line;
    *lo = min64((int64_t)r * per, m);
    *hi = min64(*lo + per, m);
}

/* Each rank reduces its own share of every chunk, reading that share of
 * its own input where it lies (only the shares the others reduce are
 * copied into its slot), and writes its share of the result out while it
 * is still in cache; after the second barrier it copies the others'. */
cx_status cx_shm_all_reduce(cx_shm *s, void *out, const void *in, int64_t count, cx_dtype dt, cx_reduce_op red,
                            double scale, char *err, size_t errn)
{
    size_t es = cx_dtype_size(dt), rs = cx_shm_result_size(dt);
    bool stream = (size_t)count * es >= s->stream_min;
    int64_t per_chunk = (int64_t)(s->chunk / es);
    const void *src[s->size];
    slot_plan plan = plan_slots(s, SHM_ALL_REDUCE, (size_t)count * es);
    uintptr_t in_at = (uintptr_t)in, out_at = (uintptr_t)out, span = (uintptr_t)count * es;
    bool in_place = in_at < out_at + span && out_at < in_at + span;
    for (int64_t off = 0; off < count; off += per_chunk) {
        int64_t m = min64(per_chunk, count - off), lo, hi;
        int set = next_set(s);
        const uint8_t *mine = (const uint8_t *)in + (size_t)off * es;
        uint8_t *slot = shm_slot(s, set, s->rank), *dst = (uint8_t *)out + (size_t)off * es;
        share_of(m, rs, s->size, s->rank, &lo, &hi);
        slot_write(slot, mine, (size_t)lo * es, plan.way);
        slot_write(slot + (size_t)hi * es, mine + (size_t)hi * es, (size_t)(m - hi) * es, plan.way);
        if (slot_barrier(s, &plan, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) src[r] = (r == s->rank ? mine : shm_slot(s, set, r)) + (size_t)lo * es;
        if (plan.way == CX_SHM_STREAMED) {
            reduce_share_streamed(s->size, dst + (size_t)lo * es, s->result[set] + (size_t)lo * rs, src, hi - lo, dt,
                                  red, scale, in_place);
        } else {
            cx_shm_reduce(s->result[set] + (size_t)lo * rs, src, s->size, hi - lo, dt, red);
            cx_shm_copy_out(dst + (size_t)lo * es, s->result[set] + (size_t)lo * rs, hi - lo, dt, scale, stream);
        }
        if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
        cx_shm_copy_out(dst, s->result[set], lo, dt, scale, stream);
        cx_shm_copy_out(dst + (size_t)hi * es, s->result[set] + (size_t)hi * rs, m - hi, dt, scale, stream);
    }
    slots_done(&plan);
    return CX_OK;
}

/* Each slot holds, per destination rank, the next piece of its block; the
 * destination alone reduces its pieces, into its own part of the result
 * area, and scales them out. */
cx_status cx_shm_reduce_scatter(cx_shm *s, void *out, const void *in, int64_t count, cx_dtype dt,
                                cx_reduce_op red, double scale, char *err, size_t errn)
{
    size_t es = cx_dtype_size(dt), rs = cx_shm_result_size(dt);
    int64_t piece = (int64_t)(s->chunk / es) / s->size;
    bool stream = (size_t)count * es >= s->stream_min;
    const void *src[s->size];
    slot_plan plan = plan_slots(s, SHM_REDUCE_SCATTER, (size_t)count * es * (size_t)s->size);
    for (int64_t off = 0; off < count; off += piece) {
        int64_t m = min64(piece, count - off);
        int set = next_set(s);
        uint8_t *mine = shm_slot(s, set, s->rank);
        for (int d = 0; d < s->size; d++)
            slot_write(mine + (size_t)(d * piece) * es, (const uint8_t *)in + (size_t)(d * count + off) * es,
                       (size_t)m * es, plan.way);
        if (slot_barrier(s, &plan, "reduce_scatter", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) src[r] = shm_slot(s, set, r) + (size_t)(s->rank * piece) * es;
        uint8_t *acc = s->result[set] + (size_t)(s->rank * piece) * rs;
        cx_shm_reduce(acc, src, s->size, m, dt, red);
        cx_shm_copy_out((uint8_t *)out + (size_t)off * es, acc, m, dt, scale, stream);
    }
    slots_done(&plan);
    return CX_OK;
}

cx_status cx_shm_all_gather(cx_shm *s, void *out, const void *in, int64_t bytes, char *err, size_t errn)
{
    int64_t per_chunk = (int64_t)s->chunk;
    slot_plan plan = plan_slots(s, SHM_ALL_GATHER, (size_t)bytes * (size_t)s->size);
    for (int64_t off = 0; off < bytes; off += per_chunk) {
        int64_t m = min64(per_chunk, bytes - off);
        int set = next_set(s);
        slot_write(shm_slot(s, set, s->rank), (const uint8_t *)in + off, (size_t)m, plan.way);
        if (slot_barrier(s, &plan, "all_gather", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) memcpy((uint8_t *)out + r * bytes + off, shm_slot(s, set, r), (size_t)m);
    }
    slots_done(&plan);
    return CX_OK;
}

cx_status cx_shm_broadcast(cx_shm *s, void *buf, int64_t bytes, int root, char *err, size_t errn)
{
    int64_t per_chunk = (int64_t)s->chunk;
    slot_plan plan = plan_slots(s, SHM_BROADCAST, (size_t)bytes);
    for (int64_t off = 0; off < bytes; off += per_chunk) {
        int64_t m = min64(per_chunk, bytes - off);
        int set = next_set(s);
        if (s->rank == root) slot_write(shm_slot(s, set, root), (uint8_t *)buf + off, (size_t)m, plan.way);
        if (slot_barrier(s, &plan, "broadcast", err, errn) != CX_OK) return CX_ERR_COMM;
        if (s->rank != root) memcpy((uint8_t *)buf + off, shm_slot(s, set, root), (size_t)m);
    }
    slots_done(&plan);
    return CX_OK;
}
