/* Device buffers (reference counted) and the accounting of device memory
 * (live buffers + the executor's arena) against CX_MEMORY_LIMIT. */
#ifndef CX_BUFFER_H
#define CX_BUFFER_H

#include "base.h"

typedef struct cx_buffer {
    void *data;
    size_t bytes;
    int refs;
    bool shared;    /* from cx_comm_alloc: a collective's output */
} cx_buffer;

/* @return a buffer with one reference, or NULL (error set). */
cx_buffer *cx_buffer_new(size_t bytes);
/* The same for a collective's output: from the backend's shared memory
 * when it is large enough for in-place writes to pay and the backend has
 * some to give, else as cx_buffer_new. */
cx_buffer *cx_buffer_new_collective(size_t bytes);
void cx_buffer_ref(cx_buffer *b);
void cx_buffer_unref(cx_buffer *b);
/* Device memory accounting (live buffers + arena). */
void cx_mem_account(int64_t delta);
/* Checks a request against CX_MEMORY_LIMIT. @return CX_OK or CX_ERR_OOM. */
cx_status cx_mem_check(int64_t request, const char *what);

#endif
