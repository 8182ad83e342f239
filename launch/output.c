/* Output tagging: each line a rank prints goes to the launcher's stdout or stderr
 * behind "[rank R] ", in one write (lines of different ranks never mix), and as it
 * is to the rank's log under --log-dir. */
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void xl_output_init(struct xl_output *out, const char *log_dir, int attempt)
{
    *out = (struct xl_output){ .log_dir = log_dir, .attempt = attempt };
}

/* The rank's log, opened at first use. @return its fd, or < 0 when there is none. */
static int log_fd(struct xl_output *out, int rank)
{
    if (!out->log_dir || rank < 0 || rank >= XL_MAX_RANKS) return -1;
    if (rank >= out->n) {
        int n = out->n ? out->n : 8;
        while (n <= rank) n *= 2;
        out->log_fds = xl_realloc_array(out->log_fds, (size_t)n, sizeof *out->log_fds);
        for (int i = out->n; i < n; i++) out->log_fds[i] = -1;
        out->n = n;
    }
    if (out->log_fds[rank] == -1) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank_%d.log", out->log_dir, rank);
        /* a restart continues the log of the earlier attempts */
        int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (out->attempt == 0 ? O_TRUNC : 0);
        int fd = open(path, flags, 0666);
        if (fd < 0) {
            xl_err("cannot write log '%s': %s", path, strerror(errno));
            fd = -2;   /* said once, not tried again */
        } else if (out->attempt > 0) {
            char head[96];
            int n = snprintf(head, sizeof head, "=== %s: restart %d ===\n", XL_NAME, out->attempt);
            xl_write_all(fd, head, (size_t)n);
        }
        out->log_fds[rank] = fd;
    }
    return out->log_fds[rank];
}

void xl_output_open_log(struct xl_output *out, int rank) { log_fd(out, rank); }

void xl_output_line(struct xl_output *out, int rank, int stream, const char *line, size_t len)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    xl_write3(stream == 2 ? 2 : 1, prefix, (size_t)n, line, len, "\n", 1);
    int fd = log_fd(out, rank);
    if (fd >= 0) xl_write3(fd, line, len, "\n", 1, NULL, 0);
}

void xl_output_close(struct xl_output *out)
{
    for (int i = 0; i < out->n; i++)
        if (out->log_fds[i] >= 0) close(out->log_fds[i]);
    free(out->log_fds);
    out->log_fds = NULL;
    out->n = 0;
}
