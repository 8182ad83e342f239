/* The graph of one sync: captured from the live tensors' pending nodes,
 * keyed, and handed to the compiler as a cx_graph (capture.c). */
#ifndef CX_CAPTURE_H
#define CX_CAPTURE_H

#include "graph.h"
#include "ir.h"
#include "cx_hash.h"

typedef struct {
    cx_node **nodes;         /* post-order: inputs before their users */
    int n, cap;
    cx_node **inputs;        /* data leaves, canonical order, then donors outside the graph */
    int n_inputs, in_cap;
    int n_graph_inputs;
    cx_node **rts;           /* runtime scalars */
    int n_rts, rt_cap;
    uint64_t *words;         /* the key's material */
    int nwords, wcap;
} cx_capture;

/* The graph below the outputs, inputs before their users; data leaves get
 * ordinals in visit order. @return false when out of memory. */
bool cx_capture_graph(cx_capture *cp, cx_node *const *outs, int nouts);
/* Appends a donor buffer that is not part of the graph as one more input.
 * @return its ordinal, -1 when out of memory. */
int cx_capture_add_input(cx_capture *cp, cx_node *x);
/* @return the ordinal of input x, -1 if it is not an input. */
int cx_capture_input_ordinal(const cx_capture *cp, const cx_node *x);

/* The 128-bit structural key of a captured graph: ops, attributes, shapes,
 * dtypes, the parameter sequence, the aliasing plan, the library version,
 * compile flags and options, and the thread count. Buffer contents never
 * enter it. @return false when out of memory. */
bool cx_capture_key(cx_capture *cp, cx_node *const *outs, int nouts, const int *out_alias, cx_key128 *key);

/* The key of the last cx_capture_key without the thread count (the only
 * word that may differ between ranks running the same graph). */
cx_key128 cx_capture_shared_key(cx_capture *cp);

/* The compiler's view of the capture. @return false when out of memory;
 * release with cx_graph_release either way. */
bool cx_capture_to_graph(const cx_capture *cp, cx_node *const *outs, int nouts, const int *out_alias, cx_graph *g);
void cx_graph_release(cx_graph *g);

/* The compile options string mixed into every key (cx_set_compile_options,
 * else $XLA_FLAGS and $CX_COMPILE_OPTIONS). */
const char *cx_compile_options(void);

#endif
