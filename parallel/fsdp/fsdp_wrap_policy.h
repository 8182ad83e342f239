/* Helpers of the FSDP wrappers' auto-wrap walks (fsdp_wrap_policy.c). */
#ifndef CX_FSDP_WRAP_POLICY_H
#define CX_FSDP_WRAP_POLICY_H

#include <stdbool.h>

/* @return whether s is one of list[0..n) (NULL entries never match). */
bool cx_fsdp_listed(const char *s, const char *const *list, int n);
/* "a.b", or "b" when a is "" (the root). @return a malloc'd string
 * (release with free()), or NULL when out of memory. */
char *cx_fsdp_join_path(const char *a, const char *b);

#endif
