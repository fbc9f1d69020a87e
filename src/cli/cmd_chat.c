/* kiln chat: an interactive multi-turn conversation in the model's chat template. Each turn renders the whole
 * history; the context reuses the KV cache for the part already evaluated. Ctrl-C stops a reply, EOF exits. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gen_opts.h"
#include "cli/prompt.h"
#include "kiln.h"

int cmd_chat(int argc, char **argv);

static volatile sig_atomic_t interrupted, replying;

/* During a reply Ctrl-C stops it; at the prompt it exits, as a shell would. */
static void on_sigint(int sig) {
    (void)sig;
    if (!replying) _exit(130);
    interrupted = 1;
}

static void usage(FILE *out) {
    fprintf(out, "usage: kiln chat -m MODEL [--system TEXT] [-n N] [options]\n\n"
                 "Interactive chat: type a message and press Enter; the reply streams to stdout. The history is kept\n"
                 "for the whole session. Ctrl-C stops a reply; Ctrl-D (end of input) exits.\n"
                 "  --system TEXT            system message\n"
                 "  -n, --n-predict N        most tokens per reply, -1 = until the model stops (default -1)\n");
    gen_opts_usage(out, 1);
}

typedef struct history {
    kiln_message *msgs;
    char **owned; /* the strings of msgs, freed at the end */
    int n, cap;
} history;

static int history_add(history *h, const char *role, const char *content) {
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 16;
        kiln_message *m = realloc(h->msgs, sizeof *m * (size_t)cap);
        if (!m) return -1;
        h->msgs = m;
        char **o = realloc(h->owned, sizeof *o * (size_t)cap);
        if (!o) return -1;
        h->owned = o;
        h->cap = cap;
    }
    char *copy = strdup(content);
    if (!copy) return -1;
    h->owned[h->n] = copy;
    h->msgs[h->n++] = (kiln_message){role, copy};
    return 0;
}

static void history_free(history *h) {
    for (int i = 0; i < h->n; i++) free(h->owned[i]);
    free(h->owned);
    free(h->msgs);
}

/* The reply as it streams: printed, and kept for the history. */
typedef struct reply {
    char *text;
    size_t len, cap;
} reply;

static int on_token(const kiln_token_event *ev, void *user) {
    reply *r = user;
    fwrite(ev->text, 1, ev->len, stdout);
    fflush(stdout);
    if (r->len + ev->len + 1 > r->cap) {
        size_t cap = (r->len + ev->len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) return 1;
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, ev->text, ev->len);
    r->len += ev->len;
    r->text[r->len] = 0;
    return interrupted;
}

static int turn(kiln_context *c, history *h, const kiln_generate_params *gp) {
    char err[512];
    int32_t *ids = NULL;
    int n = prompt_tokenize_chat(kiln_context_model(c), h->msgs, h->n, &ids);
    if (n < 0) return -1;
    reply r = {0};
    kiln_generate_result res;
    interrupted = 0;
    replying = 1;
    int rc = kiln_generate(c, ids, n, gp, on_token, &r, &res, err, sizeof err);
    replying = 0;
    free(ids);
    printf("\n");
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        free(r.text);
        return -1;
    }
    rc = history_add(h, "assistant", r.text ? r.text : "");
    free(r.text);
    return rc;
}

static int loop(kiln_context *c, history *h, const kiln_generate_params *gp) {
    char *line = NULL;
    size_t cap = 0;
    int tty = isatty(STDIN_FILENO), rc = 0;
    for (;;) {
        if (tty) fprintf(stderr, "> ");
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (history_add(h, "user", line) || turn(c, h, gp)) {
            rc = -1;
            break;
        }
    }
    free(line);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    gen_opts g;
    gen_opts_init(&g);
    const char *system = NULL;
    long n_predict = -1;
    for (int i = 1; i < argc; i++) {
        int r = gen_opts_parse(&g, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--system")) system = argv[++i];
        else if (i + 1 < argc && (!strcmp(argv[i], "-n") || !strcmp(argv[i], "--n-predict"))) {
            if (gen_parse_int(argv[i], argv[i + 1], -1, 1 << 24, &n_predict)) return 1;
            i++;
        } else {
            fprintf(stderr, "error: unknown option or missing value: %s (see 'kiln chat --help')\n", argv[i]);
            return 1;
        }
    }
    kiln_model *m;
    kiln_context *c;
    if (gen_opts_open(&g, true, &m, &c)) return 1;
    gen_opts_describe(&g, c);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    kiln_generate_params gp = kiln_generate_default_params();
    gp.max_tokens = (int)n_predict;
    gp.sampling = g.sampling;
    gp.stop = g.stop;
    gp.n_stop = g.n_stop;
    history h = {0};
    int rc = system && history_add(&h, "system", system) ? -1 : loop(c, &h, &gp);
    history_free(&h);
    kiln_context_free(c);
    kiln_model_close(m);
    return rc ? 1 : 0;
}
