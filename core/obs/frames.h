/* A return address as the program's source (frames.c). */
#ifndef CX_OBS_FRAMES_H
#define CX_OBS_FRAMES_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char fn[128];      /* function, "??" when unknown */
    char file[512];    /* source path as the compiler recorded it */
    int line;
} cx_obs_frame;

/* The source of the code at addr (a return address minus 1), from the
 * DWARF of the module holding it: the function at addr first, then each
 * function it was inlined into, at the line of that call.
 * @return how many of out[0..max) were filled; 0 when the module has no line
 *         information, and then *symbol, if not NULL, names the function
 *         from the module's symbol table (*sym_off bytes into it). */
int cx_obs_frame_lookup(uintptr_t addr, cx_obs_frame *out, int max, const char **symbol, uintptr_t *sym_off);

#endif
