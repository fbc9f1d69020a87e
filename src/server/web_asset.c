#include "server/web_asset.h"

/* index_html.inc is generated in the build tree from web/index.html (see web/web.cmake); it ends with a 0 byte. */
static const unsigned char index_html[] = {
#include "index_html.inc"
};

const char *kiln_web_index_html(size_t *len) {
    *len = sizeof index_html - 1;
    return (const char *)index_html;
}
