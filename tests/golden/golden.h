/* Helpers for the golden-value tests: the deterministic inputs/weights that
 * gen_golden.py also generates, and comparisons against its results. */
#ifndef CX_GOLDEN_H
#define CX_GOLDEN_H

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_values.h"

static inline uint32_t golden_fnv1a(const char *s)
{
    uint32_t h = 0x811C9DC5u;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x01000193u;
    }
    return h;
}

static inline uint64_t golden_hash(uint64_t salt, int64_t i)
{
    uint64_t z = salt + (uint64_t)i + 1;
    z *= 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Same float32 operations as gen_golden.py's vals(). */
static inline void golden_vals(float *out, int64_t n, const char *key, float scale)
{
    uint64_t salt = (uint64_t)golden_fnv1a(key) << 32;
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(golden_hash(salt, i) >> 40) * (1.0f / 16777216.0f);
        out[i] = (u * 2.0f - 1.0f) * scale;
    }
}

static inline void golden_ints(int64_t *out, int64_t n, const char *key, int64_t mod)
{
    uint64_t salt = (uint64_t)golden_fnv1a(key) << 32;
    for (int64_t i = 0; i < n; i++) out[i] = (int64_t)((golden_hash(salt, i) >> 33) % (uint64_t)mod);
}

static inline float golden_param_scale(const int64_t *shape, int ndim)
{
    if (ndim < 2) return 0.5f;
    int64_t fan_in = 1;
    for (int i = 1; i < ndim; i++) fan_in *= shape[i];
    return (float)(1.0 / sqrt((double)fan_in));
}

static inline int64_t golden_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* A tensor of generated values "<case>/<name>" (persistent outside a step). */
static inline cx_tensor *golden_input(const char *gcase, const char *name, const int64_t *shape, int ndim,
                                      float scale)
{
    char key[256];
    snprintf(key, sizeof key, "%s/%s", gcase, name);
    int64_t n = golden_numel(shape, ndim);
    float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
    if (!buf) return NULL;
    golden_vals(buf, n, key, scale);
    cx_tensor *t = cx_from_host(buf, shape, ndim, CX_F32);
    free(buf);
    return t;
}

/* Loads every parameter of m with the values gen_golden.py gives
 * "<case>/<full name>". @return false on a load failure. */
static inline bool golden_load_params(cx_module *m, const char *gcase)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    if (!ps) return false;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s/%s", gcase, ps[i].name);
        cx_tensor *t = ps[i].tensor;
        int64_t numel = cx_numel(t);
        float *buf = malloc((size_t)numel * sizeof *buf);
        if (!buf) { ok = false; break; }
        golden_vals(buf, numel, key, golden_param_scale(cx_shape(t), cx_ndim(t)));
        ok = cx_module_load(m, ps[i].name, buf, CX_F32) == CX_OK;
        free(buf);
    }
    free(ps);
    return ok;
}

static inline const cx_golden *golden_find(const char *key)
{
    for (int i = 0; i < CX_GOLDEN_COUNT; i++)
        if (!strcmp(cx_golden_table[i].key, key)) return &cx_golden_table[i];
    return NULL;
}

/* Compares host values with the reference `key`: each sample within
 * rtol * max(|ref|, 1% of the tensor's max |ref|) (the floor keeps entries
 * that cancel to ~0 from demanding more than float32 gives), and the sum of
 * |x| within rtol. @return NULL if they match, else a message in msg. */
static inline const char *golden_compare_loose(const char *key, const double *x, int64_t n, double rtol,
                                               int64_t loose_lo, int64_t loose_hi, double atol, char *msg,
                                               size_t cap);

static inline const char *golden_compare(const char *key, const double *x, int64_t n, double rtol, char *msg,
                                         size_t cap)
{
    return golden_compare_loose(key, x, n, rtol, 0, 0, 0, msg, cap);
}

/* golden_compare, except that elements [loose_lo, loose_hi) only need to be
 * within atol (values that are noise in exact arithmetic but bounded). */
static inline const char *golden_compare_loose(const char *key, const double *x, int64_t n, double rtol,
                                               int64_t loose_lo, int64_t loose_hi, double atol, char *msg,
                                               size_t cap)
{
    const cx_golden *g = golden_find(key);
    if (!g) { snprintf(msg, cap, "%s: no golden value", key); return msg; }
    if (g->numel != n) {
        snprintf(msg, cap, "%s: %lld elements, golden has %lld", key, (long long)n, (long long)g->numel);
        return msg;
    }
    double floor = 0.01 * g->max_abs;
    for (int k = 0; k < g->nsamples; k++) {
        double ref = g->v[k], got = x[(int64_t)k * g->stride];
        int64_t at = (int64_t)k * g->stride;
        double tol = at >= loose_lo && at < loose_hi ? atol : rtol * (fabs(ref) > floor ? fabs(ref) : floor);
        if (!(fabs(got - ref) <= tol)) {
            snprintf(msg, cap, "%s[%lld]: got %.9g, want %.9g (|diff| %.3g > %.3g)", key,
                     (long long)k * g->stride, got, ref, fabs(got - ref), tol);
            return msg;
        }
    }
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs(x[i]);
    if (!(fabs(s - g->abs_sum) <= rtol * g->abs_sum + (double)(loose_hi - loose_lo) * atol + 1e-30)) {
        snprintf(msg, cap, "%s: sum |x| %.9g, want %.9g", key, s, g->abs_sum);
        return msg;
    }
    return NULL;
}

static inline const char *golden_check_loose(const char *key, cx_tensor *t, double rtol, int64_t loose_lo,
                                             int64_t loose_hi, double atol, char *msg, size_t cap);

/* The same for a tensor (read back as f32). */
static inline const char *golden_check(const char *key, cx_tensor *t, double rtol, char *msg, size_t cap)
{
    return golden_check_loose(key, t, rtol, 0, 0, 0, msg, cap);
}

static inline const char *golden_check_loose(const char *key, cx_tensor *t, double rtol, int64_t loose_lo,
                                             int64_t loose_hi, double atol, char *msg, size_t cap)
{
    if (!t) { snprintf(msg, cap, "%s: tensor is NULL", key); return msg; }
    int64_t n = cx_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    if (!f || !d) { free(f); free(d); snprintf(msg, cap, "%s: out of memory", key); return msg; }
    const char *r;
    if (cx_to_host(t, f, CX_F32) != CX_OK) {
        snprintf(msg, cap, "%s: cx_to_host failed: %s", key, cx_last_error());
        r = msg;
    } else {
        for (int64_t i = 0; i < n; i++) d[i] = f[i];
        r = golden_compare_loose(key, d, n, rtol, loose_lo, loose_hi, atol, msg, cap);
    }
    free(f);
    free(d);
    return r;
}

/* A Criterion expectation that the tensor matches the reference `key`
 * within rtol (golden_check), its message in the test file's g_msg. */
#define GOLDEN_EXPECT(key, t, rtol)                                             \
    do {                                                                        \
        const char *e_ = golden_check((key), (t), (rtol), g_msg, sizeof g_msg); \
        cr_expect(e_ == NULL, "%s", e_ ? e_ : "");                              \
    } while (0)

#endif
