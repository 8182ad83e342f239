/* The `train` program: flags, data-set errors, exit codes, output format. */
#include <criterion/criterion.h>

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_train[4096];

/* The build tree: this test runs from <build>/tests, train is in <build>/examples. */
static void find_train(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    char *dir = dirname(dirname(exe));
    snprintf(g_train, sizeof g_train, "%s/examples/train", dir);
    if (access(g_train, X_OK) != 0) cr_skip_test("train not built at %s", g_train);
}

/* Runs train with args; output (stdout + stderr) into out. @return exit code. */
static int run(const char *args, char *out, size_t cap)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "CX_NUM_THREADS=2 %s %s 2>&1", g_train, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char g_out[1 << 16];

Test(train_cli, help_lists_flags_with_defaults, .init = find_train)
{
    cr_expect_eq(run("--help", g_out, sizeof g_out), 0);
    const char *flags[] = { "--model", "--data", "--data-dir", "--epochs", "--steps", "--batch-size", "--lr",
                            "--momentum", "--optimizer", "--weight-decay", "--seed", "--log-every", "--threads",
                            "--target-accuracy", "--width", "--depth" };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        cr_expect(strstr(g_out, flags[i]) != NULL, "--help lacks %s", flags[i]);
    cr_expect(strstr(g_out, "default cnn") != NULL);
    cr_expect(strstr(g_out, "default 64") != NULL);
}

static void expect_usage_error(const char *args, const char *needle)
{
    cr_expect_eq(run(args, g_out, sizeof g_out), 2, "train %s", args);
    cr_expect(strstr(g_out, needle) != NULL, "train %s: %s", args, g_out);
    char *nl = strchr(g_out, '\n');
    cr_expect(nl && nl[1] == '\0', "one line: %s", g_out);
}

Test(train_cli, bad_flags_exit_2_with_one_line, .init = find_train)
{
    expect_usage_error("--bogus 1", "unknown flag --bogus");
    expect_usage_error("--lr abc", "--lr: expected a number");
    expect_usage_error("--lr -1", "--lr: expected a number >= 0, got '-1'");
    expect_usage_error("--epochs 0", "--epochs: expected an integer");
    expect_usage_error("--batch-size 12x", "--batch-size");
    expect_usage_error("--model resnet", "--model: unknown value 'resnet'");
    expect_usage_error("--optimizer", "--optimizer needs a value");
    expect_usage_error("stray", "unexpected argument 'stray'");
    expect_usage_error("-np 2", "unknown flag -np");
    /* the '_' spelling is the same flag, and its errors name it as the help does */
    expect_usage_error("--batch_size=0", "--batch-size: expected an integer in [1, 1048576], got '0'");
    expect_usage_error("--zero 4", "--zero: expected an integer in [2, 3]");
}

/* --precision: fp16 and a precision variable that does not parse or does
 * not go with the flag are one line each, exit 2 */
Test(train_cli, bad_precision_exits_2_with_one_line, .init = find_train)
{
    expect_usage_error("--precision fp16", "--precision fp16: cxla has no float16");
    expect_usage_error("--precision bf17", "--precision bf17: unknown precision; use f32, bf16-mixed or bf16");
    cr_assert_eq(setenv("XLA_USE_BF16", "yes", 1), 0);
    expect_usage_error("--precision bf16", "bad XLA_USE_BF16 'yes': want one of 0, 1 (default 0)");
    cr_assert_eq(setenv("XLA_USE_BF16", "1", 1), 0);
    expect_usage_error("--precision bf16-mixed", "--precision bf16-mixed, but XLA_USE_BF16=1 holds every f32 tensor as bf16");
    /* without the flag: its default is what conflicts, and the line says so */
    expect_usage_error("--steps 1", "--precision f32 (the default), but XLA_USE_BF16=1 holds every f32 tensor as bf16");
    /* the other way round: the flag must not silently beat an explicit 0 */
    cr_assert_eq(setenv("XLA_USE_BF16", "0", 1), 0);
    expect_usage_error("--precision bf16", "--precision bf16 holds every f32 tensor as bf16 (XLA_USE_BF16=1), but the "
                                           "environment sets XLA_USE_BF16=0");
    /* Lightning's spellings, any case, _ for -: read as the names they stand for */
    expect_usage_error("--precision bf16-true", "--precision bf16-true holds every f32 tensor as bf16");
    expect_usage_error("--precision 16-true", "--precision 16-true: cxla has no float16");
    cr_assert_eq(setenv("XLA_USE_BF16", "1", 1), 0);
    expect_usage_error("--precision BF16_Mixed", "--precision BF16_Mixed, but XLA_USE_BF16=1");
    /* given, f32 is no longer "the default" in the line */
    expect_usage_error("--precision 32-true", "--precision 32-true, but XLA_USE_BF16=1");
    expect_usage_error("--precision f32", "--precision f32, but XLA_USE_BF16=1");
    unsetenv("XLA_USE_BF16");
}

Test(train_cli, missing_data_names_path_and_package, .init = find_train)
{
    cr_expect_eq(run("--data fashion-mnist --data-dir /nonexistent/dir", g_out, sizeof g_out), 3);
    cr_expect(strstr(g_out, "/nonexistent/dir/train-images-idx3-ubyte.gz") != NULL, "%s", g_out);
    cr_expect(strstr(g_out, "dataset-fashion-mnist") != NULL, "%s", g_out);
    cr_expect_eq(run("--data mnist --data-dir /nonexistent/m", g_out, sizeof g_out), 3);
    cr_expect(strstr(g_out, "/nonexistent/m/train-images-idx3-ubyte.gz") != NULL, "%s", g_out);
}

Test(train_cli, fake_run_logs_and_misses_target, .init = find_train, .timeout = 240)
{
    int rc = run("--model mlp --width 32 --depth 1 --data fake --steps 5 --log_every=2 --batch_size 32 "
                 "--target-accuracy 90",
                 g_out, sizeof g_out);
    cr_expect_eq(rc, 21, "exit %d: %s", rc, g_out);
    /* with --steps, the share of the 5 steps (160 images), not of the data set */
    cr_expect(strstr(g_out, "Train Epoch: 1 [0/160 (0%)]\tLoss: ") != NULL, "%s", g_out);
    cr_expect(strstr(g_out, "Train Epoch: 1 [64/160 (40%)]\tLoss: ") != NULL, "%s", g_out);
    cr_expect(strstr(g_out, "images/s") != NULL, "%s", g_out);
    cr_expect(strstr(g_out, "Test accuracy: ") != NULL, "%s", g_out);
    cr_expect(strstr(g_out, "below the target") != NULL, "%s", g_out);
}
