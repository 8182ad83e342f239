/* examples/custom_trainer builds against an installed cxla: installs the
 * build tree to a temporary prefix, builds the trainer there with CMake's
 * find_package(cxla) and runs it, then builds it again with pkg-config alone
 * (--define-prefix: the .pc file names the configured prefix, and this
 * install went elsewhere). Both programs run without LD_LIBRARY_PATH, as a
 * user's would: the .pc file passes an rpath on. */
#include <criterion/criterion.h>

#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_build[4096], g_src[4096], g_tmp[64];

static void setup(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    snprintf(g_build, sizeof g_build, "%s", dirname(dirname(exe)));
    /* __FILE__ is <src>/tests/unit/this.c, absolute or relative to the
     * test's build directory, which is where ctest runs it. */
    char file[4096];
    snprintf(file, sizeof file, "%s", __FILE__);
    cr_assert(realpath(dirname(dirname(dirname(file))), g_src), "cannot find the source tree from %s", __FILE__);
    strcpy(g_tmp, "/tmp/cxla-install-XXXXXX");
    cr_assert(mkdtemp(g_tmp));
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(custom_trainer, builds_against_installed_cxla, .init = setup, .fini = teardown, .timeout = 600)
{
    cr_assert_eq(sh("cmake --install '%s' --prefix %s/prefix > %s/install.log 2>&1", g_build, g_tmp, g_tmp), 0,
                 "cmake --install failed (see %s/install.log)", g_tmp);
    cr_assert_eq(sh("cmake -S '%s/examples/custom_trainer' -B %s/build -DCMAKE_PREFIX_PATH=%s/prefix "
                    "> %s/configure.log 2>&1 && cmake --build %s/build > %s/build.log 2>&1",
                    g_src, g_tmp, g_tmp, g_tmp, g_tmp, g_tmp),
                 0, "building with find_package(cxla) failed");
    /* Find where the library went (lib or lib/<multiarch>). */
    cr_assert_eq(sh("dirname $(find %s/prefix -name cxla.pc | head -1) > %s/pcdir && "
                    "dirname $(find %s/prefix -name 'libcxla.so*' | head -1) > %s/libdir",
                    g_tmp, g_tmp, g_tmp, g_tmp), 0);
    /* no LD_LIBRARY_PATH: a user's program must find the library by itself */
    cr_assert_eq(sh("cd %s && env -u LD_LIBRARY_PATH CX_NUM_THREADS=2 ./build/custom_trainer --data fake "
                    "--steps 20 > run1.log 2>&1", g_tmp), 0, "custom_trainer failed (see %s/run1.log)", g_tmp);
    cr_assert_eq(sh("grep -q 'test accuracy' %s/run1.log", g_tmp), 0);
    cr_assert_eq(sh("cd %s && PKG_CONFIG_PATH=$(cat pcdir) cc -o ct2 '%s/examples/custom_trainer/custom_trainer.c' "
                    "$(PKG_CONFIG_PATH=$(cat pcdir) pkg-config --define-prefix --cflags --libs cxla) > pc.log 2>&1",
                    g_tmp, g_src), 0, "building with pkg-config failed (see %s/pc.log)", g_tmp);
    cr_assert_eq(sh("cd %s && env -u LD_LIBRARY_PATH CX_NUM_THREADS=2 ./ct2 --data fake --steps 5 "
                    "> run2.log 2>&1", g_tmp), 0, "pkg-config build failed to run (see %s/run2.log)", g_tmp);
}
