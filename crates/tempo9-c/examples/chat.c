/* Tempo9 from C: load a model, stream a chat (pull-style and with a callback),
 * cancel, share the model between two threads, and report typed errors.
 *
 * Build (crates/tempo9-c/tests/c_example.rs links the static library instead):
 *   gcc -std=c11 -Wall -Wextra -Werror -I crates/tempo9-c/include chat.c \
 *       -L $TARGET/release -ltempo9_c -lpthread -Wl,-rpath,$TARGET/release -o chat
 * Run:  ./chat smol MODEL.gguf    (greedy chat, streaming, callback, cancel, threads)
 *       ./chat tools MODEL.gguf   (a tool-call round trip)
 * Prints one line per result, `key: value`, for the test to read. */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tempo9.h"

#define CHECK(call)                                                                \
    do {                                                                           \
        Tempo9Status s_ = (call);                                                  \
        if (s_ != TEMPO9_OK) {                                                     \
            fprintf(stderr, "%s failed: %d %s\n", #call, (int)s_, tempo9_last_error()); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* The value of an integer field `"key":N` in a JSON text (-1 if absent). */
static long json_int(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* The JSON string literal (quotes and escapes kept) of field `key` in `json`, copied
 * into `out`: it can be pasted into another JSON text as is. */
static int json_string_literal(const char *json, const char *key, char *out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat) - 1;
    const char *q = p + 1;
    while (*q && *q != '"') q += (*q == '\\' && q[1]) ? 2 : 1;
    if (*q != '"' || (size_t)(q - p + 2) > n) return 0;
    memcpy(out, p, q - p + 1);
    out[q - p + 1] = 0;
    return 1;
}

/* The type of an event: text, tool_call, done or other. */
static const char *event_type(const char *ev) {
    if (strstr(ev, "\"type\":\"text\"")) return "text";
    if (strstr(ev, "\"type\":\"tool_call\"")) return "tool_call";
    if (strstr(ev, "\"type\":\"done\"")) return "done";
    return "other";
}

static const char *GREEDY_MESSAGES =
    "[{\"role\":\"system\",\"content\":\"You are a concise assistant.\"},"
    "{\"role\":\"user\",\"content\":\"Name three colors of the rainbow.\"}]";

/* Pull-style: prints each event as `event: JSON`; returns the number of text events.
 * Keeps the last done event in `last_done` and the last tool call in `last_call`. */
static char last_call[1024];
static int pull_chat(const Tempo9Model *m, const char *messages, const char *tools,
                     const char *options, char *last_done, size_t n) {
    Tempo9Stream *st = NULL;
    CHECK(tempo9_chat(m, messages, tools, options, &st));
    char *ev = NULL;
    int texts = 0;
    Tempo9Status s;
    while ((s = tempo9_stream_next(st, &ev)) == TEMPO9_OK) {
        printf("event: %s\n", ev);
        if (!strcmp(event_type(ev), "text")) texts++;
        if (!strcmp(event_type(ev), "done") && last_done) snprintf(last_done, n, "%s", ev);
        if (!strcmp(event_type(ev), "tool_call")) snprintf(last_call, sizeof last_call, "%s", ev);
        tempo9_string_free(ev);
    }
    if (s != TEMPO9_DONE) {
        fprintf(stderr, "stream_next: %d %s\n", (int)s, tempo9_last_error());
        exit(1);
    }
    tempo9_stream_free(st);
    return texts;
}

struct counter { int events; int stop_after; };

static int32_t on_event(const char *ev, void *user) {
    struct counter *c = user;
    c->events++;
    (void)ev;
    return c->stop_after > 0 && c->events >= c->stop_after;
}

/* Waits until the engine runs nothing; returns kv_pages_used then. */
static long wait_idle(const Tempo9Model *m) {
    for (int i = 0; i < 3000; i++) {
        char *js = NULL;
        CHECK(tempo9_model_stats(m, &js));
        long running = json_int(js, "running"), used = json_int(js, "kv_pages_used");
        tempo9_string_free(js);
        if (running == 0) return used;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static const char *SHARED_SYSTEM =
    "You are the assistant of a hardware store. Answer questions about tools, paint, garden "
    "supplies and opening hours politely. Answer questions about tools, paint, garden supplies "
    "and opening hours politely. Answer questions about tools, paint, garden supplies and opening "
    "hours politely. Answer questions about tools, paint, garden supplies and opening hours "
    "politely. Answer questions about tools, paint, garden supplies and opening hours politely.";

struct job { const Tempo9Model *m; const char *question; long cached; };

static void *ask(void *arg) {
    struct job *j = arg;
    char messages[2048], done[1024] = "";
    snprintf(messages, sizeof messages,
             "[{\"role\":\"system\",\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"%s\"}]",
             SHARED_SYSTEM, j->question);
    Tempo9Stream *st = NULL;
    CHECK(tempo9_chat(j->m, messages, NULL, "{\"temperature\":0,\"max_tokens\":12}", &st));
    char *ev = NULL;
    while (tempo9_stream_next(st, &ev) == TEMPO9_OK) {
        if (!strcmp(event_type(ev), "done")) snprintf(done, sizeof done, "%s", ev);
        tempo9_string_free(ev);
    }
    tempo9_stream_free(st);
    j->cached = json_int(done, "cached_tokens");
    return NULL;
}

static int smol(const char *path) {
    Tempo9Model *m = NULL;
    /* Typed errors first. */
    Tempo9Status s = tempo9_model_load("/nonexistent/model.gguf", NULL, &m);
    printf("missing_file_status: %d\n", (int)s);
    printf("missing_file_error_nonempty: %d\n", tempo9_last_error()[0] != 0);
    s = tempo9_model_load(path, "{\"threads\": \"two\"}", &m);
    printf("bad_options_status: %d\n", (int)s);

    CHECK(tempo9_model_load(path, "{\"threads\":2,\"context\":4096,\"kv_budget_bytes\":67108864,"
                                  "\"ssd\":false}", &m));
    printf("version: %s\n", tempo9_version());
    Tempo9Stream *st = NULL;
    s = tempo9_chat(m, "[{\"role\":\"wizard\"}]", NULL, NULL, &st);
    printf("bad_messages_status: %d\n", (int)s);
    s = tempo9_chat(m, GREEDY_MESSAGES, NULL,
                    "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                    "{\"name\":\"x\",\"schema\":{\"type\":12}}}}", &st);
    printf("bad_schema_status: %d\n", (int)s);
    s = tempo9_chat(NULL, GREEDY_MESSAGES, NULL, NULL, &st);
    printf("null_model_status: %d\n", (int)s);

    /* Greedy chat, pulled event by event. */
    char done[1024] = "";
    int texts = pull_chat(m, GREEDY_MESSAGES, NULL, "{\"temperature\":0,\"max_tokens\":48}", done,
                          sizeof done);
    printf("greedy_text_events: %d\n", texts);
    printf("greedy_done: %s\n", done);

    /* The same request with a callback; then one cancelled after 3 events. */
    struct counter all = {0, 0}, three = {0, 3};
    CHECK(tempo9_chat_callback(m, GREEDY_MESSAGES, NULL, "{\"temperature\":0,\"max_tokens\":48}",
                               on_event, &all));
    printf("callback_events: %d\n", all.events);
    CHECK(tempo9_chat_callback(m, "[{\"role\":\"user\",\"content\":\"Tell me a very long story.\"}]",
                               NULL, "{\"temperature\":0,\"max_tokens\":2000}", on_event, &three));
    printf("cancelled_after_events: %d\n", three.events);
    printf("pages_used_after_cancel: %ld\n", wait_idle(m));

    /* A pulled stream freed early. */
    CHECK(tempo9_chat(m, "[{\"role\":\"user\",\"content\":\"Tell me another long story.\"}]", NULL,
                      "{\"temperature\":0,\"max_tokens\":2000}", &st));
    char *ev = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK(tempo9_stream_next(st, &ev));
        tempo9_string_free(ev);
    }
    tempo9_stream_free(st);
    printf("pages_used_after_free: %ld\n", wait_idle(m));

    /* Plain completion on token ids. */
    uint32_t *ids = NULL;
    size_t n = 0;
    CHECK(tempo9_tokenize(m, "The sea is", &ids, &n));
    CHECK(tempo9_complete(m, ids, n, "{\"max_tokens\":5,\"stop_at_eog\":false}", &st));
    tempo9_tokens_free(ids, n);
    int tokens = 0;
    while (tempo9_stream_next(st, &ev) == TEMPO9_OK) {
        tokens += strstr(ev, "\"type\":\"token\"") != NULL;
        tempo9_string_free(ev);
    }
    tempo9_stream_free(st);
    printf("completion_tokens: %d\n", tokens);

    /* Two threads on one model: a warm-up caches the shared system prompt. */
    struct job warm = {m, "Hello!", 0}, a = {m, "Do you sell hammers?", 0},
               b = {m, "When do you open on Sunday?", 0};
    ask(&warm);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, ask, &a);
    pthread_create(&tb, NULL, ask, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    printf("thread_cached_tokens: %ld %ld\n", a.cached, b.cached);
    tempo9_model_free(m);
    return 0;
}

static int tools(const char *path) {
    Tempo9Model *m = NULL;
    CHECK(tempo9_model_load(path, "{\"threads\":2,\"context\":4096,\"kv_budget_bytes\":67108864,"
                                  "\"ssd\":false}", &m));
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
        "\"Get the current weather in a given city.\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"City name\"}},"
        "\"required\":[\"city\"]}}}]";
    const char *first =
        "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
        "{\"role\":\"user\",\"content\":\"What is the weather in Paris right now?\"}]";
    char done[1024] = "";
    pull_chat(m, first, tools, "{\"temperature\":0,\"max_tokens\":40}", done, sizeof done);
    printf("first_done: %s\n", done);
    /* The application runs the call the model made and answers it. */
    char name[128], args[512], second[4096];
    if (!json_string_literal(last_call, "name", name, sizeof name) ||
        !json_string_literal(last_call, "arguments", args, sizeof args)) {
        fprintf(stderr, "no tool call in the first answer\n");
        return 1;
    }
    snprintf(second, sizeof second,
             "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
             "{\"role\":\"user\",\"content\":\"What is the weather in Paris right now?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
             "\"type\":\"function\",\"function\":{\"name\":%s,\"arguments\":%s}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Sunny, 23 degrees "
             "Celsius.\"},"
             "{\"role\":\"user\",\"content\":\"Now tell me the answer in one sentence.\"}]",
             name, args);
    pull_chat(m, second, tools, "{\"temperature\":0,\"max_tokens\":32}", done, sizeof done);
    printf("second_done: %s\n", done);
    tempo9_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s smol|tools MODEL.gguf\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(argv[1], "smol")) return smol(argv[2]);
    if (!strcmp(argv[1], "tools")) return tools(argv[2]);
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
