/* The four shared-memory collectives, chunk by chunk (see shm.h for why a
 * slot may be rewritten after one barrier). */
#include "shm_internal.h"

#include <cxla/metrics.h>

#include <stdatomic.h>
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

/* All-reduces from this size up look for their buffers in the heaps; the
 * exchange costs one barrier. */
#define IN_HEAPS_MIN_BYTES ((size_t)256 << 10)

/* Where every rank's input and output lie (NULL: not in its heap), told by
 * each rank and read after one barrier, so every rank reads the same. An
 * output that overlaps its input without being it is not offered: the
 * others would overwrite input its rank has not read yet. */
typedef struct {
    bool all_in, all_out;
    const uint8_t **ins;
    uint8_t **outs;
} heap_places;

static cx_status exchange_places(cx_shm *s, const void *in, void *out, size_t bytes, heap_places *hp, char *err,
                                 size_t errn)
{
    uintptr_t o = (uintptr_t)out, i = (uintptr_t)in;
    bool partial = o != i && o < i + bytes && i < o + bytes;
    int64_t in_at = cx_shm_heap_offset(s->heap, in, bytes), out_at = partial ? -1 : cx_shm_heap_offset(s->heap, out, bytes);
    atomic_store_explicit(&s->flags[s->rank].in_at, in_at, memory_order_relaxed);
    atomic_store_explicit(&s->flags[s->rank].out_at, out_at, memory_order_relaxed);
    if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
    hp->all_in = hp->all_out = true;
    for (int r = 0; r < s->size; r++) {
        uint8_t *base = cx_shm_heap_base(s->heap, s->heap_rank[r]);
        int64_t at_in = atomic_load_explicit(&s->flags[r].in_at, memory_order_relaxed);
        int64_t at_out = atomic_load_explicit(&s->flags[r].out_at, memory_order_relaxed);
        hp->ins[r] = at_in < 0 ? NULL : base + at_in;
        hp->outs[r] = at_out < 0 ? NULL : base + at_out;
        hp->all_in = hp->all_in && hp->ins[r];
        hp->all_out = hp->all_out && hp->outs[r];
    }
    return CX_OK;
}

/* Writes e reduced elements into every rank's output, the others' first
 * (this rank's own is read soonest, so it goes last). Streamed stores are
 * left unfenced for the caller to fence once. */
static void write_everywhere(uint8_t *const *outs, int n, int rank, size_t at, const void *res, int64_t e, cx_dtype dt,
                             double scale, bool stream)
{
    for (int k = 1; k <= n; k++) {
        uint8_t *dst = outs[(rank + k) % n] + at;
        if (stream && dt != CX_BF16 && scale == 1.0) cx_shm_copy_stream_unfenced(dst, res, (size_t)e * cx_dtype_size(dt));
        else cx_shm_copy_out(dst, res, e, dt, scale, false);
    }
}

/* An f32 sum of m elements at element lo of every rank's output, streamed
 * in one pass from the sources (the others' outputs first). */
static void sum_everywhere(const cx_shm *s, uint8_t *const *outs, int64_t lo, const float *const *src, int64_t m,
                           double scale)
{
    float *dst[s->size];
    for (int k = 1; k <= s->size; k++) dst[k - 1] = (float *)outs[(s->rank + k) % s->size] + lo;
    cx_shm_sum_f32_stream(dst, s->size, src, s->size, m, (float)scale);
}

/* The others write into this rank's output until they arrive here; the
 * wait counts against the way, which the others use too. */
static cx_status finish_in_heaps(cx_shm *s, slot_plan *plan, char *err, size_t errn)
{
    if (plan->way == CX_SHM_STREAMED) cx_shm_stream_fence();
    if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
    cx_counter_add("ShmHeapAllReduceCount", 1);
    slots_done(plan);
    return CX_OK;
}

/* This rank's share of a chunk, m elements from element `at`, reduced
 * from src straight into every rank's output (res: room for m results, for
 * the ways that go through it). */
static void share_to_outputs(const cx_shm *s, uint8_t *const *outs, int64_t at, uint8_t *res, const void *const *src,
                             int64_t m, cx_dtype dt, cx_reduce_op red, double scale, bool streamed)
{
    if (streamed && dt == CX_F32 && red == CX_RED_SUM) {
        sum_everywhere(s, outs, at, (const float *const *)src, m, scale);
        return;
    }
    cx_shm_reduce(res, src, s->size, m, dt, red);
    write_everywhere(outs, s->size, s->rank, (size_t)at * cx_dtype_size(dt), res, m, dt, scale, streamed);
}

/* Every input and output in the heaps: each rank reduces its share of the
 * whole message straight from the others' inputs into every output, a
 * block at a time through L1, and nothing is copied into the segment. Each
 * rank reads and writes only its own share of every buffer, so an input
 * that is its own output is read before it is overwritten. */
static cx_status all_reduce_in_heaps(cx_shm *s, const heap_places *hp, int64_t count, cx_dtype dt, cx_reduce_op red,
                                     double scale, char *err, size_t errn)
{
    size_t es = cx_dtype_size(dt), rs = cx_shm_result_size(dt);
    slot_plan plan = plan_slots(s, SHM_ALL_REDUCE_IN_HEAPS, (size_t)count * es);
    int64_t lo, hi;
    share_of(count, rs, s->size, s->rank, &lo, &hi);
    _Alignas(64) uint8_t scratch[16384];
    int64_t per = (int64_t)(sizeof scratch / rs);
    const void *src[s->size];
    for (int64_t b = lo; b < hi; b += per) {
        int64_t e = min64(per, hi - b);
        for (int r = 0; r < s->size; r++) src[r] = hp->ins[r] + (size_t)b * es;
        share_to_outputs(s, hp->outs, b, scratch, src, e, dt, red, scale, plan.way == CX_SHM_STREAMED);
    }
    return finish_in_heaps(s, &plan, err, errn);
}

/* Each rank reduces its own share of every chunk, reading that share of
 * its own input where it lies (only the shares the others reduce are
 * copied into its slot). When every rank's output lies in the node's heaps
 * it writes its share of the result into all of them and a chunk takes one
 * barrier; otherwise it writes its share out while it is still in cache,
 * and after a second barrier copies the others' from the result area. */
cx_status cx_shm_all_reduce(cx_shm *s, void *out, const void *in, int64_t count, cx_dtype dt, cx_reduce_op red,
                            double scale, char *err, size_t errn)
{
    size_t es = cx_dtype_size(dt), rs = cx_shm_result_size(dt);
    bool stream = (size_t)count * es >= s->stream_min;
    int64_t per_chunk = (int64_t)(s->chunk / es);
    const void *src[s->size];
    const uint8_t *ins[s->size];
    uint8_t *outs[s->size];
    heap_places hp = { .ins = ins, .outs = outs };
    if (s->heap && (size_t)count * es >= IN_HEAPS_MIN_BYTES &&
        exchange_places(s, in, out, (size_t)count * es, &hp, err, errn) != CX_OK)
        return CX_ERR_COMM;
    if (hp.all_in && hp.all_out) return all_reduce_in_heaps(s, &hp, count, dt, red, scale, err, errn);
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
        uint8_t *res = s->result[set] + (size_t)lo * rs;
        if (hp.all_out) {
            share_to_outputs(s, outs, off + lo, res, src, hi - lo, dt, red, scale, plan.way == CX_SHM_STREAMED);
            continue;
        }
        if (plan.way == CX_SHM_STREAMED) {
            reduce_share_streamed(s->size, dst + (size_t)lo * es, res, src, hi - lo, dt, red, scale, in_place);
        } else {
            cx_shm_reduce(res, src, s->size, hi - lo, dt, red);
            cx_shm_copy_out(dst + (size_t)lo * es, res, hi - lo, dt, scale, stream);
        }
        if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
        cx_shm_copy_out(dst, s->result[set], lo, dt, scale, stream);
        cx_shm_copy_out(dst + (size_t)hi * es, s->result[set] + (size_t)hi * rs, m - hi, dt, scale, stream);
    }
    /* the others write into this rank's output until they arrive here */
    if (hp.all_out) {
        cx_shm_stream_fence();
        if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
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
