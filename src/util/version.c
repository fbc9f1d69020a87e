#include "kiln.h"

const char *kiln_version(void) { return "0.1.0"; }
