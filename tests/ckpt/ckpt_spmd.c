/* SPMD checkpoints, one step of tests/ckpt/spmd_ckpt.sh per mode:
 *
 *   save DIR [LEVEL] 4 ranks, mesh (2, 2) (data, model): an mlp whose first
 *                  weight is split in 3 blocks over model, whose second
 *                  weight splits unevenly (7 rows over data, padded) and
 *                  whose buffer splits 5 rows over data x model (one rank
 *                  holds only padding) trains 2 AdamW steps and saves
 *                  DIR/ck (compressed at zstd level LEVEL, if given);
 *                  every parameter, buffer and optimizer state, gathered
 *                  with cx_to_host, goes to DIR/ref.bin.
 *   load41 DIR     4 ranks, mesh (4, 1), other shardings (other blocks,
 *                  other dimensions, other uneven splits): a model built
 *                  with another seed loads DIR/ck (or, with a FILE, the
 *                  full file FILE with cx_ckpt_load_full) and equals
 *                  ref.bin bit for bit; its tensors keep the shardings
 *                  marked before the load.
 *   single DIR     one process without SPMD: the same (FILE: load_full;
 *                  a PREFIX, not ending in .h5: another checkpoint).
 *   fsdp DIR       any ranks without SPMD: an FSDP wrapper loads DIR/ck
 *                  (each rank's flat shards sliced from the SPMD boxes) and
 *                  saves DIR/fsdp (consolidated and compared by `single`).
 *   fail DIR TEXT  one process (or any ranks, with SPMD): the load of
 *                  DIR/ck fails, the same one-line error on every rank,
 *                  containing TEXT, and leaves the model untouched.
 */
#include "../dist/dist_check.h"

#include <stdint.h>
#include <string.h>

enum { B = 8, IN = 8, H = 12, OUT = 7 };

static cx_tensor *host(int64_t d0, int64_t d1, double phase)
{
    int64_t shape[2] = { d0, d1 };
    float v[B * H];
    for (int64_t i = 0; i < d0 * d1; i++) v[i] = (float)(0.5 * sin(0.37 * (double)i + phase));
    return cx_from_host(v, shape, 2, CX_F32);
}

/* 0: linear(IN, H), 1: relu, 2: linear(H, OUT), and a buffer "scale" (5, 3). */
static cx_module *build(uint64_t seed)
{
    cx_manual_seed(seed);
    cx_module *l[3] = { cx_nn_linear(IN, H, true), cx_nn_relu(), cx_nn_linear(H, OUT, true) };
    cx_module *m = cx_nn_sequential(l, 3);
    cx_tensor *scale = cx_persist(host(5, 3, (double)seed));
    CHECK(cx_module_register_buffer(m, "scale", scale) >= 0, "register_buffer: %s", cx_last_error());
    return m;
}

static void mark(cx_module *m, const char *key, const cx_mesh *mesh, cx_spec_entry a, cx_spec_entry b, int nd)
{
    cx_spec_entry spec[2] = { a, b };
    cx_tensor *t = cx_module_get(m, key);
    CHECK(t && cx_mark_sharding(t, mesh, spec, nd) == CX_OK, "mark %s: %s", key, cx_last_error());
}

static const cx_spec_entry k_none = CX_SPEC_NONE;
static const cx_spec_entry k_data_model = { 2, { 0 }, { "data", "model" }, 0 };

static cx_mesh *mesh_of(int d0, int d1)
{
    int shape[2] = { d0, d1 };
    const char *names[2] = { "data", "model" };
    cx_mesh *mesh = cx_mesh_new(NULL, 2, shape, names);
    CHECK(mesh, "mesh: %s", cx_last_error());
    return mesh;
}

/* The save's shardings on (2, 2). */
static void shard_22(cx_module *m, const cx_mesh *mesh)
{
    mark(m, "0.weight", mesh, CX_SPEC_BLOCKS("model", 3), k_none, 2);   /* 12 rows: 3 blocks of 4, 2 per rank */
    mark(m, "0.bias", mesh, CX_SPEC_NAME("model"), k_none, 1);
    mark(m, "2.weight", mesh, CX_SPEC_NAME("data"), CX_SPEC_NAME("model"), 2);   /* 7 rows: 4 + 3 */
    mark(m, "2.bias", mesh, CX_SPEC_NAME("data"), k_none, 1);
    mark(m, "scale", mesh, k_data_model, k_none, 2);   /* 5 rows over 4: 2, 2, 1, 0 */
}

/* The load's shardings on (4, 1): other splits of every tensor. */
static void shard_41(cx_module *m, const cx_mesh *mesh)
{
    mark(m, "0.weight", mesh, CX_SPEC_BLOCKS("data", 3), k_none, 2);   /* 1 row of each block per rank */
    mark(m, "2.weight", mesh, k_none, CX_SPEC_NAME("data"), 2);         /* 12 columns over 4 */
    mark(m, "2.bias", mesh, CX_SPEC_NAME("data"), k_none, 1);           /* 7 over 4: 2, 2, 2, 1 */
    mark(m, "scale", mesh, k_none, CX_SPEC_NAME("data"), 2);            /* 3 columns over 4: 1, 1, 1, 0 */
}

static cx_optimizer *optimizer(cx_module *m)
{
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_adam_opts o = cx_adamw_default_opts();
    o.lr = 0.05;
    cx_optimizer *opt = cx_optim_adamw(ps, n, o);
    free(ps);
    return opt;
}

static void train(cx_module *m, cx_optimizer *opt, const cx_mesh *mesh)
{
    cx_tensor *x = cx_persist(host(B, IN, 0.3)), *y = cx_persist(host(B, OUT, 1.1));
    cx_spec_entry spec[2] = { CX_SPEC_NAME("data"), CX_SPEC_NONE };
    CHECK(cx_mark_sharding(x, mesh, spec, 2) == CX_OK && cx_mark_sharding(y, mesh, spec, 2) == CX_OK, "input: %s",
          cx_last_error());
    for (int s = 0; s < 2; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *d = cx_sub(cx_module_forward(m, x), y);
        cx_tensor *loss = cx_mean(cx_mul(d, d), NULL, 0, false);
        CHECK(cx_backward(loss) == CX_OK && cx_optim_step(opt) == CX_OK, "step %d: %s", s, cx_last_error());
        CHECK(cx_step_end() == CX_OK, "step end %d: %s", s, cx_last_error());
    }
    cx_free(x);
    cx_free(y);
}

/* Every tensor of the state dict and the optimizer state, by name (the
 * names live in the lists, freed with the result by free_all). */
static cx_named_tensor *g_lists[2];

static cx_named_tensor *all_tensors(cx_module *m, cx_optimizer *opt, int *n)
{
    int a = 0, b = 0;
    g_lists[0] = cx_module_state_dict(m, &a);
    g_lists[1] = cx_optim_state(opt, &b);
    cx_named_tensor *all = calloc((size_t)(a + b), sizeof *all);
    memcpy(all, g_lists[0], sizeof *all * (size_t)a);
    memcpy(all + a, g_lists[1], sizeof *all * (size_t)b);
    *n = a + b;
    return all;
}

static void free_all(cx_named_tensor *all)
{
    free(all);
    free(g_lists[0]);
    free(g_lists[1]);
}

/* ref.bin: per tensor its name (64 bytes), numel, then the f32 values. */
static void write_ref(const char *dir, cx_module *m, cx_optimizer *opt)
{
    int n;
    cx_named_tensor *all = all_tensors(m, opt, &n);
    char path[4200];
    snprintf(path, sizeof path, "%s/ref.bin", dir);
    FILE *f = cx_global_ordinal() == 0 ? fopen(path, "wb") : NULL;
    for (int i = 0; i < n; i++) {
        int64_t k = cx_numel(all[i].tensor);
        float *v = malloc(sizeof(float) * (size_t)(k ? k : 1));
        CHECK(cx_to_host(all[i].tensor, v, CX_F32) == CX_OK, "to_host %s: %s", all[i].name, cx_last_error());
        char name[64] = { 0 };
        snprintf(name, sizeof name, "%s", all[i].name);
        if (f) {
            fwrite(name, 1, sizeof name, f);
            fwrite(&k, sizeof k, 1, f);
            fwrite(v, sizeof(float), (size_t)k, f);
        }
        free(v);
    }
    if (f) fclose(f);
    free_all(all);
}

/* Every tensor equals ref.bin bit for bit (and the file lists them all). */
static void compare_ref(const char *dir, cx_module *m, cx_optimizer *opt, const char *what)
{
    int n;
    cx_named_tensor *all = all_tensors(m, opt, &n);
    char path[4200];
    snprintf(path, sizeof path, "%s/ref.bin", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f, "%s: no %s", what, path);
    int seen = 0;
    char name[64];
    int64_t k;
    while (f && fread(name, 1, sizeof name, f) == sizeof name && fread(&k, sizeof k, 1, f) == 1) {
        float *want = malloc(sizeof(float) * (size_t)(k ? k : 1)), *got = malloc(sizeof(float) * (size_t)(k ? k : 1));
        CHECK(fread(want, sizeof(float), (size_t)k, f) == (size_t)k, "%s: ref.bin is short", what);
        int i = 0;
        while (i < n && strcmp(all[i].name, name)) i++;
        CHECK(i < n, "%s: %s is not in the model", what, name);
        if (i < n && cx_numel(all[i].tensor) != k) {
            CHECK(false, "%s: %s has %lld elements, saved %lld", what, name,
                  (long long)cx_numel(all[i].tensor), (long long)k);
        } else if (i < n) {
            CHECK(cx_to_host(all[i].tensor, got, CX_F32) == CX_OK, "%s: to_host %s: %s", what, name, cx_last_error());
            for (int64_t j = 0; j < k; j++)
                if (memcmp(&got[j], &want[j], sizeof(float))) {
                    CHECK(false, "%s: %s[%lld] is %.9g, saved %.9g", what, name, (long long)j, got[j], want[j]);
                    break;
                }
            seen++;
        }
        free(want);
        free(got);
    }
    if (f) fclose(f);
    CHECK(seen == n, "%s: ref.bin holds %d of the %d tensors", what, seen, n);
    CHECK(cx_optim_step_count(opt) == 2, "%s: optimizer step count %lld, want 2", what,
          (long long)cx_optim_step_count(opt));
    if (cx_global_ordinal() == 0 && !g_failures) printf("%s: %d tensors equal the saved ones bit for bit\n", what, n);
    free_all(all);
}

static void expect_sharding(cx_module *m, const char *key, const char *want)
{
    char got[256];
    cx_sharding_spec(cx_module_get(m, key), got, sizeof got);
    CHECK(strstr(got, want), "%s: sharding %s after the load, want %s", key, got, want);
}

/* An SPMD checkpoint into an FSDP wrapper, saved again from there. */
static void fsdp_round_trip(const char *dir, const char *prefix)
{
    cx_module *m = build(2);
    cx_fsdp *f = cx_fsdp_wrap(m, cx_fsdp_default_opts());
    CHECK(f, "fsdp_wrap: %s", cx_last_error());
    if (!f) return;
    int n = 0;
    cx_named_tensor *flat = cx_fsdp_parameters(f, &n);
    cx_optimizer *opt = cx_optim_adamw(flat, n, cx_adamw_default_opts());
    free(flat);
    cx_ckpt_extra ex;
    CHECK(cx_ckpt_load(prefix, cx_ckpt_model_fsdp(f, true), opt, &ex) == CX_OK, "fsdp load: %s", cx_last_error());
    CHECK(cx_optim_step_count(opt) == 2, "fsdp: step count %lld", (long long)cx_optim_step_count(opt));
    char out[4200];
    snprintf(out, sizeof out, "%s/fsdp", dir);
    /* the sampler position counts each rank's samples: the consolidated file's is world times it */
    ex.sampler_position /= cx_world_size();
    CHECK(cx_ckpt_save(out, cx_ckpt_model_fsdp(f, true), opt, &ex) == CX_OK, "fsdp save: %s", cx_last_error());
    if (cx_global_ordinal() == 0 && !g_failures) printf("fsdp on %d ranks: loaded and saved again\n", cx_world_size());
    cx_optim_free(opt);
    cx_fsdp_free(f);
    cx_module_free(m);
}

static int run(const char *mode, const char *dir, const char *arg)
{
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    if (!strcmp(mode, "fsdp")) {
        fsdp_round_trip(dir, prefix);
        return 0;
    }
    bool spmd = strcmp(mode, "single") && !(cx_world_size() == 1 && !strcmp(mode, "fail"));
    cx_mesh *mesh = NULL;
    if (spmd) {
        cx_use_spmd();
        mesh = !strcmp(mode, "save") ? mesh_of(2, 2) : mesh_of(cx_world_size(), 1);
        if (!mesh) return 1;
    }
    cx_module *m = build(!strcmp(mode, "save") ? 1 : 2);
    if (mesh) (!strcmp(mode, "save") ? shard_22 : shard_41)(m, mesh);
    cx_optimizer *opt = optimizer(m);
    if (!strcmp(mode, "save")) {
        train(m, opt, mesh);
        cx_ckpt_extra ex = { 2, 1, 16 };
        cx_ckpt_opts o = cx_ckpt_default_opts();
        o.compress_level = arg ? atoi(arg) : 0;   /* chunked zstd datasets */
        CHECK(cx_ckpt_save_opts(prefix, cx_ckpt_model_spmd(m), opt, &ex, o) == CX_OK, "save: %s", cx_last_error());
        write_ref(dir, m, opt);
    } else if (!strcmp(mode, "fail")) {
        float before[H * IN], after[H * IN];
        CHECK(cx_to_host(cx_module_get(m, "0.weight"), before, CX_F32) == CX_OK, "to_host: %s", cx_last_error());
        cx_status st = cx_ckpt_load(prefix, cx_ckpt_model_spmd(m), opt, NULL);
        const char *err = cx_last_error();
        CHECK(st != CX_OK && strstr(err, arg) && !strchr(err, '\n'), "a load that must fail (%s): %s", arg,
              st == CX_OK ? "it succeeded" : err);
        if (st != CX_OK) printf("rank %d: %s\n", cx_global_ordinal(), err);
        CHECK(cx_to_host(cx_module_get(m, "0.weight"), after, CX_F32) == CX_OK &&
                  !memcmp(before, after, sizeof before),
              "the failed load modified the model");
    } else {
        cx_ckpt_extra ex = { 0, 0, 0 };
        size_t len = arg ? strlen(arg) : 0;
        bool file = len > 3 && !strcmp(arg + len - 3, ".h5");
        cx_status st = file ? cx_ckpt_load_full(arg, cx_ckpt_model_spmd(m), opt, &ex)
                            : cx_ckpt_load(arg ? arg : prefix, cx_ckpt_model_spmd(m), opt, &ex);
        CHECK(st == CX_OK, "load: %s", cx_last_error());
        /* (a resharded checkpoint's position is each of its ranks') */
        CHECK(ex.step == 2 && ex.epoch == 1 && (ex.sampler_position == 16 || (arg && !file)),
              "extra: step %lld epoch %lld position %lld",
              (long long)ex.step, (long long)ex.epoch, (long long)ex.sampler_position);
        char what[128];
        snprintf(what, sizeof what, "%s%s%s on %d rank(s)", mode, arg ? " " : "", arg ? arg : "", cx_world_size());
        compare_ref(dir, m, opt, what);
        if (mesh) {
            expect_sharding(m, "0.weight", "spec=(data in 3 blocks, None)");
            expect_sharding(m, "2.weight", "spec=(None, data)");
            expect_sharding(m, "0.bias", "replicated");
        }
    }
    cx_optim_free(opt);
    cx_module_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "ckpt_spmd: %s\n", cx_last_error());
        return 1;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: ckpt_spmd {save,load41,single,fsdp,fail} DIR [FILE|PREFIX|TEXT]\n");
        cx_dist_finalize();
        return 2;
    }
    run(argv[1], argv[2], argc > 3 ? argv[3] : NULL);
    return dist_finish("ckpt_spmd");
}
