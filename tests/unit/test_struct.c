/* cx_struct_take, the reading of a sized struct from a caller built against
 * other headers: a second version of a struct stands in for a member the
 * public structs have not gained yet, so an older caller's missing members
 * can be seen to keep the library's defaults. */
#include "cx_struct.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct {
    size_t struct_size;
    int a;
    double b;
} v1;

typedef struct {
    size_t struct_size;
    int a;
    double b;
    int added;   /* the second version's */
} v2;

static v2 defaults(void)
{
    return (v2){ sizeof(v2), .a = 1, .b = 2.0, .added = 42 };
}

Test(struct_take, an_older_caller_gets_the_defaults_of_what_it_lacks)
{
    v1 old = { sizeof old, .a = 7, .b = 8.0 };
    v2 got = defaults();
    char err[256];
    cr_assert(cx_struct_take(&got, sizeof got, &old, old.struct_size, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err),
              "%s", err);
    cr_expect_eq(got.a, 7);
    cr_expect_eq(got.b, 8.0);
    cr_expect_eq(got.added, 42, "a member the caller does not know keeps its default");
}

Test(struct_take, a_newer_callers_extra_bytes_are_ignored)
{
    struct {
        v2 known;
        char later[16];
    } newer;
    memset(&newer, 0x5a, sizeof newer);
    newer.known = (v2){ sizeof newer, .a = 3, .b = 4.0, .added = 5 };
    v2 got = defaults();
    char err[256];
    cr_assert(cx_struct_take(&got, sizeof got, &newer, newer.known.struct_size, CX_SIZE_THROUGH(v2, b), "v2", err,
                             sizeof err), "%s", err);
    cr_expect_eq(got.a, 3);
    cr_expect_eq(got.added, 5);
}

Test(struct_take, below_the_first_version_is_refused_by_name)
{
    v1 old = { CX_SIZE_THROUGH(v1, a), .a = 7 };
    v2 got = defaults();
    char err[256];
    cr_expect_not(cx_struct_take(&got, sizeof got, &old, old.struct_size, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err));
    cr_expect(strstr(err, "v2.struct_size is") != NULL, "%s", err);
    cr_expect_eq(got.a, 1, "nothing taken from a refused struct");
    cr_expect_not(cx_struct_take(&got, sizeof got, &old, 0, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err));
    cr_expect(strstr(err, "v2.struct_size is 0") != NULL, "%s", err);
}

/* cx_struct_give, the library filling a sized struct in the caller's
 * memory: an older caller's v1 sits in a buffer with a canary after it,
 * which a library writing its whole v2 would overwrite. */
Test(struct_give, an_older_caller_gets_only_its_bytes)
{
    unsigned char buf[sizeof(v2) + 16];
    memset(buf, 0xa5, sizeof buf);
    v1 old = { sizeof old, .a = 0, .b = 0.0 };
    memcpy(buf, &old, sizeof old);
    v2 mine = defaults();
    char err[256];
    cr_assert(cx_struct_give(buf, &mine, sizeof mine, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err), "%s", err);
    memcpy(&old, buf, sizeof old);
    cr_expect_eq(old.struct_size, sizeof(v1), "the caller's size stays");
    cr_expect_eq(old.a, 1);
    cr_expect_eq(old.b, 2.0);
    for (size_t i = sizeof(v1); i < sizeof buf; i++) cr_assert_eq(buf[i], 0xa5, "byte %zu past the caller's struct written", i);
}

Test(struct_give, a_newer_caller_keeps_what_the_library_does_not_know)
{
    struct {
        v2 known;
        int later;
    } newer = { { sizeof newer, .a = 0, .b = 0.0, .added = 0 }, .later = 99 };
    v2 mine = defaults();
    char err[256];
    cr_assert(cx_struct_give(&newer, &mine, sizeof mine, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err), "%s", err);
    cr_expect_eq(newer.known.struct_size, sizeof newer, "the caller's size stays");
    cr_expect_eq(newer.known.added, 42);
    cr_expect_eq(newer.later, 99);
}

Test(struct_give, below_the_first_version_writes_nothing)
{
    unsigned char buf[sizeof(v2)];
    memset(buf, 0xa5, sizeof buf);
    size_t small = CX_SIZE_THROUGH(v2, a);
    memcpy(buf, &small, sizeof small);
    v2 mine = defaults();
    char err[256];
    cr_expect_not(cx_struct_give(buf, &mine, sizeof mine, CX_SIZE_THROUGH(v2, b), "v2", err, sizeof err));
    cr_expect(strstr(err, "v2.struct_size is") != NULL, "%s", err);
    for (size_t i = sizeof small; i < sizeof buf; i++) cr_assert_eq(buf[i], 0xa5, "byte %zu written", i);
}
