/* The loops of conv_direct_bf16.c compiled for one vector width and its
 * instructions. That file includes this one once per width, with
 *   WIDTH         floats per vector: 16 (AVX-512), 8 (AVX2), 4 (the
 *                 baseline: SSE2 on x86-64, NEON on Arm);
 *   WIDTH_TARGET  the instructions that width is compiled for;
 * and each name below gets the width as a suffix (AT_WIDTH). It picks a
 * width by cx_isa_active(), so CX_CPU_ISA caps these loops as it caps the
 * GEMMs. The image widening has no vector type of its own, but is here
 * so the compiler vectorizes it with each width's instructions.
 *
 * Why each width is written out, not one 16-float loop cloned per CPU
 * (target_clones): where a clone has no 16-float register (AVX2), GCC
 * keeps such a vector in memory, moving it through the stack 8 bytes at
 * a time, and splits a comparison of 16 lanes into 16 scalar compares.
 * Compiled for AVX2, the 16-float forward ran 5 times slower than for
 * AVX-512 and the weight gradient 5.7 times (the cnn's bf16 step 10 %
 * slower than its f32 step). Here every vector is one register.
 *
 * The layouts are the file's, in VEC (16) floats whatever the width:
 * the planes, the padded rows, and a weight-gradient term's VEC lane sums,
 * which a narrower width adds in VEC / WIDTH passes over the plane (lane
 * l always sums the plane's floats at l, l + VEC, l + 2 VEC, ... in that
 * order; each pass reads every line of the plane for a part of it, in L1).
 * Every width thus adds in the same order, and a product of two bf16
 * values is exact in f32, so every width gives the same bits
 * (bf16_conv/direct_bits_are_the_same_at_every_width), FMA or not, but
 * where a product leaves f32's normal range (below 2^-126 or past its
 * largest): there a loop without FMA rounds it before adding it. */

#ifndef WIDTH
#error "conv_direct_bf16_width.h: include it through each_width.h (conv_direct_bf16.c does)"
#endif

typedef float AT_WIDTH(floats) __attribute__((vector_size(WIDTH * sizeof(float))));
typedef uint32_t AT_WIDTH(words) __attribute__((vector_size(WIDTH * sizeof(uint32_t))));
typedef int32_t AT_WIDTH(signed_words) __attribute__((vector_size(WIDTH * sizeof(int32_t))));
typedef uint16_t AT_WIDTH(halves) __attribute__((vector_size(WIDTH * sizeof(uint16_t))));
#define vf AT_WIDTH(floats)
#define vu AT_WIDTH(words)
#define vi AT_WIDTH(signed_words)
#define vh AT_WIDTH(halves)

/* WIDTH sums rounded to bf16 as cx_f32_to_bf16_inline rounds them (to
 * nearest even), in place and left as f32 (their low 16 bits zero), so a
 * bias adds to them as they are. By pointer: a vector argument wider than
 * the baseline's registers changes the ABI.
 *
 * No lane needs cx_f32_to_bf16_inline's NaN case: every NaN a sum or a
 * biased sum can hold is quiet with its low 16 bits zero. Its operands
 * are bf16 values widened (low half zero); an FMA or an add passes an
 * operand's NaN on, quieted, and an invalid one (inf - inf, 0 x inf) gives
 * the default NaN (0xffc00000 on x86, 0x7fc00000 on Arm). Such a NaN
 * comes out of the rounding below as it went in, as the NaN case gives
 * it. bf16_conv/direct_forward_is_the_scalar_sum_bit_for_bit holds the
 * kernel to that with infs and NaNs in every operand. */
WIDTH_INLINE void AT_WIDTH(round_bf16)(vf *x)
{
    vu u;
    memcpy(&u, x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(x, &u, sizeof u);
}

/* outputs [q0, q0 + lanes) of one row from their f32 sums: rounded once,
 * then the epilogue as cx_bf16_add_bias_inline computes it (+ the bf16
 * bias, rounded, relu with NaN to 0) */
WIDTH_INLINE void AT_WIDTH(store_row)(uint16_t *y, const float *sums, int lanes, bool add_bias, bool relu, float bias)
{
    vf f;
    memcpy(&f, sums, sizeof f);
    AT_WIDTH(round_bf16)(&f);
    if (add_bias) {
        f += bias;
        AT_WIDTH(round_bf16)(&f);
        if (relu) {
            const vi positive = f > 0.0f;   /* NaN too goes to 0 */
            vi bits;
            memcpy(&bits, &f, sizeof bits);
            bits &= positive;
            memcpy(&f, &bits, sizeof f);
        }
    }
    vu u;
    memcpy(&u, &f, sizeof u);
    vh out = __builtin_convertvector(u >> 16, vh);
    if (lanes == WIDTH) {
        memcpy(y, &out, sizeof out);
    } else {
        uint16_t part[WIDTH];
        memcpy(part, &out, sizeof out);
        for (int l = 0; l < lanes; l++) y[l] = part[l];
    }
}

/* image n of x, widened into xp (C, H + 2 PH, W + 2 PW; rows j->wp
 * apart) with zeros around, then the weight gradient's shifted copies.
 * @return whether every value is finite */
WIDTH_INLINE bool AT_WIDTH(widen_padded)(float *xp, const uint16_t *x, const direct_job *j, int64_t n)
{
    const cx_conv_geom *g = j->g;
    const int64_t hp = g->h + 2 * g->pad_h, wp = j->wp, room = image_room(g, j->dir);
    memset(xp, 0, sizeof *xp * (size_t)room);
    uint16_t special = 0;   /* an exponent of all ones: inf or NaN */
    for (int64_t c = 0; c < g->c; c++)
        for (int64_t r = 0; r < g->h; r++) {
            const uint16_t *src = x + ((n * g->c + c) * g->h + r) * g->w;
            float *dst = xp + (c * hp + r + g->pad_h) * wp + g->pad_w;
            for (int64_t q = 0; q < g->w; q++) {
                dst[q] = cx_bf16_to_f32_inline(src[q]);
                special |= (uint16_t)((src[q] & 0x7f80u) == 0x7f80u);
            }
        }
    for (int64_t jj = 1; jj < image_copies(g, j->dir); jj++) {
        float *copy = xp + jj * room;
        memcpy(copy, xp + jj, sizeof *xp * (size_t)(room - jj));
        memset(copy + room - jj, 0, sizeof *xp * (size_t)jj);
    }
    return !special;
}

/* Output channels [o0, o0 + OB) of image n (xp): OB independent sums per
 * vector of the plane, over the window in registers (a sum kept in
 * memory waited for its last store at every term, one alone in a
 * register for its last FMA), into OB planes, then rounded row by row.
 * K is a constant where inlined for the common window. */
WIDTH_INLINE void AT_WIDTH(forward_block)(const direct_job *j, const float *xp, float *planes, int64_t n, int64_t o0,
                                        const int64_t k)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, ob = min64(OB, g->o - o0), room = plane_room(g, 0), stride = plane_stride(g);
    float bias[OB] = { 0 };
    for (int64_t b = 0; b < ob; b++)
        if (j->epi && j->epi->bias) bias[b] = cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(j->epi->bias[o0 + b]));
    /* each weight in a whole vector, so each product is one FMA with its
     * operand in memory (AVX2 has no broadcast within the FMA); a channel
     * past the last of a part block gets zeros */
    vf wv[DIRECT_MAX_K][OB];
    for (int64_t t = 0; t < k; t++)
        for (int b = 0; b < OB; b++) {
            const float wt = b < ob ? cx_bf16_to_f32_inline(j->w[(o0 + b) * k + t]) : 0.0f;
            for (int l = 0; l < WIDTH; l++) wv[t][b][l] = wt;
        }
    for (int64_t p0 = 0; p0 < room; p0 += WIDTH) {
        vf a[OB];
        for (int b = 0; b < OB; b++) a[b] = (vf){ 0 };
        for (int64_t t = 0; t < k; t++) {
            vf v;
            memcpy(&v, xp + p0 + j->off[t], sizeof v);
            for (int b = 0; b < OB; b++) a[b] += wv[t][b] * v;
        }
        /* unrolled, or GCC stores the sums to the stack and copies them */
#pragma GCC unroll 8
        for (int b = 0; b < OB; b++) memcpy(planes + b * stride + p0, &a[b], sizeof a[b]);
    }
    /* a row's last vector is stored whole where it ends inside the plane:
     * what spills into the next rows is written over by them right after;
     * nothing spills past the plane (the next may be another thread's) */
    const int64_t plane = g->oh * ow, oh = g->oh, wp = j->wp;
    /* in locals: every store (a memcpy) may alias the job, so its fields
     * were read again at each */
    const bool add_bias = j->epi && j->epi->bias, relu = add_bias && j->epi->relu;
    uint16_t *const y = j->out + (n * g->o + o0) * plane;
    for (int64_t b = 0; b < ob; b++)
        for (int64_t r = 0; r < oh; r++)
            for (int64_t q0 = 0; q0 < ow; q0 += WIDTH)
                AT_WIDTH(store_row)(y + (b * oh + r) * ow + q0, planes + b * stride + r * wp + q0,
                                   r * ow + q0 + WIDTH <= plane ? WIDTH : (int)min64(WIDTH, ow - q0), add_bias, relu,
                                   bias[b]);
}

/* image n's output planes, every channel */
WIDTH_TARGET static void AT_WIDTH(forward_image)(const direct_job *j, float *xp, float *planes, int64_t n)
{
    (void)AT_WIDTH(widen_padded)(xp, j->x, j, n);   /* a column past a row's end is never stored */
    for (int64_t o0 = 0; o0 < j->g->o; o0 += OB) {
        if (j->k == 9) AT_WIDTH(forward_block)(j, xp, planes, n, o0, 9);
        else AT_WIDTH(forward_block)(j, xp, planes, n, o0, j->k);
    }
}

/* n bf16 values widened into dst: whole vectors, the last one
 * overlapping the one before (element by element, dy's rows had taken a
 * quarter of the weight gradient's time) */
WIDTH_INLINE void AT_WIDTH(widen_row)(float *restrict dst, const uint16_t *restrict src, int64_t n)
{
    if (n < WIDTH) {
        for (int64_t q = 0; q < n; q++) dst[q] = cx_bf16_to_f32_inline(src[q]);
        return;
    }
    for (int64_t q = 0;; q += WIDTH) {
        if (q + WIDTH > n) q = n - WIDTH;
        vh h;
        memcpy(&h, src + q, sizeof h);
        const vu w = __builtin_convertvector(h, vu) << 16;
        memcpy(dst + q, &w, sizeof w);
        if (q + WIDTH == n) return;
    }
}

/* Image n's terms of dw for output channels [o0, o1), added into sums (VEC
 * lanes per channel and term): dy's plane widened into d with the padded
 * row stride (its zeros between rows set once), then the K sums along it
 * in registers, VEC / WIDTH passes of WIDTH lanes each. */
WIDTH_INLINE void AT_WIDTH(weight_image)(const direct_job *j, const float *xp, float *d, float *sums, int64_t n,
                                       int64_t o0, int64_t o1, const int64_t k)
{
    const cx_conv_geom *g = j->g;
    const int64_t ow = g->ow, room = plane_room(g, 2);
    for (int64_t o = o0; o < o1; o++) {
        for (int64_t r = 0; r < g->oh; r++)
            AT_WIDTH(widen_row)(d + r * j->wp, j->dy + ((n * g->o + o) * g->oh + r) * ow, ow);
        float *s = sums + (o - o0) * k * VEC;
        for (int64_t part = 0; part < VEC; part += WIDTH) {
            vf a[DIRECT_MAX_K];
            for (int64_t t = 0; t < k; t++) memcpy(&a[t], s + t * VEC + part, sizeof a[t]);
            for (int64_t p0 = part; p0 < room; p0 += VEC) {
                vf dv;
                memcpy(&dv, d + p0, sizeof dv);
                for (int64_t t = 0; t < k; t++) {
                    vf v;
                    memcpy(&v, xp + p0 + j->off[t], sizeof v);
                    a[t] += dv * v;
                }
            }
            for (int64_t t = 0; t < k; t++) memcpy(s + t * VEC + part, &a[t], sizeof a[t]);
        }
    }
}

/* dw of output channels [o0, o1): the images in order, then each term's
 * lanes in order */
WIDTH_TARGET static void AT_WIDTH(weight_channels)(const direct_job *j, float *xp, float *d, float *sums, int64_t o0,
                                                  int64_t o1)
{
    const cx_conv_geom *g = j->g;
    const int64_t k = j->k;
    memset(sums, 0, sizeof *sums * (size_t)((o1 - o0) * k * VEC));
    /* the columns past each row's end and the plane's tail stay zero:
     * every plane after writes only its rows' outputs */
    memset(d, 0, sizeof *d * (size_t)plane_room(g, 2));
    for (int64_t n = 0; n < g->n; n++) {
        if (!AT_WIDTH(widen_padded)(xp, j->x, j, n)) weight_image_masked(j, xp, d, sums, n, o0, o1);
        else if (k == 9) AT_WIDTH(weight_image)(j, xp, d, sums, n, o0, o1, 9);
        else AT_WIDTH(weight_image)(j, xp, d, sums, n, o0, o1, k);
    }
    for (int64_t o = o0; o < o1; o++)
        for (int64_t t = 0; t < k; t++) {
            float total = 0.0f;
            for (int l = 0; l < VEC; l++) total += sums[((o - o0) * k + t) * VEC + l];
            j->out[o * k + t] = cx_f32_to_bf16_inline(total);
        }
}

#undef vf
#undef vu
#undef vi
#undef vh
