/* Dense kernels the executor calls: outputs first, then inputs, then sizes.
 * All buffers are contiguous row-major f32 unless stated. Each kernel is
 * free to use the worker pool (cx_pool_parallel_for) and OpenBLAS; none
 * allocates except through the `scratch` it is given (size from the
 * matching *_scratch_bytes function), so the memory plan accounts for it.
 */
#ifndef CX_KERNELS_H
#define CX_KERNELS_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <signal.h>

/* CX_HOT marks the element loops: each is compiled for x86-64-v4 (AVX-512),
 * x86-64-v3 (AVX2, FMA) and the x86-64 baseline, and the loader picks the
 * variant the CPU runs (an ifunc), so one build runs at full speed on every
 * node of a cluster. OpenBLAS dispatches its own kernels the same way. A
 * -DCX_NATIVE=ON build targets the build machine alone instead. */
#if defined(CX_NATIVE_BUILD) || !defined(__x86_64__) || !defined(__GNUC__)
#define CX_HOT
#else
#define CX_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

/* The instructions of cx_isa's levels, for a kernel written once per
 * vector width and picked by cx_isa_active() (so CX_CPU_ISA caps it):
 * GCC moves a vector wider than the clone's registers through the stack,
 * so a CX_HOT loop on 16-float vectors is slow in its AVX2 clone. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CX_HAVE_ISA_TARGETS 1
#define CX_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define CX_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

/* Lanes of the concatenation of two vectors picked by constant indices.
 * GCC and clang spell the builtin differently: masks are written
 * CX_MASK(mask vector type, indices...) inside function-like macros, so
 * they travel through the kernels' macros as one argument and expand only
 * at the shuffle. */
#if defined(__clang__)
#define CX_SHUFFLE(a, b, mask) __builtin_shufflevector(a, b, mask)
#define CX_MASK(type, ...) __VA_ARGS__
#else
#define CX_SHUFFLE(a, b, mask) __builtin_shuffle(a, b, mask)
#define CX_MASK(type, ...) ((type){ __VA_ARGS__ })
#endif

typedef struct {
    int64_t n, c, h, w;        /* input  (N, C, H, W) */
    int64_t o, kh, kw;         /* weight (O, C/groups, KH, KW) */
    int64_t oh, ow;            /* output (N, O, OH, OW) */
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
} cx_conv_geom;

/* Fills oh/ow from the rest. @return false if the output would be empty or
 * the geometry is invalid (channels not divisible by groups, ...). */
bool cx_conv_geom_finish(cx_conv_geom *g);

/* Scratch sizes depend on the thread count when asked; the kernels use
 * as many threads as the scratch they are given (scratch_bytes) has room
 * for, so a graph compiled with fewer threads still runs correctly. */
size_t cx_conv2d_scratch_bytes(const cx_conv_geom *g);
/* y (N, O, OH, OW) = conv(x (N, C, H, W), w (O, C/g, KH, KW)) + bias[o]
 * (bias (O) or NULL), then max(y, 0) if relu (NaN -> 0, as P_RELU). */
void cx_conv2d_fwd(float *y, const float *x, const float *w, const float *bias, bool relu, const cx_conv_geom *g,
                   void *scratch, size_t scratch_bytes);

size_t cx_conv2d_bwd_input_scratch_bytes(const cx_conv_geom *g);
/* dx (N, C, H, W) = d conv / d x applied to dy (N, O, OH, OW), then kept
 * only where posmask > 0 (posmask (N, C, H, W) or NULL). Overwrites dx. */
void cx_conv2d_bwd_input(float *dx, const float *dy, const float *w, const float *posmask, const cx_conv_geom *g,
                         void *scratch, size_t scratch_bytes);

size_t cx_conv2d_bwd_weight_scratch_bytes(const cx_conv_geom *g);
/* dw (O, C/g, KH, KW) = d conv / d w applied to dy. Overwrites dw. */
void cx_conv2d_bwd_weight(float *dw, const float *x, const float *dy, const cx_conv_geom *g, void *scratch,
                   size_t scratch_bytes);

/* The three over bf16 operands and output (conv_bf16.c): dir 0 y from
 * (x, w), 1 dx from (dy, w), 2 dw from (x, dy); f32 sums, the result
 * rounded once, then the epilogue `epi` (NULL: none), the steps of the
 * program it replaces each rounded as that program would: forward
 * y = relu?(bf16(y + bf16(bias[o]))), input gradient dx where posmask > 0
 * (else 0), one chunk of images at a time while it is in cache. Two
 * routes: lowered to the bf16 GEMM (bf16 im2col, col2im in f32); or the
 * operands widened into f32 copies for the f32 kernels (Winograd where it
 * applies). cx_conv2d_bf16 takes the GEMM route with AVX512_BF16 on the
 * shapes where it measured faster (not Winograd's, enough output channels
 * and K), or where the scratch was planned for that route only (an
 * executable planned under another CX_CPU_ISA), else the widening one. */
size_t cx_conv2d_bf16_scratch_bytes(const cx_conv_geom *g, int dir);
/* Whether this process plans g's bf16 conv for the GEMM route (the
 * program dump names the route). */
bool cx_conv2d_bf16_plans_gemm(const cx_conv_geom *g);
/* each route's scratch (gemm: the GEMM route) */
size_t cx_conv2d_bf16_route_scratch_bytes(const cx_conv_geom *g, int dir, bool gemm);
typedef struct {
    const float *bias;         /* forward: (O) f32, or NULL (then no epilogue) */
    bool relu;                 /* forward, after the bias */
    const uint16_t *posmask;   /* input gradient, max-pool backward: bf16 like the output, or NULL */
} cx_bf16_epi;
void cx_conv2d_bf16(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                    const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes);
/* The route cx_conv2d_bf16 takes in scratch_bytes: the GEMM route where
 * this level plans it and the scratch holds it, or where the scratch
 * holds only it (the widening route's least: one Winograd or direct
 * lane, or a direct shape's chunked scratch where that is less). */
bool cx_conv2d_bf16_takes_gemm(const cx_conv_geom *g, int dir, size_t scratch_bytes);
/* y[i] kept where mask[i] > 0, else 0: relu's gradient over bf16 values. */
void cx_bf16_posmask(uint16_t *y, const uint16_t *mask, int64_t n);
/* the GEMM route itself, on any CPU (without AVX512_BF16 the GEMM widens
 * its tiles); scratch from cx_conv2d_bf16_route_scratch_bytes(g, dir, true) */
void cx_conv2d_bf16_gemm(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                         const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes);

/* Direct bf16 convolution (conv_direct_bf16.c), which cx_conv2d_bf16 takes
 * where it applies: the forward and the weight gradient (dir 0, 2) of a
 * conv of one group, stride and dilation 1, and C * KH * KW <= 16 (one
 * input channel, 3x3: the seed cnn's conv1). Sums in f32, each output
 * rounded once; the forward folds epi's bias (+ relu) as apply_epi does.
 * Its scratch holds, per lane, a padded f32 image and the sums (the
 * forward's output planes, or dy's plane and every channel's term sums),
 * a lane per thread (least: the one lane it runs in at the least). */
bool cx_conv2d_bf16_direct_applies(const cx_conv_geom *g, int dir);
size_t cx_conv2d_bf16_direct_scratch_bytes(const cx_conv_geom *g, int dir, bool least);
void cx_conv2d_bf16_direct(int dir, uint16_t *out, const uint16_t *in0, const uint16_t *in1, const cx_conv_geom *g,
                           const cx_bf16_epi *epi, void *scratch, size_t scratch_bytes);

/* Winograd F(2x2, 3x3) (winograd.c), which the three conv2d
 * functions above use by themselves where it applies: 3x3, stride 1,
 * dilation 1, one group, pad <= 2, at least 8 channels each way and two
 * images. dir: 0 forward, 1 input gradient, 2 weight gradient. */
bool cx_wino_applies(const cx_conv_geom *g);
size_t cx_wino_scratch_bytes(const cx_conv_geom *g, int dir);
void cx_wino_fwd(float *y, const float *x, const float *w, const float *bias, bool relu, const cx_conv_geom *g,
                 void *scratch, size_t scratch_bytes);
void cx_wino_bwd_input(float *dx, const float *dy, const float *w, const float *posmask, const cx_conv_geom *g,
                       void *scratch, size_t scratch_bytes);
void cx_wino_bwd_weight(float *dw, const float *x, const float *dy, const cx_conv_geom *g, void *scratch,
                        size_t scratch_bytes);
/* The same on bf16 tensors, in cx_wino_bf16_scratch_bytes. Without
 * AVX512_BF16 the sums are the f32 kernels' (bit for bit); with it the 16
 * products run on vdpbf16ps, their operands (U and V, or Z and Vt)
 * rounded to bf16 as cx_bf16_round_rows does and summed in f32. The sums
 * are rounded once into y or dx. w is the bf16 weights widened (f32); y
 * gets round(sum), then with a bias + bias rounded to bf16, rounded, and
 * relu; dx is zeroed where posmask (or NULL) is not > 0; dw stays f32 for
 * the caller to round. */
size_t cx_wino_bf16_scratch_bytes(const cx_conv_geom *g, int dir);
/* the least they run in: one lane (one thread's share), whatever the threads */
size_t cx_wino_bf16_min_scratch_bytes(const cx_conv_geom *g, int dir);
void cx_wino_fwd_bf16(uint16_t *y, const uint16_t *x, const float *w, const float *bias, bool relu,
                      const cx_conv_geom *g, void *scratch, size_t scratch_bytes);
void cx_wino_bwd_input_bf16(uint16_t *dx, const uint16_t *dy, const float *w, const uint16_t *posmask,
                            const cx_conv_geom *g, void *scratch, size_t scratch_bytes);
void cx_wino_bwd_weight_bf16(float *dw, const uint16_t *x, const uint16_t *dy, const cx_conv_geom *g, void *scratch,
                             size_t scratch_bytes);

typedef struct {
    int64_t n, c, h, w;        /* input (N, C, H, W) */
    int64_t oh, ow;            /* output */
    int kh, kw, sh, sw, ph, pw;
} cx_pool_geom;

bool cx_pool_geom_finish(cx_pool_geom *g);
/* 2x2 windows at stride 2 without padding: every CNN's pool, the windows
 * tiling the plane (the pools' vector paths). */
bool cx_pool_geom_is_2x2(const cx_pool_geom *g);
/* Max pool; padding acts as -inf. Ties: the first maximum in row-major
 * window order wins (as PyTorch). */
void cx_max_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g);
/* dx = scatter of dy to each window's first maximum, then kept only
 * where posmask > 0 (posmask (N, C, H, W) or NULL; NaN -> 0). Overwrites
 * dx. posmask == x (relu before the pool) costs nothing extra. */
void cx_max_pool2d_bwd(float *dx, const float *x, const float *dy, const float *posmask, const cx_pool_geom *g);
/* Average pool, count_include_pad = true (divisor kh*kw always). */
void cx_avg_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g);
void cx_avg_pool2d_bwd(float *dx, const float *dy, const cx_pool_geom *g);
/* n values of a row (bf16_rows.c): widened to f32, or rounded to bf16 as
 * cx_f32_to_bf16 does (to nearest even, NaN kept quiet, denormals kept). */
void cx_bf16_widen_row(float *dst, const uint16_t *src, int64_t n);
void cx_bf16_round_row(uint16_t *dst, const float *src, int64_t n);
/* Tables of a bf16 unary op's results for every bf16 input (bf16_lut.c).
 * fill(op, out, in, n) computes op over n widened bf16 values, each result
 * bf16-exact (its low 16 bits 0); it runs once per op and process, on
 * first use, under a lock.
 *  - cx_bf16_lut: op's table of 65536 results, or NULL when
 *    op is out of range or its table could not be allocated (the caller
 *    computes instead);
 *  - cx_bf16_lut_apply: out[j] = table[high half of in[j]], widened; in
 *    must hold bf16-exact values. */
typedef void cx_bf16_lut_fill(int op, float *out, const float *in, int n);
const uint16_t *cx_bf16_lut(int op, cx_bf16_lut_fill *fill);
void cx_bf16_lut_apply(float *out, const float *in, const uint16_t *table, int64_t n);

/* bf16 pools: which one cx_pool2d_bf16 runs. */
enum { CX_POOL_BF16_MAX, CX_POOL_BF16_AVG, CX_POOL_BF16_MAX_BWD, CX_POOL_BF16_AVG_BWD };
/* The f32 kernel `kind` over g's planes on the calling thread only (for
 * kernels that deal planes to the pool themselves); max backward reads x
 * and dy, average backward dy alone. */
void cx_pool2d_plane_f32(int kind, float *out, const float *x, const float *dy, const cx_pool_geom *g);
/* Scratch of cx_pool2d_bf16 for g: one plane's f32 copies per thread. */
size_t cx_pool2d_bf16_scratch_bytes(const cx_pool_geom *g);
/* One thread's share: what a loaded executable's bf16 pool must have. */
size_t cx_pool2d_bf16_min_scratch_bytes(const cx_pool_geom *g);
/* A bf16 pool or its gradient (kind): out is y (N, C, OH, OW) forward, dx
 * (N, C, H, W) backward; the same bits as widening the operands, the f32
 * kernel, and rounding its result once; a max backward's dx then kept
 * where posmask (bf16, dx's layout; NULL: none) > 0, else 0. scratch: at
 * least one thread's share of cx_pool2d_bf16_scratch_bytes (more threads
 * use more). */
void cx_pool2d_bf16(int kind, uint16_t *out, const uint16_t *x, const uint16_t *dy, const uint16_t *posmask,
                    const cx_pool_geom *g, void *scratch, size_t scratch_bytes);

/* Scaled dot-product attention over heads: q (N, T, H, D), k and v
 * (N, S, H, D), each a strided view whose head dim is contiguous (element
 * strides of its N, T|S and H dims below), so q, k and v can be column
 * blocks of one projection's output. Scores are scale * q k^T per head;
 * causal: query row i sees keys j <= i + S - T (a row that sees none gives
 * 0). */
typedef struct {
    int64_t n, t, s, h, d;
    int64_t q_strides[3], k_strides[3], v_strides[3], o_strides[3], do_strides[3];
    bool causal;
    /* the backward's dqkv as (N, T, 3, H, D), each row's dq, dk, dv
     * side by side: the gradient of one q|k|v projection, written in
     * place (t == s only); false: packed, below */
    bool interleaved;
    float scale;
} cx_attn_geom;

/* Keys query row i (of t) may see: [0, visible). Causal: the last query
 * row sees every key (bottom-right alignment, as PyTorch's is_causal for
 * t == s). */
static inline int64_t cx_attn_visible_keys(const cx_attn_geom *g, int64_t i)
{
    if (!g->causal) return g->s;
    int64_t v = i + 1 + (g->s - g->t);
    return v < 0 ? 0 : v > g->s ? g->s : v;
}

size_t cx_attention_scratch_bytes(const cx_attn_geom *g);
/* The least scratch cx_attention_fwd (bwd: _bwd) runs in, one thread's
 * lane of the route it then takes: what a loaded executable must have. */
size_t cx_attention_min_scratch_bytes(const cx_attn_geom *g, bool bwd);
/* out (N, T, H, D) contiguous. */
void cx_attention_fwd(float *out, const float *q, const float *k, const float *v, const cx_attn_geom *g,
                      void *scratch, size_t scratch_bytes);
size_t cx_attention_bwd_scratch_bytes(const cx_attn_geom *g);
/* dqkv: dq (N, T, H, D), then dk and dv (N, S, H, D), contiguous (or
 * interleaved, above), from the forward's output o and its gradient dout
 * (strided like q). Overwrites. */
void cx_attention_bwd(float *dqkv, const float *q, const float *k, const float *v, const float *o, const float *dout,
                      const cx_attn_geom *g, void *scratch, size_t scratch_bytes);
/* The routes (attention.c) by name, for tests: rows (a query block
 * against all its keys at once, s up to 1024, row strides >= d) or tiled
 * (an online softmax over key tiles, any geometry). The functions above
 * take rows wherever it fits; asked for rows where it does not fit, or
 * given a scratch planned for tiled only, these run tiled too. */
size_t cx_attention_route_scratch_bytes(const cx_attn_geom *g, bool bwd, bool tiled);
void cx_attention_route_fwd(float *out, const float *q, const float *k, const float *v, const cx_attn_geom *g,
                            void *scratch, size_t scratch_bytes, bool tiled);
void cx_attention_route_bwd(float *dqkv, const float *q, const float *k, const float *v, const float *o,
                            const float *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes, bool tiled);

/* One (image, head) of the rows route over contiguous f32 copies of the
 * head (rows d apart): q, o, dout, out and dq (t, d); k, v, dk and dv
 * (s, d). g gives t, s, d, causal and scale; its n, h and strides are not
 * read. lane: cx_attention_head_lane_floats(g, bwd) floats, 64-byte
 * aligned. Only where cx_attention_head_fits(g) (s up to the rows route's
 * 1024 keys, d > 0). For a caller that converts a head at a time. */
bool cx_attention_head_fits(const cx_attn_geom *g);
/* Where head (n, h)'s dq, dk and dv start in a dqkv of g's layout (in
 * elements, whatever the dtype), and their row stride: packed (dq (N, T,
 * H, D), then dk and dv (N, S, H, D)) or interleaved ((N, T, 3, H, D),
 * t == s: the gradient of one q|k|v projection). */
void cx_attn_grad_places(const cx_attn_geom *g, int64_t n, int64_t h, int64_t at[3], int64_t *ld);
int64_t cx_attention_head_lane_floats(const cx_attn_geom *g, bool bwd);
void cx_attention_head_fwd(const cx_attn_geom *g, float *lane, float *out, const float *q, const float *k, const float *v);
void cx_attention_head_bwd(const cx_attn_geom *g, float *lane, float *dq, float *dk, float *dv, const float *q,
                           const float *k, const float *v, const float *o, const float *dout);

/* The same over bf16 q, k, v (and o, dout), giving bf16 out or dqkv
 * (attention_bf16.c says how each route computes): heads wherever it fits
 * (up to 1024 keys; with AVX512_BF16 the rows route's steps with bf16
 * products, P and dS rounded to bf16; without, each head widened into
 * f32 copies for the rows route above, the result rounded once); beyond,
 * the GEMM route with
 * AVX512_BF16 (bf16 products with f32 sums, P and dS rounded to bf16, as
 * PyTorch's bf16 attention) and widening without (chunks of images for
 * the f32 kernels above). A scratch planned for another route (an
 * executable planned under another CX_CPU_ISA) runs a route it fits. */
size_t cx_attention_bf16_scratch_bytes(const cx_attn_geom *g);
void cx_attention_bf16_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                           const cx_attn_geom *g, void *scratch, size_t scratch_bytes);
size_t cx_attention_bf16_bwd_scratch_bytes(const cx_attn_geom *g);
void cx_attention_bf16_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o,
                           const uint16_t *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes);
/* Each route by name, on any CPU, for tests and benches (the GEMM route
 * without AVX512_BF16 widens its tiles; heads where it does not fit runs
 * widening); its scratch (bwd: the backward's). The GEMM backward does
 * not read o (P is recomputed). */
typedef enum { CX_ATTN_BF16_HEADS, CX_ATTN_BF16_GEMM, CX_ATTN_BF16_WIDEN } cx_attn_bf16_route;
/* The least scratch cx_attention_bf16_fwd (bwd: _bwd) runs in: what a
 * loaded executable's bf16 attention must have. */
size_t cx_attention_bf16_min_scratch_bytes(const cx_attn_geom *g, bool bwd);
size_t cx_attention_bf16_route_scratch_bytes(const cx_attn_geom *g, bool bwd, cx_attn_bf16_route r);
void cx_attention_bf16_route_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const cx_attn_geom *g, void *scratch, size_t scratch_bytes, cx_attn_bf16_route r);
void cx_attention_bf16_route_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const uint16_t *o, const uint16_t *dout, const cx_attn_geom *g, void *scratch,
                                 size_t scratch_bytes, cx_attn_bf16_route r);

/* Layer norm over the last dim of (rows, c): y = (x - mean) / sqrt(var +
 * eps) * w + b (w, b (c) or NULL: 1 and 0). */
void cx_layer_norm_fwd(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c, float eps);
/* The same, its output rounded to bf16 (to nearest even, NaN kept quiet):
 * the f32 forward's values cast, bit for bit (an autocast layer norm whose
 * only reader is the cast before a bf16 product). */
void cx_layer_norm_fwd_bf16(uint16_t *y, const float *x, const float *w, const float *b, int64_t rows, int64_t c,
                            float eps);
/* Scratch for the backward: the per-lane partial sums of dw and db. */
size_t cx_layer_norm_bwd_scratch_bytes(int64_t rows, int64_t c);
/* dxwb: dx (rows, c), then dw (c) and db (c), from x, w (or NULL) and dy.
 * dw and db sum over rows in a fixed order (deterministic). Overwrites. */
void cx_layer_norm_bwd(float *dxwb, const float *x, const float *w, const float *dy, int64_t rows, int64_t c,
                       float eps, void *scratch, size_t scratch_bytes);

/* C (m, n) = op(A) op(B) + beta C, row-major with leading dims, split
 * across the worker pool (each part a single-threaded OpenBLAS call: the
 * pool owns every compute thread, so OpenBLAS's own threads never spin
 * against it). */
void cx_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
              const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* The same on the calling thread only: for kernels that already spread
 * their own tasks over the pool. */
void cx_sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Whether cx_sgemm runs a whole (m, n, k) product on oneDNN: decided on the
 * whole product, so the library does not depend on how it is split. */
bool cx_sgemm_prefers_dnnl(int64_t m, int64_t n, int64_t k);
/* cx_sgemm_serial on oneDNN (dnnl, falling back to OpenBLAS when oneDNN
 * refuses the call) or OpenBLAS: for kernels that split a product into
 * parts of their own and chose the library for the whole of it. */
void cx_sgemm_serial_on(bool dnnl, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Around every oneDNN call: OpenMP held to the calling thread (the pool
 * owns the compute threads; the caller's setting comes back) and the
 * asynchronous signals held off it (oneDNN 2.6's gemm kernels point rsp
 * at a heap workspace, where a handler's frame would land). */
typedef struct {
    int omp_threads;
    sigset_t signals;
} cx_dnnl_call;
void cx_dnnl_enter(cx_dnnl_call *call);
void cx_dnnl_leave(const cx_dnnl_call *call);

/* Batched matmul: for each b in [0, batch): C_b (M, N) = op(A_b) op(B_b),
 * A_b at a + b*stride_a (stride 0 = broadcast), row-major with leading
 * dims lda/ldb. trans_a means A_b is stored (K, M). */
void cx_matmul_f32(float *c, const float *a, const float *b,
                   int64_t batch, int64_t m, int64_t n, int64_t k,
                   bool trans_a, bool trans_b,
                   int64_t stride_a, int64_t stride_b);
/* A linear layer's epilogue over C (rows, n) in place, as the compiler's
 * program computes it, add by add: C + bias[column], then relu (x > 0 ?
 * x : 0, NaN to 0) or + addend (rows, n, contiguous; NULL: none). */
void cx_linear_epilogue_f32(float *c, const float *bias, const float *addend, bool relu, int64_t rows, int64_t n);
/* Whether cx_matmul_f32 with these operands hands its products to oneDNN
 * (else OpenBLAS): the program dump names the library. */
bool cx_matmul_f32_on_dnnl(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, int64_t stride_a,
                           int64_t stride_b);

/* Instruction sets the kernels choose between at run time (isa.c), in
 * increasing order. */
typedef enum { CX_ISA_BASELINE, CX_ISA_AVX2, CX_ISA_AVX512, CX_ISA_AVX512_BF16, CX_ISA_AMX } cx_isa;
/* What the CPU and OS support. */
cx_isa cx_isa_detected(void);
/* Whether the kernel lets this process use AMX's tile state: asked once,
 * on first call (only where AMX kernels are about to run: asking makes the
 * kernel refuse small signal stacks from then on); a refusal is one
 * warning. */
bool cx_amx_permitted(void);
/* What the kernels use: the detected set capped by CX_CPU_ISA (read once). */
cx_isa cx_isa_active(void);
const char *cx_isa_name(cx_isa isa);

/* bf16 matmul (gemm_bf16.c): as cx_matmul_f32 over bf16 a, b and c, with
 * the products summed in f32 and c rounded once (to nearest even). With
 * AVX512_BF16 the tiles are multiplied by vdpbf16ps; else with AVX2 + FMA
 * (or AVX-512F) they are widened as they are packed for an f32
 * micro-kernel (gemm_fma.c); else each tile is widened to f32 for
 * cx_sgemm_serial. Memory holds bf16 throughout. Every route uses the
 * scratch from cx_matmul_bf16_scratch_bytes and as many threads as it has
 * room for. */
size_t cx_matmul_bf16_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k);
/* The scratch a route plans (bf16_route: the AVX512_BF16 one; else the
 * one this CPU runs without it): a scratch planned for any route, as a
 * persistent-cache executable compiled under another CX_CPU_ISA has,
 * still runs. */
size_t cx_matmul_bf16_route_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k, bool bf16_route);
/* The least scratch cx_matmul_bf16 runs in (one thread): what a loaded
 * executable's bf16 matmul must have. 0 for an empty product. */
size_t cx_matmul_bf16_min_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k);
void cx_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b,
                    int64_t batch, int64_t m, int64_t n, int64_t k,
                    bool trans_a, bool trans_b,
                    int64_t stride_a, int64_t stride_b, void *scratch, size_t scratch_bytes);
/* The same with a folded epilogue: epi->bias (n) f32, per column, so
 * c = round(round(sum) + bf16(bias[col])), then relu if epi->relu (the
 * steps of autocast's linear bias, each rounded as the bf16 program
 * would); relu without a bias and epi->posmask are not read. epi NULL, or
 * its bias NULL: cx_matmul_bf16. */
void cx_matmul_bf16_epi(uint16_t *c, const cx_bf16_epi *epi, const uint16_t *a, const uint16_t *b, int64_t batch,
                        int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b,
                        void *scratch, size_t scratch_bytes);
/* The same with the f32 sums unrounded: stored into c (batch, m, n), or
 * added to it (accumulate), for callers that sum more before one rounding
 * (conv's col2im and weight gradient over chunks of images). Same scratch. */
void cx_matmul_bf16_f32(float *c, bool accumulate, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t m,
                        int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b,
                        void *scratch, size_t scratch_bytes);

/* The bf16 matmul on oneDNN's matmul primitive (gemm_bf16_dnnl.c), which
 * cx_matmul_bf16* take where cx_bf16_gemm_on_dnnl() says (CX_BF16_GEMM:
 * at the amx level with auto, at AVX512_BF16 and up with onednn), for
 * every product that does not add into C:
 *  - cx_matmul_bf16_dnnl: c (bf16, with cx_matmul_bf16_epi's bias and relu
 *    when bias is not NULL) or cf (f32 sums) = op(A) op(B) for each batch
 *    entry, operands as cx_matmul_bf16's (batch folded or not, stride 0 a
 *    broadcast). @return false, with c or cf to be written again, where
 *    oneDNN has no brgemm kernel for the shape at this level or a call
 *    failed. Takes no scratch from the plan: oneDNN's scratchpads and a
 *    weight gradient's K blocks' sums are buffers of the calling threads,
 *    kept until they end. Where a product overflows f32 both ways its
 *    blocks' sums give NaN, where cxla's one running sum gives +-inf (as
 *    PyTorch's oneDNN matmul does); a sum that underflows may be +0 where
 *    cxla's is -0, and a NaN's sign and payload may differ. */
bool cx_bf16_gemm_on_dnnl(void);
/* Whether that route runs on AMX tiles (the amx level, permitted). */
bool cx_bf16_gemm_on_amx(void);
/* cxla's own routes whatever CX_BF16_GEMM says (tests hold the oneDNN
 * route to them): cx_matmul_bf16_epi into c, or cx_matmul_bf16_f32's
 * stored sums into cf when cf is not NULL (epi then unread). */
void cx_matmul_bf16_cxla(uint16_t *c, float *cf, const cx_bf16_epi *epi, const uint16_t *a, const uint16_t *b,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a,
                         int64_t stride_b, void *scratch, size_t scratch_bytes);
bool cx_matmul_bf16_dnnl(uint16_t *c, float *cf, const float *bias, bool relu, const uint16_t *a, const uint16_t *b,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a,
                         int64_t stride_b);

/* The bf16 matmul's route without AVX512_BF16 (gemm_fma.c): bf16 blocks
 * widened to f32 as they are packed, summed by an f32 micro-kernel of
 * CX_FMA_TILE_ROWS rows by cx_fma_tile_cols() columns (AVX2 + FMA: 16;
 * AVX-512F: 32), each sum down K in order.
 *  - cx_fma_route_available: the CPU (as CX_CPU_ISA caps it) has one;
 *  - cx_fma_pack: count lanes by kb of bf16 into panels of `width` lanes
 *    (round_up(count, width) x kb floats, the ragged panel's empty lanes
 *    0); with k_major, K runs down src's rows (lane c of row q at src +
 *    q ld + c: B, a transposed A), else along them (lane c at src + c ld);
 *  - cx_fma_gemm_panels: c (mb, nb) (ld ldc) = A B, or c + A B unless
 *    first, from A's CX_FMA_TILE_ROWS-lane panels and B's
 *    cx_fma_tile_cols()-lane ones; c has room for whole tiles
 *    (round_up(mb, CX_FMA_TILE_ROWS) rows, round_up(nb, cols) columns);
 *  - cx_fma_tile_bf16: one whole tile's A B (CX_FMA_TILE_ROWS by
 *    cx_fma_tile_cols()) rounded into cb (ld ldc); with a bias (its first
 *    column's at bias[0]) as cx_matmul_bf16_epi's epilogue. */
enum { CX_FMA_TILE_ROWS = 6 };
bool cx_fma_route_available(void);
int64_t cx_fma_tile_cols(void);
void cx_fma_pack(float *dst, int64_t width, bool k_major, const uint16_t *src, int64_t ld, int64_t count, int64_t kb);
void cx_fma_gemm_panels(float *c, int64_t ldc, bool first, const float *ap, const float *bp, int64_t mb, int64_t nb,
                        int64_t kb);
void cx_fma_tile_bf16(uint16_t *cb, int64_t ldc, const float *ap, const float *bp, int64_t kb, const float *bias,
                      bool relu);

/* Products for a pool task that makes its own operands in f32
 * (Winograd's bf16 products) or runs its own small products (the bf16
 * attention's heads route), in the calling thread; only with
 * AVX512_BF16 (cx_isa_active()). Operands are rounded to bf16 by
 * vcvtneps2bf16: to nearest even, denormals flushed to zero.
 *  - cx_bf16_round_rows: dst (height, width) (ld ldd) = src (rows, cols)
 *    (ld lds) rounded, rows past rows and columns past cols 0;
 *  - cx_bf16_pack_a: A (m, k) bf16 (ld lda) into
 *    cx_bf16_panel_words(m, k, true) words;
 *  - cx_bf16_pack_panels: count lanes by k of bf16 into
 *    cx_bf16_panel_words(count, k, a_side) words, A's panels (a_side) or
 *    B's; with k_major, K runs down src's rows (lane c of row q at src +
 *    q ld + c: B, or a transposed A), else along them (lane c at src + c
 *    ld: A, or a transposed B). An odd k's last pair has a 0 high half;
 *  - cx_bf16_gemm_panels: c (m, n) (ld ldc) = A B, or c + A B with
 *    accumulate, summed in f32; A packed (ap), or else bf16 rows read in
 *    place (a, ld lda, k even, and round_up(m, CX_BF16_TILE_ROWS) rows
 *    readable). With room, c has round_up(m, CX_BF16_TILE_ROWS) rows and
 *    round_up(n, CX_BF16_TILE_COLS) columns to write whole tiles into
 *    (the excess gets what the padding gives, or, past a ragged last
 *    panel's rows rounded up to 4 or 8 or its columns to 16, is left as
 *    it was). */
enum { CX_BF16_TILE_ROWS = 12, CX_BF16_TILE_COLS = 32 };   /* the micro-kernel's tile of c */
size_t cx_bf16_panel_words(int64_t lanes, int64_t k, bool a_side);
void cx_bf16_round_rows(uint16_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols,
                        int64_t height, int64_t width);
void cx_bf16_pack_a(uint32_t *ap, const uint16_t *a, int64_t lda, int64_t m, int64_t k);
void cx_bf16_pack_panels(uint32_t *dst, bool a_side, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                         int64_t k);
void cx_bf16_gemm_panels(float *c, int64_t ldc, bool accumulate, const uint32_t *ap, const uint16_t *a, int64_t lda,
                         const uint32_t *bp, int64_t m, int64_t n, int64_t k, bool room);

/* torch.gather / scatter_add on a tensor viewed as (outer, dim, inner):
 * out (outer, idx_dim, inner); index (outer, idx_dim, inner) of i64.
 * Gather: out[o][i][j] = src[o][index[o][i][j]][j] with src (outer, src_dim, inner).
 * Indices outside [0, src_dim) are clamped away: gather yields 0 and
 * scatter_add skips them, and the count of such indices is returned so
 * the caller can report it. */
int64_t cx_gather_f32(float *out, const float *src, const int64_t *index,
                      int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner);
/* out (outer, out_dim, inner) += src (outer, idx_dim, inner) at index. */
int64_t cx_scatter_add_f32(float *out, const float *src, const int64_t *index,
                           int64_t outer, int64_t out_dim, int64_t idx_dim, int64_t inner);
/* The same with one index per (o, i) row, at index[o * idx_outer_stride
 * + i * idx_dim_stride]: whole rows of inner values move. An index out of
 * range counts inner times (once per element it stands for). */
int64_t cx_gather_rows_f32(float *out, const float *src, const int64_t *index, int64_t idx_outer_stride,
                           int64_t idx_dim_stride, int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner);
int64_t cx_scatter_add_rows_f32(float *out, const float *src, const int64_t *index, int64_t idx_outer_stride,
                                int64_t idx_dim_stride, int64_t outer, int64_t out_dim, int64_t idx_dim, int64_t inner);

#endif
