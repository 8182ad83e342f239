/* Shared by the observers in core/obs/: the configuration read from the
 * environment, and per-rank output files. */
#ifndef CX_OBS_INTERNAL_H
#define CX_OBS_INTERNAL_H

#include "api.h"
#include "cx_sbuf.h"

typedef struct {
    int debug_level;       /* PT_XLA_DEBUG_LEVEL */
    bool all_ranks;        /* CX_DEBUG_ALL_RANKS: not only local rank 0 prints */
    char *debug_file;      /* PT_XLA_DEBUG_FILE, NULL: stderr */
    char *dump_path;       /* XLA_SAVE_TENSORS_FILE */
    bool dump_dot;         /* XLA_SAVE_TENSORS_FMT=dot */
    char *metrics_path;    /* XLA_METRICS_FILE */
} cx_obs_config;

/* The configuration (env.c); read after cx_obs_get(). */
extern cx_obs_config cx_obs_cfg;

/* path, or path.<rank> when the world has more than one rank: ranks writing
 * the same setting never interleave in one file. */
void cx_obs_rank_path(char *buf, size_t cap, const char *path);

/* mkdir -p, with a one-line error "WHO: cannot create DIR: reason".
 * @return CX_OK or CX_ERR_IO. */
cx_status cx_obs_mkdir(const char *who, const char *path);

/* IR text and Graphviz formats (dump.c), shared with the analysis. notes
 * (may be NULL): the SPMD partitioner's, for the graph of these nodes. */
struct cx_spmd_notes;
void cx_obs_format_text(cx_sbuf *b, cx_node *const *nodes, int n, cx_node *const *roots, int nroots,
                        cx_tensor *const *named, const struct cx_spmd_notes *notes);

/* Tests: feeds `iters` mutated payloads of cache file `path` to the
 * validating loader (disk_cache.c). @return how many it accepted, -1 if
 * the file is unreadable. */
int cx_disk_cache_fuzz(const char *path, int iters, unsigned seed);
/* Tests and the fuzzer: the decompressed payload of cache file `path` into
 * *out (malloc'd). @return 0, or -1 if it cannot be read or decompressed. */
int cx_disk_cache_payload(const char *path, unsigned char **out, size_t *n);
/* Whether the validating loader accepts payload[0..n) as an executable. */
bool cx_disk_cache_payload_ok(const unsigned char *payload, size_t n);

#endif
