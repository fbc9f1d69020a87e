/* The default model's path, from scripts/fetch-model.sh (which fetches it once if missing). */
#ifndef KILN_TESTS_MODEL_PATH_H
#define KILN_TESTS_MODEL_PATH_H

#include <stddef.h>

/* Writes the path into buf; returns 0, or -1 when the script fails. */
int kiln_test_model_path(char *buf, size_t cap);

#endif
