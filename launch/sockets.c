/* The sockets the per-rank wrappers connect to, to send their output and fate. */
/* Linux-only: SOCK_CLOEXEC, SOCK_NONBLOCK, the abstract socket namespace. */
#define _GNU_SOURCE
#include "launcher.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Where the wrappers on this node connect: a Unix socket in the abstract namespace, so
 * there is no file to create or to leave behind; the token, not file permissions,
 * keeps strangers out. */
int xl_listen_unix(char *name, size_t cap)
{
    char rnd[17];
    xl_random_hex(rnd, 8);
    snprintf(name, cap, "@xla-launch.%d.%s", (int)getpid(), rnd);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) xl_die("socket: %s", strerror(errno));
    struct sockaddr_un addr;
    socklen_t len = xl_unix_addr(&addr, name);
    if (bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, SOMAXCONN) != 0)
        xl_die("cannot listen on Unix socket '%s': %s", name, strerror(errno));
    return fd;
}

/* Wrappers on other nodes connect over TCP, to any of our IPv4 addresses. */
int xl_listen_tcp(char *env, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) xl_die("socket: %s", strerror(errno));
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t al = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &al) != 0)
        xl_die("cannot listen on a TCP port: %s", strerror(errno));
    int n = snprintf(env, cap, "%d:", ntohs(addr.sin_port));
    struct ifaddrs *ifs = NULL, *i;
    bool any = false;
    if (getifaddrs(&ifs) == 0) {
        for (i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
            if ((size_t)n + strlen(ip) + 2 >= cap) break;
            n += snprintf(env + n, cap - (size_t)n, "%s%s", any ? "," : "", ip);
            any = true;
        }
        freeifaddrs(ifs);
    }
    if (!any) snprintf(env + n, cap - (size_t)n, "127.0.0.1");
    return fd;
}
