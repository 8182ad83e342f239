/* consolidate_ckpts: stitch a sharded cxla checkpoint into one full model
 * file, or reshard it for another world size, as PyTorch/XLA's
 * consolidate_sharded_ckpts (streaming, validated, with optimizer state).
 *
 * Exit codes: 0 success, 1 invalid or inconsistent input / I/O error,
 * 2 bad flag. */
#include <cxla/cxla.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: consolidate_ckpts --ckpt-prefix P [--ckpt-suffix '%s'] [--save-path OUT]\n"
            "                         [--with-optimizer] [--reshard N --out-prefix Q]\n"
            "                         [--shard-size-multiple M] [--compress LEVEL]\n"
            "  --ckpt-prefix P            the checkpoint: files P<suffix> and commit marker P.commit\n"
            "  --ckpt-suffix S            glob after the prefix (default '%s')\n"
            "  --save-path OUT            consolidated output (default P_consolidated.h5)\n"
            "  --with-optimizer           also stitch the optimizer state\n"
            "  --reshard N                instead, write a committed N-rank FSDP checkpoint ...\n"
            "  --out-prefix Q             ... named Q (Q_rank-<r>-of-N.h5, Q.commit)\n"
            "  --shard-size-multiple M    reshard: pad flat parameters to N*M (default 1)\n"
            "  --compress LEVEL           zstd level 1..22 for the output (default 0 = none)\n"
            "exit codes: 0 ok, 1 invalid input or I/O error, 2 bad flag\n",
            CX_CKPT_DEFAULT_SUFFIX, CX_CKPT_DEFAULT_SUFFIX);
}

static void bad_flag(const char *msg, const char *arg)
{
    fprintf(stderr, "consolidate_ckpts: %s%s (see --help)\n", msg, arg ? arg : "");
    exit(2);
}

static long parse_long(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "consolidate_ckpts: %s: expected an integer in [%ld, %ld], got '%s' (see --help)\n", flag, lo,
                hi, v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    const char *prefix = NULL, *save_path = NULL, *out_prefix = NULL;
    long reshard = 0;
    cx_ckpt_consolidate_opts o = cx_ckpt_consolidate_default_opts();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--with-optimizer")) {
            o.with_optimizer = true;
            continue;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (strncmp(a, "--", 2) || len >= sizeof name) bad_flag("unexpected argument ", a);
        memcpy(name, a, len);
        name[len] = '\0';
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) bad_flag("missing value for ", name);
        if (!strcmp(name, "--ckpt-prefix")) prefix = v;
        else if (!strcmp(name, "--ckpt-suffix")) o.suffix = v;
        else if (!strcmp(name, "--save-path")) save_path = v;
        else if (!strcmp(name, "--out-prefix")) out_prefix = v;
        else if (!strcmp(name, "--reshard")) reshard = parse_long(name, v, 1, 65536);
        else if (!strcmp(name, "--shard-size-multiple")) o.shard_size_multiple = (int)parse_long(name, v, 1, 1 << 20);
        else if (!strcmp(name, "--compress")) o.compress_level = (int)parse_long(name, v, 0, 22);
        else bad_flag("unknown flag ", name);
    }
    if (!prefix || !*prefix) bad_flag("--ckpt-prefix is required", NULL);
    if (reshard && !out_prefix) bad_flag("--reshard needs --out-prefix", NULL);
    if (!reshard && out_prefix) bad_flag("--out-prefix needs --reshard", NULL);
    if (reshard && save_path) bad_flag("--save-path and --reshard exclude each other", NULL);

    const char *suffix = o.suffix ? o.suffix : CX_CKPT_DEFAULT_SUFFIX;
    int n = cx_ckpt_count_files(prefix, suffix);
    if (n <= 0) {
        fprintf(stderr, "consolidate_ckpts: no checkpoint files match %s%s\n", prefix, suffix);
        return 1;
    }
    printf("found %d checkpoint files in %s%s\n", n, prefix, suffix);
    fflush(stdout);

    if (reshard) {
        /* the optimizer state follows the parameters unless asked otherwise */
        if (cx_ckpt_reshard(prefix, out_prefix, (int)reshard, o) != CX_OK) {
            fprintf(stderr, "consolidate_ckpts: %s\n", cx_last_error());
            return 1;
        }
        printf("saved resharded checkpoint (%ld ranks) to %s%s\n", reshard, out_prefix, CX_CKPT_DEFAULT_SUFFIX);
        return 0;
    }
    char def[4200];
    if (!save_path) {
        snprintf(def, sizeof def, "%s_consolidated.h5", prefix);
        save_path = def;
    }
    if (cx_ckpt_consolidate(prefix, save_path, o) != CX_OK) {
        fprintf(stderr, "consolidate_ckpts: %s\n", cx_last_error());
        return 1;
    }
    printf("saved consolidated model to %s\n", save_path);
    return 0;
}
