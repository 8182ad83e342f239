/* cxla GPT: a decoder-only transformer language model (GPT-2's layout, as
 * nanoGPT writes it), built from public cxla modules and ops.
 *
 * State-dict names are PyTorch's, weights (out, in):
 *   transformer.wte.weight (vocab, C), transformer.wpe.weight (block, C),
 *   transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 *   mlp.c_proj}.{weight, bias}, transformer.ln_f.{weight, bias}; and
 *   lm_head.weight, tied to transformer.wte.weight (listed once, under the
 *   embedding's name).
 * Attention is the fused causal kernel (cx_scaled_dot_product_attention),
 * GELU the exact erf form, dropout none.
 *
 * The model is an ordinary module: nn.h's ownership and thread rules apply.
 */
#ifndef CXLA_GPT_H
#define CXLA_GPT_H

#include <cxla/nn.h>
#include <cxla/spmd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Start from cx_gpt_default_config() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    int64_t vocab_size;   /* tokens are in [0, vocab_size) */
    int64_t block_size;   /* the longest sequence (wpe's rows) */
    int n_layer;
    int n_head;
    int64_t n_embd;       /* a multiple of n_head */
} cx_gpt_config;

/* vocab 256 (bytes), block 128, 4 layers, 4 heads, n_embd 256. */
static inline cx_gpt_config cx_gpt_default_config(void)
{
    cx_gpt_config o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.vocab_size = 256;
    o.block_size = 128;
    o.n_layer = 4;
    o.n_head = 4;
    o.n_embd = 256;
    return o;
}

/* A GPT with nanoGPT's initialization from the seeded RNG (cx_manual_seed):
 * every 2-D weight and both embeddings from normal(0, 0.02), the two c_proj
 * weights per block from normal(0, 0.02 / sqrt(2 n_layer)), biases 0,
 * LayerNorm weights 1.
 *
 * Its forward takes one or two inputs through cx_module_forward_many:
 *   idx (B, T) integer tokens, T <= block_size -> out[0] logits (B, T, vocab)
 *   idx, targets (B, T) integer                -> out[0] logits, out[1] the
 *                                                 mean cross-entropy (0-d)
 * and cx_module_forward(m, idx) gives the logits. A bad input is a
 * poisoned output (or -1 from forward_many) naming the shape.
 * @return the model, or NULL with cx_last_error set on a bad config (each
 * size positive, n_embd a multiple of n_head, a struct_size no lower than
 * the first version's) or out of memory. */
CX_API cx_module *cx_nn_gpt(cx_gpt_config cfg);

/* Fills *out with the model's config: out->struct_size is the caller's
 * (start from cx_gpt_default_config()), and only that many bytes are
 * written (core.h). @return CX_OK, or CX_ERR_ARG with cx_last_error set
 * and *out untouched when m is not a GPT, out is NULL or its struct_size
 * is below the first version's. */
CX_API cx_status cx_gpt_config_of(const cx_module *m, cx_gpt_config *out);

/* Matmul flops of one token through forward and backward at block length
 * t: 6 * (parameters other than wpe, which is a lookup) plus the attention's
 * q k^T and att v, 12 * n_layer * n_embd per key seen; with a causal mask
 * a token sees (t + 1) / 2 keys on average (PaLM's appendix B counts t,
 * the unmasked work; a causal kernel skips the rest). @return the flops, or
 * NaN with cx_last_error set for a struct_size below the first version's. */
CX_API double cx_gpt_flops_per_token(cx_gpt_config cfg, int64_t t);

/* Megatron-style tensor parallelism by annotations alone (SPMD mode,
 * cx_use_spmd): in every block c_attn's weight and bias split on their
 * output dimension over mesh axis `axis` as three blocks (q, k and v, so
 * each rank holds whole heads of each), c_fc's weight and bias on their
 * output dimension, and both c_proj weights on their input dimension;
 * everything else stays replicated. A step then needs one all-reduce per
 * block for the attention and one for the MLP in forward, and the same in
 * backward. Call it before building the optimizer. A deferred model
 * (cx_deferred_init_begin) materializes only each rank's shards. mesh NULL
 * is the global mesh.
 * @return CX_OK; CX_ERR_ARG when m is not a GPT, the mesh has no such
 * axis, or n_head does not divide by the axis' size; otherwise as
 * cx_mark_sharding, naming the parameter. */
CX_API cx_status cx_gpt_tensor_parallel(cx_module *m, const cx_mesh *mesh, const char *axis);

#ifdef __cplusplus
}
#endif
#endif
