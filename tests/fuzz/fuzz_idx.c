/* IDX files (MNIST's format), raw or gzip: cx_idx_read on any bytes. */
#include "fuzz_common.h"

#include <cxla/cxla.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    cx_idx_array a;
    if (cx_idx_read(fuzz_as_file(data, n), &a) == CX_OK) {
        size_t numel = 1;
        for (int d = 0; d < a.ndim; d++) numel *= (size_t)a.dims[d];
        volatile uint8_t sink = numel ? a.data[numel - 1] : 0;   /* the whole array is there */
        (void)sink;
        cx_idx_array_release(&a);
    }
    return 0;
}
