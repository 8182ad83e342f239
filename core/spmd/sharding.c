/* Meshes and shardings: the registry of meshes, and shardings as plain
 * data (equality, hashes, ways, local shapes, blocks, specs). Tensors get
 * their shardings in ops/sharding_ops.c and api/materialize.c; the
 * partitioner that acts on them is compile/partition.c. */
#include "sharding.h"
#include "backend.h"
#include "cx_hash.h"
#include "cx_vec.h"

#include <stdlib.h>

static bool g_spmd;

cx_status cx_use_spmd(void) { g_spmd = true; return CX_OK; }
bool cx_is_spmd(void) { return g_spmd; }

/* ---- meshes --------------------------------------------------------------------------- */

static cx_mesh **g_meshes;   /* never freed: shardings and cached executables point at them */
static int g_nmeshes, g_meshes_cap;
static cx_mesh *g_global_mesh;

static uint64_t mesh_hash(const cx_mesh *m)
{
    uint64_t h = cx_hash64(m->shape, sizeof(int) * (size_t)m->ndim);
    h = cx_hash64_more(m->names, sizeof m->names[0] * (size_t)m->ndim, h);
    return cx_hash64_more(m->device_ids, sizeof(int) * (size_t)m->ndevices, h);
}

static const char *mesh_describe(const cx_mesh *m, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "mesh (");
    for (int a = 0; a < m->ndim && n < cap; a++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=%d", a ? ", " : "", m->names[a][0] ? m->names[a] : "_", m->shape[a]);
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, ") devices [");
    for (int i = 0; i < m->ndevices && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", m->device_ids[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static bool mesh_fill(cx_mesh *m, const int *device_ids, int ndim, const int *shape, const char *const *names)
{
    if (ndim < 1 || ndim > CX_MESH_MAX_DIMS) {
        cx_set_last_error("mesh: %d axes; a mesh has 1 to %d", ndim, CX_MESH_MAX_DIMS);
        return false;
    }
    int world = cx_world_size(), total = 1;
    m->ndim = ndim;
    for (int a = 0; a < ndim; a++) {
        if (!shape || shape[a] < 1) { cx_set_last_error("mesh: axis %d has size %d", a, shape ? shape[a] : 0); return false; }
        total *= shape[a];
        m->shape[a] = shape[a];
        const char *nm = names ? names[a] : NULL;
        if (nm && strlen(nm) >= CX_MESH_AXIS_NAME_MAX) {
            cx_set_last_error("mesh: axis name '%s' is longer than %d characters", nm, CX_MESH_AXIS_NAME_MAX - 1);
            return false;
        }
        snprintf(m->names[a], sizeof m->names[a], "%s", nm ? nm : "");
        for (int b = 0; nm && nm[0] && b < a; b++)
            if (!strcmp(m->names[b], nm)) { cx_set_last_error("mesh: axis name '%s' is used twice", nm); return false; }
    }
    if (total != world) {
        cx_set_last_error("mesh: the shape's product is %d devices but there are %d (one per rank)", total, world);
        return false;
    }
    m->ndevices = total;
    m->device_ids = malloc(sizeof(int) * (size_t)total);
    char *seen = calloc((size_t)total, 1);
    if (!m->device_ids || !seen) { free(seen); cx_set_last_error("mesh: out of memory"); return false; }
    for (int i = 0; i < total; i++) {
        int d = device_ids ? device_ids[i] : i;
        if (d < 0 || d >= world || seen[d]) {
            free(seen);
            cx_set_last_error("mesh: device id %d is %s (devices 0..%d)", d, d < 0 || d >= world ? "out of range" : "listed twice",
                              world - 1);
            return false;
        }
        seen[d] = 1;
        m->device_ids[i] = d;
    }
    free(seen);
    m->hash = mesh_hash(m);
    return true;
}

/* Interns m (taking its device list) and checks that every rank built the
 * same mesh. */
static cx_mesh *mesh_register(cx_mesh *m)
{
    char desc[512];
    mesh_describe(m, desc, sizeof desc);
    if (cx_world_size() > 1 && cx_comm_check(desc) != CX_OK) { free(m->device_ids); return NULL; }
    for (int i = 0; i < g_nmeshes; i++)
        if (g_meshes[i]->hash == m->hash && g_meshes[i]->ndim == m->ndim) { free(m->device_ids); return g_meshes[i]; }
    cx_mesh *r = malloc(sizeof *r);
    if (!r || !CX_GROW(g_meshes, g_meshes_cap, g_nmeshes + 1)) {
        free(r); free(m->device_ids);
        cx_set_last_error("mesh: out of memory");
        return NULL;
    }
    *r = *m;
    r->id = g_nmeshes + 1;
    g_meshes[g_nmeshes++] = r;
    return r;
}

const cx_mesh *cx_mesh_find(uint64_t hash, int ndim)
{
    for (int i = 0; i < g_nmeshes; i++)
        if (g_meshes[i]->hash == hash && g_meshes[i]->ndim == ndim) return g_meshes[i];
    return NULL;
}

cx_mesh *cx_mesh_new(const int *device_ids, int ndim, const int *shape, const char *const *axis_names)
{
    cx_mesh m = { 0 };
    if (!mesh_fill(&m, device_ids, ndim, shape, axis_names)) { free(m.device_ids); return NULL; }
    return mesh_register(&m);
}

cx_mesh *cx_hybrid_mesh_new(int ndim, const int *ici_shape, const int *dcn_shape, const char *const *axis_names)
{
    if (ndim < 1 || ndim > CX_MESH_MAX_DIMS || !ici_shape || !dcn_shape) {
        cx_set_last_error("hybrid mesh: %d axes (1 to %d) with both an ICI and a DCN shape", ndim, CX_MESH_MAX_DIMS);
        return NULL;
    }
    int shape[CX_MESH_MAX_DIMS], ici_total = 1, dcn_total = 1;
    for (int a = 0; a < ndim; a++) {
        if (ici_shape[a] < 1 || dcn_shape[a] < 1) {
            cx_set_last_error("hybrid mesh: axis %d has ICI size %d and DCN size %d", a, ici_shape[a], dcn_shape[a]);
            return NULL;
        }
        shape[a] = ici_shape[a] * dcn_shape[a];
        ici_total *= ici_shape[a];
        dcn_total *= dcn_shape[a];
    }
    int world = cx_world_size();
    int per_node = cx_comm_local_size();
    if (ici_total != per_node || ici_total * dcn_total != world) {
        cx_set_last_error("hybrid mesh: ICI shape covers %d devices and DCN shape %d nodes, but there are %d ranks "
                          "with %d per node", ici_total, dcn_total, world, per_node);
        return NULL;
    }
    /* position (c_a = dcn_a * ici_a_size + ici_a) holds device node * per_node + local, where node and
     * local are the row-major indices of the DCN and ICI coordinates */
    int *ids = malloc(sizeof(int) * (size_t)world);
    if (!ids) { cx_set_last_error("hybrid mesh: out of memory"); return NULL; }
    for (int p = 0; p < world; p++) {
        int rem = p, coord[CX_MESH_MAX_DIMS];
        for (int a = ndim - 1; a >= 0; a--) { coord[a] = rem % shape[a]; rem /= shape[a]; }
        int node = 0, local = 0;
        for (int a = 0; a < ndim; a++) {
            node = node * dcn_shape[a] + coord[a] / ici_shape[a];
            local = local * ici_shape[a] + coord[a] % ici_shape[a];
        }
        ids[p] = node * per_node + local;
    }
    cx_mesh *m = cx_mesh_new(ids, ndim, shape, axis_names);
    free(ids);
    return m;
}

int cx_mesh_shape(const cx_mesh *mesh, int *shape)
{
    if (!mesh) return 0;
    for (int a = 0; shape && a < mesh->ndim; a++) shape[a] = mesh->shape[a];
    return mesh->ndim;
}

int cx_mesh_device_ids(const cx_mesh *mesh, int *ids, int cap)
{
    if (!mesh) return 0;
    for (int i = 0; ids && i < mesh->ndevices && i < cap; i++) ids[i] = mesh->device_ids[i];
    return mesh->ndevices;
}

int cx_mesh_axis_index(const cx_mesh *mesh, const char *name)
{
    for (int a = 0; mesh && name && a < mesh->ndim; a++)
        if (mesh->names[a][0] && !strcmp(mesh->names[a], name)) return a;
    return -1;
}

void cx_set_global_mesh(cx_mesh *mesh) { g_global_mesh = mesh; }
cx_mesh *cx_get_global_mesh(void) { return g_global_mesh; }

bool cx_mesh_coords(const cx_mesh *mesh, int rank, int *coords)
{
    for (int p = 0; p < mesh->ndevices; p++) {
        if (mesh->device_ids[p] != rank) continue;
        for (int a = mesh->ndim - 1; a >= 0; a--) { coords[a] = p % mesh->shape[a]; p /= mesh->shape[a]; }
        return true;
    }
    return false;
}

int64_t cx_mesh_axes_group(const cx_mesh *mesh, const uint8_t *axes, int naxes, int *group_size)
{
    int gs = 1;
    bool in_group[CX_MESH_MAX_DIMS] = { false };
    for (int i = 0; i < naxes; i++) { gs *= mesh->shape[axes[i]]; in_group[axes[i]] = true; }
    int ngroups = mesh->ndevices / gs;
    int *ranks = malloc(sizeof(int) * (size_t)mesh->ndevices);
    if (!ranks) { cx_set_last_error("spmd: out of memory"); return -1; }
    /* group index: the row-major index of the other axes' coordinates; member
     * index: the listed axes' coordinates, first axis major */
    for (int p = 0; p < mesh->ndevices; p++) {
        int coord[CX_MESH_MAX_DIMS], rem = p;
        for (int a = mesh->ndim - 1; a >= 0; a--) { coord[a] = rem % mesh->shape[a]; rem /= mesh->shape[a]; }
        int g = 0, mbr = 0;
        for (int a = 0; a < mesh->ndim; a++) if (!in_group[a]) g = g * mesh->shape[a] + coord[a];
        for (int i = 0; i < naxes; i++) mbr = mbr * mesh->shape[axes[i]] + coord[axes[i]];
        ranks[g * gs + mbr] = mesh->device_ids[p];
    }
    cx_replica_groups rg = { ngroups, gs, ranks };
    int64_t id = cx_groups_intern(&rg, "spmd", group_size);
    free(ranks);
    return id;
}

/* ---- shardings ---------------------------------------------------------------------------- */

cx_sharding cx_sharding_replicated(const cx_mesh *mesh, int nd)
{
    cx_sharding s;
    memset(&s, 0, sizeof s);
    s.mesh = mesh;
    s.ndim = (uint8_t)nd;
    return s;
}

bool cx_sharding_is_replicated(const cx_sharding *s)
{
    if (!s) return true;
    if (s->partial) return false;
    for (int d = 0; d < s->ndim; d++) if (s->naxes[d]) return false;
    return true;
}

bool cx_sharding_equal(const cx_sharding *a, const cx_sharding *b)
{
    bool ra = cx_sharding_is_replicated(a), rb = cx_sharding_is_replicated(b);
    if (ra || rb) return ra == rb;
    if (a->mesh != b->mesh || a->ndim != b->ndim || a->partial != b->partial) return false;
    for (int d = 0; d < a->ndim; d++) {
        if (a->naxes[d] != b->naxes[d] || a->blocks[d] != b->blocks[d]) return false;
        for (int i = 0; i < a->naxes[d]; i++) if (a->axes[d][i] != b->axes[d][i]) return false;
    }
    return true;
}

uint64_t cx_sharding_hash(const cx_sharding *s)
{
    if (cx_sharding_is_replicated(s)) return 0x5eedull;
    uint64_t h = cx_hash64(&s->mesh->hash, sizeof s->mesh->hash);
    h = cx_hash64_more(s->naxes, sizeof s->naxes, h);
    h = cx_hash64_more(s->axes, sizeof s->axes, h);
    h = cx_hash64_more(s->blocks, sizeof s->blocks, h);
    return cx_hash64_more(&s->partial, sizeof s->partial, h ^ s->ndim);
}

int cx_sharding_ways(const cx_sharding *s, int d)
{
    int k = 1;
    for (int i = 0; s && i < s->naxes[d]; i++) k *= s->mesh->shape[s->axes[d][i]];
    return k;
}

int cx_sharding_index(const cx_sharding *s, int d, int rank)
{
    if (!s || !s->naxes[d]) return 0;
    int coord[CX_MESH_MAX_DIMS];
    if (!cx_mesh_coords(s->mesh, rank, coord)) return 0;
    int idx = 0;
    for (int i = 0; i < s->naxes[d]; i++) idx = idx * s->mesh->shape[s->axes[d][i]] + coord[s->axes[d][i]];
    return idx;
}

void cx_sharding_local_shape(const cx_sharding *s, const int64_t *global, int64_t *local)
{
    for (int d = 0; d < (s ? s->ndim : 0); d++) {
        int64_t k = cx_sharding_ways(s, d), b = cx_sharding_blocks(s, d), part = global[d] / b;
        local[d] = b * ((part + k - 1) / k);
    }
}

int cx_sharding_blocks(const cx_sharding *s, int d) { return s && s->naxes[d] && s->blocks[d] > 1 ? s->blocks[d] : 1; }

bool cx_sharding_has_blocks(const cx_sharding *s)
{
    for (int d = 0; s && d < s->ndim; d++) if (cx_sharding_blocks(s, d) > 1) return true;
    return false;
}

bool cx_sharding_unblocked(const cx_sharding *s, const int64_t *global, cx_sharding *u, int64_t *ushape)
{
    *u = cx_sharding_replicated(s->mesh, 0);
    u->partial = s->partial;
    int e = 0;
    for (int d = 0; d < s->ndim; d++) {
        int b = cx_sharding_blocks(s, d);
        if (e + (b > 1) + 1 > CX_MAX_DIMS) {
            cx_set_last_error("spmd: a blocked split of a rank-%d tensor needs more than %d dimensions", s->ndim, CX_MAX_DIMS);
            return false;
        }
        if (b > 1) ushape[e++] = b;
        ushape[e] = global[d] / b;
        u->naxes[e] = s->naxes[d];
        memcpy(u->axes[e], s->axes[d], sizeof u->axes[e]);
        e++;
    }
    u->ndim = (uint8_t)e;
    return true;
}

int cx_axes_of_mask(unsigned mask, uint8_t *axes)
{
    int n = 0;
    for (int a = 0; a < CX_MESH_MAX_DIMS; a++) if (mask >> a & 1) axes[n++] = (uint8_t)a;
    return n;
}

const char *cx_sharding_describe(const cx_sharding *s, char *buf, size_t cap)
{
    if (cx_sharding_is_replicated(s)) { snprintf(buf, cap, "replicated"); return buf; }
    size_t n = (size_t)snprintf(buf, cap, "{devices=[");
    for (int d = 0; d < s->ndim && n < cap; d++) n += (size_t)snprintf(buf + n, cap - n, "%s%d", d ? "," : "", cx_sharding_ways(s, d));
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "] mesh=(");
    for (int a = 0; a < s->mesh->ndim && n < cap; a++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=%d", a ? "," : "", s->mesh->names[a][0] ? s->mesh->names[a] : "_", s->mesh->shape[a]);
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, ") spec=(");
    for (int d = 0; d < s->ndim && n < cap; d++) {
        if (d && n < cap) n += (size_t)snprintf(buf + n, cap - n, ", ");
        if (!s->naxes[d] && n < cap) n += (size_t)snprintf(buf + n, cap - n, "None");
        if (s->naxes[d] > 1 && n < cap) n += (size_t)snprintf(buf + n, cap - n, "(");
        for (int i = 0; i < s->naxes[d] && n < cap; i++) {
            int a = s->axes[d][i];
            if (s->mesh->names[a][0]) n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", s->mesh->names[a]);
            else n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? ", " : "", a);
        }
        if (s->naxes[d] > 1 && n < cap) n += (size_t)snprintf(buf + n, cap - n, ")");
        if (cx_sharding_blocks(s, d) > 1 && n < cap) n += (size_t)snprintf(buf + n, cap - n, " in %d blocks", s->blocks[d]);
    }
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, ")");
    for (int a = 0, first = 1; s->partial && a < s->mesh->ndim && n < cap; a++) {
        if (!(s->partial >> a & 1)) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", first ? " partial over (" : ", ", s->mesh->names[a][0] ? s->mesh->names[a] : "_");
        first = 0;
    }
    if (s->partial && n < cap) n += (size_t)snprintf(buf + n, cap - n, ")");
    if (n < cap) snprintf(buf + n, cap - n, "}");
    return buf;
}

cx_status cx_spec_to_sharding(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, int nd, const int64_t *shape,
                                  cx_sharding *s)
{
    if (!g_spmd) {
        cx_set_last_error("mark_sharding: SPMD mode is off (call cx_use_spmd first)");
        return CX_ERR_ARG;
    }
    if (!mesh) { cx_set_last_error("mark_sharding: mesh is NULL (and no global mesh is set)"); return CX_ERR_ARG; }
    if (nspec != nd || (nspec && !spec)) {
        cx_set_last_error("mark_sharding: the partition spec has %d entries but the tensor has rank %d", nspec, nd);
        return CX_ERR_ARG;
    }
    *s = cx_sharding_replicated(mesh, nd);
    unsigned used = 0;
    for (int d = 0; d < nd; d++) {
        if (spec[d].naxes < 0 || spec[d].naxes > mesh->ndim) {
            cx_set_last_error("mark_sharding: spec entry %d lists %d axes; the mesh has %d", d, spec[d].naxes, mesh->ndim);
            return CX_ERR_ARG;
        }
        for (int i = 0; i < spec[d].naxes; i++) {
            int a = spec[d].axes[i];
            const char *nm = spec[d].names[i];
            if (nm) {
                a = cx_mesh_axis_index(mesh, nm);
                if (a < 0) { cx_set_last_error("mark_sharding: spec entry %d names axis '%s', which the mesh does not have", d, nm); return CX_ERR_ARG; }
            } else if (a < 0 || a >= mesh->ndim) {
                cx_set_last_error("mark_sharding: spec entry %d names axis %d; the mesh has axes 0..%d", d, a, mesh->ndim - 1);
                return CX_ERR_ARG;
            }
            if (used >> a & 1) {
                cx_set_last_error("mark_sharding: mesh axis %s%s%d is used twice in the partition spec",
                                  mesh->names[a][0] ? mesh->names[a] : "", mesh->names[a][0] ? " = " : "", a);
                return CX_ERR_ARG;
            }
            used |= 1u << a;
            if (mesh->shape[a] > 1) s->axes[d][s->naxes[d]++] = (uint8_t)a;   /* an axis of one device splits nothing */
        }
        int b = spec[d].blocks;
        if (b < 0 || b > 255 || (b > 1 && shape && shape[d] % b)) {
            cx_set_last_error("mark_sharding: spec entry %d asks for %d blocks; dimension %d has size %lld", d, b, d,
                              shape ? (long long)shape[d] : -1LL);
            return CX_ERR_ARG;
        }
        if (b > 1 && s->naxes[d]) s->blocks[d] = (uint8_t)b;
    }
    return CX_OK;
}

cx_sharding *cx_sharding_dup(const cx_sharding *s)
{
    if (cx_sharding_is_replicated(s)) return NULL;
    cx_sharding *c = malloc(sizeof *c);
    if (c) *c = *s;
    return c;
}

/* ---- notes for IR dumps ---------------------------------------------------------------- */

void cx_spmd_notes_free(cx_spmd_notes *notes)
{
    if (!notes) return;
    free(notes->sh);
    free(notes->coll);
    free(notes);
}

const char *cx_spmd_coll_describe(const cx_spmd_coll *k, const cx_mesh *mesh, char *buf, size_t cap)
{
    static const char *const kinds[4] = { "all-reduce", "all-gather", "reduce-scatter", "all-to-all" };
    size_t n = (size_t)snprintf(buf, cap, "%s over (", kinds[k->kind & 3]);
    bool first = true;
    for (int a = 0; a < CX_MESH_MAX_DIMS && n < cap; a++) {
        if (!(k->axes >> a & 1)) continue;
        if (mesh && a < mesh->ndim && mesh->names[a][0]) n += (size_t)snprintf(buf + n, cap - n, "%s%s", first ? "" : ", ", mesh->names[a]);
        else n += (size_t)snprintf(buf + n, cap - n, "%s%d", first ? "" : ", ", a);
        first = false;
    }
    if (n < cap) snprintf(buf + n, cap - n, ")");
    return buf;
}
