/* How the format-version-1 checkpoints beside this file were made: built
 * against libcxla of commit 72647d1 (the last to write version 1) and run
 * as `make_v1 DIR`. Not part of the build: today's library writes the
 * current version. ckpt_faults.c checks that they still load.
 *
 *   gcc -I<72647d1>/include make_v1.c -L<72647d1>/build -lcxla -o make_v1
 *
 * Every tensor, model and optimizer state alike, holds
 * v1_value(its name, i) (ckpt_faults.c computes the same values). */
#include <cxla/cxla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tag(const char *s)
{
    int t = 0;
    for (; *s; s++) t += (unsigned char)*s;
    return t % 61;
}

static void fill(cx_tensor *t, const char *name)
{
    int64_t n = cx_numel(t);
    cx_dtype dt = cx_dtype_of(t);
    void *buf = malloc((size_t)n * 8 + 8);
    if (!buf) exit(1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == CX_F32) ((float *)buf)[i] = (float)(tag(name) + i) / 8.0f;
        else if (dt == CX_I64) ((int64_t *)buf)[i] = tag(name) + i;
        else exit(1);
    }
    cx_tensor *v = cx_from_host(buf, cx_shape(t), cx_ndim(t), dt);
    if (cx_assign(t, v) != CX_OK || cx_sync_tensors(&t, 1) != CX_OK) {
        fprintf(stderr, "%s\n", cx_last_error());
        exit(1);
    }
    cx_free(v);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    cx_manual_seed(3);
    cx_module *m[3] = { cx_nn_linear(4, 3, true), cx_nn_batch_norm2d(3, cx_batch_norm_default_opts()),
                        cx_nn_linear(3, 2, true) };
    cx_module *model = cx_nn_sequential(m, 3);
    int n;
    cx_named_tensor *ps = cx_module_parameters(model, &n);
    cx_optimizer *opt = cx_optim_adam(ps, n, cx_adam_default_opts());
    free(ps);
    cx_named_tensor *sd = cx_module_state_dict(model, &n);
    for (int i = 0; i < n; i++) fill(sd[i].tensor, sd[i].name);
    free(sd);
    cx_named_tensor *st = cx_optim_state(opt, &n);
    for (int i = 0; i < n; i++) fill(st[i].tensor, st[i].name);
    free(st);
    cx_optim_set_step_count(opt, 5);
    cx_set_rng_state((cx_rng_state){ 42, 1000 });
    cx_ckpt_extra ex = { 5, 2, 24 };
    char p[4096], q[4096];
    snprintf(p, sizeof p, "%s/v1_single", argv[1]);
    snprintf(q, sizeof q, "%s/v1_sharded", argv[1]);
    cx_ckpt_consolidate_opts co = cx_ckpt_consolidate_default_opts();
    co.with_optimizer = true;
    if (cx_ckpt_save(p, cx_ckpt_model_single(model), opt, &ex) != CX_OK || cx_ckpt_reshard(p, q, 2, co) != CX_OK) {
        fprintf(stderr, "%s\n", cx_last_error());
        return 1;
    }
    return 0;
}
