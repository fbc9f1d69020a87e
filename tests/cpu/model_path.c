#include "model_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_test_model_path(char *buf, size_t cap) {
    const char *src = getenv("KILN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/scripts/fetch-model.sh", src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char *line = fgets(buf, (int)cap, p);
    int rc = pclose(p);
    if (!line || rc != 0) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}
