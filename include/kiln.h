/* kiln: the public C API. Open a model, make a context, tokenize, generate, free.
 * The kiln CLI and server are built on this same API. */
#ifndef KILN_H
#define KILN_H

#ifdef __cplusplus
extern "C" {
#endif

/* Library version, "MAJOR.MINOR.PATCH". */
const char *kiln_version(void);

#ifdef __cplusplus
}
#endif

#endif
