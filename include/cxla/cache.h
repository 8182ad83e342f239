/* cxla compile caches: the in-memory executable cache and the persistent
 * one (xr.initialize_cache), and the compile options every cache key
 * includes. */
#ifndef CXLA_CACHE_H
#define CXLA_CACHE_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- persistent compile cache ---------------------------------------------- */

/* Keeps compiled executables in `path` (created if missing), one
 * zstd-compressed file per graph key, shared safely by several processes.
 * readonly: look up but never write. Must be called before any
 * computation. @return CX_OK, CX_ERR_STATE (too late, or already
 * initialized with another path), CX_ERR_IO (cannot create the directory). */
CX_API cx_status cx_cache_init(const char *path, bool readonly);
/* @return the cache directory (the library's copy, kept for the process),
 * or NULL when there is none. */
CX_API const char *cx_cache_dir(void);
/* Compile options: a free-form string that is part of every cache key
 * (default: $XLA_FLAGS and $CX_COMPILE_OPTIONS). Changing it never reuses
 * an executable compiled under other options. */
CX_API void cx_set_compile_options(const char *opts);
/* @return the library's copy, valid until the next cx_set_compile_options. */
CX_API const char *cx_get_compile_options(void);
/* Drops every executable cached in memory (the persistent cache keeps its
 * files) and the intermediate arena they ran in, which otherwise keeps the
 * size of the largest graph run so far. Call it outside a step. */
CX_API void cx_cache_clear(void);

#ifdef __cplusplus
}
#endif
#endif
