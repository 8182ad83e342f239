/* Every collective as an IR op, with and without replica groups, against a
 * result computed locally from what every rank contributes; invalid groups
 * and mismatched sizes are errors, not hangs; eager host collectives. */
#include "dist_check.h"

#include <string.h>

/* rank r's value at i: known to every rank */
static float val(int r, int64_t i) { return (float)(r * 100 + i) * 0.5f; }

static cx_tensor *rank_tensor(int r, const int64_t *shape, int nd)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = val(r, i);
    cx_tensor *t = cx_from_host(h, shape, nd, CX_F32);
    free(h);
    return t;
}

static float *read(cx_tensor *t)
{
    float *h = malloc(sizeof(float) * (size_t)cx_numel(t) + 4);
    cx_status st = cx_to_host(t, h, CX_F32);
    CHECK(st == CX_OK, "read: %s", cx_last_error());
    return h;
}

static void all_reduce(int rank, int world, const cx_replica_groups *g, const int *members, int gsize)
{
    int64_t s[2] = { 3, 5 };
    cx_tensor *x = rank_tensor(rank, s, 2);
    const cx_reduce_op ops[4] = { CX_RED_SUM, CX_RED_MEAN, CX_RED_MAX, CX_RED_MIN };
    for (int k = 0; k < 4; k++) {
        cx_tensor *y = cx_all_reduce(x, ops[k], k == 0 ? 2.0 : 1.0, g, false);
        float *h = read(y);
        for (int i = 0; i < 15; i++) {
            double acc = ops[k] == CX_RED_MAX ? -1e30 : ops[k] == CX_RED_MIN ? 1e30 : 0;
            for (int m = 0; m < gsize; m++) {
                double v = val(members[m], i);
                if (ops[k] == CX_RED_MAX) acc = fmax(acc, v);
                else if (ops[k] == CX_RED_MIN) acc = fmin(acc, v);
                else acc += v;
            }
            if (ops[k] == CX_RED_MEAN) acc /= gsize;
            if (k == 0) acc *= 2.0;
            CHECK(close_rel(h[i], acc, 1e-6), "all_reduce op %d groups %s: [%d] %g want %g", k, g ? "yes" : "no", i, h[i], acc);
        }
        free(h);
        cx_free(y);
    }
    cx_free(x);
    (void)world;
}

static void all_gather(int rank, const cx_replica_groups *g, const int *members, int gsize)
{
    int64_t s[2] = { 2, 3 };
    cx_tensor *x = rank_tensor(rank, s, 2);
    for (int axis = 0; axis < 2; axis++) {
        cx_tensor *y = cx_all_gather(x, axis, g, false);
        CHECK(cx_dim(y, axis) == s[axis] * gsize, "all_gather shape");
        float *h = read(y);
        for (int i = 0; i < 2 * (axis == 0 ? gsize : 1); i++)
            for (int j = 0; j < 3 * (axis == 1 ? gsize : 1); j++) {
                int who = axis == 0 ? i / 2 : j / 3;
                int li = axis == 0 ? i % 2 : i, lj = axis == 1 ? j % 3 : j;
                float want = val(members[who], li * 3 + lj);
                float got = h[i * 3 * (axis == 1 ? gsize : 1) + j];
                CHECK(got == want, "all_gather axis %d (%d,%d): %g want %g", axis, i, j, got, want);
            }
        free(h);
        cx_free(y);
    }
    cx_free(x);
}

static void reduce_scatter(int rank, const cx_replica_groups *g, const int *members, int gsize, int me)
{
    int64_t s[2] = { 2 * gsize, 3 * gsize };
    cx_tensor *x = rank_tensor(rank, s, 2);
    for (int axis = 0; axis < 2; axis++) {
        cx_tensor *y = cx_reduce_scatter(x, CX_RED_SUM, 1.0, axis, g, false);
        float *h = read(y);
        int64_t rows = axis == 0 ? 2 : 2 * gsize, cols = axis == 1 ? 3 : 3 * gsize;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                int64_t gi = axis == 0 ? i + 2 * me : i, gj = axis == 1 ? j + 3 * me : j;
                double want = 0;
                for (int m = 0; m < gsize; m++) want += val(members[m], gi * s[1] + gj);
                CHECK(close_rel(h[i * cols + j], want, 1e-6), "reduce_scatter axis %d (%lld,%lld): %g want %g", axis,
                      (long long)i, (long long)j, h[i * cols + j], want);
            }
        free(h);
        cx_free(y);
    }
    cx_free(x);
}

static void all_to_all(int rank, const cx_replica_groups *g, const int *members, int gsize, int me)
{
    int64_t s[2] = { 2 * gsize, 3 };
    cx_tensor *x = rank_tensor(rank, s, 2);
    cx_tensor *y = cx_all_to_all(x, 0, 1, g, false); /* (2, 3 * gsize) */
    float *h = read(y);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3 * gsize; j++) {
            int src = j / 3; /* block j/3 came from member src: its rows [2*me, 2*me+2) */
            float want = val(members[src], (2 * me + i) * 3 + j % 3);
            CHECK(h[i * 3 * gsize + j] == want, "all_to_all (%d,%d): %g want %g", i, j, h[i * 3 * gsize + j], want);
        }
    free(h);
    cx_free(y);
    cx_free(x);
    int64_t sb[1] = { 4 };
    cx_tensor *b = rank_tensor(rank, sb, 1);
    cx_tensor *bc = cx_broadcast(b, gsize - 1, g, false);
    float *hb = read(bc);
    for (int i = 0; i < 4; i++) CHECK(hb[i] == val(members[gsize - 1], i), "broadcast [%d]", i);
    free(hb);
    cx_free(bc);
    cx_free(b);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal(), world = cx_world_size();
    CHECK(world >= 2, "expected several ranks, got %d", world);
    CHECK(cx_addressable_device_count() == 1, "device counts");
    CHECK(cx_is_master_ordinal(false) == (rank == 0), "master ordinal");
    int everyone[64] = { 0 };
    for (int i = 0; i < world; i++) everyone[i] = i;
    all_reduce(rank, world, NULL, everyone, world);
    all_gather(rank, NULL, everyone, world);
    reduce_scatter(rank, NULL, everyone, world, rank);
    all_to_all(rank, NULL, everyone, world, rank);
    /* replica groups: pairs {0,1}, {2,3}, ... (world even) */
    if (world % 2 == 0) {
        int ranks[64];
        for (int i = 0; i < world; i++) ranks[i] = i;
        cx_replica_groups g = { world / 2, 2, ranks };
        int pair[2] = { rank & ~1, (rank & ~1) + 1 };
        all_reduce(rank, world, &g, pair, 2);
        all_gather(rank, &g, pair, 2);
        reduce_scatter(rank, &g, pair, 2, rank & 1);
        all_to_all(rank, &g, pair, 2, rank & 1);
    }
    /* invalid groups and sizes: errors at record time, on every rank, no hang */
    int64_t s[1] = { 3 };
    cx_tensor *x = rank_tensor(rank, s, 1);
    int dup[2] = { 0, 0 };
    cx_replica_groups bad = { 1, 2, dup };
    cx_tensor *e1 = cx_all_reduce(x, CX_RED_SUM, 1.0, &bad, false);
    CHECK(cx_tensor_error(e1) && strstr(cx_tensor_error(e1), "replica groups"), "duplicate rank in groups: %s", cx_tensor_error(e1) ? cx_tensor_error(e1) : "no error");
    cx_tensor *e2 = cx_reduce_scatter(x, CX_RED_SUM, 1.0, 0, NULL, false);
    CHECK(world == 3 || (cx_tensor_error(e2) && strstr(cx_tensor_error(e2), "divisible")), "reduce_scatter of 3 over %d ranks: %s", world,
          cx_tensor_error(e2) ? cx_tensor_error(e2) : "no error");
    cx_free(e1);
    cx_free(e2);
    cx_free(x);
    /* eager host collectives */
    CHECK(cx_barrier() == CX_OK, "barrier");
    int payload = rank * 7;
    void *all = NULL;
    CHECK(cx_rendezvous("payload", &payload, sizeof payload, &all, NULL) == CX_OK, "rendezvous: %s", cx_last_error());
    for (int r = 0; all && r < world; r++) CHECK(((int *)all)[r] == r * 7, "rendezvous payload of rank %d", r);
    free(all);
    all = NULL;
    cx_status st = cx_rendezvous(rank == 0 ? "tag-a" : "tag-b", &payload, sizeof payload, &all, NULL);
    CHECK(st == CX_ERR_ARG && strstr(cx_last_error(), "different tag"), "mismatched tags: %d %s", st, cx_last_error());
    free(all);
    double v = rank + 1, mean = 0;
    CHECK(cx_mesh_reduce("acc", &v, 1, NULL, &mean) == CX_OK && close_rel(mean, (world + 1) / 2.0, 1e-12), "mesh_reduce mean %g", mean);
    return dist_finish("dist_collectives");
}
