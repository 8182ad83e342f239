/* The programs' flag parser (cli/, used by train, gpt, consolidate_ckpts,
 * xla-launch and cxla-bench) on any argument list: the input split at NUL
 * bytes into argv, parsed against a spec with every kind of flag. */
#include "fuzz_common.h"

#include "cx_cli.h"

#include <fcntl.h>
#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    char *buf = malloc(n + 1);
    if (!buf) return 0;
    memcpy(buf, data, n);
    buf[n] = '\0';
    char *argv[66] = { "prog" };
    int argc = 1;
    for (size_t i = 0; i <= n && argc < 64; i++) {
        argv[argc++] = buf + i;
        i += strlen(buf + i);
    }
    argv[argc] = NULL;
    bool b = false;
    int in = 0;
    int64_t i64 = 0;
    double d = 0;
    const char *str = NULL, *choice = "a";
    cli_strings many = { 0 };
    static const char *const choices[] = { "a", "b", "ddp", NULL };
    const cli_flag flags[] = {
        { .name = "flag", .kind = CLI_BOOL, .dest = &b, .help = "a switch" },
        { .name = "n", .kind = CLI_INT, .dest = &in, .min = -5, .max = 1000, .help = "an int" },
        { .name = "big-n", .kind = CLI_I64, .dest = &i64, .min = 0, .max = 0x1p40, .help = "an i64" },
        { .name = "lr", .kind = CLI_DOUBLE, .dest = &d, .min = 0, .max = INFINITY, .help = "a double" },
        { .name = "path", .kind = CLI_STRING, .dest = &str, .metavar = "P", .help = "a string" },
        { .name = "mode", .kind = CLI_CHOICE, .dest = &choice, .choices = choices, .help = "a choice" },
        { .name = "arg", .kind = CLI_STRINGS, .dest = &many, .help = "repeatable" },
        { .name = "other_n", .synonym_of = "n" },
        { .name = "ddp", .synonym_of = "mode", .preset = "ddp" },
        { .name = "ignored", .kind = CLI_BOOL, .help = "accepted, no effect" },
        { .name = "dangling", .synonym_of = "nowhere" },
    };
    const cli_spec spec = { .prog = "prog", .summary = "fuzzed", .flags = flags, .nflags = 11, .positionals = true };
    int first = 0;
    /* help and errors print: keep them off the terminal, but give stderr
     * back for libFuzzer's own report */
    static int devnull = -1;
    if (devnull < 0) devnull = open("/dev/null", O_WRONLY);
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), err = dup(2);
    dup2(devnull, 1);
    dup2(devnull, 2);
    cli_parse(&spec, argc, argv, &first);
    fflush(stdout);
    fflush(stderr);
    dup2(out, 1);
    dup2(err, 2);
    close(out);
    close(err);
    free(many.v);
    free(buf);
    return 0;
}
