/* Slurm's tasks per node ("2(x3),1", util/cx_job.c), as the library, the
 * launcher and the wrapper read them from the environment: any text gives
 * a count in range or -1, never a crash, and no node has more tasks than
 * the whole. The first byte picks the node asked for (255: the total). */
#include "fuzz_common.h"

#include "cx_job.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    char text[4096];
    size_t len = n - 1 < sizeof text - 1 ? n - 1 : sizeof text - 1;
    memcpy(text, data + 1, len);
    text[len] = '\0';
    int node = data[0] == 255 ? -1 : data[0];
    int got = cx_job_slurm_tasks(text, node);
    if (got < -1 || got > (1 << 30)) abort();
    int total = cx_job_slurm_tasks(text, -1);
    if (got >= 0 && node >= 0 && total >= 0 && got > total) abort();
    return 0;
}
