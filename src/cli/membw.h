/* Memory read bandwidth of this machine, measured the way decoding uses memory: threads streaming through a buffer
 * much larger than the caches. */
#ifndef KILN_CLI_MEMBW_H
#define KILN_CLI_MEMBW_H

/* Bytes per second read by n_threads threads over a buffer of mib MiB (best of a few passes); 0 on failure. */
double membw_read(int n_threads, int mib);

#endif
