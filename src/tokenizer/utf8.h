/* UTF-8 helpers for the tokenizers, and GPT-2's byte <-> unicode table. */
#ifndef KILN_TOKENIZER_UTF8_H
#define KILN_TOKENIZER_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length a lead byte announces (1 for continuation and invalid bytes), as llama.cpp's SPM/BPE symbol split reads it. */
static inline size_t kiln_utf8_lead_len(uint8_t c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Encodes cp (<= 0x10FFFF) into out; returns 1..4. */
size_t kiln_utf8_encode(uint32_t cp, char out[4]);

/* Length of the sequence at s that llama.cpp's decoder accepts (lead byte plus the continuation bytes it announces,
 * not checked for overlong forms), or 0 if it rejects the byte at s. */
size_t kiln_utf8_loose_len(const char *s, size_t n);

/* Length of the strictly valid UTF-8 character at s (no overlongs, surrogates or values above U+10FFFF), 0 if the
 * bytes at s are not one, -1 (as SIZE_MAX) if they are a valid but incomplete start. Decodes into *cp. */
#define KILN_UTF8_INCOMPLETE ((size_t)-1)
size_t kiln_utf8_strict_len(const char *s, size_t n, uint32_t *cp);

/* Copies text into out replacing every byte llama.cpp's decoder rejects by U+FFFD; out must hold 3 * n bytes.
 * Returns the bytes written. */
size_t kiln_utf8_sanitize(const char *text, size_t n, char *out);

/* GPT-2 byte-level table: byte b is represented by the code point kiln_byte_to_cp(b). */
uint32_t kiln_byte_to_cp(uint8_t b);
/* The byte a code point stands for, or -1 if it is not in the table. */
int kiln_cp_to_byte(uint32_t cp);

#endif
