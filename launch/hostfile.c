/* The hosts of an Open MPI hostfile: xla-launch needs their number (--nnodes is checked
 * against it) and the first one (the default MASTER_ADDR); mpirun reads the rest. */
#define _GNU_SOURCE
#include "launcher.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xl_parse_hostfile(FILE *f, char **first, int *err)
{
    *first = NULL;
    *err = 0;
    /* whole lines, however long: a piece of a long comment must not pass for a host */
    char *line = NULL;
    size_t cap = 0;
    char **hosts = NULL;
    int n = 0;
    for (;;) {
        errno = 0;   /* getline leaves it alone at the end of the file */
        if (getline(&line, &cap, f) < 0) break;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *host = line + strspn(line, " \t\r\n");
        host[strcspn(host, " \t\r\n")] = 0;
        if (!*host) continue;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++) seen = !strcmp(hosts[i], host);
        if (seen) continue;
        char **grown = realloc(hosts, sizeof *hosts * ((size_t)n + 1));
        char *copy = grown ? strdup(host) : NULL;
        if (grown) hosts = grown;
        if (!copy) { errno = ENOMEM; break; }
        hosts[n++] = copy;
    }
    *err = errno ? errno : ferror(f) ? EIO : 0;
    free(line);
    if (!*err && n > 0) *first = hosts[0];
    for (int i = *first ? 1 : 0; i < n; i++) free(hosts[i]);
    free(hosts);
    return *err ? -1 : n;
}

int xl_read_hostfile(const char *path, char **first)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) xl_die("hostfile '%s' not found", path);
        xl_die("cannot read hostfile '%s': %s", path, strerror(errno));
    }
    int err;
    int n = xl_parse_hostfile(f, first, &err);
    fclose(f);
    if (n < 0) xl_die("cannot read hostfile '%s': %s", path, strerror(err));
    if (n == 0) xl_die("hostfile '%s' lists no hosts", path);
    return n;
}
