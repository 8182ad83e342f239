/* Writing 8-bit images as JPEG (libjpeg-turbo) or PNG (libspng), for the
 * programs that make image folders: tests/data/make_imagefolder and
 * cxla-bench's loader benchmark. Not part of libcxla. */
#ifndef CX_TOOLS_IMAGE_WRITE_H
#define CX_TOOLS_IMAGE_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Encodes px, (h, w, c) with c = 1 (grayscale) or 3 (RGB), as a JPEG of
 * the given quality (1..100), its chroma subsampled 4:2:0 (as cameras and
 * most of ImageNet) or kept whole (4:4:4), into a malloc'ed buffer *out of
 * *size bytes. @return 0, or -1 with one line in err. */
int imgw_jpeg(uint8_t **out, size_t *size, const uint8_t *px, int w, int h, int c, int quality, bool chroma_420,
              char *err, size_t errn);
/* The same as a PNG (8-bit grayscale or truecolor). @return as imgw_jpeg. */
int imgw_png(uint8_t **out, size_t *size, const uint8_t *px, int w, int h, int c, char *err, size_t errn);
/* Writes the first `size` bytes of data to path. @return 0, or -1 with one
 * line in err naming the path. */
int imgw_save(const char *path, const uint8_t *data, size_t size, char *err, size_t errn);

#endif
