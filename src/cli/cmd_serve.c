/* kiln serve: the OpenAI-compatible HTTP server over one model, until SIGINT or SIGTERM. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gen_opts.h"
#include "server/server.h"

int cmd_serve(int argc, char **argv);

typedef struct serve_opts {
    const char *model, *alias;
    srv_options srv;
    kiln_sched_params sched;
} serve_opts;

static int stop_pipe[2];
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    stop_signal = sig;
    char byte = 1;
    ssize_t n = write(stop_pipe[1], &byte, 1); /* a full pipe already holds a wake-up */
    (void)n;
}

static void usage(FILE *out) {
    fprintf(out, "usage: kiln serve -m MODEL [options]\n\n"
                 "Serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models), /health, /metrics\n"
                 "and a chat page at /. Runs until SIGINT or SIGTERM. See docs/server.md.\n"
                 "  -m, --model PATH         GGUF file or safetensors folder (required)\n"
                 "  --host ADDR              address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
                 "  --port N                 TCP port (default 8080; 0 = any free port, printed at start)\n"
                 "  --parallel N             sequences generated at once (default 4)\n"
                 "  -c, --ctx N              most tokens per request, prompt and completion (default: the model's,\n"
                 "                           at most 4096)\n"
                 "  --queue N                requests that may wait beyond --parallel (default 256)\n"
                 "  -t, --threads N          CPU threads (default: physical cores)\n"
                 "  --device cpu|cuda|auto   where to run (default auto)\n"
                 "  --gpu-f16 on|off|auto    GPU: F16 activations on tensor cores in the batched step (default\n"
                 "                           auto: on for F16/BF16 models, off for quantized ones, where it gives\n"
                 "                           more tokens a second from ~4-8 busy sequences and for prompts, fewer\n"
                 "                           for one or two; see docs/cuda.md, half mode)\n"
                 "  --api-key KEY            require 'Authorization: Bearer KEY' (or set KILN_API_KEY)\n"
                 "  --alias NAME             the model's name in responses (default: the file's base name)\n"
                 "  --cors ORIGIN            allow browser requests from ORIGIN (default: no CORS headers)\n"
                 "  --max-body MIB           largest request body in MiB (default 8)\n");
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path;
    for (size_t i = 0; i + 1 < n; i++)
        if (path[i] == '/') b = path + i + 1;
    return b;
}

static int parse_number(const char *a, const char *v, long lo, long hi, int *out) {
    long n;
    if (gen_parse_int(a, v, lo, hi, &n)) return -1;
    *out = (int)n;
    return 0;
}

static int parse_option(serve_opts *o, const char *a, const char *v) {
    int n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--host")) o->srv.host = v;
    else if (!strcmp(a, "--port")) return parse_number(a, v, 0, 65535, &o->srv.port);
    else if (!strcmp(a, "--parallel")) return parse_number(a, v, 1, 1024, &o->sched.parallel);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) return parse_number(a, v, 16, 1 << 20, &o->sched.n_ctx);
    else if (!strcmp(a, "--queue")) return parse_number(a, v, 1, 1 << 20, &o->sched.max_queue);
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) return parse_number(a, v, 1, 1024, &o->sched.n_threads);
    else if (!strcmp(a, "--api-key")) o->srv.api_key = v;
    else if (!strcmp(a, "--alias")) o->alias = v;
    else if (!strcmp(a, "--cors")) o->srv.cors_origin = v;
    else if (!strcmp(a, "--max-body")) {
        if (parse_number(a, v, 1, 1024, &n)) return -1;
        o->srv.max_body = (size_t)n << 20;
    } else if (!strcmp(a, "--device")) {
        if (!strcmp(v, "cpu")) o->sched.device = KILN_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->sched.device = KILN_DEVICE_CUDA;
        else if (!strcmp(v, "auto")) o->sched.device = KILN_DEVICE_AUTO;
        else {
            fprintf(stderr, "error: --device expects cpu, cuda or auto, got '%s'\n", v);
            return -1;
        }
    } else if (!strcmp(a, "--gpu-f16")) {
        if (!strcmp(v, "on")) o->sched.gpu_f16 = KILN_GPU_F16_ON;
        else if (!strcmp(v, "off")) o->sched.gpu_f16 = KILN_GPU_F16_OFF;
        else if (!strcmp(v, "auto")) o->sched.gpu_f16 = KILN_GPU_F16_AUTO;
        else {
            fprintf(stderr, "error: --gpu-f16 expects on, off or auto, got '%s'\n", v);
            return -1;
        }
    } else {
        fprintf(stderr, "error: unknown option: %s (see 'kiln serve --help')\n", a);
        return -1;
    }
    return 0;
}

static int parse_args(serve_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value (see 'kiln serve --help')\n", argv[i]);
            return -1;
        }
        if (parse_option(o, argv[i], argv[i + 1])) return -1;
        i++;
    }
    if (!o->model) {
        fprintf(stderr, "error: no model given (-m PATH)\n");
        return -1;
    }
    if (o->srv.api_key && !o->srv.api_key[0]) {
        fprintf(stderr, "error: --api-key must not be empty\n");
        return -1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    memset(&o, 0, sizeof o);
    o.srv.port = 8080;
    o.srv.max_body = (size_t)8 << 20;
    o.srv.api_key = getenv("KILN_API_KEY");
    o.sched = kiln_sched_default_params();
    o.sched.device = KILN_DEVICE_AUTO;
    if (parse_args(&o, argc, argv)) return 1;
    o.srv.model_id = o.alias ? o.alias : base_name(o.model);

    /* SIGINT and SIGTERM: blocked in every thread but this one (threads started later inherit the mask); their
     * handler wakes this thread through a pipe */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    if (pipe(stop_pipe)) {
        perror("error: pipe");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    char msg[512];
    kiln_model *m = kiln_model_open(o.model, msg, sizeof msg);
    if (!m) {
        fprintf(stderr, "error: %s\n", msg);
        return 1;
    }
    if (gen_require_tokenizer(m, o.model)) {
        kiln_model_close(m);
        return 1;
    }
    kiln_error err = {{0}};
    srv_server *s = srv_start(m, &o.sched, &o.srv, &err);
    if (!s) {
        fprintf(stderr, "error: %s\n", err.msg);
        kiln_model_close(m);
        return 1;
    }
    const char *host = o.srv.host ? o.srv.host : "127.0.0.1";
    bool ipv6 = strchr(host, ':') != NULL;
    kiln_sched_info info;
    srv_info(s, &info);
    char extent[64], memory[160];
    snprintf(extent, sizeof extent, "%d blocks of %d positions", info.kv_blocks, info.kv_block_size);
    bool gpu = info.device == KILN_DEVICE_CUDA;
    fprintf(stderr, "kiln serve: on the %s%s: %s\n", gpu ? "GPU" : "CPU",
            gpu && info.gpu_f16 ? " (half mode: F16 activations on tensor cores)" : "",
            gen_memory_phrase(&info.memory, extent, memory, sizeof memory));
    if (!gpu && o.sched.gpu_f16 == KILN_GPU_F16_ON)
        fprintf(stderr, "kiln serve: --gpu-f16 on has no effect on the CPU\n");
    fprintf(stderr, "kiln serve: %s on http://%s%s%s:%d (API key %s)\n", o.srv.model_id, ipv6 ? "[" : "", host,
            ipv6 ? "]" : "", srv_port(s), o.srv.api_key ? "required" : "not required");
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL);
    char byte;
    while (read(stop_pipe[0], &byte, 1) < 0 && errno == EINTR) continue;
    fprintf(stderr, "kiln serve: %s: stopping\n", stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(s);
    kiln_model_close(m);
    return 0;
}
