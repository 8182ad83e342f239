/* The observability registry: the flag bits and the hook table of obs.h. */
#include "obs.h"

_Atomic int cx_obs_flags = OBS_UNINIT;
cx_obs_hook_table cx_obs_hooks;

void cx_obs_set(int bit, bool on)
{
    if (on) atomic_fetch_or_explicit(&cx_obs_flags, bit, memory_order_relaxed);
    else atomic_fetch_and_explicit(&cx_obs_flags, ~bit, memory_order_relaxed);
}

void cx_obs_init(void)
{
    /* the environment reader clears OBS_UNINIT itself, under its lock */
    if (cx_obs_hooks.env) cx_obs_hooks.env();
    else cx_obs_set(OBS_UNINIT, false);
}
