/* Program-level optimizations of a fused kernel: the relu patterns and dead
 * code (peephole), and fewer, longer loops (coalescing). */
#include "passes.h"

/* ---- peephole -------------------------------------------------------------------- */

static bool zero_const(const cx_pinstr *in)
{
    return in->kind == P_CONST && in->f == 0.0 && (in->dtype == CX_F32 || in->dtype == CX_BF16);
}

void cx_prog_peephole(cx_program *p)
{
    for (int i = 0; i < p->n; i++) {
        cx_pinstr *w = &p->ins[i];
        if (w->kind != P_WHERE || (w->dtype != CX_F32 && w->dtype != CX_BF16)) continue;
        const cx_pinstr *c = &p->ins[w->a];
        if (c->kind != P_BIN || c->op != OP_LT || !zero_const(&p->ins[c->a]) || !zero_const(&p->ins[w->c])) continue;
        int x = c->b;
        if (p->ins[x].dtype != w->dtype) continue;
        cx_pinstr r = { .kind = w->b == x ? P_RELU : P_POSMASK, .dtype = w->dtype, .a = x, .b = w->b };
        *w = r;
    }
    /* dead-code elimination, then compact the registers */
    char *live = calloc((size_t)p->n + 1, 1);
    int *map = malloc(sizeof(int) * (size_t)(p->n + 1));
    if (!live || !map) { free(live); free(map); return; }   /* the unoptimized program is still correct */
    live[p->result] = 1;
    for (int i = p->n - 1; i >= 0; i--) {
        if (!live[i]) continue;
        const cx_pinstr *in = &p->ins[i];
        switch ((cx_pkind)in->kind) {
        case P_UN: case P_CAST: case P_MASK: case P_RELU: live[in->a] = 1; break;
        case P_BIN: case P_POSMASK: live[in->a] = 1; live[in->b] = 1; break;
        case P_WHERE: live[in->a] = 1; live[in->b] = 1; live[in->c] = 1; break;
        default: break;
        }
    }
    int k = 0;
    for (int i = 0; i < p->n; i++) {
        if (!live[i]) continue;
        cx_pinstr in = p->ins[i];
        switch ((cx_pkind)in.kind) {
        case P_UN: case P_CAST: case P_MASK: case P_RELU: in.a = map[in.a]; break;
        case P_BIN: case P_POSMASK: in.a = map[in.a]; in.b = map[in.b]; break;
        case P_WHERE: in.a = map[in.a]; in.b = map[in.b]; in.c = map[in.c]; break;
        default: break;
        }
        map[i] = k;
        p->ins[k++] = in;
    }
    p->result = map[p->result];
    p->n = k;
    free(live);
    free(map);
}

/* ---- coalescing ----------------------------------------------------------------- */

static bool view_full(const cx_view *v, int d, const int64_t *shape)
{
    return !v->masked || (v->lo[d] <= 0 && v->hi[d] >= shape[d]);
}

int cx_prog_coalesce(cx_program *p, int64_t *shape, int nd, int *split)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (shape[d] != 1) continue;
        bool full = true;
        for (int v = 0; v < p->nviews; v++) if (!view_full(&p->views[v], d, shape)) full = false;
        if (!full) continue;
        for (int v = 0; v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            for (int e = d; e < nd - 1; e++) { w->strides[e] = w->strides[e + 1]; w->lo[e] = w->lo[e + 1]; w->hi[e] = w->hi[e + 1]; }
            w->strides[nd - 1] = 0;
        }
        for (int e = d; e < nd - 1; e++) shape[e] = shape[e + 1];
        nd--;
        if (d < *split) (*split)--;
    }
    for (int d = nd - 2; d >= 0; d--) {
        if (d == *split - 1) continue;
        bool ok = true;
        for (int v = 0; ok && v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            if (w->strides[d] != w->strides[d + 1] * shape[d + 1]) ok = false;
            if (!view_full(w, d, shape) || !view_full(w, d + 1, shape)) ok = false;
        }
        if (!ok) continue;
        for (int v = 0; v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            w->strides[d] = w->strides[d + 1];
            if (w->masked) { w->lo[d] = 0; w->hi[d] = shape[d] * shape[d + 1]; }
            for (int e = d + 1; e < nd - 1; e++) { w->strides[e] = w->strides[e + 1]; w->lo[e] = w->lo[e + 1]; w->hi[e] = w->hi[e + 1]; }
            w->strides[nd - 1] = 0;
        }
        shape[d] *= shape[d + 1];
        for (int e = d + 1; e < nd - 1; e++) shape[e] = shape[e + 1];
        nd--;
        if (*split > d + 1) (*split)--;
    }
    return nd;
}

