/* The compiled program as text: what runs, not what was traced. Each
 * kernel with the ops fused into it, its shapes and the path it takes;
 * the collectives with the kernels they overlap; the arena plan; the
 * outputs written over their inputs' buffers; the parts of the cache key.
 * Written for every compilation into the dump directory (XLA_FLAGS=
 * --xla_dump_to=DIR, CX_DUMP_DIR), for XLA_SAVE_TENSORS_FMT=hlo, and with
 * a graph whose compile or run failed (XLA_SAVE_HLO_FILE). */
#include "obs_internal.h"
#include "cx_log.h"

#include <cxla/comm.h>
#include <cxla/debug.h>
#include <cxla/version.h>

#include <errno.h>

/* The graph the kernels' node indices refer to: the lowered cx_graph, or,
 * for an executable compiled from an unpartitioned capture, the captured
 * IR nodes (same order, same indices). */
typedef struct {
    const cx_graph *g;
    cx_node *const *ir;
    int n;
} gview;

static int gv_op(const gview *v, int i) { return v->g ? v->g->nodes[i].op : v->ir[i]->op; }
static int gv_nin(const gview *v, int i) { return v->g ? v->g->nodes[i].ninputs : v->ir[i]->ninputs; }
static int gv_in(const gview *v, int i, int k) { return v->g ? v->g->nodes[i].inputs[k] : v->ir[i]->inputs[k]->index; }
static uint32_t gv_loc(const gview *v, int i) { return v->g ? v->g->nodes[i].loc : v->ir[i]->loc; }
static bool gv_leaf(const gview *v, int i)
{
    if (!v->g && v->ir[i]->buf) return true;
    int op = gv_op(v, i);
    return op == OP_DATA || op == OP_RTSCALAR;
}


/* How the kernel computes: the path the runtime takes for it. */
static void path_str(cx_sbuf *b, const cx_kernel *k)
{
    static const char *const epi[] = { [EPI_PROG] = "program", [EPI_BIAS] = "bias", [EPI_BIAS_RELU] = "bias+relu",
                                       [EPI_POSMASK] = "relu-gradient mask", [EPI_BIAS_ADD] = "bias+addend" };
    switch (k->kind) {
    case K_FUSED: cx_sb_printf(b, "fused loop, %d instructions", k->prog.n); break;
    case K_REDUCE:
        cx_sb_printf(b, "%s over %d kept dims, prologue of %d instructions", cx_op_table[k->red_op].name, k->nkeep,
                     k->prog.n);
        break;
    case K_MATMUL: {
        const cx_kin *a = &k->in[0], *w = &k->in[1];
        if (a->dtype == CX_BF16) {
            const char *route = cx_bf16_gemm_on_dnnl()
                                    ? (cx_bf16_gemm_on_amx() ? "oneDNN matmul (AMX)" : "oneDNN matmul")
                                : cx_isa_active() >= CX_ISA_AVX512_BF16 ? "AVX512_BF16 micro-kernel"
                                : cx_fma_route_available()                 ? "blocks widened as packed, f32 micro-kernel"
                                                                           : "blocks widened into sgemm";
            cx_sb_printf(b, "bf16 GEMM, %s%s", route, cx_kernel_is_matmul_f32_sums(k) ? ", f32 sums out (its cast folded)" : "");
            break;
        }
        /* the operands run_matmul hands cx_matmul_f32 */
        const int nd = a->ndim;
        int64_t batch = 1;
        for (int d = 0; d + 2 < nd; d++) batch *= a->shape[d];
        bool dnnl = nd >= 2 && cx_matmul_f32_on_dnnl(batch, a->shape[nd - 2], w->shape[nd - 1], a->shape[nd - 1], a->trans,
                                                     batch > 1 ? a->batch_stride : 0, batch > 1 ? w->batch_stride : 0);
        cx_sb_printf(b, "sgemm, %s", dnnl ? "oneDNN" : "OpenBLAS");
        break;
    }
    case K_CONV: case K_CONV_BI: case K_CONV_BW: {
        cx_conv_geom g;
        cx_kernel_conv_geom(k, &g);
        bool bf16 = k->in[0].dtype == CX_BF16;
        int dir = k->kind == K_CONV ? 0 : k->kind == K_CONV_BI ? 1 : 2;
        if (bf16 && cx_conv2d_bf16_plans_gemm(&g)) cx_sb_printf(b, "bf16 im2col + bf16 GEMM");
        else if (bf16 && cx_conv2d_bf16_direct_applies(&g, dir)) cx_sb_printf(b, "bf16 direct, f32 sums along the plane");
        else if (cx_wino_applies(&g) && !bf16) cx_sb_printf(b, "Winograd F(2x2,3x3)");
        else if (cx_wino_applies(&g))
            cx_sb_printf(b, "Winograd F(2x2,3x3) on bf16, f32 transforms, %s",
                         cx_isa_active() >= CX_ISA_AVX512_BF16 ? "products on vdpbf16ps" : "sgemm products");
        else cx_sb_printf(b, "%s", bf16 ? "bf16 widened, im2col + sgemm" : "im2col + sgemm");
        break;
    }
    case K_COLL: cx_sb_printf(b, "comm backend"); break;
    case K_ATTENTION: case K_ATTENTION_BWD: case K_LAYER_NORM: case K_LAYER_NORM_BWD:
        cx_sb_printf(b, "fused kernel");
        /* the output is the concat of the gradients its readers see */
        if (k->kind == K_ATTENTION_BWD && k->nattrs > CX_AT_ATTN_INTERLEAVED && k->attrs[CX_AT_ATTN_INTERLEAVED])
            cx_sb_printf(b, ", dq|dk|dv rows interleaved");
        break;
    default: cx_sb_printf(b, "direct"); break;
    }
    if (k->has_epilogue && k->epi < sizeof epi / sizeof *epi)
        cx_sb_printf(b, ", epilogue fused: %s", epi[k->epi]);
}

static void shape_str(cx_sbuf *b, int dtype, const int64_t *shape, int nd)
{
    cx_sb_printf(b, "%s[", cx_dtype_name((cx_dtype)dtype));
    for (int d = 0; d < nd; d++) cx_sb_printf(b, "%s%lld", d ? "," : "", (long long)shape[d]);
    cx_sb_printf(b, "]");
}

static void slot_str(cx_sbuf *b, const cx_executable *e, int s)
{
    static const char *const kinds[] = { "input", "output", "arena" };
    if (s < 0 || s >= e->nslots) { cx_sb_printf(b, "-"); return; }
    const cx_slot *sl = &e->slots[s];
    if (sl->kind == SLOT_ARENA) cx_sb_printf(b, "arena#%d", s);
    else cx_sb_printf(b, "%s%d", kinds[sl->kind], sl->index);
}

/* The ops fused into kernel k: the nodes below its own that no other
 * kernel computes, ascending (inputs first). stamp[] is per-dump scratch. */
static void group_ops(cx_sbuf *b, const gview *v, const char *is_root, int *stamp, int **stack, int k, int node,
                      bool locs)
{
    int sp = 0, *st = *stack;
    st[sp++] = node;
    stamp[node] = k + 1;
    while (sp) {
        int x = st[--sp];
        for (int i = 0; i < gv_nin(v, x); i++) {
            int c = gv_in(v, x, i);
            if (stamp[c] == k + 1 || is_root[c] || gv_leaf(v, c)) continue;
            stamp[c] = k + 1;
            st[sp++] = c;
        }
    }
    cx_sb_printf(b, "    ops:");
    for (int i = 0; i <= node; i++) {
        if (stamp[i] != k + 1) continue;
        cx_sb_printf(b, " %%%d %s", i, cx_op_table[gv_op(v, i)].name);
        char at[600];
        if (locs && gv_loc(v, i)) { cx_obs_site_str(gv_loc(v, i), at, sizeof at); cx_sb_printf(b, "@%s", at); }
        if (i != node) cx_sb_printf(b, ",");
    }
    cx_sb_printf(b, "\n");
}

static void kernel_str(cx_sbuf *b, const cx_executable *e, int ki)
{
    const cx_kernel *k = &e->kernels[ki];
    cx_sb_printf(b, "  k%d %s ", ki, k->kind == K_COLL ? cx_op_table[k->coll_op].name : cx_kernel_kind_name(k->kind));
    shape_str(b, k->out_dtype, k->shape, k->ndim);
    cx_sb_printf(b, " -> ");
    slot_str(b, e, k->out_slot);
    cx_sb_printf(b, " <-");
    for (int i = 0; i < k->nin; i++) {
        cx_sb_printf(b, " ");
        shape_str(b, k->in[i].dtype, k->in[i].shape, k->in[i].ndim);
        cx_sb_printf(b, "%s:", k->in[i].trans ? "^T" : "");
        slot_str(b, e, k->in[i].slot);
    }
    for (int i = 0; i < k->prog.n; i++) {   /* what the fused program loads */
        const cx_pinstr *in = &k->prog.ins[i];
        bool again = false;
        for (int j = 0; j < i; j++) again = again || (k->prog.ins[j].kind == P_LOAD && k->prog.ins[j].slot == in->slot);
        if (in->kind != P_LOAD || again || k->has_epilogue) continue;
        cx_sb_printf(b, " ");
        slot_str(b, e, in->slot);
    }
    cx_sb_printf(b, "; path: ");
    path_str(b, k);
    if (k->scratch_slot >= 0) cx_sb_printf(b, "; scratch %lld bytes", (long long)k->scratch_bytes);
    if (k->kind == K_COLL) {
        if (k->wait_at >= 0 && k->wait_at > ki + 1) cx_sb_printf(b, "; starts here, waited before k%d", k->wait_at);
        else cx_sb_printf(b, "; starts here, waited at once");
    }
    cx_sb_printf(b, "\n");
}

static void collectives_str(cx_sbuf *b, const cx_executable *e)
{
    int n = 0;
    for (int ki = 0; ki < e->nkernels; ki++) n += e->kernels[ki].kind == K_COLL;
    cx_sb_printf(b, "## Collectives: %d\n", n);
    for (int ki = 0; ki < e->nkernels; ki++) {
        const cx_kernel *k = &e->kernels[ki];
        if (k->kind != K_COLL) continue;
        int wait = k->wait_at > ki ? k->wait_at : ki + 1;
        cx_sb_printf(b, "  %s ", cx_op_table[k->coll_op].name);
        shape_str(b, k->in[0].dtype, k->in[0].shape, k->in[0].ndim);
        cx_sb_printf(b, ": start k%d, wait before k%d, overlaps %d kernels\n", ki, wait, wait - ki - 1);
    }
}

static void memory_str(cx_sbuf *b, const cx_executable *e)
{
    cx_sb_printf(b, "## Arena: %lld bytes (%lld bytes of intermediates before packing)\n", (long long)e->arena_bytes,
                 (long long)e->intermediate_bytes);
    for (int s = 0; s < e->nslots; s++) {
        const cx_slot *sl = &e->slots[s];
        if (sl->kind != SLOT_ARENA || sl->last < 0) continue;
        cx_sb_printf(b, "  arena#%d: offset %lld, %lld bytes, live k%d..k%d\n", s, (long long)sl->offset,
                     (long long)sl->bytes, sl->def, sl->last);
    }
    cx_sb_printf(b, "## Outputs\n");
    for (int o = 0; o < e->n_outputs; o++) {
        cx_sb_printf(b, "  output%d: %lld bytes", o, (long long)e->out_bytes[o]);
        if (e->out_alias[o] >= 0)
            cx_sb_printf(b, ", aliased: written over input%d's buffer (donated by cx_assign)", e->out_alias[o]);
        cx_sb_printf(b, "\n");
    }
}

static void key_str(cx_sbuf *b, const cx_executable *e)
{
    cx_sb_printf(b, "Graph Hash: %016llx%016llx\n", (unsigned long long)e->key_hi, (unsigned long long)e->key_lo);
    cx_sb_printf(b, "Key parts: library %s, build %s, options \"%s\", threads %d%s", CX_VERSION_STRING,
                 CX_COMPILE_FLAGS, cx_compile_options(), cx_get_num_threads(), cx_is_spmd() ? ", SPMD rank " : "");
    if (cx_is_spmd()) cx_sb_printf(b, "%d", cx_global_ordinal());
    cx_sb_printf(b, ", the graph's ops, shapes, dtypes, attributes and shardings, %d inputs, %d outputs and their "
                    "aliasing; shared key (without threads and rank) %016llx%016llx\n",
                 e->n_inputs, e->n_outputs, (unsigned long long)e->shared_hi, (unsigned long long)e->shared_lo);
}

static void format_program(cx_sbuf *b, const gview *v, const cx_executable *e, bool locs)
{
    int ncoll = 0;
    for (int ki = 0; ki < e->nkernels; ki++) ncoll += e->kernels[ki].kind == K_COLL;
    cx_sb_printf(b, "[cx_program] rank %d of %d\n", cx_global_ordinal(), cx_world_size());
    key_str(b, e);
    cx_sb_printf(b, "Kernels: %d, collectives: %d, inputs: %d, outputs: %d\n## Kernels\n", e->nkernels, ncoll,
                 e->n_inputs, e->n_outputs);
    char *is_root = v->n > 0 ? calloc((size_t)v->n, 1) : NULL;
    int *stamp = v->n > 0 ? calloc((size_t)v->n, sizeof *stamp) : NULL;
    int *stack = v->n > 0 ? malloc(sizeof *stack * (size_t)v->n) : NULL;
    bool groups = is_root && stamp && stack;
    for (int ki = 0; groups && ki < e->nkernels; ki++) {
        int x = e->kernels[ki].node;   /* -1: a copy the alias pass added */
        if (x >= v->n) groups = false;
        else if (x >= 0) is_root[x] = 1;
    }
    if (v->n > 0 && !groups) cx_sb_printf(b, "  (fusion groups unknown)\n");
    for (int ki = 0; ki < e->nkernels; ki++) {
        kernel_str(b, e, ki);
        int x = e->kernels[ki].node;
        if (groups && x >= 0) group_ops(b, v, is_root, stamp, &stack, ki, x, locs);
    }
    free(is_root);
    free(stamp);
    free(stack);
    collectives_str(b, e);
    memory_str(b, e);
}

void cx_obs_format_program(cx_sbuf *b, const cx_graph *g, const cx_executable *e, bool locs)
{
    gview v = { g, NULL, g ? g->n : 0 };
    format_program(b, &v, e, locs);
}

/* For an executable whose graph is the captured one (not partitioned):
 * the kernels' node indices are the capture's. */
void cx_obs_format_program_ir(cx_sbuf *b, cx_node *const *nodes, int n, const cx_executable *e, bool locs)
{
    gview v = { NULL, e->out_sharding ? NULL : nodes, e->out_sharding ? 0 : n };
    format_program(b, &v, e, locs);
}

/* The partitioned graph, one line per node as the IR text. */
static void format_graph(cx_sbuf *b, const cx_graph *g, bool locs)
{
    cx_sb_printf(b, "GRAPH {\n");
    for (int i = 0; i < g->n; i++) {
        const cx_gnode *x = &g->nodes[i];
        cx_sb_printf(b, "  %%%d = ", i);
        shape_str(b, x->dtype, x->shape, x->ndim);
        cx_sb_printf(b, " %s(", x->op == OP_DATA ? "device_data" : cx_op_table[x->op].name);
        for (int k = 0; k < x->ninputs; k++) cx_sb_printf(b, "%s%%%d", k ? ", " : "", x->inputs[k]);
        cx_sb_printf(b, ")");
        if (x->nattrs > 0 && x->op != OP_DATA) {
            cx_sb_printf(b, ", attrs=[");
            for (int a = 0; a < x->nattrs; a++) cx_sb_printf(b, "%s%lld", a ? "," : "", (long long)x->attrs[a]);
            cx_sb_printf(b, "]");
        }
        for (int o = 0; o < g->n_outputs; o++) if (g->outputs[o] == i) cx_sb_printf(b, ", ROOT=%d", o);
        char at[600];
        if (locs && x->loc) { cx_obs_site_str(x->loc, at, sizeof at); cx_sb_printf(b, ", location=%s", at); }
        cx_sb_printf(b, "\n");
    }
    cx_sb_printf(b, "}\n");
}

/* DIR/cxla_<hash>.r<rank>.<what>.txt. @return false (logged once) when it cannot be written. */
static bool write_file(const char *path, const cx_sbuf *b)
{
    FILE *f = b->oom ? NULL : fopen(path, "w");
    bool ok = f && fputs(b->s ? b->s : "", f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    return ok;
}

static void dump_path(char *buf, size_t cap, uint64_t hi, uint64_t lo, const char *what)
{
    snprintf(buf, cap, "%s/cxla_%016llx%016llx.r%d.%s.txt", cx_obs_cfg.dump_dir, (unsigned long long)hi,
             (unsigned long long)lo, cx_global_ordinal(), what);
}

static void write_part(const cx_obs_program_info *p, const char *what, const cx_sbuf *b, bool *warned)
{
    char path[4096];
    dump_path(path, sizeof path, p->key_hi, p->key_lo, what);
    if (!write_file(path, b) && !*warned) {
        cx_logf(CX_LOG_WARNING, "dump", "%s: cannot write %s: %s", cx_obs_cfg.dump_dir_name, path, b->oom ? "out of memory" : strerror(errno));
        *warned = true;
    }
}

/* One compilation into the dump directory: the captured graph, the
 * partitioned one (SPMD), the lowered program. */
static void dump_program(const cx_obs_program_info *p)
{
    static bool warned;
    static char made[4096];   /* the directory made last (cx_debug_reload_env may name another) */
    if (strcmp(made, cx_obs_cfg.dump_dir) != 0) {
        char err[1024];
        snprintf(err, sizeof err, "%s", cx_last_error());
        cx_status st = cx_obs_mkdir(cx_obs_cfg.dump_dir_name, cx_obs_cfg.dump_dir);
        if (st != CX_OK && !warned) cx_logf(CX_LOG_WARNING, "dump", "%s", cx_last_error());
        cx_set_last_error("%s", err);   /* a dump that cannot be written is no error of the step */
        if (st != CX_OK) { warned = true; return; }
        snprintf(made, sizeof made, "%s", cx_obs_cfg.dump_dir);
    }
    bool locs = cx_obs_cfg.hlo_debug;
    cx_sbuf b = { 0 };
    cx_obs_format_text(&b, p->nodes, p->n, p->outs, p->nouts, NULL, p->notes);
    write_part(p, "captured", &b, &warned);
    free(b.s);
    if (p->partitioned && p->lowered) {
        b = (cx_sbuf){ 0 };
        format_graph(&b, p->lowered, locs);
        write_part(p, "partitioned", &b, &warned);
        free(b.s);
    }
    if (p->e) {
        b = (cx_sbuf){ 0 };
        cx_obs_format_program(&b, p->lowered, p->e, locs);
        write_part(p, "program", &b, &warned);
        free(b.s);
    }
}

/* A graph that failed to compile or run: its IR (with locations under
 * XLA_IR_DEBUG) and, if it was compiled, its program, into
 * XLA_SAVE_HLO_FILE or the dump directory; the error names the file. */
static void save_failed(const cx_obs_graph_info *g, cx_status st)
{
    char path[4096], err[2048];
    snprintf(err, sizeof err, "%s", cx_last_error());
    if (cx_obs_cfg.save_hlo_file) {
        cx_obs_rank_path(path, sizeof path, cx_obs_cfg.save_hlo_file);
    } else {
        if (cx_obs_mkdir(cx_obs_cfg.dump_dir_name, cx_obs_cfg.dump_dir) != CX_OK) {
            cx_set_last_error("%s (graph not saved: %s)", err, cx_last_error());
            return;
        }
        snprintf(path, sizeof path, "%s/cxla_%016llx%016llx.r%d.failed.txt", cx_obs_cfg.dump_dir,
                 (unsigned long long)g->key_hi, (unsigned long long)g->key_lo, cx_global_ordinal());
    }
    cx_sbuf b = { 0 };
    cx_sb_printf(&b, "[cx_failed_graph] %s: %s\nGraph Hash: %016llx%016llx\n## BEGIN_GRAPH\n", cx_status_str(st), err,
                 (unsigned long long)g->key_hi, (unsigned long long)g->key_lo);
    cx_obs_format_text(&b, g->nodes, g->n, g->outs, g->nouts, NULL, g->e ? g->e->spmd_notes : NULL);
    cx_sb_printf(&b, "## END_GRAPH\n");
    if (g->e) {
        cx_sb_printf(&b, "## BEGIN_PROGRAM\n");
        cx_obs_format_program_ir(&b, g->nodes, g->n, g->e, cx_obs_cfg.hlo_debug);
        cx_sb_printf(&b, "## END_PROGRAM\n");
    }
    bool ok = write_file(path, &b);
    const char *why = b.oom ? "out of memory" : strerror(errno);
    if (ok) cx_set_last_error("%s (graph saved to %s)", err, path);
    else cx_set_last_error("%s (graph not saved: cannot write %s: %s)", err, path, why);
    free(b.s);
}

__attribute__((constructor)) static void register_program_dump(void)
{
    cx_obs_hooks.program = dump_program;
    cx_obs_hooks.failed = save_failed;
}
