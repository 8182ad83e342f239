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
