/* CX_API marks the public API: the library is built with hidden visibility,
 * and only functions declared with CX_API in include/cxla/ are exported
 * (tests/api checks that the two lists match). */
#ifndef CXLA_EXPORT_H
#define CXLA_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CX_API __attribute__((visibility("default")))
#else
#define CX_API
#endif

#endif
