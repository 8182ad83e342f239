/* The program's own C frames by function, file and line, for the analysis
 * (analysis.c). backtrace()/dladdr see only dynamic symbols, which a program
 * has none of: its frames were "?? (train+0x6be7)". libdw reads the symbol
 * table and the DWARF line tables instead (programs built with -g), and the
 * inline scopes, since at -O3 the line of a return address is often in a
 * function inlined into the one on the stack.
 *
 * Only the analysis calls this: nothing here runs, nor is any file opened,
 * unless PT_XLA_DEBUG_LEVEL prints frames. */
#include "frames.h"

#include <dwarf.h>
#include <elfutils/libdwfl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* one session per process, kept: reading the maps and the ELF files is the
 * cost, and a session answers every later frame from its caches */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static Dwfl *g_dwfl;

static bool report_maps(Dwfl *d)
{
    dwfl_report_begin(d);
    return dwfl_linux_proc_report(d, getpid()) == 0 && dwfl_report_end(d, NULL, NULL) == 0;
}

static Dwfl_Module *module_of(Dwarf_Addr a)
{
    /* separate debug files by build ID from this machine only: the standard
     * lookup asks the debuginfod servers of DEBUGINFOD_URLS (Debian's
     * profile sets it) for a library's, a download in the middle of a run */
    static const Dwfl_Callbacks cb = { .find_elf = dwfl_linux_proc_find_elf,
                                       .find_debuginfo = dwfl_build_id_find_debuginfo };
    if (!g_dwfl && (g_dwfl = dwfl_begin(&cb)) != NULL && !report_maps(g_dwfl)) {
        dwfl_end(g_dwfl);
        g_dwfl = NULL;
    }
    if (!g_dwfl) return NULL;
    Dwfl_Module *m = dwfl_addrmodule(g_dwfl, a);
    /* a library dlopen()ed since the maps were read */
    if (!m && report_maps(g_dwfl)) m = dwfl_addrmodule(g_dwfl, a);
    return m;
}

static void set_frame(cx_obs_frame *fr, const char *fn, const char *file, int line)
{
    snprintf(fr->fn, sizeof fr->fn, "%s", fn ? fn : "??");
    snprintf(fr->file, sizeof fr->file, "%s", file ? file : "");
    fr->line = line;
}

/* The scopes around a: the innermost function first, then each function
 * it was inlined into, at the line of the inlined call, up to the real one. */
static int inline_chain(Dwfl_Module *m, Dwarf_Addr a, cx_obs_frame *out, int max)
{
    Dwarf_Addr bias;
    Dwarf_Die *cu = dwfl_module_addrdie(m, a, &bias);
    Dwfl_Line *ln = cu ? dwfl_module_getsrc(m, a) : NULL;
    int line = 0;
    const char *file = ln ? dwfl_lineinfo(ln, NULL, &line, NULL, NULL, NULL) : NULL;
    if (!file) return 0;
    Dwarf_Files *files = NULL;
    size_t nfiles = 0;
    if (dwarf_getsrcfiles(cu, &files, &nfiles) != 0) files = NULL;
    /* dwarf_getscopes continues from an inlined body into its abstract
     * origin's scopes, not into the function it was inlined into: take
     * only its innermost scope, and walk out through the concrete tree */
    Dwarf_Die *scopes = NULL, inner;
    int ns = dwarf_getscopes(cu, a - bias, &scopes), n = 0;
    if (ns > 0) inner = scopes[0];
    free(scopes);
    scopes = NULL;
    ns = ns > 0 ? dwarf_getscopes_die(&inner, &scopes) : 0;
    for (int i = 0; i < ns && n < max && file; i++) {
        int tag = dwarf_tag(&scopes[i]);
        if (tag != DW_TAG_subprogram && tag != DW_TAG_inlined_subroutine) continue;
        Dwarf_Attribute at;
        set_frame(&out[n++], dwarf_formstring(dwarf_attr_integrate(&scopes[i], DW_AT_name, &at)), file, line);
        if (tag == DW_TAG_subprogram) break;
        Dwarf_Word idx = 0, cl = 0;
        bool ok = files && dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &at), &idx) == 0 &&
                  dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &at), &cl) == 0;
        file = ok ? dwarf_filesrc(files, idx, NULL, NULL) : NULL;
        line = (int)cl;
    }
    free(scopes);
    /* line tables without scopes (no DW_TAG_subprogram): still the line */
    if (n == 0) {
        const char *fn = dwfl_module_addrname(m, a);
        set_frame(&out[n++], fn, file, line);
    }
    return n;
}

int cx_obs_frame_lookup(uintptr_t addr, cx_obs_frame *out, int max, const char **symbol, uintptr_t *sym_off)
{
    *symbol = NULL;
    *sym_off = 0;
    if (max <= 0) return 0;
    pthread_mutex_lock(&g_lock);
    Dwfl_Module *m = module_of((Dwarf_Addr)addr);
    int n = m ? inline_chain(m, (Dwarf_Addr)addr, out, max) : 0;
    GElf_Off off = 0;
    GElf_Sym sym;
    const char *name = m && n == 0 ? dwfl_module_addrinfo(m, (GElf_Addr)addr, &off, &sym, NULL, NULL, NULL) : NULL;
    /* the nearest symbol below is not the function when addr is past its end
     * (stripped files keep only the dynamic symbols) */
    if (name && off < sym.st_size) {
        set_frame(&out[0], name, NULL, 0);
        *symbol = out[0].fn;
        *sym_off = (uintptr_t)off;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}
