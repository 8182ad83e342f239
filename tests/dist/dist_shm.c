/* The shared-memory collectives against MPI's own results: every
 * collective the backend sends there (all-reduce, reduce-scatter,
 * all-gather, broadcast) for every dtype and reduction, sizes of 1 element,
 * primes, sizes not divisible by the rank count and sizes spanning many
 * chunks, the whole world and replica groups, in place and not. Integers
 * and max/min must match bit for bit; f32 and bf16 sums within the
 * rounding that a different summation order gives.
 *
 * The reference is MPI called directly on a communicator of the same
 * members, with the backend's documented post-processing (scale, MEAN as
 * SUM / group size, bf16 reduced in f32 and rounded once).
 *
 * usage: dist_shm [check|die]   (default check)
 *   check: the comparison; exits non-zero on a mismatch, and when the
 *          shared-memory path did not take exactly the collectives
 *          CX_SHM_COLLECTIVES says (unset: reductions, all: gathers and
 *          broadcasts too, 0: none), or the hierarchical one none although
 *          the ranks span nodes (really, or as CX_SHM_NODE_RANKS says) and
 *          CX_SHM_HIERARCHICAL=1 asks for it (or some without it).
 *   die:   all-reduces of 16 MiB in a loop (in place, in the heaps, so
 *          the others write into every rank's buffer); writes "pid" files into
 *          $DIST_SHM_DIR so a test can kill a rank in the middle. */
#include "dist_check.h"

#include <cxla/comm.h>
#include <cxla/metrics.h>

#include <mpi.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* collectives this test issued, by what the shared-memory path takes */
static int64_t g_reductions, g_gathers;

static const cx_dtype DTYPES[] = { CX_F32, CX_BF16, CX_I32, CX_I64, CX_U8, CX_BOOL };
static const char *const DT_NAME[] = { "f32", "bf16", "i32", "i64", "u8", "bool" };
static const cx_reduce_op REDS[] = { CX_RED_SUM, CX_RED_MEAN, CX_RED_MAX, CX_RED_MIN };
static const char *const RED_NAME[] = { "sum", "mean", "max", "min" };
/* 1, primes, one that no rank count divides, and several chunks' worth
 * (the default chunk is 1 MiB: 262,144 f32; messages from 512 KiB up take
 * the timed slot writes, both ways in turn) */
static const int64_t SIZES[] = { 1, 2, 7, 13, 127, 1021, 4099, 65537, 300007, 1000003 };

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f)   /* round to nearest even, NaN kept quiet */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Rank r's element i: signed values with a spread of magnitudes; integers
 * large enough that sums wrap (which MPI's and ours both do). */
static void fill(void *buf, cx_dtype dt, int64_t n, int r, int salt)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(r * 7919 + salt) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        double u = (double)(h >> 11) * (1.0 / 9007199254740992.0) * 2 - 1;   /* [-1, 1) */
        switch (dt) {
        case CX_F32: ((float *)buf)[i] = (float)(u * (1 + (i % 5) * 10)); break;
        case CX_BF16: ((uint16_t *)buf)[i] = f32_to_bf16((float)(u * (1 + (i % 3) * 4))); break;
        case CX_I32: ((int32_t *)buf)[i] = (int32_t)(h >> 32); break;
        case CX_I64: ((int64_t *)buf)[i] = (int64_t)h; break;
        case CX_U8: ((uint8_t *)buf)[i] = (uint8_t)(h >> 40); break;
        default: ((uint8_t *)buf)[i] = (uint8_t)((h >> 40) & 1); break;
        }
    }
}

static MPI_Datatype mpi_of(cx_dtype dt)
{
    switch (dt) {
    case CX_F32: case CX_BF16: return MPI_FLOAT;   /* bf16 reduces in f32 */
    case CX_I32: return MPI_INT32_T;
    case CX_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

static MPI_Op mpi_red(cx_reduce_op r)
{
    return r == CX_RED_MAX ? MPI_MAX : r == CX_RED_MIN ? MPI_MIN : MPI_SUM;
}

/* The reference all-reduce of n elements (bf16 as f32 on the way), scaled
 * as the backend documents, into ref (dt's own layout). */
static void reference_reduce(void *ref, const void *in, int64_t n, cx_dtype dt, cx_reduce_op red, double scale,
                             MPI_Comm c, int gsize)
{
    size_t es = cx_dtype_size(dt);
    if (red == CX_RED_MEAN) scale /= gsize;
    if (dt == CX_BF16) {
        float *f = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) f[i] = bf16_to_f32(((const uint16_t *)in)[i]);
        MPI_Allreduce(MPI_IN_PLACE, f, (int)n, MPI_FLOAT, mpi_red(red), c);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)ref)[i] = f32_to_bf16((float)(f[i] * scale));
        free(f);
        return;
    }
    if ((dt == CX_U8 || dt == CX_BOOL) && red == CX_RED_SUM) {
        /* MPI's sum in int32, wrapped to a byte as C adds uint8 (Open
         * MPI's own byte sum saturates on AVX machines: ompi#8045) */
        int32_t *w = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) w[i] = ((const uint8_t *)in)[i];
        MPI_Allreduce(MPI_IN_PLACE, w, (int)n, MPI_INT32_T, MPI_SUM, c);
        for (int64_t i = 0; i < n; i++) ((uint8_t *)ref)[i] = (uint8_t)w[i];
        free(w);
        return;
    }
    memcpy(ref, in, es * (size_t)n);
    MPI_Allreduce(MPI_IN_PLACE, ref, (int)n, mpi_of(dt), mpi_red(red), c);
    if (scale == 1.0) return;
    for (int64_t i = 0; i < n; i++) {
        if (dt == CX_F32) ((float *)ref)[i] *= (float)scale;
        else if (dt == CX_I32) ((int32_t *)ref)[i] = (int32_t)(((int32_t *)ref)[i] * scale);
        else if (dt == CX_I64) ((int64_t *)ref)[i] = (int64_t)((double)((int64_t *)ref)[i] * scale);
    }
}

static unsigned long long bits(const void *p, size_t es, int64_t i)
{
    unsigned long long v = 0;
    memcpy(&v, (const char *)p + es * (size_t)i, es);
    return v;
}

/* Whether got matches ref: bit-exact, except sums of floats, which may
 * differ by the rounding of another order: |got - ref| <= tol * sum|x_r|
 * over the members' inputs (abs_sum, as f32). */
static bool same(const void *got, const void *ref, const float *abs_sum, int64_t n, cx_dtype dt, bool float_sum,
                 int64_t *bad)
{
    size_t es = cx_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        if (!float_sum || (dt != CX_F32 && dt != CX_BF16)) {
            if (memcmp((const char *)got + es * (size_t)i, (const char *)ref + es * (size_t)i, es)) {
                *bad = i;
                fprintf(stderr, "  element %lld: got 0x%llx, MPI 0x%llx\n", (long long)i, bits(got, es, i), bits(ref, es, i));
                return false;
            }
            continue;
        }
        double g = dt == CX_F32 ? ((const float *)got)[i] : bf16_to_f32(((const uint16_t *)got)[i]);
        double r = dt == CX_F32 ? ((const float *)ref)[i] : bf16_to_f32(((const uint16_t *)ref)[i]);
        /* f32: a few ulps of the magnitudes summed; bf16: one bf16 ulp of it */
        double tol = (dt == CX_F32 ? 4e-7 : 1.0 / 128) * abs_sum[i] + 1e-30;
        if (!(fabs(g - r) <= tol)) { *bad = i; return false; }
    }
    return true;
}

/* sum over members of |in| per element, as float, for the tolerances */
static float *abs_sums(const void *in, int64_t n, cx_dtype dt, MPI_Comm c)
{
    float *a = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        a[i] = dt == CX_F32 ? fabsf(((const float *)in)[i])
             : dt == CX_BF16 ? fabsf(bf16_to_f32(((const uint16_t *)in)[i])) : 0;
    MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, c);
    return a;
}

typedef struct {
    const int *members;   /* NULL: the world */
    int gsize, me;        /* my index in the group */
    MPI_Comm comm;        /* the same members, for the reference */
    const char *name;
} group;

static cx_comm_op base_op(const group *g, cx_coll_kind kind, cx_dtype dt, int64_t count)
{
    return (cx_comm_op){ .kind = kind, .red = CX_RED_SUM, .scale = 1.0, .dtype = dt, .count = count,
                         .group = g->members, .group_size = g->members ? g->gsize : 0 };
}

/* Where an all-reduce's buffers lie: ordinary memory, or cx_comm_alloc's
 * (the node's heaps, which the others write into): the output only, input
 * and output, the same buffer, or on rank 0 only (every rank must then keep
 * to the slots). */
typedef enum { PLAIN, OUT_SHARED, BOTH_SHARED, IN_PLACE_SHARED, ONE_RANK_SHARED, PLACEMENTS } placement;
static const char *const PLACE_NAME[] = { "", " (output shared)", " (input and output shared)", " in place (shared)",
                                          " (rank 0's buffers shared)" };

static void *place_alloc(size_t bytes, bool shared) { return shared ? cx_comm_alloc(bytes) : malloc(bytes); }
static void place_free(void *p, bool shared)
{
    if (shared) cx_comm_free(p);
    else free(p);
}

static void check_all_reduce(const group *g, int d, int64_t n, bool in_place, placement place)
{
    cx_dtype dt = DTYPES[d];
    size_t es = cx_dtype_size(dt);
    int rank = cx_global_ordinal();
    bool out_shared = place != PLAIN && (place != ONE_RANK_SHARED || rank == 0);
    bool in_shared = out_shared && place != OUT_SHARED;
    in_place = in_place || place == IN_PLACE_SHARED;
    void *in = place_alloc(es * (size_t)n, in_shared), *out = place_alloc(es * (size_t)n, out_shared);
    void *ref = malloc(es * (size_t)n);
    for (int k = 0; k < 4; k++) {
        cx_reduce_op red = REDS[k];
        if ((dt == CX_U8 || dt == CX_BOOL) && red == CX_RED_MEAN) continue;
        double scale = red == CX_RED_SUM && (dt == CX_F32 || dt == CX_BF16 || dt == CX_I64) ? 0.5 : 1.0;
        fill(in, dt, n, rank, (int)n + k);
        float *as = abs_sums(in, n, dt, g->comm);
        reference_reduce(ref, in, n, dt, red, scale, g->comm, g->gsize);
        cx_comm_op op = base_op(g, CX_COLL_ALL_REDUCE, dt, n);
        op.red = red;
        op.scale = scale;
        if (in_place) { memcpy(out, in, es * (size_t)n); op.in = out; }
        else op.in = in;
        op.out = out;
        cx_status st = cx_comm_run(&op);
        g_reductions++;
        int64_t bad = -1;
        CHECK(st == CX_OK, "all_reduce: %s", cx_last_error());
        bool float_sum = red == CX_RED_SUM || red == CX_RED_MEAN;
        CHECK(st != CX_OK || same(out, ref, as, n, dt, float_sum, &bad),
              "all_reduce %s %s n=%lld group %s%s%s: element %lld differs from MPI's", RED_NAME[k], DT_NAME[d],
              (long long)n, g->name, in_place ? " in place" : "", PLACE_NAME[place], (long long)bad);
        free(as);
    }
    place_free(in, in_shared);
    place_free(out, out_shared);
    free(ref);
}

static void check_reduce_scatter(const group *g, int d, int64_t n, bool in_place)
{
    cx_dtype dt = DTYPES[d];
    size_t es = cx_dtype_size(dt);
    int rank = cx_global_ordinal();
    int64_t full = n * g->gsize;
    void *in = malloc(es * (size_t)full), *out = malloc(es * (size_t)full), *ref = malloc(es * (size_t)full);
    for (int k = 0; k < 4; k++) {
        cx_reduce_op red = REDS[k];
        if ((dt == CX_U8 || dt == CX_BOOL) && red == CX_RED_MEAN) continue;
        fill(in, dt, full, rank, (int)n * 3 + k);
        float *as = abs_sums(in, full, dt, g->comm);
        reference_reduce(ref, in, full, dt, red, 1.0, g->comm, g->gsize);
        cx_comm_op op = base_op(g, CX_COLL_REDUCE_SCATTER, dt, n);
        op.red = red;
        if (in_place) { memcpy(out, in, es * (size_t)full); op.in = out; }
        else op.in = in;
        op.out = out;
        cx_status st = cx_comm_run(&op);
        g_reductions++;
        CHECK(st == CX_OK, "reduce_scatter: %s", cx_last_error());
        int64_t bad = -1, off = n * g->me;
        bool float_sum = red == CX_RED_SUM || red == CX_RED_MEAN;
        CHECK(st != CX_OK || same(out, (char *)ref + es * (size_t)off, as + off, n, dt, float_sum, &bad),
              "reduce_scatter %s %s n=%lld group %s%s: element %lld differs from MPI's", RED_NAME[k], DT_NAME[d],
              (long long)n, g->name, in_place ? " in place" : "", (long long)bad);
        free(as);
    }
    free(in);
    free(out);
    free(ref);
}

static void check_gather_and_broadcast(const group *g, int d, int64_t n)
{
    cx_dtype dt = DTYPES[d];
    size_t es = cx_dtype_size(dt);
    int rank = cx_global_ordinal();
    void *in = malloc(es * (size_t)n), *out = malloc(es * (size_t)n * (size_t)g->gsize),
         *ref = malloc(es * (size_t)n * (size_t)g->gsize);
    fill(in, dt, n, rank, (int)n * 5);
    MPI_Allgather(in, (int)(n * (int64_t)es), MPI_BYTE, ref, (int)(n * (int64_t)es), MPI_BYTE, g->comm);
    cx_comm_op op = base_op(g, CX_COLL_ALL_GATHER, dt, n);
    op.in = in;
    op.out = out;
    cx_status st = cx_comm_run(&op);
    g_gathers++;
    CHECK(st == CX_OK && !memcmp(out, ref, es * (size_t)n * (size_t)g->gsize),
          "all_gather %s n=%lld group %s differs from MPI's (%s)", DT_NAME[d], (long long)n, g->name,
          st == CX_OK ? "data" : cx_last_error());

    for (int root = 0; root < g->gsize; root++) {
        for (int in_place = 0; in_place < 2; in_place++) {
            fill(in, dt, n, rank, (int)n * 7 + root);
            memcpy(ref, in, es * (size_t)n);
            MPI_Bcast(ref, (int)(n * (int64_t)es), MPI_BYTE, root, g->comm);
            memset(out, 0xA5, es * (size_t)n);
            if (in_place) memcpy(out, in, es * (size_t)n);
            op = base_op(g, CX_COLL_BROADCAST, dt, n);
            op.root = root;
            op.in = in_place ? out : in;
            op.out = out;
            st = cx_comm_run(&op);
            g_gathers++;
            CHECK(st == CX_OK && !memcmp(out, ref, es * (size_t)n),
                  "broadcast %s n=%lld root %d group %s%s differs from MPI's (%s)", DT_NAME[d], (long long)n, root,
                  g->name, in_place ? " in place" : "", st == CX_OK ? "data" : cx_last_error());
        }
    }
    free(in);
    free(out);
    free(ref);
}

static void check_group(const group *g)
{
    for (int d = 0; d < (int)(sizeof DTYPES / sizeof *DTYPES); d++) {
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++) {
            int64_t n = SIZES[s];
            /* the largest sizes for f32 only: dist_shm_small_chunks_np4
             * (4 KiB chunks) covers every dtype's multi-chunk path */
            if (n > 70000 && DTYPES[d] != CX_F32) continue;
            check_all_reduce(g, d, n, s % 2 == 1, PLAIN);
            check_reduce_scatter(g, d, n, s % 2 == 0);
            check_gather_and_broadcast(g, d, n);
        }
    }
}

/* All-reduces whose buffers lie in the heaps, for every dtype: one size
 * just past the 256 KiB from which the heaps are looked at, one of several
 * chunks (f32 only, as above), and one below, which keeps to the slots. */
static void check_shared_buffers(const group *g)
{
    for (int d = 0; d < (int)(sizeof DTYPES / sizeof *DTYPES); d++) {
        int64_t just_past = (int64_t)((256 << 10) / cx_dtype_size(DTYPES[d])) + 13;
        const int64_t sizes[] = { 4099, just_past, DTYPES[d] == CX_F32 ? 1000003 : 0 };
        for (int p = OUT_SHARED; p < PLACEMENTS; p++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                if (sizes[s]) check_all_reduce(g, d, sizes[s], false, (placement)p);
    }
}

static int run_checks(void)
{
    int rank = cx_global_ordinal(), world = cx_world_size();
    int64_t shm_before = cx_counter_value("ShmCollectiveCount");
    int64_t hier_before = cx_counter_value("HierarchicalAllReduceCount");

    int64_t heap_before = cx_counter_value("ShmHeapAllReduceCount");
    group all = { .members = NULL, .gsize = world, .me = rank, .comm = MPI_COMM_WORLD, .name = "world" };
    check_group(&all);
    check_shared_buffers(&all);

    /* strided pairs {0,2}, {1,3} (4 ranks) or singletons (2 ranks): a
     * group's members are not the node's first ranks */
    int stride_ranks[64];
    int gs = world >= 4 ? 2 : 1, ng = world / gs;
    for (int gi = 0; gi < ng; gi++)
        for (int m = 0; m < gs; m++) stride_ranks[gi * gs + m] = gi + m * ng;
    int mine = rank % ng, me = rank / ng;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, mine, me, &sub);
    group strided = { .members = stride_ranks + mine * gs, .gsize = gs, .me = me, .comm = sub, .name = "strided" };
    check_group(&strided);
    check_shared_buffers(&strided);
    MPI_Comm_free(&sub);

    int64_t used = cx_counter_value("ShmCollectiveCount") - shm_before;
    int64_t hier = cx_counter_value("HierarchicalAllReduceCount") - hier_before;
    const char *env = getenv("CX_SHM_COLLECTIVES"), *nodes = getenv("CX_SHM_NODE_RANKS");
    /* the ranks span nodes: really (a hostfile), or as CX_SHM_NODE_RANKS says */
    MPI_Comm node;
    int node_size = world;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    const char *hier_env = getenv("CX_SHM_HIERARCHICAL");
    bool off = env && !strcmp(env, "0"), hier_on = hier_env && !strcmp(hier_env, "1"),
         split = (nodes && atoi(nodes) > 0 && atoi(nodes) < world) || node_size < world;
    /* on one node every collective the path takes goes there: reductions,
     * and with CX_SHM_COLLECTIVES=all the gathers and broadcasts too */
    int64_t want = off ? 0 : g_reductions + (env && !strcmp(env, "all") ? g_gathers : 0);
    CHECK(split ? used >= 0 : used == want, "shared-memory path taken %lld times, want %lld (CX_SHM_COLLECTIVES=%s)",
          (long long)used, (long long)want, env ? env : "(unset)");
    CHECK(split && !off && hier_on ? hier > 0 : hier == 0,
          "hierarchical path taken %lld times with CX_SHM_NODE_RANKS=%s, CX_SHM_HIERARCHICAL=%s", (long long)hier,
          nodes ? nodes : "(unset)", hier_env ? hier_env : "(unset)");
    /* on one node, with the heaps on, the all-reduces with every buffer in
     * them go through them (the output alone may lie there too: not counted) */
    int64_t heap = cx_counter_value("ShmHeapAllReduceCount") - heap_before;
    const char *heap_env = getenv("CX_SHM_HEAP_MIB");
    bool heap_on = !off && world > 1 && !(heap_env && !strcmp(heap_env, "0"));
    if (!split)
        CHECK(heap_on ? heap > 0 : heap == 0, "all-reduces through the heaps: %lld (CX_SHM_HEAP_MIB=%s)",
              (long long)heap, heap_env ? heap_env : "(unset)");
    if (rank == 0)
        printf("dist_shm: %lld collectives through shared memory, %lld hierarchical all-reduces, %lld all-reduces "
               "within the heaps\n", (long long)used, (long long)hier, (long long)heap);
    return 0;
}

/* A loop of large all-reduces that a test kills a rank in. */
static int run_die(void)
{
    const char *dir = getenv("DIST_SHM_DIR");
    if (!dir) { fprintf(stderr, "dist_shm die: set DIST_SHM_DIR\n"); return 2; }
    int64_t n = 4 << 20;   /* 16 MiB of f32, in the heaps: the others write into it */
    float *buf = cx_comm_alloc((size_t)n * sizeof *buf);
    if (buf) memset(buf, 0, (size_t)n * sizeof *buf);
    char path[512];
    snprintf(path, sizeof path, "%s/rank-%d.pid", dir, cx_global_ordinal());
    FILE *f = fopen(path, "w");
    if (!buf) { fprintf(stderr, "dist_shm die: %s\n", cx_last_error()); return 2; }
    if (!f) { fprintf(stderr, "dist_shm die: cannot write %s\n", path); return 2; }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    for (int it = 0; it < 1000000; it++) {
        cx_comm_op op = { .kind = CX_COLL_ALL_REDUCE, .red = CX_RED_SUM, .scale = 1.0, .dtype = CX_F32,
                          .in = buf, .out = buf, .count = n };
        if (cx_comm_run(&op) != CX_OK) { fprintf(stderr, "all_reduce: %s\n", cx_last_error()); return 1; }
    }
    cx_comm_free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    const char *mode = argc > 1 ? argv[1] : "check";
    if (!strcmp(mode, "die")) return run_die();
    if (strcmp(mode, "check")) { fprintf(stderr, "dist_shm: unknown mode '%s' (check, die)\n", mode); return 2; }
    run_checks();
    return dist_finish("dist_shm");
}
