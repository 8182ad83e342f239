/* The four shared-memory collectives, chunk by chunk (see shm.h for why a
 * slot may be rewritten after one barrier). */
#include "shm_internal.h"

#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The buffer set of the next chunk. */
static int next_set(cx_shm *s) { return (int)(s->chunks++ & 1); }

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
    for (int64_t off = 0; off < count; off += per_chunk) {
        int64_t m = min64(per_chunk, count - off), lo, hi;
        int set = next_set(s);
        const uint8_t *mine = (const uint8_t *)in + (size_t)off * es;
        uint8_t *slot = shm_slot(s, set, s->rank), *dst = (uint8_t *)out + (size_t)off * es;
        share_of(m, rs, s->size, s->rank, &lo, &hi);
        memcpy(slot, mine, (size_t)lo * es);
        memcpy(slot + (size_t)hi * es, mine + (size_t)hi * es, (size_t)(m - hi) * es);
        if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) src[r] = (r == s->rank ? mine : shm_slot(s, set, r)) + (size_t)lo * es;
        cx_shm_reduce(s->result[set] + (size_t)lo * rs, src, s->size, hi - lo, dt, red);
        cx_shm_copy_out(dst + (size_t)lo * es, s->result[set] + (size_t)lo * rs, hi - lo, dt, scale, stream);
        if (cx_shm_barrier(s, "all_reduce", err, errn) != CX_OK) return CX_ERR_COMM;
        cx_shm_copy_out(dst, s->result[set], lo, dt, scale, stream);
        cx_shm_copy_out(dst + (size_t)hi * es, s->result[set] + (size_t)hi * rs, m - hi, dt, scale, stream);
    }
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
    for (int64_t off = 0; off < count; off += piece) {
        int64_t m = min64(piece, count - off);
        int set = next_set(s);
        uint8_t *mine = shm_slot(s, set, s->rank);
        for (int d = 0; d < s->size; d++)
            memcpy(mine + (size_t)(d * piece) * es, (const uint8_t *)in + (size_t)(d * count + off) * es, (size_t)m * es);
        if (cx_shm_barrier(s, "reduce_scatter", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) src[r] = shm_slot(s, set, r) + (size_t)(s->rank * piece) * es;
        uint8_t *acc = s->result[set] + (size_t)(s->rank * piece) * rs;
        cx_shm_reduce(acc, src, s->size, m, dt, red);
        cx_shm_copy_out((uint8_t *)out + (size_t)off * es, acc, m, dt, scale, stream);
    }
    return CX_OK;
}

cx_status cx_shm_all_gather(cx_shm *s, void *out, const void *in, int64_t bytes, char *err, size_t errn)
{
    int64_t per_chunk = (int64_t)s->chunk;
    for (int64_t off = 0; off < bytes; off += per_chunk) {
        int64_t m = min64(per_chunk, bytes - off);
        int set = next_set(s);
        memcpy(shm_slot(s, set, s->rank), (const uint8_t *)in + off, (size_t)m);
        if (cx_shm_barrier(s, "all_gather", err, errn) != CX_OK) return CX_ERR_COMM;
        for (int r = 0; r < s->size; r++) memcpy((uint8_t *)out + r * bytes + off, shm_slot(s, set, r), (size_t)m);
    }
    return CX_OK;
}

cx_status cx_shm_broadcast(cx_shm *s, void *buf, int64_t bytes, int root, char *err, size_t errn)
{
    int64_t per_chunk = (int64_t)s->chunk;
    for (int64_t off = 0; off < bytes; off += per_chunk) {
        int64_t m = min64(per_chunk, bytes - off);
        int set = next_set(s);
        if (s->rank == root) memcpy(shm_slot(s, set, root), (uint8_t *)buf + off, (size_t)m);
        if (cx_shm_barrier(s, "broadcast", err, errn) != CX_OK) return CX_ERR_COMM;
        if (s->rank != root) memcpy((uint8_t *)buf + off, shm_slot(s, set, root), (size_t)m);
    }
    return CX_OK;
}
