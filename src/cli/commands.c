#include "cli/commands.h"

#include <stddef.h>

/* One line per subcommand; the prototypes sit beside the table so each cmd_*.c needs no header of its own. */
#define KILN_CMD(name) int cmd_##name(int argc, char **argv);
KILN_CMD(inspect)
KILN_CMD(quantize)
KILN_CMD(run)
KILN_CMD(bench)
KILN_CMD(chat)
KILN_CMD(perplexity)
KILN_CMD(synth)
KILN_CMD(template)
KILN_CMD(tokenize)
KILN_CMD(serve)

const kiln_command KILN_COMMANDS[] = {
    {"run", cmd_run, "generate text from a prompt (--chat wraps it in the model's chat template)"},
    {"serve", cmd_serve, "serve the OpenAI-compatible HTTP API (chat, completions, models, metrics) and a chat page"},
    {"chat", cmd_chat, "interactive multi-turn chat in the model's chat template"},
    {"perplexity", cmd_perplexity, "perplexity of a text file (chunks of --ctx tokens, scored on their second half)"},
    {"bench", cmd_bench, "measure prompt and decode speed and the decode memory-bandwidth fraction (--json)"},
    {"inspect", cmd_inspect, "show a model's architecture, hyperparameters, tokenizer and tensors (--json)"},
    {"tokenize", cmd_tokenize, "print the token ids of stdin (--raw, --pieces)"},
    {"quantize", cmd_quantize, "convert a GGUF or safetensors folder to a GGUF of another type (q4_k_m, q8_0, ...)"},
    {"synth", cmd_synth, "write a random-weight model at a real shape (qwen2-1.5b, llama3-8b, smollm2-135m)"},
    {"template", cmd_template, "print the prompt a model's chat template makes of a conversation (--messages)"},
    {NULL, NULL, NULL},
};
