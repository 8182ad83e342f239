/* The image folder's pieces (nn/data_decode.c, nn/data_resample.c,
 * nn/data_imagefolder.c). Not installed. */
#ifndef CX_NN_DATA_IMAGE_H
#define CX_NN_DATA_IMAGE_H

#include <cxla/core.h>

#include <stddef.h>
#include <stdint.h>

/* An 8-bit RGB image, rows of w * 3 bytes: (h, w, 3); the rectangle at
 * (ox, oy) of a decoded image of full_w x full_h (all of it, unless a
 * JPEG was decoded in part). */
typedef struct {
    uint8_t *px;
    int w, h;
    int ox, oy, full_w, full_h;
} cx_rgb8;

/* How to decode a JPEG: at 1 / denom scale (1, 2, 4 or 8), and only the
 * pixels [x0, x1) x [y0, y1) of the scaled image when x1 > x0 (libjpeg's
 * cropped and skipped scanlines; the buffer may hold more). */
typedef struct {
    int denom;
    int x0, y0, x1, y1;
} cx_decode_plan;

/* Told the full size of an image before it is decoded: fills *plan (which
 * holds denom 1 and no region when called). A JPEG is decoded as the plan
 * says; a PNG is decoded whole whatever it says. */
typedef void (*cx_pick_scale_fn)(void *user, int w, int h, cx_decode_plan *plan);

/* Whether a file of `size` bytes whose first n (at most 8) are head starts
 * as a JPEG or PNG does: so a file can be refused before it is read whole.
 * @return CX_OK; CX_ERR_IO for an empty file or an unknown signature, with
 * one line in err naming path. */
cx_status cx_image_sniff(const uint8_t *head, size_t n, int64_t size, const char *path, char *err, size_t errn);

/* Decodes `size` bytes of `path`, which passed cx_image_sniff (its
 * signature is not checked again: the first byte tells JPEG from PNG),
 * into *out (its px malloc'ed: the caller frees it). pick(user, w, h,
 * &plan) is called once the size is known, and a JPEG is decoded as it
 * says (pick may be NULL: all of it, full size); *full_w and *full_h
 * get the image's own size. The pixels a partial
 * decode gives are those of the whole decode: the crop is widened by a
 * pixel each side (libjpeg's fancy upsampling treats a partial row's ends
 * as the image's), and the rows below it are still entropy-decoded, so a
 * truncated file fails whatever the region.
 * @return CX_OK; CX_ERR_IO for a file that is corrupt, truncated,
 * unsupported (CMYK) or too large, with one line in err naming path; CX_ERR_OOM (err says so). */
cx_status cx_image_decode(cx_rgb8 *out, int *full_w, int *full_h, const uint8_t *data, size_t size,
                          const char *path, cx_pick_scale_fn pick, void *user, char *err, size_t errn);

/* A source region for cx_resample: the image `src`, of which the
 * rectangle [x0, x0 + w) x [y0, y0 + h) is "the image" PIL resizes (its
 * borders clamp the filter), and within it the box (bx0, by0, bx1, by1)
 * (Image.resize's box argument) that is mapped onto the output. */
typedef struct {
    const cx_rgb8 *src;
    int x0, y0, w, h;
    double bx0, by0, bx1, by1;
} cx_resample_src;

/* PIL's bilinear Image.resize of the region to (out_w, out_h), of which
 * only the window [ox, ox + dst->w) x [oy, oy + dst->h) is computed into
 * dst (so a center crop costs only its own pixels). Same coefficients,
 * fixed point and rounding as Pillow's Resample.c: a triangle filter of
 * support max(1, scale), horizontal pass (rounded to 8 bits) then vertical.
 * @return CX_OK or CX_ERR_OOM. */
cx_status cx_resample(cx_rgb8 *dst, const cx_resample_src *s, int out_w, int out_h, int ox, int oy);

#endif
