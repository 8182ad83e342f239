/* The root attributes of a checkpoint file (format, version, strategy,
 * world and rank, progress, RNG and optimizer step count, the program's
 * metadata): one table says
 * which struct field each attribute is, and both directions go through it,
 * so a save, a consolidation and a reshard write the same preamble. */
#include "ckpt_internal.h"

#include <stddef.h>
#include <string.h>

enum { A_STR, A_I64, A_U64 };
/* REQUIRED: a file without it is refused; IF_SET: written only when nonzero
 * (a string: nonempty), so files without one stay as older libraries wrote
 * them, and an absent one reads as 0 or "" */
enum { OPTIONAL = 0, REQUIRED = 1, IF_SET = 2 };

typedef struct {
    const char *name;
    int kind;
    size_t off, cap;
    int rule;
} root_attr;

#define FIELD(f) offsetof(ckpt_root, f), sizeof ((ckpt_root *)0)->f

/* in the order the file lists them */
static const root_attr k_attrs[] = {
    { "format_version", A_I64, FIELD(format_version), REQUIRED },
    { "library_version", A_STR, FIELD(library_version), OPTIONAL },
    { "strategy", A_STR, FIELD(strategy), REQUIRED },
    { "world_size", A_I64, FIELD(world_size), REQUIRED },
    { "rank", A_I64, FIELD(rank), REQUIRED },
    { "train_world_size", A_I64, FIELD(train_world_size), OPTIONAL },
    { "step", A_I64, FIELD(step), OPTIONAL },
    { "epoch", A_I64, FIELD(epoch), OPTIONAL },
    { "sampler_epoch", A_I64, FIELD(sampler_epoch), OPTIONAL },
    { "sampler_position", A_I64, FIELD(sampler_position), OPTIONAL },
    { "rng_seed", A_U64, FIELD(rng_seed), OPTIONAL },
    { "rng_offset", A_U64, FIELD(rng_offset), OPTIONAL },
    { "optimizer", A_STR, FIELD(optimizer), OPTIONAL },
    { "optimizer_steps", A_I64, FIELD(optimizer_steps), OPTIONAL },
    { "compression", A_STR, FIELD(compression), OPTIONAL },
    { "consolidated_from_world_size", A_I64, FIELD(consolidated_from_world_size), IF_SET },
    { "resharded_from_world_size", A_I64, FIELD(resharded_from_world_size), IF_SET },
    { "program_meta", A_STR, FIELD(program_meta), IF_SET },
};
#define NATTRS ((int)(sizeof k_attrs / sizeof k_attrs[0]))

static int write_attrs(hid_t f, const ckpt_root *r)
{
    if (ckpt_attr_write_str(f, "format", CKPT_FORMAT_NAME) < 0) return -1;
    for (int i = 0; i < NATTRS; i++) {
        const root_attr *a = &k_attrs[i];
        const char *p = (const char *)r + a->off;
        int rc;
        if (a->kind == A_STR) {
            if (a->rule == IF_SET && !*p) continue;
            rc = ckpt_attr_write_str(f, a->name, p);
        } else {
            int64_t v;   /* same bits for u64 */
            memcpy(&v, p, sizeof v);
            if (a->rule == IF_SET && v == 0) continue;
            rc = a->kind == A_I64 ? ckpt_attr_write_i64(f, a->name, v) : ckpt_attr_write_u64(f, a->name, (uint64_t)v);
        }
        if (rc < 0) return -1;
    }
    return 0;
}

cx_status ckpt_file_begin(const char *path, const ckpt_root *r, int level, hid_t *fid, hid_t *model)
{
    ckpt_root w = *r;
    w.format_version = CX_CKPT_FORMAT_VERSION;
    ckpt_strlcpy(w.library_version, sizeof w.library_version, CX_VERSION_STRING);
    w.sampler_epoch = w.epoch;
    if (level > 0) snprintf(w.compression, sizeof w.compression, "zstd-%d", level);
    else snprintf(w.compression, sizeof w.compression, "none");
    *model = -1;
    *fid = ckpt_file_create(path);
    if (*fid < 0) {
        cx_set_last_error("%s: cannot create: %s", path, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    if (write_attrs(*fid, &w) < 0) {
        cx_set_last_error("%s: cannot write attributes: %s", path, ckpt_h5_msg());
    } else {
        *model = ckpt_group_create(*fid, "model");
        if (*model >= 0) return CX_OK;
        cx_set_last_error("%s: cannot create /model: %s", path, ckpt_h5_msg());
    }
    H5Fclose(*fid);
    *fid = -1;
    return CX_ERR_IO;
}

static int read_attr(hid_t f, const root_attr *a, ckpt_root *r)
{
    char *p = (char *)r + a->off;
    if (a->kind == A_STR) return ckpt_attr_read_str(f, a->name, p, a->cap);
    if (a->kind == A_I64) return ckpt_attr_read_i64(f, a->name, (int64_t *)(void *)p);
    return ckpt_attr_read_u64(f, a->name, (uint64_t *)(void *)p);
}

cx_status ckpt_root_read(hid_t fid, const char *path, ckpt_root *r)
{
    memset(r, 0, sizeof *r);
    char fmt[64];
    if (ckpt_attr_read_str(fid, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, CKPT_FORMAT_NAME)) {
        cx_set_last_error("%s: not a cxla checkpoint (format attribute is not '%s')", path, CKPT_FORMAT_NAME);
        return CX_ERR_IO;
    }
    /* the version first: a file of another version may lack what this one requires */
    if (ckpt_attr_read_i64(fid, "format_version", &r->format_version) < 0 ||
        r->format_version < CKPT_OLDEST_VERSION || r->format_version > CX_CKPT_FORMAT_VERSION) {
        cx_set_last_error("%s: unsupported checkpoint format version %lld (this library reads %d to %d)", path,
                          (long long)r->format_version, CKPT_OLDEST_VERSION, CX_CKPT_FORMAT_VERSION);
        return CX_ERR_IO;
    }
    for (int i = 0; i < NATTRS; i++) {
        if (read_attr(fid, &k_attrs[i], r) == 0 || k_attrs[i].rule != REQUIRED) continue;
        cx_set_last_error("%s: missing or bad root attribute %s", path, k_attrs[i].name);
        return CX_ERR_IO;
    }
    if (r->world_size < 1 || r->rank < 0 || r->rank >= r->world_size) {
        cx_set_last_error("%s: bad world_size/rank attributes (rank %lld of %lld)", path, (long long)r->rank,
                          (long long)r->world_size);
        return CX_ERR_IO;
    }
    return CX_OK;
}
