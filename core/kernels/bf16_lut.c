/* Lookup tables of bf16 unary functions: a bf16 op of bf16 values has
 * 65536 inputs, so its rounded results are a 128 KiB table. ggml keeps
 * f16 GELU the same way.
 *
 * The table is filled by the caller's own loop (the program interpreter's
 * bf16 op over every bf16 value, in one call), so a lookup gives the bits
 * that loop gives. Under AVX2 the bf16 GELU's erf made it 1.3x the f32
 * GELU's time, rounding and widening included, and GELU's gradient (erf
 * and exp) was most of its matmul epilogue's. */
#include "kernels.h"
#include "cx_bf16.h"
#include "op_set.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { ENTRIES = 65536 };

typedef struct {
    _Atomic(uint16_t *) table;
    bool failed;                     /* out of memory once: the caller computes */
} lut_slot;

static lut_slot slots[OP_COUNT];
static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;

/* every bf16 value widened, fed to fill, the results' high halves kept */
static uint16_t *build(int op, cx_bf16_lut_fill *fill)
{
    float *in = malloc(sizeof(float) * ENTRIES), *out = malloc(sizeof(float) * ENTRIES);
    uint16_t *t = calloc(ENTRIES, sizeof *t);
    if (!in || !out || !t) { free(in); free(out); free(t); return NULL; }
    for (int i = 0; i < ENTRIES; i++) in[i] = cx_bf16_to_f32_inline((uint16_t)i);
    fill(op, out, in, ENTRIES);
    for (int i = 0; i < ENTRIES; i++) {
        uint32_t u;
        memcpy(&u, &out[i], sizeof u);
        t[i] = (uint16_t)(u >> 16);
    }
    free(in);
    free(out);
    return t;
}

const uint16_t *cx_bf16_lut(int op, cx_bf16_lut_fill *fill)
{
    if (op < 0 || op >= OP_COUNT) return NULL;
    lut_slot *s = &slots[op];
    uint16_t *t = atomic_load_explicit(&s->table, memory_order_acquire);
    if (t) return t;
    pthread_mutex_lock(&build_lock);
    t = atomic_load_explicit(&s->table, memory_order_relaxed);
    if (!t && !s->failed) {
        t = build(op, fill);
        if (t) atomic_store_explicit(&s->table, t, memory_order_release);
        else s->failed = true;
    }
    pthread_mutex_unlock(&build_lock);
    return t;
}

/* Scalar loads, eight in flight: on the Zen 5 they took 0.21 ns a value
 * against AVX2's 8-lane gather's 0.42 and AVX-512's 16-lane one's 0.32
 * (one thread, a GELU's inputs). */
void cx_bf16_lut_apply(float *out, const float *in, const uint16_t *table, int64_t n)
{
#pragma GCC unroll 8
    for (int64_t j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, &in[j], sizeof u);
        uint32_t w = (uint32_t)table[u >> 16] << 16;
        memcpy(&out[j], &w, sizeof w);
    }
}
