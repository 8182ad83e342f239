/* Shared by the observers in core/obs/: the configuration read from the
 * environment, and per-rank output files. */
#ifndef CX_OBS_INTERNAL_H
#define CX_OBS_INTERNAL_H

#include "api.h"
#include "frames.h"
#include "cx_sbuf.h"

typedef struct {
    int debug_level;       /* PT_XLA_DEBUG_LEVEL */
    bool all_ranks;        /* CX_DEBUG_ALL_RANKS: not only local rank 0 prints */
    char *debug_file;      /* PT_XLA_DEBUG_FILE, NULL: stderr */
    char *dump_path;       /* XLA_SAVE_TENSORS_FILE */
    bool dump_dot;         /* XLA_SAVE_TENSORS_FMT=dot */
    char *metrics_path;    /* XLA_METRICS_FILE */
    bool dump_hlo;         /* XLA_SAVE_TENSORS_FMT=hlo: the lowered program, in dumps and cx_ir_text */
    bool ir_debug;         /* XLA_IR_DEBUG */
    bool hlo_debug;        /* XLA_HLO_DEBUG (with XLA_IR_DEBUG): locations in program dumps */
    char *dump_dir;        /* XLA_FLAGS=--xla_dump_to=DIR, else CX_DUMP_DIR */
    const char *dump_dir_name;   /* which of the two, for messages */
    char *save_hlo_file;   /* XLA_SAVE_HLO_FILE */
} cx_obs_config;

/* The configuration (env.c); read after cx_obs_get(). */
extern cx_obs_config cx_obs_cfg;

/* path, or path.<rank> when the world has more than one rank: ranks writing
 * the same setting never interleave in one file. */
void cx_obs_rank_path(char *buf, size_t cap, const char *path);

/* mkdir -p, with a one-line error "WHO: cannot create DIR: reason".
 * @return CX_OK or CX_ERR_IO. */
cx_status cx_obs_mkdir(const char *who, const char *path);

/* XLA_IR_DEBUG's locations (site.c): a location's frame, resolved on
 * first use (NULL for 0 or when out of memory), and as "file:line" (or
 * "function (module+offset)" without line information). */
const cx_obs_frame *cx_obs_site(uint32_t loc);
void cx_obs_site_str(uint32_t loc, char *buf, size_t cap);

/* The lowered program as text (program_dump.c): fusion groups, kernels,
 * collectives, the arena plan, aliasing, the key's parts. g: the graph
 * the passes lowered (NULL: kernels without their ops); locs: the ops'
 * locations. */
void cx_obs_format_program(cx_sbuf *b, const struct cx_graph *g, const cx_executable *e, bool locs);
/* The same for an executable compiled from the captured nodes[n] (the
 * kernels' node indices are theirs unless it was partitioned). */
void cx_obs_format_program_ir(cx_sbuf *b, cx_node *const *nodes, int n, const cx_executable *e, bool locs);

/* The recompilation explainer (explain.c), for a graph just compiled: the
 * closest graph compiled before and what differs, as lines starting with
 * prefix on f; f NULL: only remembers g for later ones. */
void cx_obs_explain(FILE *f, const char *prefix, const cx_obs_graph_info *g);

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
