/* Runs a program built for one x86-64 level (-march=LEVEL) where this CPU
 * has that level's instructions. Elsewhere it prints why it cannot and
 * exits 77, which ctest counts as a skip (SKIP_RETURN_CODE): such a build
 * would die of an illegal instruction, which is the CPU's lack, not a
 * failure of the code under test.
 * usage: cx_at_level LEVEL PROGRAM [ARGS...]
 * exit: PROGRAM's status; 77 where the CPU lacks LEVEL; 2 on bad usage or
 * an unknown level; 1 where PROGRAM cannot be started. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { EXIT_SKIPPED = 77 };

/* 1 where this CPU runs code built for level, 0 where it cannot, -1 for a
 * level this tool does not know (__builtin_cpu_supports takes only
 * constant names) */
static int cpu_runs_level(const char *level)
{
    __builtin_cpu_init();
    if (strcmp(level, "x86-64") == 0) return 1;
    if (strcmp(level, "x86-64-v2") == 0) return __builtin_cpu_supports("x86-64-v2") != 0;
    if (strcmp(level, "x86-64-v3") == 0) return __builtin_cpu_supports("x86-64-v3") != 0;
    if (strcmp(level, "x86-64-v4") == 0) return __builtin_cpu_supports("x86-64-v4") != 0;
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cx_at_level LEVEL PROGRAM [ARGS...]\n");
        return 2;
    }
    const int runs = cpu_runs_level(argv[1]);
    if (runs < 0) {
        fprintf(stderr, "cx_at_level: unknown level '%s' (x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)\n", argv[1]);
        return 2;
    }
    if (!runs) {
        printf("skipped: this CPU lacks the instructions of %s, so %s (built for it) cannot run here\n", argv[1],
               argv[2]);
        return EXIT_SKIPPED;
    }
    execv(argv[2], argv + 2);
    fprintf(stderr, "cx_at_level: cannot run %s: %s\n", argv[2], strerror(errno));
    return 1;
}
