/* Runtime configuration: compute threads. */
#include "base.h"
#include "cx_settings.h"

#include <unistd.h>

/* OpenBLAS's own threads stay off: the worker pool splits every gemm into
 * single-threaded calls, so OpenBLAS's idle spinning never competes with
 * the pool for the cores. */
extern void openblas_set_num_threads(int);

static int g_threads;

int cx_get_num_threads(void)
{
    if (g_threads <= 0) {
        int n = (int)cx_setting_int("CX_NUM_THREADS");
        if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n <= 0) n = 1;
        g_threads = n;
        openblas_set_num_threads(1);
    }
    return g_threads;
}

void cx_set_num_threads(int n)
{
    if (n <= 0) n = 1;
    g_threads = n;
    openblas_set_num_threads(1);
}
