/* Learning curves with gnuplot (see learning_curve.h). */
#include "learning_curve.h"

#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* One data row per value found: step, then the value in its series' column
 * and NaN in the others (gnuplot then joins each column's own points).
 * @return the lines with a step, -1 if the log file cannot be read. */
static int write_columns(const lc_plot_spec *p, FILE *out)
{
    FILE *in = fopen(p->log_file, "r");
    if (!in) return -1;
    char line[4096], key[96];
    int steps = 0;
    while (fgets(line, sizeof line, in)) {
        const char *s = strstr(line, "\"step\":");
        if (!s) continue;
        long long step = atoll(s + 7);
        for (int k = 0; k < p->nseries; k++) {
            snprintf(key, sizeof key, "\"%s\":", p->series[k].key);
            const char *v = strstr(line, key);
            if (!v) continue;
            fprintf(out, "%lld", step);
            for (int j = 0; j < p->nseries; j++)
                if (j == k) fprintf(out, " %.6g", strtod(v + strlen(key), NULL));
                else fprintf(out, " NaN");
            fputc('\n', out);
        }
        steps++;
    }
    fclose(in);
    return steps;
}

/* A file name inside a gnuplot single-quoted string ('' is a quote). */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_script(const lc_plot_spec *p, bool svg, const char *dat, FILE *f)
{
    fprintf(f, "set terminal %s size 800,500\nset output ", svg ? "svg" : "pngcairo");
    put_quoted(f, p->out);
    fprintf(f, "\nset xlabel 'step'\nset ylabel '%s'\nset key top right\nset datafile missing 'NaN'\n", p->ylabel);
    if (p->y2label) fprintf(f, "set y2label '%s'\nset y2tics\nset ytics nomirror\n", p->y2label);
    fprintf(f, "plot ");
    for (int k = 0; k < p->nseries; k++) {
        const lc_series *s = &p->series[k];
        if (k) fprintf(f, ", ");
        if (k) fprintf(f, "''");
        else put_quoted(f, dat);
        fprintf(f, " using 1:%d with %s%s title '%s'", k + 2, s->points ? "linespoints" : "lines",
                s->right_axis ? " axes x1y2" : "", s->title);
    }
    fputc('\n', f);
}

/* gnuplot SCRIPT, without a shell (any file name is fine). @return its exit status, -1 if it did not run. */
static int run_gnuplot(char *script)
{
    char *argv[] = { "gnuplot", script, NULL };
    pid_t pid;
    if (posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ) != 0) return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A temporary file. @return it open for writing, NULL on failure. */
static FILE *temp_file(char *name)
{
    int fd = mkstemp(name);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

int lc_plot(const lc_plot_spec *p)
{
    size_t n = strlen(p->out);
    bool svg = n > 4 && !strcmp(p->out + n - 4, ".svg"), png = n > 4 && !strcmp(p->out + n - 4, ".png");
    if (!svg && !png) { fprintf(stderr, "%s: --out %s: want a .png or .svg name\n", p->prog, p->out); return 2; }
    char dat[] = "/tmp/cx-plot-XXXXXX", gp[] = "/tmp/cx-plot-XXXXXX";
    FILE *d = temp_file(dat);
    if (!d) { fprintf(stderr, "%s: cannot make a temporary file: %s\n", p->prog, strerror(errno)); return 1; }
    int steps = write_columns(p, d);
    int err = errno;
    fclose(d);
    FILE *g = steps > 0 ? temp_file(gp) : NULL;
    int st = -1;
    if (g) {
        write_script(p, svg, dat, g);
        fclose(g);
        st = run_gnuplot(gp);
        unlink(gp);
    }
    unlink(dat);
    if (steps < 0) { fprintf(stderr, "%s: cannot read --log-file %s: %s\n", p->prog, p->log_file, strerror(err)); return 3; }
    if (steps == 0) { fprintf(stderr, "%s: %s holds no logged step\n", p->prog, p->log_file); return 3; }
    if (!g) { fprintf(stderr, "%s: cannot make a temporary file: %s\n", p->prog, strerror(errno)); return 1; }
    if (st != 0) {
        fprintf(stderr, "%s: gnuplot failed (install gnuplot-nox: scripts/install-deps.sh)\n", p->prog);
        return 1;
    }
    printf("wrote %s\n", p->out);
    return 0;
}
