/* The flags every cxla-bench subcommand shares (--rounds, --min-time) and
 * how a subcommand parses its own next to them. */
#include "bench.h"

#include <cxla/parallel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_common_flags(bench_cfg *cfg, cli_flag *out)
{
    out[0] = (cli_flag){ .name = "rounds", .kind = CLI_INT, .dest = &cfg->rounds,
                         .help = "rounds; each times every side in turn (default 5, ckpt 11)", .min = 1,
                         .max = BENCH_MAX_ROUNDS };
    out[1] = (cli_flag){ .name = "min-time", .kind = CLI_DOUBLE, .dest = &cfg->min_time, .metavar = "SECONDS",
                         .help = "time each side for at least this long per round (0: one unit of work)",
                         .min = 0, .max = 3600 };
    return 2;
}

int bench_parse(const char *sub, int argc, char **argv, const cli_flag *extra, int nextra, bench_cfg *cfg)
{
    return bench_parse_checked(sub, argc, argv, extra, nextra, cfg, NULL);
}

int bench_parse_checked(const char *sub, int argc, char **argv, const cli_flag *extra, int nextra, bench_cfg *cfg,
                        int (*check)(void))
{
    cli_flag flags[16];
    int n = bench_common_flags(cfg, flags);
    for (int i = 0; i < nextra && n < (int)(sizeof flags / sizeof *flags); i++) flags[n++] = extra[i];
    char prog[64];
    snprintf(prog, sizeof prog, "cxla-bench %s", sub);
    cli_spec spec = { .prog = prog, .args = "[flags]", .summary = bench_summary(sub), .flags = flags, .nflags = n };
    switch (cli_parse(&spec, argc, argv, NULL)) {
    case CLI_OK: {
        const int rc = check ? check() : -1;
        if (rc >= 0) return rc;
        if (cfg->rounds == 0) cfg->rounds = bench_default_rounds(sub);
        bench_machine_start();
        return -1;
    }
    case CLI_HELP: return 0;
    default: return 2;
    }
}

bool bench_in_launched_rank(void)
{
    /* a launcher's rank (mpirun, srun --mpi=pmix, Hydra), or xla-launch's,
     * which exports its restart count to every rank */
    const char *launcher = "none";
    cx_job_place(NULL, NULL, NULL, NULL, &launcher, NULL, 0);
    return strcmp(launcher, "none") || getenv("XLA_LAUNCH_RESTART_COUNT");
}

bool bench_is_rank0(void)
{
    /* the library's reader of the launchers' variables, which knows srun's
     * and PMIx's as well as xla-launch's: RANK is not set under srun */
    int rank = 0;
    cx_job_place(&rank, NULL, NULL, NULL, NULL, NULL, 0);
    return rank <= 0;
}
