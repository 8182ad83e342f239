/* The optimizer object shared by SGD and Adam(W): parameters, state, step. */
#include "optim_internal.h"

cx_optimizer *cx_optim_new(const cx_optim_kind *kind, const cx_named_tensor *params, int n, double lr,
                           const bool *want)
{
    if (n < 0 || (n > 0 && !params)) {
        cx_set_last_error("%s: no parameter list", kind->name);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!params[i].tensor || !cx_is_persistent(params[i].tensor) ||
            !cx_dtype_is_float(cx_dtype_of(params[i].tensor))) {
            cx_set_last_error("%s: parameter %d (%s) is not a persistent float tensor", kind->name, i,
                         params[i].name ? params[i].name : "unnamed");
            return NULL;
        }
    }
    cx_optimizer *o = calloc(1, sizeof *o);
    if (!o) goto oom;
    o->kind = kind;
    o->lr = lr;
    o->ps = calloc((size_t)(n ? n : 1), sizeof *o->ps);
    if (!o->ps) goto oom;
    o->n = n;
    size_t maxbytes = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)cx_numel(params[i].tensor) * sizeof(float);
        if (b > maxbytes) maxbytes = b;
    }
    /* State starts as device data (not a constant), so step 1 traces the
     * same graph as every later step. */
    float *zeros = calloc(1, maxbytes ? maxbytes : sizeof(float));
    if (!zeros) goto oom;
    for (int i = 0; i < n; i++) {
        cx_oparam *p = &o->ps[i];
        char fallback[32];
        snprintf(fallback, sizeof fallback, "param%d", i);
        p->name = strdup(params[i].name ? params[i].name : fallback);
        p->p = params[i].tensor;
        if (!p->name) { free(zeros); goto oom; }
        for (int s = 0; s < kind->nstate; s++) {
            if (!want[s]) continue;
            bool is_step = !strcmp(kind->state_names[s], "step");
            p->state[s] = is_step ? cx_from_host(zeros, NULL, 0, CX_F32)
                                  : cx_from_host(zeros, cx_shape(p->p), cx_ndim(p->p), CX_F32);
            if (!p->state[s] || cx_tensor_error(p->state[s])) { free(zeros); goto oom; }
            cx_persist(p->state[s]);
            char label[512];
            snprintf(label, sizeof label, "%s.%s", p->name, kind->state_names[s]);
            cx_set_name(p->state[s], label);
        }
    }
    free(zeros);
    return o;
oom:
    cx_optim_free(o);
    cx_set_last_error("%s: out of memory for the state of %d parameters", kind->name, n);
    return NULL;
}

void cx_optim_free(cx_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->ps[i].name);
        for (int s = 0; s < CX_OPTIM_MAX_STATE; s++) cx_free(o->ps[i].state[s]);
    }
    free(o->ps);
    free(o);
}

cx_status cx_optim_assign(cx_tensor *dst, cx_tensor *value, const char *what)
{
    const char *e = cx_tensor_error(value);
    if (e) {
        cx_set_last_error("%s: %s", what, e);
        return CX_ERR_SHAPE;
    }
    return cx_assign(dst, value);
}

cx_status cx_optim_step(cx_optimizer *o)
{
    if (!o) { cx_set_last_error("cx_optim_step: optimizer is NULL"); return CX_ERR_ARG; }
    cx_tensor *hp[16];
    cx_no_grad_begin();
    int nhp = o->kind->hyper(o, hp);
    cx_status st = CX_OK;
    for (int i = 0; i < o->n && st == CX_OK; i++) {
        cx_oparam *p = &o->ps[i];
        if (!cx_grad(p->p)) continue;
        st = o->kind->update(o, p, hp);
        p->steps++;
    }
    for (int i = 0; i < nhp; i++) cx_drop(hp[i]);
    cx_no_grad_end();
    o->steps++;
    return st;
}

void cx_optim_zero_grad(cx_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) cx_zero_grad(o->ps[i].p);
}

void cx_optim_set_lr(cx_optimizer *o, double lr) { o->lr = lr; }
double cx_optim_get_lr(const cx_optimizer *o) { return o->lr; }
int64_t cx_optim_step_count(const cx_optimizer *o) { return o->steps; }
const char *cx_optim_name(const cx_optimizer *o) { return o->kind->name; }

void cx_optim_set_step_count(cx_optimizer *o, int64_t steps)
{
    o->steps = steps;
    for (int i = 0; i < o->n; i++) o->ps[i].steps = steps;
}

/* One block: array then names. */
static cx_named_tensor *named_block(int count, size_t chars, cx_named_tensor **arr, char **names)
{
    size_t head = (size_t)(count ? count : 1) * sizeof(cx_named_tensor);
    char *block = malloc(head + chars + 1);
    if (!block) return NULL;
    *arr = (cx_named_tensor *)block;
    *names = block + head;
    return *arr;
}

cx_named_tensor *cx_optim_state(const cx_optimizer *o, int *n)
{
    int count = 0;
    size_t chars = 0;
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < o->kind->nstate; s++)
            if (o->ps[i].state[s]) {
                count++;
                chars += strlen(o->ps[i].name) + strlen(o->kind->state_names[s]) + 2;
            }
    cx_named_tensor *arr;
    char *names;
    if (!named_block(count, chars, &arr, &names)) {
        cx_set_last_error("cx_optim_state: out of memory");
        *n = 0;
        return NULL;
    }
    int k = 0;
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < o->kind->nstate; s++)
            if (o->ps[i].state[s]) {
                int w = sprintf(names, "%s.%s", o->ps[i].name, o->kind->state_names[s]);
                arr[k++] = (cx_named_tensor){ names, o->ps[i].state[s] };
                names += w + 1;
            }
    *n = k;
    return arr;
}

cx_named_tensor *cx_optim_params(const cx_optimizer *o, int *n)
{
    size_t chars = 0;
    for (int i = 0; i < o->n; i++) chars += strlen(o->ps[i].name) + 1;
    cx_named_tensor *arr;
    char *names;
    if (!named_block(o->n, chars, &arr, &names)) {
        cx_set_last_error("cx_optim_params: out of memory");
        *n = 0;
        return NULL;
    }
    for (int i = 0; i < o->n; i++) {
        size_t l = strlen(o->ps[i].name);
        memcpy(names, o->ps[i].name, l + 1);
        arr[i] = (cx_named_tensor){ names, o->ps[i].p };
        names += l + 1;
    }
    *n = o->n;
    return arr;
}
