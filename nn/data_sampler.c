/* Deterministic, rank-aware shuffling sampler (DistributedSampler semantics). */
#include "nn_internal.h"

#include "cx_struct.h"

#include <cxla/data.h>

struct cx_sampler {
    cx_sampler_opts o;
    int64_t n;           /* data set size */
    int64_t per_rank;    /* indices this rank takes per epoch */
    int64_t epoch;
    int64_t pos;
    int64_t *order;      /* (per_rank) this rank's indices for the epoch */
    int64_t *perm;       /* (n) scratch permutation */
};

/* Uniform in [0, bound) without modulo bias (Lemire's method). */
static uint64_t below(uint64_t *s, uint64_t bound)
{
    for (;;) {
        uint64_t x = cx_splitmix64(s);
        __uint128_t m = (__uint128_t)x * bound;
        uint64_t lo = (uint64_t)m;
        if (lo >= bound || lo >= (-bound) % bound) return (uint64_t)(m >> 64);
    }
}

static void build_epoch(cx_sampler *s)
{
    int64_t n = s->n, world = s->o.world_size;
    for (int64_t i = 0; i < n; i++) s->perm[i] = i;
    if (s->o.shuffle) {
        /* Every rank derives the same permutation from seed + epoch. */
        uint64_t st = s->o.seed * 0x2545f4914f6cdd1dull + (uint64_t)s->epoch;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)below(&st, (uint64_t)i + 1);
            int64_t t = s->perm[i]; s->perm[i] = s->perm[j]; s->perm[j] = t;
        }
    }
    /* Global position k (padded by wrapping around when not drop_last). */
    for (int64_t k = 0; k < s->per_rank; k++) s->order[k] = s->perm[(s->o.rank + k * world) % n];
    s->pos = 0;
}

cx_sampler *cx_sampler_new(int64_t dataset_size, cx_sampler_opts given)
{
    cx_sampler_opts o = cx_sampler_default_opts();
    if (!CX_TAKE_STRUCT("cx_sampler_new", cx_sampler_opts, o, &given, drop_last)) return NULL;
    if (dataset_size <= 0 || o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
        cx_set_last_error("cx_sampler_new: bad arguments: size %lld, rank %d of world size %d",
                     (long long)dataset_size, o.rank, o.world_size);
        return NULL;
    }
    int64_t w = o.world_size;
    /* drop_last cuts the tail; otherwise the permutation wraps around to pad. */
    int64_t per = o.drop_last ? dataset_size / w : (dataset_size + w - 1) / w;
    if (per <= 0) {
        cx_set_last_error("cx_sampler_new: %lld samples cannot be split over %d ranks with drop_last",
                     (long long)dataset_size, o.world_size);
        return NULL;
    }
    cx_sampler *s = calloc(1, sizeof *s);
    if (!s) { cx_set_last_error("cx_sampler_new: out of memory"); return NULL; }
    s->o = o;
    s->n = dataset_size;
    s->per_rank = per;
    s->order = malloc((size_t)per * sizeof *s->order);
    s->perm = malloc((size_t)dataset_size * sizeof *s->perm);
    if (!s->order || !s->perm) {
        cx_sampler_free(s);
        cx_set_last_error("cx_sampler_new: out of memory for %lld indices", (long long)dataset_size);
        return NULL;
    }
    build_epoch(s);
    return s;
}

void cx_sampler_free(cx_sampler *s)
{
    if (!s) return;
    free(s->order);
    free(s->perm);
    free(s);
}

void cx_sampler_set_epoch(cx_sampler *s, int64_t epoch)
{
    s->epoch = epoch;
    build_epoch(s);
}

int64_t cx_sampler_epoch(const cx_sampler *s) { return s->epoch; }
int64_t cx_sampler_len(const cx_sampler *s) { return s->per_rank; }
int64_t cx_sampler_position(const cx_sampler *s) { return s->pos; }

cx_status cx_sampler_set_position(cx_sampler *s, int64_t pos)
{
    if (pos < 0 || pos > s->per_rank) {
        cx_set_last_error("cx_sampler_set_position: position %lld outside [0, %lld]", (long long)pos,
                     (long long)s->per_rank);
        return CX_ERR_ARG;
    }
    s->pos = pos;
    return CX_OK;
}

int64_t cx_sampler_take(cx_sampler *s, int64_t *out, int64_t n)
{
    int64_t k = s->per_rank - s->pos;
    if (k > n) k = n;
    if (k <= 0) return 0;
    memcpy(out, s->order + s->pos, (size_t)k * sizeof *out);
    s->pos += k;
    return k;
}
