/* Desync detection: ranks about to run different collectives get one clear
 * error on every rank, before any data moves, instead of a heap overflow or
 * a hang; and the job can go on once the ranks agree again. */
#include "dist_check.h"

#include <string.h>

/* One step that all-reduces a tensor of n floats per entry of sizes[]. */
static cx_status step(const int64_t *sizes, int count)
{
    cx_step_begin();
    for (int i = 0; i < count; i++) {
        float *ones = malloc(sizeof(float) * (size_t)sizes[i]);
        for (int64_t k = 0; k < sizes[i]; k++) ones[k] = 1.0f;
        cx_tensor *x = cx_from_host(ones, &sizes[i], 1, CX_F32);
        free(ones);
        cx_keep(cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false));
    }
    return cx_step_end();
}

static void expect_desync(cx_status st, const char *what, const char *needle)
{
    CHECK(st == CX_ERR_COMM, "%s: step returned %d, not CX_ERR_COMM (%s)", what, (int)st, cx_last_error());
    CHECK(strstr(cx_last_error(), "desync") != NULL, "%s: no desync message: %s", what, cx_last_error());
    CHECK(strstr(cx_last_error(), needle) != NULL, "%s: message lacks '%s': %s", what, needle, cx_last_error());
    if (cx_global_ordinal() == 0) printf("%s: %s\n", what, cx_last_error());
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal();

    /* rank 1 all-reduces 1024 floats where the others all-reduce 2048 */
    int64_t mine = rank == 1 ? 1024 : 2048;
    expect_desync(step(&mine, 1), "sizes", rank == 1 ? "f32[2048]" : "f32[1024]");
    CHECK(strstr(cx_last_error(), "rank 1 at") != NULL, "rank 1 not named: %s", cx_last_error());

    /* rank 1 leaves one of two all-reduces out of a step */
    int64_t two[2] = { 64, 64 };
    expect_desync(step(two, rank == 1 ? 1 : 2), "skipped", "all_reduce f32[64], all_reduce f32[64]");

    /* agreement again: the next steps run, and sum right */
    int64_t n = 16;
    CHECK(step(&n, 1) == CX_OK, "a matching step failed after the desync: %s", cx_last_error());

    /* host collectives take part: two different barriers */
    cx_status st = cx_comm_check(rank == 0 ? "barrier 'save'" : "barrier 'load'");
    expect_desync(st, "host", rank == 0 ? "barrier 'load'" : "barrier 'save'");
    CHECK(cx_comm_check("barrier 'same'") == CX_OK, "a matching host check failed: %s", cx_last_error());
    return dist_finish("dist_desync");
}
