/* PT_XLA_DEBUG_LEVEL's compilation and execution analysis (why a graph was
 * compiled or executed, and the C frames that caused it), the "too
 * frequent" warnings after each step, and the call-site entry points
 * (cx_sync_at & co.) that name the user's line. */
#define _GNU_SOURCE   /* dladdr */
#include "obs_internal.h"
#include "backend.h"
#include "frames.h"

#include <cxla/comm.h>
#include <cxla/debug.h>
#include <cxla/metrics.h>

#include <dlfcn.h>
#include <execinfo.h>


cx_status cx_sync_at(const char *file, int line)
{
    cx_record()->site_file = file;
    cx_record()->site_line = line;
    cx_status st = cx_sync();
    cx_record()->site_file = NULL;
    return st;
}

cx_status cx_step_end_at(const char *file, int line)
{
    cx_record()->site_file = file;
    cx_record()->site_line = line;
    cx_status st = cx_step_end();
    cx_record()->site_file = NULL;
    return st;
}

double cx_item_at(cx_tensor *t, const char *file, int line)
{
    cx_record()->site_file = file;
    cx_record()->site_line = line;
    double v = cx_item(t);
    cx_record()->site_file = NULL;
    return v;
}

static const char *cause_text(const char *cause)
{
    if (!strcmp(cause, "user sync")) return "user called cx_sync / cx_sync_tensors (mark_step)";
    if (!strcmp(cause, "step end")) return "cx_step_end (mark_step) at the end of a step";
    if (!strcmp(cause, "loader")) return "mark_step in parallel loader at step end";
    if (!strcmp(cause, "value read"))
        return "user code trying to access a tensor value (cx_item / cx_to_host) before the step ended; "
               "read it after cx_step_end, or cx_keep it";
    if (!strcmp(cause, "eager")) return "eager debug mode runs every op (XLA_USE_EAGER_DEBUG_MODE)";
    return "";
}

/* @return the stream for analysis output, or NULL when this rank is quiet */
static FILE *dbg_open(bool *close_it)
{
    *close_it = false;
    if (!cx_obs_cfg.all_ranks && cx_comm_local_rank() != 0) return NULL;
    if (!cx_obs_cfg.debug_file) return stderr;
    char path[4096];
    /* like the other per-rank files: ranks asked to print must not interleave */
    cx_obs_rank_path(path, sizeof path, cx_obs_cfg.debug_file);
    FILE *f = fopen(path, "a");
    *close_it = f != NULL;
    return f ? f : stderr;
}

static void dbg_close(FILE *f, bool close_it)
{
    if (close_it) fclose(f); else fflush(f);
}

/* The first frame of the caller's stack: the frames above the library
 * (backtrace's own) and the library's hidden internals are skipped, so the
 * stack starts at the first frame outside the library or at a public
 * function (only those have a dynamic symbol name). */
static int caller_start(void *const *pcs, int n, const Dl_info *self)
{
    int start = 0;
    bool entered = false;
    for (int i = 0; i < n; i++) {
        Dl_info di;
        bool ours = dladdr(pcs[i], &di) && di.dli_fbase == self->dli_fbase;
        entered = entered || ours;
        if (!entered || (ours && !di.dli_sname)) start = i + 1;
        else break;
    }
    return start;
}

/* One frame outside the library as "function (file:line)", a line per
 * function inlined there, when its module has line information (a program
 * built with -g); else by its symbol and offset.
 * @return lines printed, or -1 past main (the C runtime's frames) */
static int print_program_frame(FILE *f, const char *prefix, uintptr_t pc, const char *mod, uintptr_t off)
{
    cx_obs_frame fr[4];
    const char *sym;
    uintptr_t sym_off;
    int n = cx_obs_frame_lookup(pc, fr, 4, &sym, &sym_off);
    for (int k = 0; k < n; k++) fprintf(f, "%s   %s (%s:%d)\n", prefix, fr[k].fn, fr[k].file, fr[k].line);
    if (n == 0 && sym)
        fprintf(f, "%s   %s+0x%lx (%s+0x%lx)\n", prefix, sym, (unsigned long)sym_off + 1, mod, (unsigned long)off);
    else if (n == 0)
        fprintf(f, "%s   ?? (%s+0x%lx)\n", prefix, mod, (unsigned long)off);
    bool main_done = n > 0 ? !strcmp(fr[n - 1].fn, "main") : sym && !strcmp(sym, "main");
    return main_done ? -1 : n > 0 ? n : 1;
}

static void print_frames(FILE *f, const char *prefix, const char *api)
{
    const cx_record_ctx *rec = cx_record();
    if (rec->site_file) fprintf(f, "%s   %s (%s:%d)\n", prefix, api, rec->site_file, rec->site_line);
    void *pcs[32];
    int n = backtrace(pcs, 32);
    Dl_info self;
    if (!dladdr((void *)print_frames, &self)) return;
    int shown = 0;
    for (int i = caller_start(pcs, n, &self); i < n && shown < 8; i++) {
        Dl_info di;
        if (!dladdr(pcs[i], &di)) { fprintf(f, "%s   %p\n", prefix, pcs[i]); shown++; continue; }
        const char *mod = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        mod = mod ? mod + 1 : di.dli_fname ? di.dli_fname : "?";
        /* a return address points after the call; -1 lands in the call */
        uintptr_t pc = (uintptr_t)pcs[i] - 1, off = pc - (uintptr_t)di.dli_fbase;
        if (di.dli_sname && !strcmp(di.dli_sname, "__libc_start_call_main")) break;
        if (di.dli_fbase != self.dli_fbase) {
            /* the library's frames keep their public names, never its lines */
            int k = print_program_frame(f, prefix, pc, mod, off);
            if (k < 0) break;
            shown += k;
        } else if (di.dli_sname) {
            fprintf(f, "%s   %s+0x%lx (%s+0x%lx)\n", prefix, di.dli_sname,
                    (unsigned long)((uintptr_t)pcs[i] - (uintptr_t)di.dli_saddr), mod, (unsigned long)off);
            shown++;
        }
        /* the library's hidden internals (kept as frames of their own in a
         * build that does not inline them, a Debug build) have no name a
         * user could look up: left out, as the public call above them says
         * where the user's code entered */
    }
}

static const char *api_of(const char *cause)
{
    if (!strcmp(cause, "user sync")) return "cx_sync";
    if (!strcmp(cause, "value read")) return "cx_item";
    return "cx_step_end";
}

/* XLA_IR_DEBUG: the lines that made the graph's outputs, each once. */
static void output_sites(FILE *f, const char *p, const cx_obs_graph_info *g)
{
    enum { SHOWN = 4 };
    uint32_t seen[SHOWN];
    int n = 0, more = 0;
    for (int o = 0; o < g->nouts; o++) {
        uint32_t loc = g->outs[o]->loc;
        bool dup = !loc;
        for (int k = 0; k < n && !dup; k++) dup = seen[k] == loc;
        if (dup) continue;
        if (n == SHOWN) { more++; continue; }
        seen[n++] = loc;
    }
    if (n == 0) return;
    fprintf(f, "%s   Outputs made at:", p);
    for (int k = 0; k < n; k++) {
        char at[600];
        cx_obs_site_str(seen[k], at, sizeof at);
        fprintf(f, "%s %s", k ? "," : "", at);
    }
    if (more) fprintf(f, " and %d other lines", more);
    fprintf(f, "\n");
}

static void analysis(FILE *f, const char *who, const cx_obs_graph_info *g)
{
    const char *cause = g->cause;
    uint64_t hi = g->key_hi, lo = g->key_lo;
    const cx_executable *e = g->e;
    int source = g->source;
    char p[64];
    snprintf(p, sizeof p, "%s Analysis:", who);
    static const char *bar = "================================================================================";
    fprintf(f, "%s %s\n%s %s Cause\n", p, bar, p, who);
    fprintf(f, "%s   %s: %s\n", p, cause, cause_text(cause));
    if (source == 2) fprintf(f, "%s   (loaded from the persistent compile cache, not compiled)\n", p);
    fprintf(f, "%s Graph Info:\n%s   Graph Hash: %016llx%016llx\n", p, p, (unsigned long long)hi, (unsigned long long)lo);
    fprintf(f, "%s   Number of Graph Inputs: %d\n%s   Number of Graph Outputs: %d\n", p, e->n_inputs, p, e->n_outputs);
    if (cx_obs_cfg.ir_debug) output_sites(f, p, g);
    if (source == 1 && !strcmp(who, "Compilation")) cx_obs_explain(f, p, g);
    fprintf(f, "%s C Frames Triggered Execution:\n", p);
    print_frames(f, p, api_of(cause));
    fprintf(f, "%s --------------------------------------------------------------------------------\n", p);
    fprintf(f, "%s %s\n\n", p, bar);
}

static void post_compile(FILE *f, const cx_executable *e)
{
    int64_t in_bytes = 0, out_bytes = 0, alias_bytes = 0, prog = (int64_t)sizeof *e;
    for (int s = 0; s < e->nslots; s++) if (e->slots[s].kind == SLOT_INPUT) in_bytes += e->slots[s].bytes;
    for (int o = 0; o < e->n_outputs; o++) {
        out_bytes += e->out_bytes[o];
        if (e->out_alias[o] >= 0) alias_bytes += e->out_bytes[o];
    }
    for (int k = 0; k < e->nkernels; k++)
        prog += (int64_t)sizeof(cx_kernel) + e->kernels[k].prog.n * (int64_t)sizeof(cx_pinstr) +
                e->kernels[k].prog.nviews * (int64_t)sizeof(cx_view);
    const char *p = "Post Compilation Analysis:";
    const double gb = 1024.0 * 1024.0 * 1024.0;
    fprintf(f, "%s ================================================================================\n", p);
    fprintf(f, "%s Graph input size: %f GB\n", p, (double)in_bytes / gb);
    fprintf(f, "%s Graph output size: %f GB\n", p, (double)out_bytes / gb);
    fprintf(f, "%s Aliased Input size: %f GB\n", p, (double)alias_bytes / gb);
    fprintf(f, "%s Intermediate tensor size: %f GB\n", p, (double)e->intermediate_bytes / gb);
    fprintf(f, "%s Compiled program size: %f GB\n", p, (double)prog / gb);
    fprintf(f, "%s Kernels: %d, arena %lld bytes\n", p, e->num_work_kernels, (long long)e->arena_bytes);
    fprintf(f, "%s --------------------------------------------------------------------------------\n", p);
    fprintf(f, "%s ================================================================================\n\n", p);
}

static void analyze_graph(const cx_obs_graph_info *g)
{
    bool close_it;
    FILE *f = dbg_open(&close_it);
    if (!f) {
        if (g->source == 1) cx_obs_explain(NULL, "", g);   /* a quiet rank remembers for when it is asked */
        return;
    }
    if (g->source != 0) {
        analysis(f, "Compilation", g);
        post_compile(f, g->e);
    }
    if (cx_obs_cfg.debug_level >= 2) analysis(f, "Execution", g);
    dbg_close(f, close_it);
}

static int64_t g_compiles_at_warmup = -1;

/* PyTorch/XLA's auto-metrics analysis, after each step: after a warm-up,
 * more than one compile every other step means the graph keeps changing;
 * more than one device->host read every other step means values are read
 * every step. The counts printed are totals, as PyTorch/XLA's. */
static void step_warnings(void)
{
    int64_t steps = cx_counter_value("MarkStep");
    cx_metric_stats ms;
    int64_t compiles = cx_metric_data("CompileTime", &ms) ? ms.total_samples : 0;
    int64_t reads = cx_metric_data("TransferFromDeviceTime", &ms) ? ms.total_samples : 0;
    bool close_it;
    FILE *f = NULL;
    /* compiles during the warm-up (parameter init, the first step's
     * graphs) do not count: only those after the 10th step */
    if (steps <= 10 || g_compiles_at_warmup < 0) g_compiles_at_warmup = compiles;
    bool warn_compile = steps > 10 && (compiles - g_compiles_at_warmup) * 2 > steps - 10;
    bool warn_read = steps > 0 && reads * 2 > steps;
    if ((warn_compile || warn_read) && (f = dbg_open(&close_it)) != NULL) {
        if (warn_compile)
            fprintf(f, "pt-xla-profiler: CompileTime too frequent: %lld counts during %lld steps\n", (long long)compiles,
                    (long long)steps);
        if (warn_read)
            fprintf(f, "pt-xla-profiler: TransferFromDeviceTime too frequent: %lld counts during %lld steps\n",
                    (long long)reads, (long long)steps);
        dbg_close(f, close_it);
    }
}

__attribute__((constructor)) static void register_analysis(void)
{
    cx_obs_hooks.analysis = analyze_graph;
    cx_obs_hooks.step_warnings = step_warnings;
}
