/* GGUF v3 writer. Metadata and tensor infos are collected first (small), then the file is written front to back:
 * header, metadata, tensor infos, padding, and each tensor's data streamed in order, so a model of many gigabytes
 * never has to sit in memory. The layout follows the rules llama.cpp checks: data offsets are consecutive, each
 * padded to general.alignment (default 32), relative to the aligned start of the data section.
 *
 *     kiln_gguf_writer *w = kiln_gguf_writer_new();
 *     kiln_gguf_writer_add_str(w, "general.architecture", "llama");
 *     kiln_gguf_writer_add_tensor(w, "token_embd.weight", KILN_TYPE_Q8_0, 2, (int64_t[]){576, 49152});
 *     kiln_gguf_writer_open(w, "out.gguf", err);        // writes everything up to the tensor data
 *     kiln_gguf_writer_write(w, rows, nbytes, err);      // as often as needed, tensor after tensor
 *     kiln_gguf_writer_close(w, err);                    // checks every byte arrived, then renames into place
 *     kiln_gguf_writer_free(w);
 *
 * The file is written to "<path>.tmp" and renamed on a successful close, so an interrupted run leaves no
 * half-written model under the final name. */
#ifndef KILN_FORMAT_GGUF_WRITER_H
#define KILN_FORMAT_GGUF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

typedef struct kiln_gguf_writer kiln_gguf_writer;

kiln_gguf_writer *kiln_gguf_writer_new(void); /* NULL when out of memory */
/* Frees the writer; a file still open is abandoned and its .tmp removed. */
void kiln_gguf_writer_free(kiln_gguf_writer *w);

/* Metadata, written in the order added. A repeated key, an invalid value or running out of memory makes the call
 * return -1; the first such failure is also remembered and reported by kiln_gguf_writer_open, so a long list of
 * additions needs only that one check. "general.alignment" (u32, a power of two) sets the data alignment. */
int kiln_gguf_writer_add_value(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v);
int kiln_gguf_writer_add_u32(kiln_gguf_writer *w, const char *key, uint32_t v);
int kiln_gguf_writer_add_i32(kiln_gguf_writer *w, const char *key, int32_t v);
int kiln_gguf_writer_add_u64(kiln_gguf_writer *w, const char *key, uint64_t v);
int kiln_gguf_writer_add_f32(kiln_gguf_writer *w, const char *key, float v);
int kiln_gguf_writer_add_bool(kiln_gguf_writer *w, const char *key, bool v);
int kiln_gguf_writer_add_str(kiln_gguf_writer *w, const char *key, const char *v);
/* An array of numbers in native layout (elem_type UINT8..FLOAT64 or BOOL). Arrays of arrays (via add_value) are
 * valid GGUF but llama.cpp refuses them: keep them out of files meant for it. */
int kiln_gguf_writer_add_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_vtype elem_type, const void *data,
                             uint64_t n);
int kiln_gguf_writer_add_str_arr(kiln_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Every key of an open container (e.g. one read from a file or built with kiln_meta), in its order. */
int kiln_gguf_writer_add_kvs(kiln_gguf_writer *w, const kiln_gguf *g);

/* Declares the next tensor: ne[0] is the row length and must be a multiple of the type's block size. Tensor data
 * is later written in the order of these calls. Returns the tensor's index, or -1 (remembered, as above). */
int64_t kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, uint32_t n_dims,
                                    const int64_t *ne);
/* Bytes of tensor i's data, as the file will hold it. */
uint64_t kiln_gguf_writer_tensor_size(const kiln_gguf_writer *w, uint64_t i);

/* Creates the file and writes the header, metadata and tensor infos. */
int kiln_gguf_writer_open(kiln_gguf_writer *w, const char *path, kiln_error *err);
/* Appends n bytes of tensor data; a call may not run past the end of the current tensor. Padding between tensors
 * is written automatically when a tensor is complete. */
int kiln_gguf_writer_write(kiln_gguf_writer *w, const void *data, size_t n, kiln_error *err);
/* Writes tensor i whole; i must be the next tensor expected. */
int kiln_gguf_writer_write_tensor(kiln_gguf_writer *w, uint64_t i, const void *data, kiln_error *err);
/* Checks that every tensor was written, flushes, and moves the file to its final name. */
int kiln_gguf_writer_close(kiln_gguf_writer *w, kiln_error *err);

#endif
