/* Text and token files: cx_text_open (bytes with a train/val split, and
 * uint16 tokens) on any bytes, and every window gathered. The first byte
 * picks the format and the block. */
#include "fuzz_common.h"

#include <cxla/cxla.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    cx_text_opts o = cx_text_default_opts();
    o.format = data[0] & 1 ? CX_TEXT_U16 : CX_TEXT_BYTES;
    o.block = 1 + (data[0] >> 1) % 16;
    o.val = data[0] & 0x80;
    o.eval_windows = data[0] & 0x40 ? 3 : 0;
    o.vocab_size = o.format == CX_TEXT_U16 ? 1000 : 0;
    o.path = fuzz_as_file(data + 1, n - 1);
    cx_dataset *ds = NULL;
    if (cx_text_open(o, &ds) != CX_OK) return 0;
    int64_t x[16], y[16];
    for (int64_t i = 0; i < cx_dataset_size(ds) && i < 64; i++) cx_dataset_gather(ds, &i, 1, (void *const[]){ x, y });
    cx_dataset_set_epoch(ds, 1);
    int64_t last = cx_dataset_size(ds) - 1;
    cx_dataset_gather(ds, &last, 1, (void *const[]){ x, y });
    cx_dataset_free(ds);
    return 0;
}
