/* Turning a command's prompt into tokens: raw text, a chat wrapped in the model's template, or explicit ids. */
#ifndef KILN_CLI_PROMPT_H
#define KILN_CLI_PROMPT_H

#include <stdint.h>

#include "kiln.h"

/* Tokenizes text as the reference engines do (BOS per the model flag, special-token text parsed); *ids is malloc'd. Returns the count or -1
 * after printing an error. */
int prompt_tokenize(const kiln_model *m, const char *text, int32_t **ids);
/* The same with special-token text read as plain text (for scoring ordinary text). */
int prompt_tokenize_plain(const kiln_model *m, const char *text, int32_t **ids);
/* Renders messages with the chat template and tokenizes the result. */
int prompt_tokenize_chat(const kiln_model *m, const kiln_message *msgs, int n_msgs, int32_t **ids);
/* Parses "1,2,3" into ids. */
int prompt_parse_ids(const char *list, int32_t **ids);

#endif
