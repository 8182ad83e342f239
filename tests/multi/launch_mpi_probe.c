/* Test helper for xla-launch: a real MPI program under the per-rank wrapper. It checks
 * that MPI's view of the job matches the torchrun-style variables and that a collective
 * (including one large enough to use Open MPI's single-copy shared-memory path) works. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *er = getenv("RANK"), *ew = getenv("WORLD_SIZE");
    int ok = er && ew && atoi(er) == rank && atoi(ew) == size;

    enum { N = 1 << 20 }; /* 4 MiB: past the eager limit, so CMA is exercised */
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) a[i] = (float)rank;
    MPI_Allreduce(a, b, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    float want = (float)size * (float)(size - 1) / 2.0f;
    for (int i = 0; i < N; i += 4099) ok &= b[i] == want;

    printf("mpi rank=%d size=%d env_match=%d allreduce=%s\n", rank, size, ok,
           ok ? "ok" : "bad");
    free(a);
    free(b);
    MPI_Finalize();
    return ok ? 0 : 1;
}
