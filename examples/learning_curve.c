/* Learning curves with gnuplot (see learning_curve.h). */
#include "learning_curve.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* A value of the log: a number, or NaN for null (a diverged loss), a
 * non-finite number (older logs wrote nan) or anything else. */
static double value_of(const char *v)
{
    while (*v == ' ') v++;
    char *end;
    double x = strtod(v, &end);
    return end != v && isfinite(x) ? x : NAN;
}

/* One data row per finite value found: step, then the value in its
 * series' column and NaN in the others (gnuplot then joins each column's
 * own points); counts[k] the points of series k. @return the lines with a
 * step, -1 if the log file cannot be read. */
static int write_columns(const lc_plot_spec *p, FILE *out, int *counts)
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
            double x = v ? value_of(v + strlen(key)) : NAN;
            if (isnan(x)) continue;
            counts[k]++;
            fprintf(out, "%lld", step);
            for (int j = 0; j < p->nseries; j++)
                if (j == k) fprintf(out, " %.6g", x);
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

/* Only the series with points are drawn (gnuplot fails on an empty one);
 * when the left axis has none, the right-hand series take it. */
static void write_script(const lc_plot_spec *p, bool svg, const char *dat, const int *counts, FILE *f)
{
    bool left = false, right = false;
    for (int k = 0; k < p->nseries; k++)
        if (counts[k]) *(p->series[k].right_axis ? &right : &left) = true;
    bool two_axes = left && right && p->y2label;
    fprintf(f, "set terminal %s size 800,500\nset output ", svg ? "svg" : "pngcairo");
    put_quoted(f, p->out);
    fprintf(f, "\nset xlabel 'step'\nset ylabel '%s'\nset key top right\nset datafile missing 'NaN'\n",
            left || !p->y2label ? p->ylabel : p->y2label);
    if (two_axes) fprintf(f, "set y2label '%s'\nset y2tics\nset ytics nomirror\n", p->y2label);
    fprintf(f, "plot ");
    bool first = true;
    for (int k = 0; k < p->nseries; k++) {
        const lc_series *s = &p->series[k];
        if (!counts[k]) continue;
        if (!first) fprintf(f, ", ");
        put_quoted(f, dat);
        fprintf(f, " using 1:%d with %s%s title '%s'", k + 2, s->points || counts[k] == 1 ? "linespoints" : "lines",
                s->right_axis && two_axes ? " axes x1y2" : "", s->title);
        first = false;
    }
    fputc('\n', f);
}

/* gnuplot SCRIPT, without a shell (any file name is fine), its stderr into
 * the file ERR. @return its exit status, -1 with errno if it could not be started. */
static int run_gnuplot(char *script, const char *err)
{
    char *argv[] = { "gnuplot", script, NULL };
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return -1;
    pid_t pid;
    int rc = posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_TRUNC, 0);
    if (rc == 0) rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) { errno = rc; return -1; }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return 255;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

/* A temporary file. @return it open for writing, NULL on failure. */
static FILE *temp_file(char *name)
{
    int fd = mkstemp(name);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

/* --out's directory must take a new file: checked before gnuplot, whose
 * own message would be a page of its script. @return true, or false after one line. */
static bool out_writable(const lc_plot_spec *p)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", p->out);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct stat sb;
    const char *why = NULL;
    if (stat(dir, &sb) != 0 || (S_ISDIR(sb.st_mode) && access(dir, W_OK | X_OK) != 0)) why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode)) why = "not a directory";
    if (why) fprintf(stderr, "%s: --out %s: cannot write in %s: %s\n", p->prog, p->out, dir, why);
    return !why;
}

/* The last non-empty line of gnuplot's stderr (its message follows the
 * echoed script line), into msg. */
static void last_line(const char *path, char *msg, size_t cap)
{
    snprintf(msg, cap, "no message");
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const char *s = line + strspn(line, " \t^");
        if (*s) snprintf(msg, cap, "%s", s);
    }
    fclose(f);
}

/* Draws into p->out from the data file DAT. @return the exit code, after one line on failure. */
static int draw(const lc_plot_spec *p, bool svg, const char *dat, const int *counts)
{
    char gp[] = "/tmp/cx-plot-XXXXXX", err[] = "/tmp/cx-plot-XXXXXX";
    FILE *g = temp_file(gp), *e = g ? temp_file(err) : NULL;
    if (!e) {
        fprintf(stderr, "%s: cannot make a temporary file: %s\n", p->prog, strerror(errno));
        if (g) { fclose(g); unlink(gp); }
        return 1;
    }
    fclose(e);
    write_script(p, svg, dat, counts, g);
    fclose(g);
    int st = run_gnuplot(gp, err), why = errno;
    char msg[1024];
    last_line(err, msg, sizeof msg);
    unlink(gp);
    unlink(err);
    if (st < 0 && why == ENOENT) {
        fprintf(stderr, "%s: gnuplot not found (install gnuplot-nox: scripts/install-deps.sh)\n", p->prog);
        return 1;
    }
    if (st < 0) {
        fprintf(stderr, "%s: cannot run gnuplot: %s\n", p->prog, strerror(why));
        return 1;
    }
    if (st != 0) {
        fprintf(stderr, "%s: gnuplot failed drawing %s: %s\n", p->prog, p->out, msg);
        return 1;
    }
    return 0;
}

int lc_plot(const lc_plot_spec *p)
{
    size_t n = strlen(p->out);
    bool svg = n > 4 && !strcmp(p->out + n - 4, ".svg"), png = n > 4 && !strcmp(p->out + n - 4, ".png");
    if (!svg && !png) { fprintf(stderr, "%s: --out %s: want a .png or .svg name\n", p->prog, p->out); return 2; }
    if (!out_writable(p)) return 2;
    char dat[] = "/tmp/cx-plot-XXXXXX";
    FILE *d = temp_file(dat);
    if (!d) { fprintf(stderr, "%s: cannot make a temporary file: %s\n", p->prog, strerror(errno)); return 1; }
    int counts[LC_MAX_SERIES] = { 0 };
    int steps = p->nseries <= LC_MAX_SERIES ? write_columns(p, d, counts) : -1;
    int err = errno;
    fclose(d);
    int points = 0;
    for (int k = 0; k < p->nseries && k < LC_MAX_SERIES; k++) points += counts[k];
    int rc = 0;
    if (steps < 0) {
        fprintf(stderr, "%s: cannot read --log-file %s: %s\n", p->prog, p->log_file, strerror(err));
        rc = 3;
    } else if (steps == 0) {
        fprintf(stderr, "%s: %s holds no logged step\n", p->prog, p->log_file);
        rc = 3;
    } else if (points == 0) {
        fprintf(stderr, "%s: %s holds no finite value to draw (every one is null or NaN)\n", p->prog, p->log_file);
        rc = 3;
    } else {
        for (int k = 0; k < p->nseries; k++)
            if (!counts[k]) fprintf(stderr, "%s: notice: no %s in the log\n", p->prog, p->series[k].title);
        rc = draw(p, svg, dat, counts);
    }
    unlink(dat);
    if (rc == 0) printf("wrote %s\n", p->out);
    return rc;
}

const char *lc_json_num(char *buf, size_t cap, const char *fmt, double x)
{
    if (!isfinite(x)) return "null";
    snprintf(buf, cap, fmt, x);
    return buf;
}
