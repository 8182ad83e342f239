/* consolidate_ckpts: stitch a sharded cxla checkpoint into one full model
 * file, or reshard it for another world size, as PyTorch/XLA's
 * consolidate_sharded_ckpts (streaming, validated, with optimizer state).
 *
 * Exit codes: 0 success, 1 invalid or inconsistent input / I/O error,
 * 2 bad flag. */
#include <cxla/cxla.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cx_cli.h"
#include "cx_fs.h"

/* The directory an output path names (--out-prefix ck1r/r1, --save-path
 * out/full.h5) is made as mkdir -p would: the library only creates files.
 * @return false, having said which directory could not be made. */
static bool make_parent(const char *flag, const char *path)
{
    char dir[4096], failed[4096];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return true;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int err = cx_mkdir_p(dir, failed, sizeof failed);
    struct stat st;
    if (!err && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        err = ENOTDIR;
        snprintf(failed, sizeof failed, "%s", dir);
    }
    if (err) fprintf(stderr, "consolidate_ckpts: %s %s: cannot create directory %s: %s\n", flag, path, failed, strerror(err));
    return !err;
}

int main(int argc, char **argv)
{
    const char *prefix = NULL, *save_path = NULL, *out_prefix = NULL;
    int reshard = 0;   /* 0: consolidate */
    cx_ckpt_consolidate_opts o = cx_ckpt_consolidate_default_opts();
    o.suffix = CX_CKPT_DEFAULT_SUFFIX;   /* the library's default, spelled out for the help */
    /* the names of PyTorch/XLA's consolidate_sharded_ckpts (--ckpt_prefix,
     * --ckpt_suffix, --save_path) are the same flags */
    const cli_flag flags[] = {
        { .name = "ckpt-prefix", .kind = CLI_STRING, .dest = &prefix, .metavar = "P",
          .help = "the checkpoint (required): files P<suffix> and\ncommit marker P.commit" },
        { .name = "ckpt-suffix", .kind = CLI_STRING, .dest = &o.suffix, .metavar = "S", .help = "glob after the prefix" },
        { .name = "save-path", .kind = CLI_STRING, .dest = &save_path, .metavar = "OUT",
          .help = "consolidated output (default P_consolidated.h5)" },
        { .name = "with-optimizer", .kind = CLI_BOOL, .dest = &o.with_optimizer,
          .help = "also stitch the optimizer state" },
        { .name = "reshard", .kind = CLI_INT, .dest = &reshard, .min = 1, .max = 65536,
          .help = "instead, write a committed N-rank FSDP checkpoint ..." },
        { .name = "out-prefix", .kind = CLI_STRING, .dest = &out_prefix, .metavar = "Q",
          .help = "... named Q (Q_rank-<r>-of-N.h5, Q.commit)" },
        { .name = "shard-size-multiple", .kind = CLI_INT, .dest = &o.shard_size_multiple, .metavar = "M", .min = 1,
          .max = 1 << 20, .help = "reshard: pad flat parameters to N*M" },
        { .name = "compress", .kind = CLI_INT, .dest = &o.compress_level, .metavar = "LEVEL", .min = 0, .max = 22,
          .help = "zstd level 1..22 for the output, 0 = none" },
    };
    const cli_spec spec = {
        .prog = "consolidate_ckpts",
        .args = "--ckpt-prefix P [flags]",
        .summary = "Stitch a sharded cxla checkpoint into one full model file, or reshard it for\n"
                   "another world size (streaming, validated, with optimizer state).",
        .epilog = "exit codes: 0 ok, 1 invalid input or I/O error, 2 bad flag",
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags),
    };
    cli_result parsed = cli_parse(&spec, argc, argv, NULL);
    if (parsed != CLI_OK) return parsed == CLI_HELP ? 0 : 2;
    const char *bad = !prefix                  ? "--ckpt-prefix is required"
                      : reshard && !out_prefix ? "--reshard needs --out-prefix"
                      : !reshard && out_prefix ? "--out-prefix needs --reshard"
                      : reshard && save_path   ? "--save-path and --reshard exclude each other"
                                               : NULL;
    if (bad) {
        cli_error(&spec, "%s", bad);
        return 2;
    }

    int n = cx_ckpt_count_files(prefix, o.suffix);
    if (n <= 0) {
        /* PyTorch/XLA's suffix ("_rank-*-of-*.pth") names files cxla never writes */
        int h5 = strcmp(o.suffix, CX_CKPT_DEFAULT_SUFFIX) ? cx_ckpt_count_files(prefix, CX_CKPT_DEFAULT_SUFFIX) : 0;
        if (h5 > 0)
            fprintf(stderr, "consolidate_ckpts: no checkpoint files match %s%s, but %d match %s%s, the names cxla "
                    "writes (drop --ckpt-suffix)\n", prefix, o.suffix, h5, prefix, CX_CKPT_DEFAULT_SUFFIX);
        else
            fprintf(stderr, "consolidate_ckpts: no checkpoint files match %s%s\n", prefix, o.suffix);
        return 1;
    }
    printf("found %d checkpoint files in %s%s\n", n, prefix, o.suffix);
    fflush(stdout);

    if (reshard) {
        if (!make_parent("--out-prefix", out_prefix)) return 1;
        /* the optimizer state follows the parameters unless asked otherwise */
        if (cx_ckpt_reshard(prefix, out_prefix, reshard, o) != CX_OK) {
            fprintf(stderr, "consolidate_ckpts: %s\n", cx_last_error());
            return 1;
        }
        printf("saved resharded checkpoint (%d ranks) to %s%s\n", reshard, out_prefix, CX_CKPT_DEFAULT_SUFFIX);
        return 0;
    }
    char def[4200];
    if (!save_path) {
        snprintf(def, sizeof def, "%s_consolidated.h5", prefix);
        save_path = def;
    }
    if (!make_parent("--save-path", save_path)) return 1;
    if (cx_ckpt_consolidate(prefix, save_path, o) != CX_OK) {
        fprintf(stderr, "consolidate_ckpts: %s\n", cx_last_error());
        return 1;
    }
    printf("saved consolidated model to %s\n", save_path);
    return 0;
}
