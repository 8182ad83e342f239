/* Checkpoint files: a consolidated (full) checkpoint of a small model,
 * mutated, loaded with cx_ckpt_load_full. The reading layer validates the
 * root attributes, names, shapes and checksums before any tensor is touched. */
#include "fuzz_common.h"

#include <cxla/cxla.h>

static cx_module *model(void)
{
    static cx_module *m;
    if (!m) {
        cx_manual_seed(1);
        cx_module *l[3] = { cx_nn_linear(4, 3, true), cx_nn_relu(), cx_nn_linear(3, 2, true) };
        m = cx_nn_sequential(l, 3);
    }
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    cx_ckpt_extra ex;
    cx_ckpt_load_full(fuzz_as_file(data, n), cx_ckpt_model_single(model()), NULL, &ex);
    return 0;
}
