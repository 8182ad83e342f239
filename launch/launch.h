/* xla-launch internals shared by the launcher (xla-launch.c) and the per-rank wrapper
 * (rank_wrapper.c). The launcher never links cxla: it is a plain POSIX/Linux program.
 *
 * Data path: mpirun starts `xla-launch --rank-wrapper PROGRAM ARGS` once per rank. The
 * wrapper runs PROGRAM with its stdout/stderr on pipes, cuts them into lines and sends
 * each line, then the program's fate, to the launcher over its own connection: a Unix
 * socket for ranks on the launcher's node, TCP for ranks on other nodes. The launcher is
 * thus the only writer of the job's output, and lines never interleave. (mpirun's own
 * output forwarding is not used for this because it splits lines: it forwards pipe
 * reads, not lines, and mixes the pieces of different ranks.) Only a wrapper that can
 * reach neither socket writes "[rank R] " lines and a status line to its stdout/stderr,
 * which mpirun forwards and the launcher parses, intact or not. */
#ifndef XLA_LAUNCH_H
#define XLA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define XL_NAME "xla-launch"

/* Longest line forwarded as one piece; longer lines are cut into pieces of this size. */
#define XL_MAX_LINE 65536

/* Environment handed from the launcher to the wrappers. */
#define XL_ENV_SOCKET "XLA_LAUNCH_SOCKET"   /* Unix socket ("@" = abstract), this node */
#define XL_ENV_TCP "XLA_LAUNCH_TCP"         /* "PORT:ADDR,ADDR,...", for other nodes */
#define XL_ENV_TOKEN "XLA_LAUNCH_TOKEN"     /* proves a connection belongs to this job */
#define XL_ENV_NNODES "XLA_LAUNCH_NNODES"
#define XL_ENV_NODE_RANK "XLA_LAUNCH_NODE_RANK"
#define XL_TOKEN_LEN 32

/* Fallback (no connection) status line written by a wrapper to its stderr. */
#define XL_STATUS_MARK "@xla-launch-status@ "

/* Wire format, the same over both transports: frames of a 4-byte big-endian length and
 * a payload. All integers are big-endian.
 *   HELLO   'H' 0 0 0 | rank:4 | pid:4 | token:32 | node name (0-63 bytes, no NUL)
 *                                                       the launcher answers one byte 'K'
 *   LINE    'L' stream(1 or 2) | bytes of one line, without its newline
 *   STATUS  'S' how torn 0 | rank:4 | code:4 | ended_ns:8 (CLOCK_MONOTONIC)        */
enum { XL_MSG_HELLO = 'H', XL_MSG_LINE = 'L', XL_MSG_STATUS = 'S' };
#define XL_HELLO_LEN (12 + XL_TOKEN_LEN)
#define XL_NODE_NAME_MAX 63
#define XL_STATUS_LEN 20
#define XL_MAX_FRAME (XL_MAX_LINE + 2)
#define XL_ACK 'K'

/* How a rank's program ended. */
enum xl_how {
    XL_EXITED = 'x',   /* code = exit status */
    XL_SIGNALED = 's', /* code = signal number */
    XL_LOST = 'l',     /* the wrapper vanished without reporting */
};

struct xl_status {
    int rank;
    char how;        /* enum xl_how */
    int code;
    bool torn_down;  /* ended because the job was being stopped, not on its own */
};

static inline bool xl_status_failed(const struct xl_status *s)
{
    return !(s->how == XL_EXITED && s->code == 0);
}

/* ---- small utilities (common.c) ---- */

/* One-line error "xla-launch: ..." on stderr. */
void xl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* xl_err, then exit(2): a usage or setup error. */
_Noreturn void xl_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* realloc to n elements of `size` bytes, or xl_die("out of memory"): never returns
 * NULL, so `p = xl_realloc_array(p, ...)` cannot lose p to a failed realloc. */
void *xl_realloc_array(void *p, size_t n, size_t size);

double xl_now(void);
/* Write everything, retrying on EINTR and short writes; false on error. */
bool xl_write_all(int fd, const void *buf, size_t len);
/* Send all of iov on a socket (no SIGPIPE), retrying on EINTR and short sends. */
struct iovec;
bool xl_sendv_all(int fd, struct iovec *iov, int n);
void xl_put32(unsigned char *p, uint32_t v);
uint32_t xl_get32(const unsigned char *p);
void xl_put64(unsigned char *p, uint64_t v);
uint64_t xl_get64(const unsigned char *p);
/* Write the concatenation of three pieces as one write() when possible. */
bool xl_write3(int fd, const void *a, size_t na, const void *b, size_t nb,
               const void *c, size_t nc);
/* 2*nbytes random hex digits (from /dev/urandom) and a NUL into out. */
void xl_random_hex(char *out, size_t nbytes);
/* Unix socket address for `name`; "@name" is in the abstract namespace. Returns the
 * address length to pass to bind/connect. */
struct sockaddr_un;
socklen_t xl_unix_addr(struct sockaddr_un *addr, const char *name);
/* Number of CPUs this process may run on (affinity mask), at least 1. */
int xl_cpu_count(void);
/* Parse a whole decimal int in [lo, hi]; false if not one. */
bool xl_parse_int(const char *s, long lo, long hi, int *out);

/* Signals are turned into bytes on a self-pipe so poll() loops can handle them. */
int xl_sigpipe_init(const int *signals, int n); /* returns the read end */
int xl_sigpipe_read(int fd);                   /* next pending signal or 0 */
/* Block/unblock the given signals around fork() so a child never runs our handlers. */
void xl_block_signals(const int *signals, int n, bool block);
/* In a fresh child: default dispositions for the given signals, then unblock them. */
void xl_child_reset_signals(const int *signals, int n);

/* Kill (SIGKILL) and reap every remaining child of this process, including orphans
 * adopted as a child subreaper, until none is left or `timeout` seconds pass. Returns
 * how many live processes were killed. */
int xl_sweep_children(double timeout);

/* ---- line splitting ---- */

typedef void (*xl_line_fn)(void *ctx, int stream, const char *line, size_t len);

struct xl_linebuf {
    int stream; /* 1 = stdout, 2 = stderr */
    char *buf;
    size_t len;
};

void xl_linebuf_init(struct xl_linebuf *lb, int stream);
/* Feed raw bytes; calls fn for each complete line (without its '\n'). */
void xl_linebuf_feed(struct xl_linebuf *lb, const char *data, size_t n, xl_line_fn fn,
                     void *ctx);
/* Emit a trailing partial line, if any. */
void xl_linebuf_flush(struct xl_linebuf *lb, xl_line_fn fn, void *ctx);
void xl_linebuf_free(struct xl_linebuf *lb);

/* ---- entry point of the per-rank wrapper (rank_wrapper.c) ---- */
int xl_rank_wrapper_main(int argc, char **argv);

#endif
