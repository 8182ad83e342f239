/* JPEG (libjpeg-turbo) and PNG (libspng) decoding into 8-bit RGB. A bad
 * file must end in one line naming it, never in a crash or an exit: libjpeg
 * reports errors through its error manager, which here longjmps back, and a
 * premature end of data (only a warning to libjpeg, which would pad the
 * image with gray) counts as an error, as PIL's "image file is truncated". */
#include "nn_internal.h"

#include "data_image.h"

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>
#include <jerror.h>
#include <spng.h>

/* Decoded images above this many pixels are refused (a corrupt header can
 * claim 65535 x 65535). */
#define MAX_PIXELS ((int64_t)1 << 28)

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr;

static void jpeg_fail(j_common_ptr c)
{
    jerr *e = (jerr *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings are silent, except running out of data. */
static void jpeg_emit(j_common_ptr c, int level)
{
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(c);
}

static cx_status too_large(const char *path, int64_t w, int64_t h, char *err, size_t errn)
{
    if (w >= 1 && h >= 1 && w * h <= MAX_PIXELS) return CX_OK;
    snprintf(err, errn, "%s: an image of %lldx%lld pixels (want at least 1x1, at most %lld pixels)", path,
             (long long)w, (long long)h, (long long)MAX_PIXELS);
    return CX_ERR_IO;
}

/* The plan's region, widened a pixel left and right and clamped to the
 * W x H scaled image; all of it without a region. */
static void region(const cx_decode_plan *pl, int W, int H, int r[4])
{
    bool part = pl->x1 > pl->x0 && pl->y1 > pl->y0;
    r[0] = part && pl->x0 > 1 ? pl->x0 - 1 : 0;
    r[1] = part && pl->y0 > 0 ? pl->y0 : 0;
    r[2] = part && pl->x1 + 1 < W ? pl->x1 + 1 : W;
    r[3] = part && pl->y1 < H ? pl->y1 : H;
}

/* Rows [r[1], r[3]) into px, then the rest of the entropy data: skipped
 * short of the end and one row read (skipping to the very end would not
 * read it, and a truncation there would pass). */
static void read_rows(struct jpeg_decompress_struct *ci, uint8_t *px, const int r[4], uint8_t *spare)
{
    size_t stride = (size_t)ci->output_width * 3;
    if (r[1] > 0) jpeg_skip_scanlines(ci, (JDIMENSION)r[1]);
    while (ci->output_scanline < (JDIMENSION)r[3]) {
        JSAMPROW row = px + (size_t)(ci->output_scanline - (JDIMENSION)r[1]) * stride;
        jpeg_read_scanlines(ci, &row, 1);
    }
    JDIMENSION left = ci->output_height - ci->output_scanline;
    if (left > 1) jpeg_skip_scanlines(ci, left - 1);
    if (left > 0) jpeg_read_scanlines(ci, &spare, 1);
}

static cx_status decode_jpeg(cx_rgb8 *out, int *fw, int *fh, const uint8_t *data, size_t size, const char *path,
                             cx_pick_scale_fn pick, void *user, char *err, size_t errn)
{
    struct jpeg_decompress_struct ci;
    jerr e;
    uint8_t *volatile px = NULL, *volatile spare = NULL;
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_fail;
    e.pub.emit_message = jpeg_emit;
    if (setjmp(e.jb)) {
        snprintf(err, errn, "%s: corrupt JPEG: %s", path, e.msg);
        free(px);
        free(spare);
        jpeg_destroy_decompress(&ci);
        return CX_ERR_IO;
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, data, (unsigned long)size);
    jpeg_read_header(&ci, TRUE);
    *fw = (int)ci.image_width, *fh = (int)ci.image_height;
    if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
        snprintf(err, errn, "%s: a CMYK JPEG (only grayscale and RGB/YCbCr JPEGs are read)", path);
        jpeg_destroy_decompress(&ci);
        return CX_ERR_IO;
    }
    if (too_large(path, *fw, *fh, err, errn) != CX_OK) { jpeg_destroy_decompress(&ci); return CX_ERR_IO; }
    cx_decode_plan pl = { 1, 0, 0, 0, 0 };
    if (pick) pick(user, *fw, *fh, &pl);
    ci.out_color_space = JCS_RGB;
    ci.scale_num = 1;
    ci.scale_denom = (unsigned)pl.denom;
    jpeg_start_decompress(&ci);
    int r[4];
    out->full_w = (int)ci.output_width, out->full_h = (int)ci.output_height;
    region(&pl, out->full_w, out->full_h, r);
    if (r[0] > 0 || r[2] < out->full_w) {
        JDIMENSION xo = (JDIMENSION)r[0], cw = (JDIMENSION)(r[2] - r[0]);
        jpeg_crop_scanline(&ci, &xo, &cw);   /* moves xo left to an iMCU boundary */
        r[0] = (int)xo;
    }
    out->ox = r[0], out->oy = r[1];
    out->w = (int)ci.output_width, out->h = r[3] - r[1];
    px = malloc((size_t)out->w * (size_t)out->h * 3);
    spare = malloc((size_t)out->w * 3);
    if (!px || !spare) {
        snprintf(err, errn, "%s: out of memory for a %dx%d image", path, out->w, out->h);
        free(px);
        free(spare);
        jpeg_destroy_decompress(&ci);
        return CX_ERR_OOM;
    }
    read_rows(&ci, px, r, spare);
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(spare);
    out->px = px;
    return CX_OK;
}

/* pick is told the size too, so a caller learns it the same way for both
 * formats; its plan does not apply (a PNG is always decoded whole). */
static cx_status decode_png(cx_rgb8 *out, int *fw, int *fh, const uint8_t *data, size_t size, const char *path,
                            cx_pick_scale_fn pick, void *user, char *err, size_t errn)
{
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) { snprintf(err, errn, "%s: out of memory for a PNG decoder", path); return CX_ERR_OOM; }
    struct spng_ihdr ih;
    size_t bytes = 0;
    uint8_t *px = NULL;
    cx_status st = CX_ERR_IO;
    int r = spng_set_png_buffer(ctx, data, size);
    if (!r) r = spng_get_ihdr(ctx, &ih);
    if (!r && too_large(path, ih.width, ih.height, err, errn) != CX_OK) goto out;
    cx_decode_plan pl = { 1, 0, 0, 0, 0 };
    if (!r && pick) pick(user, (int)ih.width, (int)ih.height, &pl);
    if (!r) r = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &bytes);
    if (!r && !(px = malloc(bytes))) {
        snprintf(err, errn, "%s: out of memory for a %ux%u image", path, ih.width, ih.height);
        st = CX_ERR_OOM;
        goto out;
    }
    if (!r) r = spng_decode_image(ctx, px, bytes, SPNG_FMT_RGB8, 0);
    if (r) {
        snprintf(err, errn, "%s: corrupt PNG: %s", path, spng_strerror(r));
        goto out;
    }
    *fw = out->w = out->full_w = (int)ih.width, *fh = out->h = out->full_h = (int)ih.height;
    out->ox = out->oy = 0;
    out->px = px;
    px = NULL;
    st = CX_OK;
out:
    free(px);
    spng_ctx_free(ctx);
    return st;
}

cx_status cx_image_sniff(const uint8_t *head, size_t n, int64_t size, const char *path, char *err, size_t errn)
{
    static const uint8_t png_sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    if (size == 0) {
        snprintf(err, errn, "%s: an empty file (0 bytes), not an image", path);
        return CX_ERR_IO;
    }
    if (n >= 3 && head[0] == 0xff && head[1] == 0xd8 && head[2] == 0xff) return CX_OK;
    if (n >= 8 && !memcmp(head, png_sig, 8)) return CX_OK;
    snprintf(err, errn, "%s: not a JPEG or PNG image (%lld bytes, unknown signature)", path, (long long)size);
    return CX_ERR_IO;
}

cx_status cx_image_decode(cx_rgb8 *out, int *full_w, int *full_h, const uint8_t *data, size_t size,
                          const char *path, cx_pick_scale_fn pick, void *user, char *err, size_t errn)
{
    *out = (cx_rgb8){ 0 };
    if (data[0] == 0xff) return decode_jpeg(out, full_w, full_h, data, size, path, pick, user, err, errn);
    return decode_png(out, full_w, full_h, data, size, path, pick, user, err, errn);
}
