/* make_imagefolder ROOT --train N --val M [--corrupt K] [--size S]
 *
 * Writes an ImageFolder tree from Fashion-MNIST (Debian's
 * dataset-fashion-mnist, or $CX_FASHION_MNIST_DIR): the first N training
 * images into ROOT/train/classC/IIIII.EXT and the first M test images into
 * ROOT/val/classC/IIIII.EXT, C the label 0-9 (so the sorted class names
 * are the labels). Image i is written, by i % 4, as a grayscale JPEG, an
 * RGB JPEG, a grayscale PNG, an RGB PNG (JPEG quality 95); the RGB ones
 * carry the gray pixels p as (p, p, 255 - p) (their JPEGs in 4:4:4: the
 * chroma is as sharp as the edges). S (default 28) scales the
 * 28x28 images to SxS (nearest pixel). --corrupt K adds K bad files under
 * ROOT/train, named IIIII_bad.EXT, cycling through a JPEG cut in half, a
 * PNG cut in half, a .jpg of random bytes and an empty .png.
 * Prints one summary line; exits non-zero with one line on any error. */
#include <cxla/data.h>

#include "image_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *root;
    long train, val, corrupt, size;
} args;

#define USAGE "usage: make_imagefolder ROOT --train N --val M [--corrupt K] [--size S]\n"

static int usage(const char *why)
{
    fprintf(stderr, "make_imagefolder: %s\n" USAGE, why);
    return 2;
}

static int help(void)
{
    printf(USAGE "Writes ROOT/train/classC/*.{jpg,png} (the first N Fashion-MNIST training images)\n"
           "and ROOT/val/classC/... (the first M test images), C the label; ROOT and its\n"
           "parents are created. --corrupt K adds K bad files under ROOT/train; --size S\n"
           "scales the 28x28 images to SxS (default 28).\n");
    return -1;
}

static int parse(args *a, int argc, char **argv)
{
    *a = (args){ .size = 28 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return help();
        long *dst = !strcmp(argv[i], "--train") ? &a->train : !strcmp(argv[i], "--val") ? &a->val
                  : !strcmp(argv[i], "--corrupt") ? &a->corrupt : !strcmp(argv[i], "--size") ? &a->size : NULL;
        if (!dst) {
            if (argv[i][0] == '-' || a->root) {
                fprintf(stderr, "make_imagefolder: unknown argument '%s'\n", argv[i]);
                return 2;
            }
            a->root = argv[i];
            continue;
        }
        char *end;
        if (i + 1 >= argc || (*dst = strtol(argv[i + 1], &end, 10), *end) || *dst < 0 || *dst > 1000000) {
            fprintf(stderr, "make_imagefolder: %s wants a count 0..1000000\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!a->root) return usage("no ROOT given");
    if (a->size < 1 || a->size > 4096) return usage("--size wants 1..4096");
    return 0;
}

/* mkdir -p: ROOT's missing parents too. @return 0, or 1 after one line. */
static int mkdirs(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1;; s++) {
        if (*s && *s != '/') continue;
        char c = *s;
        *s = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && (errno != EEXIST || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
            fprintf(stderr, "make_imagefolder: cannot create %s: %s\n", p,
                    errno == EEXIST ? "not a directory" : strerror(errno));
            return 1;
        }
        *s = c;
        if (!c) return 0;
    }
}

/* Reads <dir>/<stem>[.gz] of Fashion-MNIST. */
static int read_idx(cx_idx_array *out, const char *stem)
{
    const char *dir = getenv("CX_FASHION_MNIST_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.gz", dir && *dir ? dir : CX_FASHION_MNIST_DIR, stem);
    struct stat st;
    if (stat(path, &st) != 0) path[strlen(path) - 3] = 0;
    if (cx_idx_read(path, out) == CX_OK) return 0;
    fprintf(stderr, "make_imagefolder: %s (Debian's dataset-fashion-mnist provides it)\n", cx_last_error());
    return 1;
}

/* One image: gray 28x28 scaled to S x S, as gray or (p, p, 255 - p). */
static void make_pixels(uint8_t *px, const uint8_t *src, int S, int c)
{
    for (int y = 0; y < S; y++)
        for (int x = 0; x < S; x++) {
            uint8_t p = src[(y * 28 / S) * 28 + x * 28 / S];
            uint8_t *o = px + ((size_t)y * (size_t)S + (size_t)x) * (size_t)c;
            o[0] = p;
            if (c == 3) o[1] = p, o[2] = (uint8_t)(255 - p);
        }
}

/* Encodes image i (gray/RGB, JPEG/PNG by i % 4). @return 0 or 1 (told). */
static int encode(uint8_t **buf, size_t *len, const char **ext, const uint8_t *src, long i, int S)
{
    int c = i % 2 ? 3 : 1;
    bool jpeg = i % 4 < 2;
    uint8_t *px = malloc((size_t)S * (size_t)S * 3);
    char err[256];
    if (!px) { fprintf(stderr, "make_imagefolder: out of memory\n"); return 1; }
    make_pixels(px, src, S, c);
    int r = jpeg ? imgw_jpeg(buf, len, px, S, S, c, 95, false, err, sizeof err) : imgw_png(buf, len, px, S, S, c, err, sizeof err);
    free(px);
    *ext = jpeg ? "jpg" : "png";
    if (r) fprintf(stderr, "make_imagefolder: image %ld: %s\n", i, err);
    return r ? 1 : 0;
}

/* Bad file k of class directory dir, <dir>/<i>_bad.<ext> (i: the good
 * image src (28x28) it comes from, encoded at S x S), of kind k % 4: 0 the
 * first half of a JPEG, 1 of a PNG, 2 512 bytes of noise named .jpg, 3 an
 * empty .png. @return 0 or 1 (told). */
static int write_bad(const char *dir, long i, long k, const uint8_t *src, int S)
{
    uint8_t *buf = NULL, junk[512];
    size_t len = 0;
    const char *ext;
    char path[4200], err[300];
    long kind = k % 4;
    if (kind < 2 && encode(&buf, &len, &ext, src, kind == 0 ? 0 : 2, S)) return 1;
    if (kind == 2) {
        uint32_t s = (uint32_t)(k * 2654435761u + 1);
        for (size_t j = 0; j < sizeof junk; j++) junk[j] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    }
    const uint8_t *data = kind < 2 ? buf : junk;
    size_t n = kind < 2 ? len / 2 : kind == 2 ? sizeof junk : 0;
    snprintf(path, sizeof path, "%s/%05ld_bad.%s", dir, i, kind == 0 || kind == 2 ? "jpg" : "png");
    int r = imgw_save(path, data, n, err, sizeof err);
    free(buf);
    if (r) fprintf(stderr, "make_imagefolder: %s\n", err);
    return r;
}

static int write_split(const char *root, const char *split, const char *stem, long n, long corrupt, int S)
{
    char dir[4096], path[4200], err[300];
    cx_idx_array img, lab;
    char istem[64], lstem[64];
    snprintf(istem, sizeof istem, "%s-images-idx3-ubyte", stem);
    snprintf(lstem, sizeof lstem, "%s-labels-idx1-ubyte", stem);
    if (read_idx(&img, istem)) return 1;
    if (read_idx(&lab, lstem)) { cx_idx_array_release(&img); return 1; }
    int rc = 0;
    if (n > img.dims[0]) {
        fprintf(stderr, "make_imagefolder: %s has only %lld images\n", stem, (long long)img.dims[0]);
        rc = 1;
    }
    /* mkdirs makes root/split with its first class */
    for (int c = 0; !rc && c < 10; c++) {
        snprintf(dir, sizeof dir, "%s/%s/class%d", root, split, c);
        rc = mkdirs(dir);
    }
    for (long i = 0; !rc && i < n + corrupt; i++) {
        long s = i < n ? i : i - n;   /* a bad file's content comes from a good image */
        const uint8_t *src = img.data + (size_t)s * 28 * 28;
        snprintf(dir, sizeof dir, "%s/%s/class%d", root, split, lab.data[s]);
        if (i >= n) { rc = write_bad(dir, s, i - n, src, S); continue; }
        uint8_t *buf;
        size_t len;
        const char *ext;
        if ((rc = encode(&buf, &len, &ext, src, i, S))) break;
        snprintf(path, sizeof path, "%s/%05ld.%s", dir, i, ext);
        if ((rc = imgw_save(path, buf, len, err, sizeof err))) fprintf(stderr, "make_imagefolder: %s\n", err);
        free(buf);
    }
    cx_idx_array_release(&img);
    cx_idx_array_release(&lab);
    return rc;
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;   /* -1: --help printed */
    if (mkdirs(a.root)) return 1;
    if (write_split(a.root, "train", "train", a.train, a.corrupt, (int)a.size)) return 1;
    if (write_split(a.root, "val", "t10k", a.val, 0, (int)a.size)) return 1;
    printf("make_imagefolder: %s: %ld train + %ld val images of %ldx%ld (JPEG and PNG, gray and RGB), %ld bad files\n",
           a.root, a.train, a.val, a.size, a.size, a.corrupt);
    return 0;
}
