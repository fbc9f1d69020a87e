/* Hugging Face model folders (config.json, tokenizer.json, model.safetensors or shards listed in
 * model.safetensors.index.json) presented as a kiln_gguf, so everything past format/ sees one kind of container.
 *
 * What the translation gives:
 *  - Tensors under their GGUF names (blk.N.attn_q.weight, token_embd.weight, ...), shapes in GGUF order (ne[0] is
 *    the last safetensors dimension, the row length), matrices F32/F16/BF16 as stored, 1-D tensors (norms, biases)
 *    always F32 as in a GGUF. Data points into the read-only mappings, except for the widened 1-D tensors and the
 *    tensors below, which are owned copies.
 *  - Rope layout: for the llama architecture (HF llama and mistral) the rows of q_proj and k_proj (and their biases)
 *    are permuted at load exactly as llama.cpp's converter does, turning HF's "rotate halves" layout into GGUF
 *    llama's interleaved pairs. A llama container from safetensors is therefore indistinguishable from a converted
 *    GGUF: executors apply normal (GPT-J style, adjacent pairs) rope to llama and NeoX rope to qwen2, whichever file
 *    the model came from. The permuted tensors cost an owned copy (q and k only).
 *  - Llama-3 rope scaling (rope_scaling.rope_type "llama3") becomes a rope_freqs.weight F32 tensor of head_dim/2
 *    per-frequency divisors, as llama.cpp's converter writes it; "linear" and "yarn" become rope.scaling.* keys.
 *  - config.json becomes <arch>.* keys and tokenizer.json/tokenizer_config.json become tokenizer.ggml.* keys and
 *    tokenizer.chat_template (rules in hf_config.c and hf_tokenizer.c). A folder without tokenizer.json gives no
 *    tokenizer.* keys: the model loads with no tokenizer, as a GGUF without tokenizer.ggml.model does.
 * The container has version 0; kiln_gguf_close() releases it like any other. */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/error.h"

/* Largest JSON header accepted (the reference implementation's limit). */
#define KILN_SAFETENSORS_MAX_HEADER (100u * 1024 * 1024)

/* One tensor of a .safetensors file as its header describes it, after validation. */
typedef struct kiln_st_entry {
    char *name;
    kiln_type type; /* F32, F16 or BF16 */
    uint32_t n_dims;
    int64_t shape[KILN_MAX_DIMS]; /* safetensors (row-major, outermost first) order */
    uint64_t begin, end;          /* absolute byte offsets in the file */
} kiln_st_entry;

/* Parses and validates the header of a whole .safetensors file held in memory (header length, JSON object,
 * dtypes, shapes, offsets inside the data area, sizes, no overlaps, no duplicate names). `what` names the file in
 * errors. On success *out holds *n entries; free them with kiln_st_entries_free(). */
int kiln_safetensors_parse(const void *file, uint64_t size, const char *what, kiln_st_entry **out, size_t *n,
                           kiln_error *err);
void kiln_st_entries_free(kiln_st_entry *e, size_t n);

/* Opens an HF model folder as a container (see above). Errors name the file and the field. */
int kiln_safetensors_open_dir(const char *dir, kiln_gguf **out, kiln_error *err);

#endif
