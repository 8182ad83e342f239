/* dtypes (sizes, names, bf16 conversion) and shapes (element counts, text). */
#include "base.h"
#include "cx_settings.h"

static const struct { const char *name; size_t size; bool is_float; } g_dtypes[CX_DTYPE_COUNT] = {
    [CX_F32] = { "f32", 4, true },
    [CX_BF16] = { "bf16", 2, true },
    [CX_I32] = { "i32", 4, false },
    [CX_I64] = { "i64", 8, false },
    [CX_U8] = { "u8", 1, false },
    [CX_BOOL] = { "bool", 1, false },
};

size_t cx_dtype_size(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT ? g_dtypes[dt].size : 0; }
const char *cx_dtype_name(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT ? g_dtypes[dt].name : "?"; }
bool cx_dtype_is_float(cx_dtype dt) { return (unsigned)dt < CX_DTYPE_COUNT && g_dtypes[dt].is_float; }

float cx_bf16_to_f32(uint16_t h) { return cx_bf16_to_f32_inline(h); }
uint16_t cx_f32_to_bf16(float f) { return cx_f32_to_bf16_inline(f); }

void cx_bf16_to_f32_row(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_bf16_to_f32_inline(src[i]);
}

void cx_f32_to_bf16_row(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_f32_to_bf16_inline(src[i]);
}

const char *cx_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, cap - off, "(");
    for (int i = 0; i < ndim && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (ndim == 1 && off < cap) off += (size_t)snprintf(buf + off, cap - off, ",");
    if (off < cap) snprintf(buf + off, cap - off, ")");
    return buf;
}

int64_t cx_shape_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Read once: a process holds f32 one way from its first tensor to its last,
 * or bf16 leaves would meet f32 ones made before a change. */
cx_dtype cx_held_dtype(cx_dtype dt)
{
    static atomic_int mode = -1;
    int m = atomic_load_explicit(&mode, memory_order_relaxed);
    if (m < 0) {
        m = cx_setting_enum("XLA_USE_BF16") == 1 || cx_setting_enum("XLA_DOWNCAST_BF16") == 1;
        atomic_store_explicit(&mode, m, memory_order_relaxed);
    }
    return dt == CX_F32 && m ? CX_BF16 : dt;
}
