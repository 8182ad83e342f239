/* The hosts of an Open MPI hostfile: xla-launch needs their number (--nnodes is checked
 * against it) and the first one (the default MASTER_ADDR); mpirun reads the rest. */
#define _GNU_SOURCE
#include "launcher.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xl_read_hostfile(const char *path, char **first)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) xl_die("hostfile '%s' not found", path);
        xl_die("cannot read hostfile '%s': %s", path, strerror(errno));
    }
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
        hosts = xl_realloc_array(hosts, (size_t)n + 1, sizeof *hosts);
        if (!(hosts[n] = strdup(host))) xl_die("out of memory");
        n++;
    }
    int err = ferror(f) && !errno ? EIO : errno;
    free(line);
    fclose(f);
    if (err) xl_die("cannot read hostfile '%s': %s", path, strerror(err));
    if (n == 0) xl_die("hostfile '%s' lists no hosts", path);
    *first = hosts[0];
    for (int i = 1; i < n; i++) free(hosts[i]);
    free(hosts);
    return n;
}
