/* Text data sets: a corpus of tokens, memory-mapped, cut into windows of
 * block + 1 tokens ("x" the first block, "y" the last block). See data.h
 * for the window scheme. */
#include "nn_internal.h"

#include "cx_struct.h"

#include <cxla/data.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;
    const uint8_t *map;      /* the whole file */
    size_t map_bytes;
    cx_text_format format;
    int64_t first, len;      /* the split: tokens [first, first + len) */
    int64_t block, vocab;
    uint64_t seed;
    int64_t eval_windows;
    int64_t nwin;            /* items */
    int64_t stride;          /* between window starts */
    int64_t phase;           /* this epoch's first start (training windows) */
} text;

static void text_free(void *ctx)
{
    text *t = ctx;
    if (!t) return;
    if (t->map && t->map_bytes) munmap((void *)t->map, t->map_bytes);
    free(t->path);
    free(t);
}

static int64_t token_at(const text *t, int64_t i)
{
    int64_t k = t->first + i;
    if (t->format == CX_TEXT_BYTES) return t->map[k];
    return (int64_t)t->map[2 * k] | ((int64_t)t->map[2 * k + 1] << 8);   /* little-endian */
}

/* item[0]: x (block) i64, item[1]: y (block) i64 */
static cx_status text_get(void *ctx, int64_t index, void *const *item)
{
    const text *t = ctx;
    int64_t start = t->phase + index * t->stride, *x = item[0], *y = item[1];
    for (int64_t j = 0; j <= t->block; j++) {
        int64_t tok = token_at(t, start + j);
        if (tok >= t->vocab) {
            cx_set_last_error("%s: token %lld at position %lld is not below the vocab size %lld", t->path,
                              (long long)tok, (long long)(t->first + start + j), (long long)t->vocab);
            return CX_ERR_IO;
        }
        if (j < t->block) x[j] = tok;
        if (j > 0) y[j - 1] = tok;
    }
    return CX_OK;
}

/* Training windows move with the epoch: a new phase, from (seed, epoch). */
static void text_set_epoch(void *ctx, int64_t epoch)
{
    text *t = ctx;
    if (t->eval_windows > 0) return;
    int64_t room = t->len - t->nwin * t->stride;   /* phases 0..room keep every window inside */
    uint64_t s = t->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(epoch + 1));
    t->phase = (int64_t)(cx_splitmix64(&s) % (uint64_t)(room + 1));
}

static cx_status check_opts(const cx_text_opts *o)
{
    int64_t max_vocab = o->format == CX_TEXT_U16 ? 65536 : 256;
    if (!o->path || (o->format != CX_TEXT_BYTES && o->format != CX_TEXT_U16) || o->block < 1 ||
        o->vocab_size < 0 || o->vocab_size > max_vocab || o->eval_windows < 0 ||
        (o->format == CX_TEXT_BYTES && !(o->train_fraction > 0 && o->train_fraction < 1))) {
        cx_set_last_error("cx_text_open: bad options: path %s, format %d, block %lld, vocab %lld (at most %lld), "
                          "train_fraction %g (in (0, 1)), eval_windows %lld", o->path ? o->path : "NULL",
                          (int)o->format, (long long)o->block, (long long)o->vocab_size, (long long)max_vocab,
                          o->train_fraction, (long long)o->eval_windows);
        return CX_ERR_ARG;
    }
    return CX_OK;
}

/* Maps the file. @return CX_OK or CX_ERR_IO naming it. */
static cx_status map_file(text *t)
{
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        cx_set_last_error("text data set: cannot open %s: %s", t->path, strerror(errno));
        if (fd >= 0) close(fd);
        return CX_ERR_IO;
    }
    t->map_bytes = (size_t)st.st_size;
    if (t->map_bytes > 0) {
        void *m = mmap(NULL, t->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            cx_set_last_error("text data set: cannot map %s: %s", t->path, strerror(errno));
            t->map_bytes = 0;
            close(fd);
            return CX_ERR_IO;
        }
        t->map = m;
    }
    close(fd);
    return CX_OK;
}

/* The split and the windows over it. @return CX_OK or CX_ERR_IO naming the file. */
static cx_status plan_windows(text *t, const cx_text_opts *o)
{
    int64_t total = (int64_t)t->map_bytes;
    if (o->format == CX_TEXT_U16) {
        if (total % 2) {
            cx_set_last_error("text data set: %s has %lld bytes, not a whole number of uint16 tokens", t->path,
                              (long long)total);
            return CX_ERR_IO;
        }
        t->first = 0;
        t->len = total / 2;
    } else {
        int64_t cut = (int64_t)((double)total * o->train_fraction);
        t->first = o->val ? cut : 0;
        t->len = o->val ? total - cut : cut;
    }
    const char *split = o->format == CX_TEXT_U16 ? "file" : o->val ? "val split" : "train split";
    if (t->len < t->block + 1) {
        cx_set_last_error("text data set: the %s of %s has %lld tokens, fewer than one window of block + 1 = %lld",
                          split, t->path, (long long)t->len, (long long)(t->block + 1));
        return CX_ERR_IO;
    }
    if (o->eval_windows > 0) {
        int64_t span = t->len - t->block - 1;
        if (o->eval_windows > 1 && o->eval_windows > span) {
            cx_set_last_error("text data set: %lld evaluation windows of %lld tokens do not fit the %lld tokens of the "
                              "%s of %s", (long long)o->eval_windows, (long long)(t->block + 1), (long long)t->len,
                              split, t->path);
            return CX_ERR_IO;
        }
        t->nwin = o->eval_windows;
        t->stride = span / o->eval_windows;
        t->phase = 0;
    } else {
        int64_t n = (t->len - t->block) / (t->block + 1);
        t->nwin = n > 0 ? n : 1;
        t->stride = t->block + 1;
    }
    return CX_OK;
}

cx_status cx_text_open(cx_text_opts given, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_text_open: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    cx_text_opts o = cx_text_default_opts();
    if (!CX_TAKE_STRUCT("cx_text_open", cx_text_opts, o, &given, eval_windows)) return CX_ERR_ARG;
    cx_status st = check_opts(&o);
    if (st != CX_OK) return st;
    text *t = calloc(1, sizeof *t);
    if (t) t->path = strdup(o.path);
    if (!t || !t->path) {
        text_free(t);
        cx_set_last_error("cx_text_open: out of memory");
        return CX_ERR_OOM;
    }
    t->format = o.format;
    t->block = o.block;
    t->vocab = o.vocab_size ? o.vocab_size : (o.format == CX_TEXT_U16 ? 65536 : 256);
    t->seed = o.seed;
    t->eval_windows = o.eval_windows;
    if ((st = map_file(t)) != CX_OK || (st = plan_windows(t, &o)) != CX_OK) {
        text_free(t);
        return st;
    }
    text_set_epoch(t, 0);
    cx_field fields[2] = {
        { .name = CX_FIELD_X, .dtype = CX_I64, .ndim = 1, .shape = { t->block } },
        { .name = CX_FIELD_Y, .dtype = CX_I64, .ndim = 1, .shape = { t->block } },
    };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = t->nwin, .nfields = 2, .fields = fields, .get = text_get,
                          .set_epoch = text_set_epoch, .free = text_free, .ctx = t };
    *out = cx_dataset_new(&d);
    return *out ? CX_OK : CX_ERR_OOM;
}
