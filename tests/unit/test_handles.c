/* A handle that outlives its value is an error naming the mistake, never a
 * crash or a read of freed memory: after cx_step_end (not kept), after
 * cx_free, after cx_module_free, and in a later step. Public API only, as a
 * user's program sees it. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <math.h>
#include <string.h>

static cx_tensor *vec3(double v)
{
    float x[3] = { (float)v, (float)v, (float)v };
    int64_t shape[1] = { 3 };
    return cx_from_host(x, shape, 1, CX_F32);
}

Test(handles, loss_read_after_step_end_without_keep)
{
    cx_step_begin();
    cx_tensor *x = vec3(2.0);
    cx_tensor *loss = cx_sum(x, NULL, 0, false);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    double v = cx_item(loss);   /* the README's mistake: no cx_keep(loss) */
    cr_expect(isnan(v), "a released loss read as %g", v);
    cr_expect(strstr(cx_last_error(), "released at the end of its step; cx_keep it"), "%s", cx_last_error());
}

Test(handles, kept_loss_reads_after_step_end)
{
    cx_step_begin();
    cx_tensor *loss = cx_keep(cx_sum(vec3(2.0), NULL, 0, false));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_expect_float_eq(cx_item(loss), 6.0, 1e-6);
}

Test(handles, read_after_free)
{
    cx_tensor *x = vec3(1.0);
    cx_free(x);
    double v = cx_item(x);
    cr_expect(isnan(v));
    cr_expect(strstr(cx_last_error(), "used after it was freed"), "%s", cx_last_error());
    cx_clear_error();
    cx_free(x);   /* twice: refused, not a double free */
    cr_expect(strstr(cx_last_error(), "cx_free: tensor used after it was freed"), "%s", cx_last_error());
}

Test(handles, parameter_after_module_free)
{
    cx_module *m = cx_nn_linear(3, 2, true);
    cr_assert(m, "%s", cx_last_error());
    cx_tensor *w = cx_module_get(m, "weight");
    cr_assert(w);
    cx_module_free(m);
    cx_step_begin();
    cx_tensor *s = cx_sum(w, NULL, 0, false);   /* poison flows into the op */
    cr_expect(cx_tensor_error(s) && strstr(cx_tensor_error(s), "cx_module_free"), "%s",
              cx_tensor_error(s) ? cx_tensor_error(s) : "(healthy)");
    cx_step_end();
}

Test(handles, step_handle_used_in_a_later_step)
{
    cx_step_begin();
    cx_tensor *x = cx_mul_scalar(vec3(3.0), 2.0);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_add_scalar(x, 1.0));   /* x went with the first step */
    cr_expect_neq(cx_step_end(), CX_OK, "a step reading a released tensor ended well");
    cr_expect(strstr(cx_last_error(), "released at the end of its step"), "%s", cx_last_error());
    cr_expect(isnan(cx_item(y)));
    /* the handle cannot be revived either */
    cr_expect_neq(cx_assign(x, vec3(0.0)), CX_OK);
    cr_expect(strstr(cx_last_error(), "assign: tensor released"), "%s", cx_last_error());
    cr_expect_eq(cx_persist(x), x);
    cr_expect(isnan(cx_item(x)));
}
