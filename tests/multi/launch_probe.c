/* Test helper for xla-launch: a rank program whose behaviour is chosen on the command line.
 *
 *   launch_probe MODE TAG [ARGS...]
 *
 * TAG is a unique string per test run: it is only there so the test can find every
 * process of the job with `pgrep -f TAG` afterwards. Modes:
 *   env                 print the launcher's variables (stdout) and one stderr line
 *   fail R CODE         rank R exits with CODE after 0.5 s, the others sleep 60 s
 *   sigkill R           rank R SIGKILLs itself after 0.5 s, the others sleep 60 s
 *   sleep               print "ready", sleep 60 s
 *   stubborn R          ranks other than R ignore SIGTERM and leave a setsid()
 *                       grandchild behind; rank R exits 3 after 1 s
 *   restart R           on the first attempt rank R exits 3; later, print the count
 *   lines N LEN         print N lines of LEN characters, in pieces, to stdout and stderr
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0) {}
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "<unset>";
}

static int my_rank(void)
{
    const char *r = getenv("RANK");
    if (!r) {
        fprintf(stderr, "launch_probe: RANK is not set\n");
        exit(90);
    }
    return atoi(r);
}

/* write(2) the text in small pieces so lines reach the wrapper split across reads */
static void write_pieces(int fd, const char *s, size_t n)
{
    size_t step = 1 + (size_t)(rand() % 700);
    while (n > 0) {
        size_t k = n < step ? n : step;
        ssize_t w = write(fd, s, k);
        if (w <= 0) exit(91);
        s += w;
        n -= (size_t)w;
    }
}

static int mode_lines(int rank, int n, int len)
{
    char *line = malloc((size_t)len + 64);
    if (!line) return 92;
    srand((unsigned)rank * 7919u + 1);
    for (int i = 0; i < n; i++) {
        int fd = (i % 3 == 2) ? 2 : 1;
        int h = snprintf(line, 64, "r%d:%d:", rank, i);
        memset(line + h, 'a' + rank % 26, (size_t)(len > h ? len - h : 0));
        int total = len > h ? len : h;
        line[total] = '\n';
        write_pieces(fd, line, (size_t)total + 1);
    }
    free(line);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: launch_probe MODE TAG [ARGS...]\n");
        return 99;
    }
    const char *mode = argv[1];
    int rank = my_rank();
    int arg = argc > 3 ? atoi(argv[3]) : 0;
    setvbuf(stdout, NULL, _IONBF, 0);

    if (!strcmp(mode, "env")) {
        printf("RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s CX_NUM_THREADS=%s "
               "OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s MASTER_ADDR=%s MASTER_PORT=%s "
               "RESTART=%s NODE_RANK=%s NNODES=%s\n",
               env("RANK"), env("LOCAL_RANK"), env("WORLD_SIZE"), env("LOCAL_WORLD_SIZE"),
               env("CX_NUM_THREADS"), env("OMP_NUM_THREADS"), env("OPENBLAS_NUM_THREADS"),
               env("MASTER_ADDR"), env("MASTER_PORT"), env("XLA_LAUNCH_RESTART_COUNT"),
               env("NODE_RANK"), env("NNODES"));
        fprintf(stderr, "stderr-line rank=%d\n", rank);
        return 0;
    }
    if (!strcmp(mode, "fail")) {
        int code = argc > 4 ? atoi(argv[4]) : 3;
        if (rank == arg) {
            sleep_s(0.5);
            return code;
        }
        sleep_s(60);
        return 0;
    }
    if (!strcmp(mode, "sigkill")) {
        if (rank == arg) {
            sleep_s(0.5);
            raise(SIGKILL);
        }
        sleep_s(60);
        return 0;
    }
    if (!strcmp(mode, "sleep")) {
        printf("ready\n");
        sleep_s(60);
        return 0;
    }
    if (!strcmp(mode, "stubborn")) {
        if (rank == arg) {
            sleep_s(1.0);
            return 3;
        }
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        pid_t p = fork();
        if (p == 0) {
            /* a daemon-like grandchild: new session, parent exits, ignores SIGTERM */
            setsid();
            if (fork() == 0) {
                sleep_s(60);
                _exit(0);
            }
            _exit(0);
        }
        printf("ready\n");
        sleep_s(60);
        return 0;
    }
    if (!strcmp(mode, "restart")) {
        const char *c = getenv("XLA_LAUNCH_RESTART_COUNT");
        const char *t = getenv("TORCHELASTIC_RESTART_COUNT");
        printf("restart_count=%s torchelastic=%s\n", c ? c : "<unset>", t ? t : "<unset>");
        if (c && !strcmp(c, "0") && rank == arg) return 3;
        return 0;
    }
    if (!strcmp(mode, "lines")) {
        int len = argc > 4 ? atoi(argv[4]) : 100;
        return mode_lines(rank, arg, len);
    }
    fprintf(stderr, "launch_probe: unknown mode '%s'\n", mode);
    return 99;
}
