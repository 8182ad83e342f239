/* Embedding: rows of a (num, dim) table selected by integer indices. */
#include "nn_internal.h"

typedef struct {
    int w;
} embedding;

static cx_tensor *embedding_forward(cx_module *m, cx_tensor *idx)
{
    const embedding *e = cx_module_impl(m);
    return cx_embedding(cx_module_param(m, e->w), idx);
}

static const cx_module_type embedding_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Embedding", .forward = embedding_forward, .free = free };

cx_module *cx_nn_embedding(int64_t num, int64_t dim)
{
    if (num <= 0 || dim <= 0) {
        cx_set_last_error("cx_nn_embedding: bad sizes %lld x %lld", (long long)num, (long long)dim);
        return NULL;
    }
    embedding *e = malloc(sizeof *e);
    if (!e) { cx_set_last_error("cx_nn_embedding: out of memory"); return NULL; }
    cx_module *m = cx_module_new(&embedding_type, e);
    if (!m) return NULL;
    int64_t shape[2] = { num, dim };
    e->w = cx_module_register_parameter(m, "weight", cx_init_normal(shape, 2, 0.0, 1.0));
    if (e->w < 0) { cx_module_free(m); return NULL; }
    return m;
}
