/* The programs' flag parser: spellings, values, ranges, errors, help. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "cx_cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool verbose;
    int epochs;
    int64_t steps;
    double lr;
    const char *dir;
    const char *model;
    bool lr_given;
    double decay;
    int nproc;          /* 0: not given (outside its range) */
    int64_t seed;
    cli_strings tags;
} opts;

static const char *const models[] = { "cnn", "mlp", NULL };

static cli_result parse(opts *o, int argc, char **argv, int *first, bool positionals)
{
    const cli_flag flags[] = {
        { .name = "verbose", .kind = CLI_BOOL, .dest = &o->verbose, .help = "talk more" },
        { .name = "epochs", .kind = CLI_INT, .dest = &o->epochs, .help = "epochs", .min = 1, .max = 100 },
        { .name = "steps", .kind = CLI_I64, .dest = &o->steps, .help = "steps" },
        { .name = "lr", .kind = CLI_DOUBLE, .dest = &o->lr, .help = "learning rate", .max = 10, .given = &o->lr_given },
        { .name = "ckpt-dir", .kind = CLI_STRING, .dest = &o->dir, .metavar = "DIR", .help = "where" },
        { .name = "model", .kind = CLI_CHOICE, .dest = &o->model, .help = "model", .choices = models },
        { .name = "decay", .kind = CLI_DOUBLE, .dest = &o->decay, .help = "decay", .max = INFINITY },
        { .name = "nproc", .kind = CLI_INT, .dest = &o->nproc, .help = "ranks", .min = 1, .max = 64 },
        { .name = "seed", .kind = CLI_I64, .dest = &o->seed, .help = "seed", .min = 0, .max = 0x1p62 },
        { .name = "tag", .kind = CLI_STRINGS, .dest = &o->tags, .metavar = "T", .help = "a tag" },
        { .name = "num_epochs", .synonym_of = "epochs" },
        { .name = "tiny", .synonym_of = "model", .preset = "mlp" },
        { .name = "legacy-switch", .kind = CLI_BOOL, .help = "accepted, no effect" },
    };
    cli_spec s = { .prog = "prog", .args = "[flags]", .flags = flags, .nflags = (int)(sizeof flags / sizeof *flags),
                   .positionals = positionals };
    return cli_parse(&s, argc, argv, first);
}

static opts defaults(void) { return (opts){ .epochs = 2, .steps = 5, .lr = 0.1, .model = "cnn" }; }

Test(cli, both_spellings_and_value_forms)
{
    opts o = defaults();
    char *argv[] = { "prog", "--ckpt_dir", "/tmp/a", "--epochs=7", "--lr", "0.5", "--verbose", "--steps=-3",
                     "--model", "mlp" };
    int first = -1;
    cr_assert_eq(parse(&o, 10, argv, &first, false), CLI_OK);
    cr_assert_str_eq(o.dir, "/tmp/a");
    cr_assert_eq(o.epochs, 7);
    cr_assert_float_eq(o.lr, 0.5, 1e-12);
    cr_assert(o.lr_given);
    cr_assert(o.verbose);
    cr_assert_eq(o.steps, -3);
    cr_assert_str_eq(o.model, "mlp");
    cr_assert_eq(first, 10);
    char *edge[] = { "prog", "--seed", "4611686018427387904" };
    cr_assert_eq(parse(&o, 3, edge, NULL, false), CLI_OK);
    cr_assert_eq(o.seed, INT64_C(1) << 62);
}

Test(cli, defaults_stay_when_absent)
{
    opts o = defaults();
    char *argv[] = { "prog" };
    cr_assert_eq(parse(&o, 1, argv, NULL, false), CLI_OK);
    cr_assert_eq(o.epochs, 2);
    cr_assert(!o.lr_given);
    cr_assert_str_eq(o.model, "cnn");
}

Test(cli, errors_name_the_flag, .init = cr_redirect_stderr)
{
    char *bad[][3] = {
        { "prog", "--nope", NULL },          /* unknown */
        { "prog", "--epochs", "0" },         /* below range */
        { "prog", "--epochs", "x" },         /* not a number */
        { "prog", "--lr", NULL },            /* missing value */
        { "prog", "--model", "vit" },        /* not a choice */
        { "prog", "--verbose=1", NULL },     /* a bool takes no value */
        { "prog", "stray", NULL },           /* positional not allowed */
        { "prog", "--ckpt-dir=", NULL },     /* empty string */
        { "prog", "--decay", "-1" },         /* below an open-ended range */
        { "prog", "-np", "4" },              /* a single dash is no spelling of a flag */
        { "prog", "--tag", "" },             /* empty list entry */
        { "prog", "--seed=4611686018427387905", NULL },   /* 2^62 + 1: compared as an integer */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        opts o = defaults();
        int argc = bad[i][2] ? 3 : 2;
        cr_assert_eq(parse(&o, argc, bad[i], NULL, false), CLI_ERROR, "case %zu", i);
        free(o.tags.v);
    }
    cli_spec s = { .prog = "prog" };
    cli_error(&s, "--a needs --b (%d)", 1);
    fflush(stderr);
    cr_assert_stderr_eq_str("prog: unknown flag --nope (see prog --help)\n"
                            "prog: --epochs: expected an integer in [1, 100], got '0' (see prog --help)\n"
                            "prog: --epochs: expected an integer, got 'x' (see prog --help)\n"
                            "prog: --lr needs a value (see prog --help)\n"
                            "prog: --model: unknown value 'vit' (see prog --help)\n"
                            "prog: --verbose takes no value (see prog --help)\n"
                            "prog: unexpected argument 'stray' (see prog --help)\n"
                            "prog: --ckpt-dir needs a non-empty value (see prog --help)\n"
                            "prog: --decay: expected a number >= 0, got '-1' (see prog --help)\n"
                            "prog: unknown flag -np (see prog --help)\n"
                            "prog: --tag needs a non-empty value (see prog --help)\n"
                            "prog: --seed: expected an integer in [0, 4611686018427387904], got '4611686018427387905' "
                            "(see prog --help)\n"
                            "prog: --a needs --b (1) (see prog --help)\n");
}

Test(cli, positionals_stop_parsing)
{
    opts o = defaults();
    char *argv[] = { "prog", "--epochs", "3", "./a.out", "--epochs", "9" };
    int first = -1;
    cr_assert_eq(parse(&o, 6, argv, &first, true), CLI_OK);
    cr_assert_eq(first, 3);
    cr_assert_eq(o.epochs, 3);
    char *argv2[] = { "prog", "--", "--epochs" };
    cr_assert_eq(parse(&o, 3, argv2, &first, true), CLI_OK);
    cr_assert_eq(first, 2);
    char *argv3[] = { "prog", "-", "x" };   /* "-" (stdin) is a positional */
    cr_assert_eq(parse(&o, 3, argv3, &first, true), CLI_OK);
    cr_assert_eq(first, 1);
}

Test(cli, positionals_do_not_swallow_a_mistyped_flag, .init = cr_redirect_stderr)
{
    opts o = defaults();
    char *argv[] = { "prog", "-n", "2", "./a.out" };
    cr_assert_eq(parse(&o, 4, argv, NULL, true), CLI_ERROR);
    fflush(stderr);
    cr_assert_stderr_eq_str("prog: unknown flag -n (see prog --help)\n");
}

Test(cli, repeated_list_flag_appends_in_order)
{
    opts o = defaults();
    char *argv[] = { "prog", "--tag", "a", "--epochs", "3", "--tag=-b", "--tag", "c=d" };
    cr_assert_eq(parse(&o, 8, argv, NULL, false), CLI_OK);
    cr_assert_eq(o.tags.n, 3);
    cr_assert_str_eq(o.tags.v[0], "a");
    cr_assert_str_eq(o.tags.v[1], "-b");
    cr_assert_str_eq(o.tags.v[2], "c=d");
    cr_assert_eq(o.epochs, 3);
    free(o.tags.v);
}

Test(cli, help_lists_flags_with_defaults, .init = cr_redirect_stdout)
{
    opts o = defaults();
    char *argv[] = { "prog", "--help" };
    cr_assert_eq(parse(&o, 2, argv, NULL, false), CLI_HELP);
    fflush(stdout);
    char buf[4096] = "";
    FILE *f = cr_get_redirected_stdout();
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    cr_assert(strstr(buf, "usage: prog [flags]"), "%s", buf);
    cr_assert(strstr(buf, "--epochs N"), "%s", buf);
    cr_assert(strstr(buf, "(default 2)"), "%s", buf);
    cr_assert(strstr(buf, "--model {cnn,mlp}"), "%s", buf);
    cr_assert(strstr(buf, "--ckpt-dir DIR"), "%s", buf);
    cr_assert(strstr(buf, "--tag T"), "%s", buf);
    cr_assert(strstr(buf, "(repeatable)"), "%s", buf);
    /* nproc's 0 lies outside [1, 64]: it means "not given", not a default to show */
    const char *np = strstr(buf, "--nproc N");
    cr_assert(np, "%s", buf);
    cr_assert(!strncmp(strchr(np, '\n') - 5, "ranks", 5), "%s", buf);
}

Test(cli, synonyms_set_their_flag)
{
    opts o = defaults();
    char *argv[] = { "prog", "--num_epochs", "9", "--tiny", "--legacy_switch" };
    cr_assert_eq(parse(&o, 5, argv, NULL, false), CLI_OK);
    cr_assert_eq(o.epochs, 9);
    cr_assert_str_eq(o.model, "mlp");
    char *eq[] = { "prog", "--num-epochs=4" };
    cr_assert_eq(parse(&o, 2, eq, NULL, false), CLI_OK);
    cr_assert_eq(o.epochs, 4);
}

Test(cli, synonym_errors_name_the_synonym, .init = cr_redirect_stderr)
{
    char *bad[][3] = {
        { "prog", "--num_epochs", "0" },     /* the synonym's target range */
        { "prog", "--tiny=cnn", NULL },      /* a preset takes no value */
        { "prog", "--ckpt_dir=", NULL },     /* named as the help lists it */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        opts o = defaults();
        cr_assert_eq(parse(&o, bad[i][2] ? 3 : 2, bad[i], NULL, false), CLI_ERROR, "case %zu", i);
    }
    fflush(stderr);
    cr_assert_stderr_eq_str("prog: --num_epochs: expected an integer in [1, 100], got '0' (see prog --help)\n"
                            "prog: --tiny takes no value (see prog --help)\n"
                            "prog: --ckpt-dir needs a non-empty value (see prog --help)\n");
}

Test(cli, help_lists_synonyms, .init = cr_redirect_stdout)
{
    opts o = defaults();
    char *argv[] = { "prog", "--help" };
    cr_assert_eq(parse(&o, 2, argv, NULL, false), CLI_HELP);
    fflush(stdout);
    char buf[4096] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stdout());
    buf[n] = 0;
    cr_assert(strstr(buf, "--num_epochs N"), "%s", buf);
    cr_assert(strstr(buf, "synonym of --epochs\n"), "%s", buf);
    cr_assert(strstr(buf, "synonym of --model mlp\n"), "%s", buf);
}

/* Two spellings of one flag that disagree are an error naming both; the
 * same value twice, or one spelling repeated (the last wins), is fine. */
Test(cli, synonyms_that_disagree_are_an_error, .init = cr_redirect_stderr)
{
    char *bad[][5] = {
        { "prog", "--model", "cnn", "--tiny", NULL },
        { "prog", "--epochs", "3", "--num_epochs", "4" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        opts o = defaults();
        cr_assert_eq(parse(&o, bad[i][4] ? 5 : 4, bad[i], NULL, false), CLI_ERROR, "case %zu", i);
    }
    fflush(stderr);
    cr_assert_stderr_eq_str("prog: --model cnn and --tiny set one flag to different values: give one (see prog --help)\n"
                            "prog: --epochs 3 and --num_epochs 4 set one flag to different values: give one "
                            "(see prog --help)\n");
    opts o = defaults();
    char *same[] = { "prog", "--model", "mlp", "--tiny", "--num_epochs", "4", "--epochs=4" };
    cr_assert_eq(parse(&o, 7, same, NULL, false), CLI_OK);
    cr_assert_str_eq(o.model, "mlp");
    cr_assert_eq(o.epochs, 4);
    char *again[] = { "prog", "--epochs", "3", "--epochs", "5" };
    cr_assert_eq(parse(&o, 5, again, NULL, false), CLI_OK);
    cr_assert_eq(o.epochs, 5);
}
