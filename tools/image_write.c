/* See image_write.h. libjpeg's default error handler exits: here it
 * longjmps back, so a failure is a returned error. */
#include "image_write.h"

#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <spng.h>

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

int imgw_jpeg(uint8_t **out, size_t *size, const uint8_t *px, int w, int h, int c, int quality, bool chroma_420,
              char *err, size_t errn)
{
    struct jpeg_compress_struct ci;
    jerr e;
    unsigned char *volatile buf = NULL;
    unsigned long len = 0;
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_fail;
    if (setjmp(e.jb)) {
        snprintf(err, errn, "JPEG encoding failed: %s", e.msg);
        jpeg_destroy_compress(&ci);
        free(buf);
        return -1;
    }
    jpeg_create_compress(&ci);
    unsigned char *b = NULL;
    jpeg_mem_dest(&ci, &b, &len);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = c;
    ci.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    if (c == 3 && !chroma_420) ci.comp_info[0].h_samp_factor = ci.comp_info[0].v_samp_factor = 1;
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * (size_t)w * (size_t)c);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    buf = b;
    jpeg_destroy_compress(&ci);
    *out = buf;
    *size = len;
    return 0;
}

int imgw_png(uint8_t **out, size_t *size, const uint8_t *px, int w, int h, int c, char *err, size_t errn)
{
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!ctx) { snprintf(err, errn, "PNG encoding: out of memory"); return -1; }
    struct spng_ihdr ih = { .width = (uint32_t)w, .height = (uint32_t)h, .bit_depth = 8,
                            .color_type = c == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR };
    int r = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    if (!r) r = spng_set_ihdr(ctx, &ih);
    if (!r) r = spng_encode_image(ctx, px, (size_t)w * (size_t)h * (size_t)c, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    void *buf = r ? NULL : spng_get_png_buffer(ctx, size, &r);
    spng_ctx_free(ctx);
    if (r || !buf) {
        snprintf(err, errn, "PNG encoding failed: %s", spng_strerror(r));
        free(buf);
        return -1;
    }
    *out = buf;
    return 0;
}

int imgw_save(const char *path, const uint8_t *data, size_t size, char *err, size_t errn)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) snprintf(err, errn, "%s: cannot write: %s", path, strerror(errno));
    return ok ? 0 : -1;
}
