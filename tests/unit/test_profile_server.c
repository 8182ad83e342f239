/* The profile server (cx_profiler_start_server, CX_PROFILE_PORT): a request
 * "capture MS DIR" writes DIR/proc_0/trace.json and answers with its path;
 * a bad request, a capture while a trace already records, a taken port and
 * a second server on another port are each one clear answer or error. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A free loopback port: bound to 0, read back, released (fd < 0), or kept
 * bound (*fd_out) to make it a taken one. */
static int loopback_port(int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    socklen_t len = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    if (fd_out) { cr_assert_eq(listen(fd, 1), 0); *fd_out = fd; }
    else close(fd);
    return ntohs(a.sin_port);
}

/* Sends one request line, returns the answer line (static buffer). */
static const char *ask(int port, const char *req)
{
    static char buf[4600];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect %d: %s", port, strerror(errno));
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t n = 0;
    ssize_t k;
    while (n + 1 < sizeof buf && (k = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)k;
    buf[n] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
    close(fd);
    return buf;
}

Test(profile_server, captures_on_request)
{
    char dir[] = "/tmp/cx_profile_server.XXXXXX";
    cr_assert(mkdtemp(dir));
    cr_expect_eq(cx_profiler_server_port(), 0);
    int port = loopback_port(NULL);
    cr_assert_eq(cx_profiler_start_server(port), CX_OK, "%s", cx_last_error());
    cr_expect_eq(cx_profiler_server_port(), port);
    cr_expect_eq(cx_profiler_start_server(port), CX_OK, "the same port again is a no-op");

    /* something to record while the capture runs */
    cx_tensor *x = cx_from_host((float[]){ 1, 4, 9 }, (int64_t[]){ 3 }, 1, CX_F32);
    char req[256], want[256];
    snprintf(req, sizeof req, "capture 50 %s\n", dir);
    const char *got = ask(port, req);
    snprintf(want, sizeof want, "ok 0 %s/proc_0/trace.json", dir);
    cr_expect_str_eq(got, want);
    struct stat st;
    cr_expect_eq(stat(want + 5, &st), 0, "no %s", want + 5);
    cr_expect(!cx_trace_active(), "the capture left the trace on");

    got = ask(port, "capture soon /tmp\n");
    cr_expect(strstr(got, "error bad request 'capture soon /tmp': want 'capture MS DIR'"), "%s", got);

    /* the user's own trace is not interrupted */
    cr_assert_eq(cx_trace_start(dir), CX_OK, "%s", cx_last_error());
    got = ask(port, req);
    cr_expect(strstr(got, "error rank 0: trace_start: a trace is already recording"), "%s", got);
    cr_expect(cx_trace_active());
    cr_assert_eq(cx_trace_stop(), CX_OK);

    cr_expect_eq(cx_profiler_start_server(port == 65535 ? port - 1 : port + 1), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "a profile server already listens on port"), "%s", cx_last_error());
    cx_free(x);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(profile_server, taken_port_is_one_error)
{
    int keep;
    int port = loopback_port(&keep);
    cr_expect_eq(cx_profiler_start_server(port), CX_ERR_IO);
    char want[128];
    snprintf(want, sizeof want, "profiler_start_server: cannot listen on 127.0.0.1:%d (rank 0): Address already in use", port);
    cr_expect_str_eq(cx_last_error(), want);
    cr_expect_eq(cx_profiler_server_port(), 0);
    cr_expect_eq(cx_profiler_start_server(0), CX_ERR_ARG);
    cr_expect_eq(cx_profiler_start_server(70000), CX_ERR_ARG);
    close(keep);
}
