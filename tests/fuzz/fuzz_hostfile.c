/* Hostfiles, as xla-launch reads them (launch/hostfile.c): any bytes give
 * a host count, the first host and no leak, or an error, never a crash. */
#include "fuzz_common.h"

#include "launcher.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    FILE *f = fopen(fuzz_as_file(data, n), "r");
    if (!f) abort();
    char *first;
    int err;
    int hosts = xl_parse_hostfile(f, &first, &err);
    fclose(f);
    /* the first host is a word of the file: no blank, no '#' */
    if (hosts > 0 && (!first || !*first || strpbrk(first, " \t\r\n#"))) abort();
    if (hosts <= 0 && first) abort();
    free(first);
    return 0;
}
