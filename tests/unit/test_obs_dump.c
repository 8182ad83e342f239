/* Graph dumps: XLA_SAVE_TENSORS_FILE (text and dot) and cx_ir_text /
 * cx_ir_dot for pending tensors; the dot output must render with Graphviz. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

static void known_graph(cx_tensor **kept)
{
    cx_tensor *a = cx_from_host((float[]){ 1, 2, 3, 4, 5, 6 }, (int64_t[]){ 2, 3 }, 2, CX_F32);
    cx_tensor *b = cx_from_host((float[]){ 1, 0, 0, 1, 1, 1 }, (int64_t[]){ 3, 2 }, 2, CX_F32);
    cx_step_begin();
    cx_tensor *m = cx_matmul(a, b);                       /* (2, 2) */
    cx_tensor *t = cx_tanh(cx_add_scalar(m, 0.5));
    *kept = cx_keep(cx_sum(t, NULL, 0, false));
}

static bool dot_renders(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "dot -Tsvg '%s' -o /dev/null 2>/dev/null", path);
    return system(cmd) == 0;
}

static void hash_of_last(char *buf, size_t cap)
{
    cx_exec_info ei = cx_last_exec_info();
    snprintf(buf, cap, "%016llx%016llx", (unsigned long long)ei.key_hi, (unsigned long long)ei.key_lo);
}

Test(obs_dump, text_record_has_ops_and_hash)
{
    char path[256], hash[40];
    snprintf(path, sizeof path, "/tmp/cx_obs_dump_%d.txt", (int)getpid());
    unlink(path);
    setenv("XLA_SAVE_TENSORS_FILE", path, 1);
    setenv("XLA_SAVE_TENSORS_FMT", "text", 1);
    cx_debug_reload_env();
    cx_tensor *y;
    known_graph(&y);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    hash_of_last(hash, sizeof hash);
    known_graph(&y);   /* the same graph again: a second record, same hash */
    cr_assert_eq(cx_step_end(), CX_OK);
    char *s = obs_read_file(path);
    cr_assert(s);
    cr_expect_eq(obs_count(s, "## BEGIN_GRAPH"), 2, "%s", s);
    cr_expect_eq(obs_count(s, hash), 2, "hash %s in:\n%s", hash, s);
    cr_expect(strstr(s, "Cause: step end\n"), "%s", s);
    cr_expect(strstr(s, "Compile: compiled\n") && strstr(s, "Compile: cache hit\n"), "%s", s);
    cr_expect(strstr(s, "IR {\n"));
    cr_expect(strstr(s, " = f32[2,3] device_data()"), "%s", s);
    cr_expect(strstr(s, " = f32[2,2] matmul(%0, %1)"), "%s", s);
    cr_expect(strstr(s, " tanh(%"), "%s", s);
    cr_expect(strstr(s, "] sum(%"), "%s", s);
    cr_expect(strstr(s, ", ROOT=0\n"), "%s", s);
    cr_expect(strstr(s, "constant(), value=0.5"), "%s", s);
    free(s);
    unlink(path);
    unsetenv("XLA_SAVE_TENSORS_FILE");
}

Test(obs_dump, dot_record_renders)
{
    char path[256], hash[40];
    snprintf(path, sizeof path, "/tmp/cx_obs_dump_%d.dot", (int)getpid());
    unlink(path);
    setenv("XLA_SAVE_TENSORS_FILE", path, 1);
    setenv("XLA_SAVE_TENSORS_FMT", "dot", 1);
    cx_debug_reload_env();
    cx_tensor *y;
    known_graph(&y);
    cr_assert_eq(cx_step_end(), CX_OK);
    hash_of_last(hash, sizeof hash);
    char *s = obs_read_file(path);
    cr_assert(s);
    cr_expect(strstr(s, "digraph G {"), "%s", s);
    cr_expect(strstr(s, hash), "%s", s);
    cr_expect(strstr(s, "matmul\\nf32[2,2]"), "%s", s);
    cr_expect(strstr(s, " -> "), "%s", s);
    cr_expect(dot_renders(path), "dot -Tsvg rejected:\n%s", s);
    free(s);
    unlink(path);
}

Test(obs_dump, pending_ir_text_and_dot)
{
    cx_tensor *y;
    known_graph(&y);
    cx_set_name(y, "total");
    char *t = cx_ir_text(&y, 1);
    cr_assert(t, "%s", cx_last_error());
    cr_expect(!strncmp(t, "IR {\n", 5), "%s", t);
    cr_expect(strstr(t, "matmul(%0, %1)"), "%s", t);
    cr_expect(strstr(t, ", ROOT=0 (total)\n"), "%s", t);
    cr_expect(cx_is_pending(y), "dumping must not run anything");
    char *d = cx_ir_dot(&y, 1);
    cr_assert(d);
    char path[256];
    snprintf(path, sizeof path, "/tmp/cx_obs_ir_%d.dot", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(d, f);
    fclose(f);
    cr_expect(dot_renders(path), "%s", d);
    unlink(path);
    cr_assert_eq(cx_step_end(), CX_OK);
    /* a materialized tensor is a single device_data leaf */
    char *t2 = cx_ir_text(&y, 1);
    cr_expect_str_eq(t2, "IR {\n  %0 = f32[] device_data(), ROOT=0 (total)\n}\n");
    free(t);
    free(d);
    free(t2);
}

/* XLA_SAVE_TENSORS_FMT=hlo: the record is the lowered program, and
 * cx_ir_text compiles a pending graph into the same text (nothing runs). */
Test(obs_dump, hlo_record_and_ir_text_are_the_program)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/cx_obs_hlo_%d.txt", (int)getpid());
    unlink(path);
    setenv("XLA_SAVE_TENSORS_FILE", path, 1);
    setenv("XLA_SAVE_TENSORS_FMT", "hlo", 1);
    cx_debug_reload_env();
    cx_tensor *y;
    known_graph(&y);
    char *t = cx_ir_text(&y, 1);
    cr_assert(t, "%s", cx_last_error());
    cr_expect(cx_is_pending(y), "cx_ir_text must not run anything");
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cx_exec_info ei = cx_last_exec_info();
    char want[96];
    snprintf(want, sizeof want, "\nKernels: %d, collectives: 0, inputs: 2, outputs: 1\n", ei.num_kernels);
    cr_expect(strstr(t, want), "want '%s' in:\n%s", want + 1, t);
    cr_expect(strstr(t, "  k0 matmul f32[2,2] "), "%s", t);
    cr_expect(strstr(t, "path: sgemm, OpenBLAS"), "a 2x2 product is OpenBLAS's: %s", t);
    char *rec = NULL;
    size_t cap = 0;
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    ssize_t n = getdelim(&rec, &cap, '\0', f);
    fclose(f);
    cr_assert(n > 0);
    cr_expect(strstr(rec, "## BEGIN_PROGRAM\n"), "%s", rec);
    cr_expect(strstr(rec, want), "want '%s' in the record:\n%s", want + 1, rec);
    cr_expect(strstr(rec, "tanh"), "the fused ops are listed: %s", rec);
    free(rec);
    free(t);
    unlink(path);
    unsetenv("XLA_SAVE_TENSORS_FILE");
    unsetenv("XLA_SAVE_TENSORS_FMT");
    cx_debug_reload_env();
    cx_free(y);
}
