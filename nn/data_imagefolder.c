/* torchvision's ImageFolder with the ImageNet transforms (data.h says what
 * it does). Listing: classes = sorted subdirectories; each class's files
 * are walked as sorted(os.walk(class_dir)) does (directory by directory in
 * sorted order, files sorted within each), keeping the regular files
 * named .jpg/.jpeg/.png. Names come from the folder, so every message that
 * may hold one is escaped (escape()) before it reaches a terminal. */
#include "nn_internal.h"

#include "cx_log.h"
#include "cx_struct.h"
#include "data_image.h"
#include "data_internal.h"

#include <cxla/data.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 32   /* subdirectories within a class */
/* Files above this are refused unread: a file is held whole while it is
 * decoded, by every worker at once. */
#define MAX_FILE_MB 256
#define MAX_LINE 1280  /* a message before escaping (err[1024] and a prefix) */

typedef struct {
    cx_imagefolder_opts o;
    char *root;
    int nclasses;
    char **classes;
    int64_t n, cap;
    char **paths;
    int32_t *labels;
    atomic_uchar *bad;        /* (n) known bad files (skip mode) */
    atomic_llong skipped;
    int64_t epoch;            /* written only while no item is read */
    float lut[3][256];        /* per channel: (p / 255 - mean) / std */
} folder;

static void folder_free(void *ctx)
{
    folder *F = ctx;
    if (!F) return;
    for (int c = 0; c < F->nclasses; c++) free(F->classes[c]);
    for (int64_t i = 0; i < F->n; i++) free(F->paths[i]);
    free(F->classes);
    free(F->paths);
    free(F->labels);
    free(F->bad);
    free(F->root);
    free(F);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The length of the UTF-8 character at s if it is valid and printable
 * (not a C1 control, U+0080..U+009F), else 0. */
static int utf8_printable(const unsigned char *s)
{
    int n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return n == 2 && s[0] == 0xc2 && s[1] < 0xa0 ? 0 : n;
}

/* src into dst (n > 0, truncated to fit) with the bytes that could drive
 * a terminal (C0 and C1 controls, DEL, invalid UTF-8) and backslash as
 * \xNN: a file may be named with an ESC. dst needs 4x src's length. */
static void escape(char *dst, size_t n, const char *src)
{
    size_t o = 0;
    for (const unsigned char *s = (const unsigned char *)src; *s;) {
        int k = *s >= 0x80 ? utf8_printable(s) : *s >= 0x20 && *s != 0x7f && *s != '\\';
        if (k == 0) k = -1;
        size_t need = k > 0 ? (size_t)k : 4;
        if (o + need >= n) break;
        if (k > 0) memcpy(dst + o, s, need);
        else snprintf(dst + o, 5, "\\x%02x", *s);
        o += need, s += k > 0 ? k : 1;
    }
    dst[o] = 0;
}

/* The formatted line into `line` (4 * MAX_LINE bytes), escaped. */
__attribute__((format(printf, 2, 0))) static void format_escaped(char *line, const char *fmt, va_list ap)
{
    char raw[MAX_LINE];
    vsnprintf(raw, sizeof raw, fmt, ap);
    escape(line, 4 * MAX_LINE, raw);
}

/* cx_set_last_error of the line, escaped. */
__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    char line[4 * MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    format_escaped(line, fmt, ap);
    va_end(ap);
    cx_set_last_error("%s", line);
}

/* A warning of the line, escaped. */
__attribute__((format(printf, 1, 2))) static void warn(const char *fmt, ...)
{
    char line[4 * MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    format_escaped(line, fmt, ap);
    va_end(ap);
    cx_logf(CX_LOG_WARNING, "data", "%s", line);
}

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
         : S_ISDIR(m) ? "a directory" : "not a regular file";
}

static bool is_image_name(const char *name)
{
    static const char *const exts[] = { ".jpg", ".jpeg", ".png" };
    size_t n = strlen(name);
    for (size_t e = 0; e < sizeof exts / sizeof *exts; e++) {
        size_t k = strlen(exts[e]);
        if (n < k) continue;
        bool same = true;
        for (size_t i = 0; i < k && same; i++) same = tolower((unsigned char)name[n - k + i]) == exts[e][i];
        if (same) return true;
    }
    return false;
}

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) { memcpy(p, dir, a); p[a] = '/'; memcpy(p + a + 1, name, b + 1); }
    return p;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether the entry p (named `name`) is a subdirectory (symlinks followed),
 * an image (a regular file with an image's name) or neither. An image's
 * name on anything else (a FIFO, socket or device, a dangling link) is
 * warned about and left out, as torchvision's is_file leaves it: reading
 * a FIFO would block. */
static void classify(const char *p, const char *name, bool *sub, bool *img)
{
    struct stat st;
    bool found = stat(p, &st) == 0;
    *sub = found && S_ISDIR(st.st_mode);
    *img = !*sub && is_image_name(name);
    if (*img && !found) warn("imagefolder: ignoring %s: %s", p, strerror(errno));
    else if (*img && !S_ISREG(st.st_mode))
        warn("imagefolder: ignoring %s: %s, not a regular file", p, kind_of(st.st_mode));
    *img = *img && found && S_ISREG(st.st_mode);
}

/* The entries of dir, sorted, split into subdirectories and image files
 * (both malloc'ed arrays of malloc'ed full paths). @return CX_OK,
 * CX_ERR_IO (unreadable, named), CX_ERR_OOM. */
static cx_status list_dir(const char *dir, char ***dirs, int64_t *nd, char ***files, int64_t *nf)
{
    *dirs = *files = NULL;
    *nd = *nf = 0;
    DIR *d = opendir(dir);
    if (!d) {
        fail("imagefolder: %s: %s", dir, strerror(errno));
        return CX_ERR_IO;
    }
    int64_t capd = 0, capf = 0;
    cx_status st = CX_OK;
    for (struct dirent *e; st == CX_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        char *p = join(dir, e->d_name);
        bool sub = false, img = false;
        if (p) classify(p, e->d_name, &sub, &img);
        char ***arr = sub ? dirs : files;
        int64_t *n = sub ? nd : nf, *cap = sub ? &capd : &capf;
        if (p && (sub || img) && *n == *cap) {
            char **g = realloc(*arr, (size_t)(*cap = *cap ? 2 * *cap : 16) * sizeof *g);
            if (g) *arr = g; else { free(p); p = NULL; }
        }
        if (!p) { st = CX_ERR_OOM; fail("imagefolder: out of memory listing %s", dir); break; }
        if (sub || img) (*arr)[(*n)++] = p; else free(p);
    }
    closedir(d);
    if (*dirs) qsort(*dirs, (size_t)*nd, sizeof **dirs, cmp_str);
    if (*files) qsort(*files, (size_t)*nf, sizeof **files, cmp_str);
    return st;
}

static void free_list(char **a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) free(a[i]);
    free(a);
}

/* The directories (device, inode) a class's walk must not enter again:
 * root, the class directories, and those walked in the class so far. */
typedef struct {
    struct { dev_t dev; ino_t ino; } *v;
    int64_t n, cap;
} dir_set;

/* Adds dir's identity to s. @return CX_OK, CX_ERR_IO when dir cannot be
 * stat'ed or is already in s (a symlink loop: *seen), CX_ERR_OOM. */
static cx_status dir_set_add(dir_set *s, const char *dir, bool *seen)
{
    struct stat st;
    *seen = false;
    if (stat(dir, &st) != 0) { fail("imagefolder: %s: %s", dir, strerror(errno)); return CX_ERR_IO; }
    for (int64_t i = 0; i < s->n; i++)
        if (s->v[i].dev == st.st_dev && s->v[i].ino == st.st_ino) { *seen = true; return CX_ERR_IO; }
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        void *v = realloc(s->v, (size_t)cap * sizeof *s->v);
        if (!v) { fail("imagefolder: out of memory listing %s", dir); return CX_ERR_OOM; }
        s->v = v, s->cap = cap;
    }
    s->v[s->n].dev = st.st_dev, s->v[s->n++].ino = st.st_ino;
    return CX_OK;
}

/* Appends the images under dir (files first, then each subdirectory), label
 * c; a subdirectory already walked (a symlink loop, or a link to root or a
 * class) is warned about and skipped, so every image counts once. */
static cx_status walk_class(folder *F, dir_set *walked, const char *dir, int32_t c, int depth)
{
    char **dirs, **files;
    int64_t nd, nf;
    cx_status st = list_dir(dir, &dirs, &nd, &files, &nf);
    for (int64_t i = 0; st == CX_OK && i < nf; i++) {
        if (F->n == F->cap) {
            int64_t cap = F->cap ? 2 * F->cap : 1024;
            char **p = realloc(F->paths, (size_t)cap * sizeof *p);
            if (p) F->paths = p;
            int32_t *l = p ? realloc(F->labels, (size_t)cap * sizeof *l) : NULL;
            if (l) F->labels = l;
            if (!p || !l) { st = CX_ERR_OOM; fail("imagefolder: out of memory listing %s", dir); break; }
            F->cap = cap;
        }
        F->paths[F->n] = files[i];
        F->labels[F->n++] = c;
        files[i] = NULL;
    }
    for (int64_t i = 0; st == CX_OK && depth < MAX_DEPTH && i < nd; i++) {
        bool seen;
        st = dir_set_add(walked, dirs[i], &seen);
        if (seen) warn("imagefolder: skipping %s: a directory already walked (a symlink loop?)", dirs[i]);
        if (st == CX_OK) st = walk_class(F, walked, dirs[i], c, depth + 1);
        else if (seen) st = CX_OK;
    }
    free_list(dirs, nd);
    free_list(files, nf);
    return st;
}

static cx_status list_folder(folder *F)
{
    char **dirs, **files;
    int64_t nd, nf;
    cx_status st = list_dir(F->root, &dirs, &nd, &files, &nf);
    free_list(files, nf);
    if (st != CX_OK) { free_list(dirs, nd); return st; }
    if (nd == 0 || nd > INT32_MAX) {
        free_list(dirs, nd);
        fail("imagefolder: %s has no class directory (want %s/<class>/<image>.jpg|png)", F->root, F->root);
        return CX_ERR_IO;
    }
    F->classes = calloc((size_t)nd, sizeof *F->classes);
    if (!F->classes) { free_list(dirs, nd); cx_set_last_error("imagefolder: out of memory"); return CX_ERR_OOM; }
    F->nclasses = (int)nd;
    dir_set walked = { 0 };
    for (int64_t c = -1; st == CX_OK && c < nd; c++) {
        bool seen;
        st = dir_set_add(&walked, c < 0 ? F->root : dirs[c], &seen);
        if (seen) st = CX_OK;   /* two class names for one directory: both are classes, as in torchvision */
    }
    int64_t tops = walked.n;
    for (int64_t c = 0; st == CX_OK && c < nd; c++) {
        int64_t before = F->n;
        walked.n = tops;
        F->classes[c] = strdup(dirs[c] + strlen(F->root) + 1);
        if (!F->classes[c]) { st = CX_ERR_OOM; cx_set_last_error("imagefolder: out of memory"); break; }
        st = walk_class(F, &walked, dirs[c], (int32_t)c, 0);
        if (st == CX_OK && F->n == before) {
            fail("imagefolder: class directory %s holds no image (.jpg, .jpeg or .png)", dirs[c]);
            st = CX_ERR_IO;
        }
    }
    free(walked.v);
    free_list(dirs, nd);
    return st;
}

/* ---- one item ------------------------------------------------------------ */

/* The draws of one item: a counter-based stream keyed by (seed, epoch, index). */
typedef struct {
    uint64_t s;
} draws;

static draws draws_for(uint64_t seed, int64_t epoch, int64_t index)
{
    uint64_t s = seed;
    uint64_t a = cx_splitmix64(&s) ^ (uint64_t)epoch;
    uint64_t b = cx_splitmix64(&a) ^ (uint64_t)index;
    return (draws){ cx_splitmix64(&b) };
}

static double uniform(draws *d, double lo, double hi)
{
    return lo + (hi - lo) * (double)(cx_splitmix64(&d->s) >> 11) * 0x1p-53;
}

/* An integer in [0, n). */
static int below(draws *d, int n) { return (int)((cx_splitmix64(&d->s) >> 11) % (uint64_t)n); }

typedef struct {
    int i, j, h, w;     /* the crop, in the image's own pixels */
} crop;

/* torchvision's RandomResizedCrop.get_params (scale (0.08, 1), ratio (3/4, 4/3)). */
static crop random_resized_crop(draws *d, int width, int height)
{
    double area = (double)width * height, lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
    for (int t = 0; t < 10; t++) {
        double target = area * uniform(d, 0.08, 1.0), ar = exp(uniform(d, lr0, lr1));
        int w = (int)nearbyint(sqrt(target * ar)), h = (int)nearbyint(sqrt(target / ar));
        if (0 < w && w <= width && 0 < h && h <= height) {
            int i = below(d, height - h + 1), j = below(d, width - w + 1);
            return (crop){ i, j, h, w };
        }
    }
    double in_ratio = (double)width / height;
    int w = width, h = height;
    if (in_ratio < 3.0 / 4.0) h = (int)nearbyint(w / (3.0 / 4.0));
    else if (in_ratio > 4.0 / 3.0) w = (int)nearbyint(h * (4.0 / 3.0));
    return (crop){ (height - h) / 2, (width - w) / 2, h, w };
}

typedef struct {
    const folder *F;
    draws d;
    crop c;             /* train: the crop */
    int rw, rh;         /* eval: the resized size */
} plan;

/* Eval's Resize(resize_size): the shorter side to it, the longer scaled
 * (truncated, as torchvision does). */
static void eval_size(const folder *F, int w, int h, int *rw, int *rh)
{
    int r = F->o.resize_size;
    if (w <= h) *rw = r, *rh = (int)((int64_t)r * h / w);
    else *rh = r, *rw = (int)((int64_t)r * w / h);
}

/* The crop's pixels in an image decoded at sw x sh from fw x fh: the whole
 * pixels it touches [r0, r1) and the exact box b within them (x then y). */
static void crop_in(const crop *c, int fw, int fh, int sw, int sh, int r[4], double b[4])
{
    double sx = (double)sw / fw, sy = (double)sh / fh;
    double x0 = c->j * sx, y0 = c->i * sy, x1 = (c->j + c->w) * sx, y1 = (c->i + c->h) * sy;
    r[0] = (int)floor(x0), r[1] = (int)floor(y0), r[2] = (int)ceil(x1), r[3] = (int)ceil(y1);
    if (r[2] > sw) r[2] = sw;
    if (r[3] > sh) r[3] = sh;
    b[0] = x0 - r[0], b[1] = y0 - r[1], b[2] = x1 - r[0], b[3] = y1 - r[1];
}

/* Draws the crop (train) or sizes the resize (eval) from the full size.
 * With jpeg_fast, a JPEG is decoded at the largest DCT scale that keeps at
 * least S (train) or the resized size (eval) per side, and for training
 * only the crop's pixels. */
static void pick_scale(void *user, int w, int h, cx_decode_plan *pl)
{
    plan *p = user;
    int need_w, need_h, have_w, have_h, S = p->F->o.image_size;
    if (p->F->o.train) {
        p->c = random_resized_crop(&p->d, w, h);
        need_w = need_h = S, have_w = p->c.w, have_h = p->c.h;
    } else {
        eval_size(p->F, w, h, &p->rw, &p->rh);
        need_w = p->rw, need_h = p->rh, have_w = w, have_h = h;
    }
    if (!p->F->o.jpeg_fast) return;
    int k = 1;
    while (k < 8 && have_w / (2 * k) >= need_w && have_h / (2 * k) >= need_h) k *= 2;
    pl->denom = k;
    if (!p->F->o.train) return;
    double b[4];
    int r[4];
    crop_in(&p->c, w, h, (w + k - 1) / k, (h + k - 1) / k, r, b);   /* libjpeg's scaled size rounds up */
    pl->x0 = r[0], pl->y0 = r[1], pl->x1 = r[2], pl->y1 = r[3];
}

/* (3, S, S) = (p / 255 - mean) / std of the RGB8 (S, S, 3) in f32, as
 * ToTensor + Normalize compute it (through the folder's table of the 256
 * values per channel); flipped horizontally if asked. */
static void to_tensor(float *out, const cx_rgb8 *im, const float (*lut)[256], bool flip)
{
    int S = im->w;
    for (int c = 0; c < 3; c++) {
        for (int y = 0; y < S; y++) {
            const uint8_t *row = im->px + (size_t)y * (size_t)S * 3 + c;
            float *dst = out + ((size_t)c * (size_t)S + (size_t)y) * (size_t)S;
            if (flip) for (int x = 0; x < S; x++) dst[x] = lut[c][row[(S - 1 - x) * 3]];
            else for (int x = 0; x < S; x++) dst[x] = lut[c][row[x * 3]];
        }
    }
}

/* Resamples the decoded image (full size fw x fh; im the part decoded,
 * at its scale) into the S x S output. */
static cx_status transform(cx_rgb8 *outpx, const plan *p, const cx_rgb8 *im, int fw, int fh)
{
    int S = p->F->o.image_size;
    if (!p->F->o.train) {
        cx_resample_src s = { im, 0, 0, im->w, im->h, 0, 0, im->w, im->h };
        int top = (int)nearbyint((p->rh - S) / 2.0), left = (int)nearbyint((p->rw - S) / 2.0);
        return cx_resample(outpx, &s, p->rw, p->rh, left, top);
    }
    double b[4];
    int r[4];
    crop_in(&p->c, fw, fh, im->full_w, im->full_h, r, b);
    cx_resample_src s = { im, r[0] - im->ox, r[1] - im->oy, r[2] - r[0], r[3] - r[1], b[0], b[1], b[2], b[3] };
    return cx_resample(outpx, &s, S, S, 0, 0);
}

/* Reads up to n bytes of fd into buf (fewer at the end of the file).
 * @return the count, or -1 (errno). */
static ssize_t read_upto(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* The open file: a regular file (not one swapped for a FIFO or device
 * since the listing: reading it would block) within the size limit.
 * @return CX_OK or CX_ERR_IO (err names it). */
static cx_status check_file(const struct stat *st, const char *path, char *err, size_t errn)
{
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, errn, "%s: %s, not a regular file", path, kind_of(st->st_mode));
        return CX_ERR_IO;
    }
    if (st->st_size > (off_t)MAX_FILE_MB << 20) {
        snprintf(err, errn, "%s: %lld bytes, above the %d MB limit for an image file", path, (long long)st->st_size,
                 MAX_FILE_MB);
        return CX_ERR_IO;
    }
    return CX_OK;
}

/* Reads a whole image file: checked first (regular, size, signature), so
 * neither a FIFO nor a huge non-image file is read.
 * @return CX_OK, CX_ERR_IO (err names it), CX_ERR_OOM. */
static cx_status read_file(const char *path, uint8_t **data, size_t *size, char *err, size_t errn)
{
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errn, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return CX_ERR_IO;
    }
    uint8_t head[8];
    ssize_t nh = 0;
    cx_status s = check_file(&st, path, err, errn);
    if (s == CX_OK && (nh = read_upto(fd, head, sizeof head)) < 0) s = CX_ERR_IO;
    if (s == CX_OK) s = cx_image_sniff(head, (size_t)nh, (int64_t)st.st_size, path, err, errn);
    size_t want = st.st_size > nh ? (size_t)st.st_size : (size_t)nh;
    if (s == CX_OK && !(*data = malloc(want))) {
        snprintf(err, errn, "%s: out of memory for %zu bytes", path, want);
        s = CX_ERR_OOM;
    }
    ssize_t nr = 0;
    if (s == CX_OK && (nr = read_upto(fd, *data + nh, want - (size_t)nh)) < 0) s = CX_ERR_IO;
    if (s == CX_ERR_IO && (nh < 0 || nr < 0)) snprintf(err, errn, "%s: read error: %s", path, strerror(errno));
    close(fd);
    if (s != CX_OK) { free(*data); *data = NULL; return s; }
    memcpy(*data, head, (size_t)nh);
    *size = (size_t)nh + (size_t)nr;
    return CX_OK;
}

/* Sample `j` transformed with the draws of item `index` into out (3, S, S);
 * the flip draw follows the crop's. */
static cx_status load_item(const folder *F, int64_t j, int64_t index, float *out, char *err, size_t errn)
{
    uint8_t *data;
    size_t size;
    cx_status st = read_file(F->paths[j], &data, &size, err, errn);
    if (st != CX_OK) return st;
    plan p = { .F = F, .d = draws_for(F->o.seed, F->epoch, index) };
    cx_rgb8 im;
    int fw = 0, fh = 0;
    st = cx_image_decode(&im, &fw, &fh, data, size, F->paths[j], pick_scale, &p, err, errn);
    free(data);
    if (st != CX_OK) return st;
    int S = F->o.image_size;
    cx_rgb8 small = { malloc((size_t)S * (size_t)S * 3), S, S, 0, 0, S, S };
    st = small.px ? transform(&small, &p, &im, fw, fh) : CX_ERR_OOM;
    if (st == CX_OK) to_tensor(out, &small, F->lut, F->o.train && uniform(&p.d, 0, 1) < 0.5);
    else snprintf(err, errn, "%s: out of memory transforming a %dx%d image", F->paths[j], im.w, im.h);
    free(small.px);
    free(im.px);
    return st;
}

/* ---- the data set ---------------------------------------------------------- */

/* Item `index`, or in skip mode the first sample from it on (wrapping) that
 * decodes; a bad file is told once, when first found. */
static cx_status folder_get(void *ctx, int64_t index, void *const *item)
{
    folder *F = ctx;
    bool skip = F->o.on_error == CX_IMAGE_ERRORS_SKIP;
    for (int64_t k = 0; k < F->n; k++) {
        int64_t j = (index + k) % F->n;
        if (skip && atomic_load(&F->bad[j])) continue;
        char err[1024];
        cx_status st = load_item(F, j, index, item[0], err, sizeof err);
        if (st == CX_OK) {
            *(int64_t *)item[1] = F->labels[j];
            return CX_OK;
        }
        if (!skip || st != CX_ERR_IO) {
            fail("imagefolder: %s", err);
            return st;
        }
        if (!atomic_exchange(&F->bad[j], 1)) {
            atomic_fetch_add(&F->skipped, 1);
            warn("imagefolder: skipping %s", err);
        }
    }
    fail("imagefolder: %s: none of its %lld images decodes", F->root, (long long)F->n);
    return CX_ERR_IO;
}

static void folder_set_epoch(void *ctx, int64_t epoch) { ((folder *)ctx)->epoch = epoch; }

static cx_status check_opts(const cx_imagefolder_opts *o)
{
    const char *bad = !o->root ? "root is NULL"
                    : o->image_size < 1 || o->image_size > 8192 ? "image_size outside 1..8192"
                    : !o->train && (o->resize_size < o->image_size || o->resize_size > 65536)
                        ? "resize_size below image_size or above 65536"
                    : (unsigned)o->on_error > CX_IMAGE_ERRORS_SKIP ? "on_error is neither STOP nor SKIP"
                    : NULL;
    for (int c = 0; !bad && c < 3; c++)
        if (!(o->std[c] > 0) || !isfinite(o->mean[c])) bad = "std must be > 0 and mean finite";
    if (!bad) return CX_OK;
    cx_set_last_error("cx_imagefolder_open: %s (image_size %d, resize_size %d)", bad, o->image_size, o->resize_size);
    return CX_ERR_ARG;
}

cx_status cx_imagefolder_open(cx_imagefolder_opts given, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_imagefolder_open: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    if (!CX_TAKE_STRUCT("cx_imagefolder_open", cx_imagefolder_opts, o, &given, jpeg_fast)) return CX_ERR_ARG;
    if (o.resize_size == 0) o.resize_size = (int)((int64_t)o.image_size * 256 / 224);
    cx_status st = check_opts(&o);
    if (st != CX_OK) return st;
    folder *F = calloc(1, sizeof *F);
    if (F) F->root = strdup(o.root);
    if (!F || !F->root) { folder_free(F); cx_set_last_error("cx_imagefolder_open: out of memory"); return CX_ERR_OOM; }
    size_t len = strlen(F->root);
    while (len > 1 && F->root[len - 1] == '/') F->root[--len] = 0;
    F->o = o;
    F->o.root = F->root;
    for (int c = 0; c < 3; c++) cx_normalize_lut(F->lut[c], o.mean[c], o.std[c]);
    if (!is_dir(F->root)) {
        fail("imagefolder: %s: %s", F->root, errno == ENOENT ? "no such directory" : "not a readable directory");
        folder_free(F);
        return CX_ERR_IO;
    }
    if ((st = list_folder(F)) != CX_OK) { folder_free(F); return st; }
    if (!(F->bad = calloc((size_t)F->n, sizeof *F->bad))) {
        folder_free(F);
        cx_set_last_error("cx_imagefolder_open: out of memory");
        return CX_ERR_OOM;
    }
    int S = o.image_size;
    cx_field fields[2] = { { CX_FIELD_IMAGES, CX_F32, 3, { 3, S, S } }, { CX_FIELD_LABELS, CX_I64, 0, { 0 } } };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = F->n, .nfields = 2, .fields = fields,
                          .get = folder_get, .set_epoch = folder_set_epoch, .free = folder_free, .ctx = F,
                          .concurrent = true };
    *out = cx_dataset_new(&d);
    return *out ? CX_OK : CX_ERR_OOM;
}

static const folder *folder_of(const cx_dataset *ds) { return cx_dataset_ctx_of(ds, folder_get); }

int cx_imagefolder_num_classes(const cx_dataset *ds)
{
    const folder *F = folder_of(ds);
    return F ? F->nclasses : 0;
}

const char *cx_imagefolder_class_name(const cx_dataset *ds, int c)
{
    const folder *F = folder_of(ds);
    return F && c >= 0 && c < F->nclasses ? F->classes[c] : NULL;
}

const char *cx_imagefolder_path(const cx_dataset *ds, int64_t i)
{
    const folder *F = folder_of(ds);
    return F && i >= 0 && i < F->n ? F->paths[i] : NULL;
}

int64_t cx_imagefolder_skipped(const cx_dataset *ds)
{
    folder *F = (folder *)folder_of(ds);
    return F ? (int64_t)atomic_load(&F->skipped) : 0;
}
