/* The web chat page served at GET /: one self-contained HTML file (styles and script inline), compiled into the
 * binary from src/server/web/index.html so that `kiln serve` needs no files beside it. */
#ifndef KILN_SERVER_WEB_ASSET_H
#define KILN_SERVER_WEB_ASSET_H

#include <stddef.h>

/* The page's bytes (UTF-8, NUL-terminated for convenience); *len gets the length without the NUL. Static storage:
 * never freed. */
const char *kiln_web_index_html(size_t *len);

#endif
