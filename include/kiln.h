/* kiln: the public C API. Open a model, make a context, tokenize, generate, free.
 * The kiln CLI and server are built on this same API.
 *
 *     char err[512];
 *     kiln_model *m = kiln_model_open("model.gguf", err, sizeof err);
 *     kiln_context_params cp = kiln_context_default_params();
 *     kiln_context *c = kiln_context_new(m, &cp, err, sizeof err);
 *     int32_t ids[256];
 *     int n = kiln_tokenize_text(m, "Once upon a time", true, false, ids, 256, err, sizeof err);
 *     kiln_generate_params gp = kiln_generate_default_params();
 *     kiln_generate(c, ids, n, &gp, on_token, user, &result, err, sizeof err);
 *     kiln_context_free(c);
 *     kiln_model_close(m);
 *
 * Functions that can fail return NULL or -1 and write a message into err (err_size bytes, may be NULL/0). */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Library version, "MAJOR.MINOR.PATCH". */
const char *kiln_version(void);

/* ---- models ---- */

typedef struct kiln_model kiln_model;

/* Opens a GGUF file or a safetensors model folder (weights stay memory-mapped). */
kiln_model *kiln_model_open(const char *path, char *err, size_t err_size);
/* Contexts on one model share its weights (on a GPU, one upload for all of them) and keep the model: it may be
 * closed before them, and goes with the last. */
void kiln_model_close(kiln_model *m);

int kiln_model_n_vocab(const kiln_model *m);
int kiln_model_n_ctx_train(const kiln_model *m);
const char *kiln_model_arch(const kiln_model *m);
/* False for a model without a tokenizer (a GGUF whose tokenizer.ggml.model is absent or "none", a safetensors folder
 * without tokenizer.json): it evaluates token ids (kiln_eval), and tokenizing or generating text fails saying so. */
bool kiln_model_has_tokenizer(const kiln_model *m);
/* Whether prompts start with BOS (tokenizer.ggml.add_bos_token). */
bool kiln_model_add_bos(const kiln_model *m);
/* Bytes of weights read to decode one token (every layer, the head, one embedding row). */
uint64_t kiln_model_bytes_per_token(const kiln_model *m);

/* ---- tokens ---- */

/* Text → ids. add_special: BOS (and EOS) as the model's flags say; parse_special: special-token text such as
 * "<|im_start|>" becomes that token. Writes at most max_ids ids and returns how many the text needs, or -1. */
int kiln_tokenize_text(const kiln_model *m, const char *text, bool add_special, bool parse_special, int32_t *ids,
                       int max_ids, char *err, size_t err_size);
/* The bytes of one token as text (special tokens included), not NUL-terminated; NULL for a bad id. */
const char *kiln_model_token_text(const kiln_model *m, int32_t id, size_t *len);
bool kiln_model_is_eog(const kiln_model *m, int32_t id);

/* ---- chat ---- */

typedef struct kiln_message {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} kiln_message;

/* Renders messages with the model's chat template (ChatML when it has none). Returns a malloc'd string to free
 * with kiln_free, or NULL. Tokenize the result with kiln_tokenize_chat. */
char *kiln_chat_render(const kiln_model *m, const kiln_message *messages, size_t n_messages,
                       bool add_generation_prompt, char *err, size_t err_size);
/* Tokenizes rendered chat text: special tokens parsed, BOS added per the model's flag unless the text already
 * starts with it. Same contract as kiln_tokenize_text. */
int kiln_tokenize_chat(const kiln_model *m, const char *text, int32_t *ids, int max_ids, char *err, size_t err_size);
void kiln_free(void *p);

/* ---- contexts ---- */

typedef struct kiln_context kiln_context;

/* Where a context runs. AUTO: the GPU when kiln was built with CUDA and one answers, else the CPU. */
typedef enum kiln_device { KILN_DEVICE_CPU = 0, KILN_DEVICE_CUDA = 1, KILN_DEVICE_AUTO = 2 } kiln_device;

typedef struct kiln_context_params {
    int n_ctx;      /* tokens of KV cache; 0: the model's training context, at most 4096 */
    int n_threads;  /* 0: physical cores */
    int n_batch;    /* prompt tokens per matrix-matrix step; 0: 512 on the CPU, 2048 on a GPU */
    bool kv_f32;    /* F32 KV cache instead of F16 */
    bool reference; /* the plain F32 reference forward pass (slow; for checking) */
    kiln_device device; /* default CPU; the CLI asks for AUTO */
} kiln_context_params;

kiln_context_params kiln_context_default_params(void);
kiln_context *kiln_context_new(kiln_model *m, const kiln_context_params *p, char *err, size_t err_size);
void kiln_context_free(kiln_context *c);
int kiln_context_n_ctx(const kiln_context *c);
int kiln_context_n_threads(const kiln_context *c);
const kiln_model *kiln_context_model(const kiln_context *c);
/* The device a context runs on: KILN_DEVICE_CPU or KILN_DEVICE_CUDA (never AUTO). */
kiln_device kiln_context_device(const kiln_context *c);

/* Bytes a context uses on the device it runs on (GPU memory for CUDA, host memory for the CPU). */
typedef struct kiln_memory {
    uint64_t weights;   /* the model's weights: uploaded to the GPU, or on the CPU mapped from the file */
    uint64_t kv_cache;  /* keys and values of n_ctx positions */
    uint64_t workspace; /* activations and scratch */
} kiln_memory;
kiln_memory kiln_context_memory(const kiln_context *c);

/* Evaluates ids at positions pos..pos+n-1 (positions before pos stay cached; later ones are dropped) and writes
 * the last token's logits (n_vocab floats), or every token's (n * n_vocab) when all_logits. logits may be NULL. */
int kiln_eval(kiln_context *c, const int32_t *ids, int n, int pos, float *logits, bool all_logits, char *err,
              size_t err_size);

/* ---- generation ---- */

#define KILN_SEED_RANDOM UINT64_MAX
#define KILN_MAX_TOP_LOGPROBS 20

/* The sampling chain, in the reference engines' order: penalties, top-k, top-p, min-p, temperature, draw. */
typedef struct kiln_sampling_params {
    float temperature;       /* <= 0: greedy */
    int top_k;               /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off */
    int repeat_last_n;       /* tokens the penalties look back over; -1: all */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;           /* KILN_SEED_RANDOM: from the clock */
    int n_top_logprobs;      /* alternatives reported per token, 0..KILN_MAX_TOP_LOGPROBS */
} kiln_sampling_params;

/* temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties, random seed. */
kiln_sampling_params kiln_sampling_default_params(void);

typedef struct kiln_generate_params {
    int max_tokens;          /* -1: until end of generation or a full context */
    const char *const *stop; /* stop strings (not included in the output) */
    int n_stop;
    kiln_sampling_params sampling;
} kiln_generate_params;

kiln_generate_params kiln_generate_default_params(void);

/* One generated token. text is what becomes printable with it: whole UTF-8 characters only, and text that could
 * be the start of a stop string is held back until it is known not to be. A last event with token -1 flushes what
 * remains. Log-probabilities are of the distribution after penalties, before truncation and temperature. */
typedef struct kiln_token_event {
    int32_t token;
    const char *text;
    size_t len;
    float logprob;
    int n_top;
    const int32_t *top_tokens;
    const float *top_logprobs;
} kiln_token_event;

/* Return nonzero to stop generating. */
typedef int (*kiln_token_callback)(const kiln_token_event *ev, void *user);

typedef enum kiln_finish {
    KILN_FINISH_EOG,      /* the model ended its turn */
    KILN_FINISH_LENGTH,   /* max_tokens, or the context is full */
    KILN_FINISH_STOP,     /* a stop string */
    KILN_FINISH_CALLBACK, /* the callback asked to stop */
} kiln_finish;

typedef struct kiln_generate_result {
    kiln_finish finish;
    int n_prompt;      /* prompt tokens */
    int n_cached;      /* of those, reused from the previous call's KV cache */
    int n_generated;
    double prefill_ms; /* evaluating the uncached prompt tokens */
    double decode_ms;  /* the rest */
} kiln_generate_result;

/* Generates a continuation of prompt. The longest prefix shared with what the context evaluated last is reused from
 * the KV cache, so a chat can pass its whole history each turn. Fails before generating when the prompt, or prompt
 * plus max_tokens, does not fit the context. */
int kiln_generate(kiln_context *c, const int32_t *prompt, int n_prompt, const kiln_generate_params *p,
                  kiln_token_callback cb, void *user, kiln_generate_result *result, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
