/* Reading tensors of an open checkpoint: any element range of an entry,
 * taken from whichever rank files hold it, with the checksums of the
 * file's format version checked on the way. Whole-file checks are the
 * opener's (ckpt_source.c) and an SPMD entry's pieces are
 * ckpt_spmd_read.c's; this file calls both and neither calls it. */
#include "ckpt_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cx_assert.h"

/* Hashes the pieces of a dataset on a second thread while the next piece
 * is read, so the checksum costs no time beyond the read itself. Only the
 * reading thread calls HDF5. Without the thread (a single piece, or no
 * thread to be had) the reader hashes each piece itself. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *base;
    size_t total_bytes;
    size_t ready;          /* bytes read so far */
    bool stop;             /* the read failed: give up */
    ckpt_hasher h;
    bool threaded;
    pthread_t thread;
} piece_hasher;

static void *hash_pieces(void *arg)
{
    piece_hasher *ph = arg;
    size_t done = 0;
    while (done < ph->total_bytes) {
        pthread_mutex_lock(&ph->mu);
        while (ph->ready <= done && !ph->stop) pthread_cond_wait(&ph->cv, &ph->mu);
        size_t ready = ph->ready;
        bool stop = ph->stop;
        pthread_mutex_unlock(&ph->mu);
        if (stop) break;
        ckpt_hasher_update(&ph->h, ph->base + done, ready - done);
        done = ready;
    }
    return NULL;
}

static void hasher_publish(piece_hasher *ph, size_t ready, bool stop)
{
    pthread_mutex_lock(&ph->mu);
    ph->ready = ready;
    ph->stop = stop;
    pthread_cond_signal(&ph->cv);
    pthread_mutex_unlock(&ph->mu);
}

/* @return 0, or -1 when out of memory (error set). */
static int hasher_start(piece_hasher *ph, int version, const void *base, size_t total, bool threaded)
{
    memset(ph, 0, sizeof *ph);
    ph->base = base;
    ph->total_bytes = total;
    if (ckpt_hasher_begin(&ph->h, version) < 0) return -1;
    if (!threaded || pthread_mutex_init(&ph->mu, NULL) != 0) return 0;
    if (pthread_cond_init(&ph->cv, NULL) != 0) {
        pthread_mutex_destroy(&ph->mu);
        return 0;
    }
    if (pthread_create(&ph->thread, NULL, hash_pieces, ph) != 0) {
        pthread_cond_destroy(&ph->cv);
        pthread_mutex_destroy(&ph->mu);
        return 0;
    }
    ph->threaded = true;
    return 0;
}

/* The piece [done, ready) of the buffer has been read. */
static void hasher_piece(piece_hasher *ph, size_t done, size_t ready)
{
    if (ph->threaded) hasher_publish(ph, ready, false);
    else ckpt_hasher_update(&ph->h, ph->base + done, ready - done);
}

/* @return the checksum when the read succeeded (ok), else 0. */
static uint64_t hasher_finish(piece_hasher *ph, bool ok)
{
    if (ph->threaded) {
        if (!ok) hasher_publish(ph, 0, true);
        pthread_join(ph->thread, NULL);
        pthread_cond_destroy(&ph->cv);
        pthread_mutex_destroy(&ph->mu);
    }
    if (ok) return ckpt_hasher_end(&ph->h);
    ckpt_hasher_drop(&ph->h);
    return 0;
}

/* An open dataset of file f. */
typedef struct {
    const ckpt_file *f;
    const char *h5;
    hid_t d;
    int nd;
    hsize_t dims[CX_MAX_DIMS];
    cx_dtype dt;
} dataset;

/* Reads [a, b) in pieces into buf; with `hasher` each piece is hashed. */
static cx_status read_pieces(const dataset *x, int64_t a, int64_t b, void *buf, int64_t piece, piece_hasher *hasher)
{
    size_t es = cx_dtype_size(x->dt);
    hid_t fs = H5Dget_space(x->d);
    cx_status st = CX_OK;
    for (int64_t lo = a; st == CX_OK && lo < b; lo += piece) {
        int64_t hi = lo + piece < b ? lo + piece : b;
        hsize_t cnt = (hsize_t)(hi - lo);
        char *dst = (char *)buf + (size_t)(lo - a) * es;
        hid_t ms = H5Screate_simple(1, &cnt, NULL);
        if (fs < 0 || ms < 0 || ckpt_select_range(fs, x->dims, x->nd, lo, hi) != 0 ||
            H5Dread(x->d, ckpt_h5_type(x->dt), x->nd ? ms : H5S_ALL, x->nd ? fs : H5S_ALL, H5P_DEFAULT, dst) < 0) {
            cx_set_last_error("%s: cannot read %s: %s", x->f->path, x->h5, ckpt_h5_msg());
            st = CX_ERR_IO;
        } else if (hasher) {
            hasher_piece(hasher, (size_t)(lo - a) * es, (size_t)(hi - a) * es);
        }
        if (ms >= 0) H5Sclose(ms);
    }
    if (fs >= 0) H5Sclose(fs);
    return st;
}

/* Reads a whole dataset and checks it against `want`. With a checksum to
 * check, the read goes in pieces: each is hashed while it is still in
 * cache, on a second thread while the next one is read. */
static cx_status read_checked(const dataset *x, int64_t numel, void *buf, int version, uint64_t want)
{
    int64_t piece = x->nd ? (int64_t)((16u << 20) / cx_dtype_size(x->dt)) : numel;
    if (piece < 1) piece = 1;
    piece_hasher ph;
    if (hasher_start(&ph, version, buf, (size_t)numel * cx_dtype_size(x->dt), numel > piece) < 0) return CX_ERR_OOM;
    cx_status st = read_pieces(x, 0, numel, buf, piece, &ph);
    uint64_t got = hasher_finish(&ph, st == CX_OK);
    if (st == CX_OK && got != want) {
        cx_set_last_error("%s: %s: checksum mismatch (the file is corrupt)", x->f->path, x->h5);
        st = CX_ERR_IO;
    }
    return st;
}

/* Reads elements [a, b) of the dataset `h5` (shape from the file) of file
 * r; with check_hash, a whole-dataset read is checked against the
 * dataset's checksum attribute. */
static cx_status read_range(ckpt_src *s, int r, const char *h5, cx_dtype dt, int64_t a, int64_t b, void *buf,
                            bool check_hash)
{
    cx_status st = ckpt_src_verify(s, r);
    if (st != CX_OK) return st;
    dataset x = { .f = &s->files[r], .h5 = h5, .dt = dt };
    x.d = H5Dopen2(x.f->fid, h5, H5P_DEFAULT);
    if (x.d < 0) {
        cx_set_last_error("%s: cannot open %s: %s", x.f->path, h5, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    int64_t shape[CX_MAX_DIMS], numel = 0;
    if (ckpt_dataset_shape(x.d, &x.nd, shape, &numel) < 0 || a < 0 || b > numel) {
        cx_set_last_error("%s: %s: range [%lld, %lld) outside the dataset (%lld elements)", x.f->path, h5,
                          (long long)a, (long long)b, (long long)numel);
        H5Dclose(x.d);
        return CX_ERR_SHAPE;
    }
    for (int i = 0; i < x.nd; i++) x.dims[i] = (hsize_t)shape[i];
    uint64_t want = 0;
    bool whole = check_hash && a == 0 && b == numel;
    if (b <= a) st = CX_OK;
    else if (whole && ckpt_attr_read_u64(x.d, ckpt_hash_attr(s->version), &want) == 0)
        st = read_checked(&x, numel, buf, s->version, want);
    else st = read_pieces(&x, a, b, buf, b - a, NULL);
    H5Dclose(x.d);
    return st;
}

cx_status ckpt_src_read(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf)
{
    if (a < 0 || b > e->numel || a > b) {
        cx_set_last_error("checkpoint %s: %s: bad range", s->prefix, e->key);
        return CX_ERR_ARG;
    }
    if (e->npieces) return ckpt_src_read_spmd(s, e, a, b, buf);
    /* files without a whole-file checksum (a single consolidated file) are
     * checked per dataset */
    bool per_dataset = !s->files[s->home].have_marker_hash || s->per_dataset;
    if (e->replicated) return read_range(s, s->home, e->h5path, e->dtype, a, b, buf, per_dataset);
    CX_ASSERT(e->unit >= 0 && e->unit < s->nunits && e->pidx >= 0 && e->pidx < s->units[e->unit].nparams);
    const ckpt_unit *u = &s->units[e->unit];
    const ckpt_pinfo *p = &u->params[e->pidx];
    int64_t lo = p->offset + a, hi = p->offset + b, S = u->shard_numel;
    size_t es = cx_dtype_size(e->dtype);
    for (int64_t i = lo; i < hi;) {
        int r = (int)(i / S);
        int64_t end = ((int64_t)r + 1) * S < hi ? ((int64_t)r + 1) * S : hi;
        cx_status st = read_range(s, r, e->h5path, e->dtype, i - (int64_t)r * S, end - (int64_t)r * S,
                                  (char *)buf + (size_t)(i - lo) * es, false);
        if (st != CX_OK) return st;
        i = end;
    }
    return CX_OK;
}
