/* The library's own version, fixed when it is built: a program compiled
 * against other headers compares it with CX_VERSION_NUMBER. */
#include <cxla/core.h>

unsigned cx_version_number(void) { return CX_VERSION_NUMBER; }
