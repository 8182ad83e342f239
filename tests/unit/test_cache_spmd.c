/* The serialized form of a partitioned (SPMD) program, which the persistent
 * cache stores per rank: the outputs' shardings come back pointing at the
 * same registered mesh, a collective's replica groups come back as the same
 * ranks, and a payload whose mesh this process never built is refused. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include "executable.h"
#include "backend.h"
#include "runtime.h"

static cx_executable *last_executable(void)
{
    cx_exec_info info = cx_last_exec_info();
    cx_executable *e = cx_exec_cache_find(info.key_hi, info.key_lo);
    cr_assert(e, "the last graph is not in the in-memory cache");
    return e;
}

static cx_executable *round_trip(const cx_executable *e, cx_sbuf *w)
{
    *w = (cx_sbuf){ 0 };
    cx_exec_serialize(w, e);
    cr_assert(!w->oom);
    return cx_exec_deserialize((const unsigned char *)w->s, w->n);
}

static cx_mesh *one_device_mesh(void)
{
    cr_assert_eq(cx_use_spmd(), CX_OK, "%s", cx_last_error());
    cx_mesh *m = cx_mesh_new((int[]){ 0 }, 1, (int[]){ 1 }, (const char *const[]){ "data" });
    cr_assert(m, "%s", cx_last_error());
    return m;
}

Test(cache_spmd, shardings_come_back_on_the_same_mesh)
{
    cx_mesh *m = one_device_mesh();
    cx_tensor *x = cx_from_host((float[]){ -1, 2, -3, 4 }, (int64_t[]){ 4 }, 1, CX_F32);
    cr_assert_eq(cx_mark_sharding(x, m, (cx_spec_entry[]){ CX_SPEC_NAME("data") }, 1), CX_OK, "%s", cx_last_error());
    cx_tensor *y = cx_relu(x);
    cr_assert_eq(cx_mark_sharding(y, m, (cx_spec_entry[]){ CX_SPEC_NAME("data") }, 1), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    const cx_executable *e = last_executable();
    cr_assert(e->out_sharding, "the graph was not partitioned");
    cx_sbuf w;
    cx_executable *back = round_trip(e, &w);
    cr_assert(back, "a partitioned program did not deserialize");
    cr_assert(back->out_sharding);
    for (int o = 0; o < e->n_outputs; o++) {
        cr_expect(cx_sharding_equal(&back->out_sharding[o], &e->out_sharding[o]), "output %d's sharding differs", o);
        cr_expect(cx_sharding_is_replicated(&e->out_sharding[o]) || back->out_sharding[o].mesh == e->out_sharding[o].mesh,
                  "output %d points at another mesh", o);
    }
    cr_expect(memcmp(back->spmd_inserted, e->spmd_inserted, sizeof e->spmd_inserted) == 0);
    cx_executable_free(back);
    free(w.s);
    cx_free(y);
    cx_free(x);
}

Test(cache_spmd, replica_groups_come_back_as_their_ranks)
{
    cx_replica_groups rg = { 1, 1, (int[]){ 0 } };
    cx_tensor *x = cx_from_host((float[]){ 1, 2 }, (int64_t[]){ 2 }, 1, CX_F32);
    cx_tensor *y = cx_all_reduce(cx_relu(x), CX_RED_SUM, 1.0, &rg, false);
    cr_assert_eq(cx_sync_tensors(&y, 1), CX_OK, "%s", cx_last_error());
    const cx_executable *e = last_executable();
    cx_sbuf w;
    cx_executable *back = round_trip(e, &w);
    cr_assert(back, "a program with a collective did not deserialize");
    int colls = 0;
    for (int k = 0; k < e->nkernels; k++) {
        if (e->kernels[k].kind != K_COLL) continue;
        colls++;
        int ng0 = 0, gs0 = 0, ng1 = 0, gs1 = 0;
        const int *r0 = NULL, *r1 = NULL;
        cr_assert(cx_groups_describe(CX_ATTR(&e->kernels[k], CX_AT_COLL_GROUPS), &ng0, &gs0, &r0), "no groups");
        cr_assert(cx_groups_describe(CX_ATTR(&back->kernels[k], CX_AT_COLL_GROUPS), &ng1, &gs1, &r1),
                  "the loaded collective lost its groups");
        cr_expect(ng0 == ng1 && gs0 == gs1 && !memcmp(r0, r1, sizeof(int) * (size_t)(ng0 * gs0)));
    }
    cr_expect_eq(colls, 1);
    cx_executable_free(back);
    free(w.s);
    cx_free(y);
    cx_free(x);
}

/* A sharding whose mesh hash matches no mesh of this process: the payload
 * is refused (the persistent cache counts a miss) instead of a sharding
 * pointing nowhere. */
Test(cache_spmd, unknown_mesh_is_refused)
{
    cx_mesh *m = one_device_mesh();
    cx_tensor *x = cx_from_host((float[]){ 1, 2 }, (int64_t[]){ 2 }, 1, CX_F32);
    cr_assert_eq(cx_mark_sharding(x, m, (cx_spec_entry[]){ CX_SPEC_NAME("data") }, 1), CX_OK, "%s", cx_last_error());
    cx_tensor *y = cx_relu(x);
    cr_assert_eq(cx_mark_sharding(y, m, (cx_spec_entry[]){ CX_SPEC_NAME("data") }, 1), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    const cx_executable *e = last_executable();
    cr_assert(e->out_sharding);
    cx_sbuf w;
    cx_executable *back = round_trip(e, &w);
    cr_assert(back);
    cx_executable_free(back);
    /* the mesh's hash is written as is: find it and change it */
    uint64_t h = m->hash;
    int at = -1;
    for (size_t i = 0; i + sizeof h <= w.n; i++)
        if (!memcmp(w.s + i, &h, sizeof h)) { at = (int)i; break; }
    cr_assert_geq(at, 0, "the mesh hash is not in the payload");
    w.s[at] ^= 1;
    cr_expect_null(cx_exec_deserialize((const unsigned char *)w.s, w.n));
    free(w.s);
    cx_free(y);
    cx_free(x);
}
