/* Pre-tokenizer regexes by tokenizer.ggml.pre, as llama.cpp (src/llama-vocab.cpp) maps them.
 * Where llama.cpp rewrote a tokenizer.json regex only because std::regex lacks a feature ((?i:...), \p{Lu},
 * possessive quantifiers), the original regex is used: PCRE2 has those features, and the original is what the
 * reference (HF tokenizers) runs. */
#include <stddef.h>
#include <string.h>

#include "tokenizer/pretok.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define RE_LLAMA3                                                                                                    \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                                     \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK_DEEPSEEK "[一-龥ࠀ-一가-퟿]+"
#define RE_PUNCT_WORDS                                                                                               \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
#define RE_CASED_WORDS                                                                                               \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACTIONS        \
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACTIONS "?"
#define RE_SCANDI_WORDS " ?[^(\\s|.,!?…。，、।۔،)]+"

#define NAMES(...) (const char *const[]){__VA_ARGS__, NULL}
#define REGEXES(...) (const char *const[]){__VA_ARGS__, NULL}

static const kiln_pretok table[] = {
    {NAMES("default"),
     REGEXES("[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"), false, false, false},
    {NAMES("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     REGEXES(RE_LLAMA3), true, true, false},
    {NAMES("dbrx", "smaug-bpe"), REGEXES(RE_LLAMA3), false, false, false},
    {NAMES("glm4", "chatglm-bpe"), REGEXES(RE_LLAMA3), false, false, true},
    {NAMES("jais-2"),
     REGEXES(RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
                             "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)"
                             "|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"),
     false, false, false},
    /* the cased-letter class is spelled in escapes: several of its code points (U+2126, U+212A, U+1F7D, ...) turn
     * into others under Unicode normalization, which editors and copy-paste apply silently */
    {NAMES("deepseek-llm"),
     REGEXES("[\r\n]",
             "\\s?[A-Za-z"
             "\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}\\x{01BC}-\\x{01BF}"
             "\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}\\x{0376}-\\x{0377}\\x{037B}-\\x{037D}"
             "\\x{037F}\\x{0386}\\x{0388}-\\x{038A}\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}"
             "\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
             "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
             "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}"
             "\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"
             "\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
             "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
             "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
             "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}-\\x{2184}"
             "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}-\\x{2CF3}\\x{A640}-\\x{A66D}"
             "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
             "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
             "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"
             "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
             "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", RE_CJK_DEEPSEEK, "\\p{N}+"),
     false, false, false},
    {NAMES("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
     REGEXES("\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
             RE_PUNCT_WORDS "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("spark2_5"),
     REGEXES("\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", RE_PUNCT_WORDS "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
             "\\p{N}"),
     false, false, false},
    {NAMES("youtu"),
     REGEXES("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
             RE_CASED_WORDS "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     true, false, false},
    {NAMES("deepseek-coder"), REGEXES("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_DEEPSEEK, "\\p{N}"), false,
     false, false},
    {NAMES("falcon"), REGEXES("[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"), false, false, false},
    {NAMES("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     REGEXES("\\p{N}", RE_GPT2), false, false, false},
    {NAMES("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
           "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion",
           "granite-docling"),
     REGEXES(RE_GPT2), false, false, false},
    {NAMES("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
     REGEXES(RE_QWEN2), false, false, false},
    {NAMES("qwen35"),
     REGEXES(RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
                             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("poro-chat", "bloom", "gpt3-finnish"), REGEXES(RE_SCANDI_WORDS), false, false, false},
    {NAMES("viking"), REGEXES(RE_SCANDI_WORDS, "\\p{N}"), false, false, false},
    {NAMES("tekken"),
     REGEXES("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
             "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
             "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     true, true, false},
    {NAMES("chameleon"),
     REGEXES("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
             "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2),
     false, true, false},
    {NAMES("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
     REGEXES(RE_CASED_WORDS "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), false,
     false, false},
    {NAMES("granite-embed-multi-97m"),
     REGEXES("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+" RE_CONTRACTIONS
             "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*" RE_CONTRACTIONS
             "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     true, false, false},
    {NAMES("tiny_aya", "cohere2moe"),
     REGEXES("\\d{1,3}(?=(?:\\d{3})*\\b)",
             RE_CASED_WORDS "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("superbpe"), REGEXES("\\p{N}+", "(?=(\\d{3})+(?!\\d))"), false, false, false},
    {NAMES("bailingmoe", "bailingmoe2", "llada-moe"),
     REGEXES("'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*"
             "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("seed-coder"),
     REGEXES(RE_CONTRACTIONS "|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\r\n]+|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("ufakzeka"),
     REGEXES("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), false,
     false, false},
    /* llama.cpp splits digit runs in code (a leading group of 1-2, then threes). The lookahead says the same; it
     * runs only at the start of a run (after that, threes follow), so the split stays linear in the run's length */
    {NAMES("afmoe"),
     REGEXES("(?<!\\p{N})\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))|\\p{N}{3}",
             "[一-鿿㐀-䶿\\x{F900}-\\x{FAFF}぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
             RE_PUNCT_WORDS "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("laguna"), REGEXES("[^\\n]+|[\\n]+", RE_QWEN2), false, false, false},
    {NAMES("exaone-moe"),
     REGEXES(RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
                             "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"),
     false, false, false},
    {NAMES("minicpm5"),
     REGEXES("\\p{N}{1,3}", RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                                           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
     true, false, false},
};

const kiln_pretok *kiln_pretok_table(size_t *n) {
    *n = sizeof table / sizeof table[0];
    return table;
}

const kiln_pretok *kiln_pretok_default(void) { return &table[0]; }

const kiln_pretok *kiln_pretok_find(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        for (const char *const *n = table[i].names; *n; n++)
            if (!strcmp(*n, name)) return &table[i];
    return NULL;
}
