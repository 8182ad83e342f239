/* Deferred tensors: a placeholder that carries the recipe of its values, so
 * that a model can be described whole and generated piece by piece (each
 * rank its own shard) with the bits the whole would have had. */
#include "ops.h"

static bool recipe_ok(const cx_init_recipe *r, const char *op)
{
    if (!r) { cx_set_last_error("%s: recipe is NULL", op); return false; }
    if ((unsigned)r->kind > CX_INIT_NORMAL) { cx_set_last_error("%s: unknown init kind %d", op, (int)r->kind); return false; }
    return true;
}

cx_tensor *cx_deferred(const int64_t *shape, int ndim, cx_dtype dtype, const cx_init_recipe *recipe)
{
    if (!recipe_ok(recipe, "deferred")) return cx_poisoned("%s", cx_last_error());
    if (recipe->kind != CX_INIT_CONSTANT && !cx_dtype_is_float(dtype))
        return cx_poisoned("deferred: a random init needs a floating-point dtype, not %s", cx_dtype_name(dtype));
    cx_init_recipe *copy = malloc(sizeof *copy);
    if (!copy) return cx_poisoned("deferred: out of memory");
    *copy = *recipe;
    cx_tensor *t = cx_placeholder(shape, ndim, dtype);
    if (cx_tensor_error(t)) { free(copy); return t; }
    t->node->init = copy;
    return t;
}

bool cx_deferred_recipe(const cx_tensor *t, cx_init_recipe *out)
{
    if (!t || t->node->op != OP_DATA || t->node->buf || !t->node->init) return false;
    if (out) *out = *t->node->init;
    return true;
}

/* Values of elements [start, start + count) in the shape `shape`. */
static cx_tensor *init_values(const cx_init_recipe *r, const int64_t *shape, int ndim, uint64_t start, cx_dtype dtype)
{
    switch (r->kind) {
    case CX_INIT_CONSTANT: return cx_full(shape, ndim, r->a, dtype);
    case CX_INIT_UNIFORM: return cx_rng_uniform_at(shape, ndim, r->a, r->b, dtype, r->seed, r->offset + start);
    case CX_INIT_NORMAL: return cx_rng_normal_at(shape, ndim, r->a, r->b, dtype, r->seed, r->offset + start);
    }
    return cx_poisoned("init_range: unknown init kind %d", (int)r->kind);
}

cx_tensor *cx_init_range(const cx_init_recipe *r, int64_t start, int64_t count, cx_dtype dtype)
{
    if (!recipe_ok(r, "init_range")) return cx_poisoned("%s", cx_last_error());
    if (start < 0 || count < 0)
        return cx_poisoned("init_range: range [%lld, +%lld) is negative", (long long)start, (long long)count);
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("init_range: unknown dtype %d", (int)dtype);
    return init_values(r, &count, 1, (uint64_t)start, cx_held_dtype(dtype));
}

cx_tensor *cx_deferred_values(const cx_tensor *t)
{
    cx_init_recipe r;
    if (!cx_deferred_recipe(t, &r)) return NULL;
    return init_values(&r, t->node->shape, t->node->ndim, 0, (cx_dtype)t->node->dtype);
}
