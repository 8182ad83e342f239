/* A user's program built with -g that syncs from a callback of a library
 * built without -g (nodebug_lib.c): the analysis names the program's frames
 * by file and line on both sides of the library's, and the library's by its
 * symbol, without asking a debuginfod server for the library's debug info
 * (through_lib.sh). */
#include <cxla/cxla.h>

#include <stdio.h>

void nodebug_call(void (*fn)(void));

static int failed;

static void sync_in_callback(void)
{
    cx_tensor *t = cx_add(cx_ones((int64_t[]){ 2, 3 }, 2, CX_F32), cx_ones((int64_t[]){ 2, 3 }, 2, CX_F32));
    if (cx_sync() != CX_OK) failed = 1;   /* @site callback */
    cx_free(t);
}

int main(void)
{
    nodebug_call(sync_in_callback);   /* @site main */
    if (failed) fprintf(stderr, "through_lib: %s\n", cx_last_error());
    return failed;
}
