/* tests/unit/test_server_textout.c — generated-text handling: UTF-8 hold-back
 * and repair (U+FFFD per maximal invalid subpart), stop strings across token
 * boundaries, hold-back of partial stops, earliest stop wins, release at end;
 * and the UTF-8 validator used on request bodies. */
#include <string.h>

#include "check.h"
#include "server/textout.h"

static void push_all(struct textout *t, const char *const *toks, int n, int *hit_at) {
    *hit_at = -1;
    for (int i = 0; i < n; i++) {
        int h = textout_push(t, toks[i], strlen(toks[i]));
        if (h == 1 && *hit_at < 0) *hit_at = i;
    }
}

int main(void) {
    struct textout t;
    int hit;

    /* plain text, no stops: everything released at once */
    CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
    CHECK(t.stop_index == -1, "no stop yet: %d", t.stop_index);
    const char *a[] = {"Hel", "lo", " world"};
    push_all(&t, a, 3, &hit);
    CHECK(hit < 0 && t.released == 11 && strcmp(t.buf, "Hello world") == 0, "plain: %s", t.buf);
    textout_free(&t);

    /* multi-byte char split over tokens is held until complete */
    CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
    textout_push(&t, "a\xE4\xB8", 3);
    CHECK(t.released == 1 && t.len == 1, "held partial: released %zu len %zu", t.released, t.len);
    textout_push(&t, "\x96", 1);
    CHECK(t.released == 4 && strcmp(t.buf, "a\xE4\xB8\x96") == 0, "completed char");
    /* invalid: lone continuation, overlong lead, truncated then ASCII */
    textout_push(&t, "\x80", 1);
    textout_push(&t, "\xC0\xAF", 2);
    textout_push(&t, "\xE4\xB8", 2);
    textout_push(&t, "x", 1);
    /* \x80 -> 1, \xC0 \xAF -> 2 (C0 is never a lead), \xE4\xB8 before x -> 1 */
    CHECK(strcmp(t.buf, "a\xE4\xB8\x96\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx") == 0,
          "replacement chars: %s", t.buf);
    /* \xE4\xB8 then x: one U+FFFD for the maximal subpart \xE4\xB8 */
    {
        struct textout u;
        textout_init(&u, 4, NULL, 0);
        textout_push(&u, "\xE4\xB8x", 3);
        CHECK(strcmp(u.buf, "\xEF\xBF\xBDx") == 0, "maximal subpart -> one FFFD: %s", u.buf);
        textout_push(&u, "\xF0\x9F", 2);
        CHECK(u.released == 4, "held 4-byte start");
        textout_finish(&u);
        CHECK(strcmp(u.buf, "\xEF\xBF\xBDx\xEF\xBF\xBD") == 0, "flush incomplete tail -> FFFD");
        textout_free(&u);
    }
    textout_free(&t);

    /* stop string spanning tokens; text before it released, stop never released */
    const char *stops[] = {"STOP", "end"};
    CHECK(textout_init(&t, 4, stops, 2) == 0, "init");
    textout_push(&t, "abc S", 5);
    CHECK(t.released == 4, "partial stop held: %zu", t.released);
    textout_push(&t, "T", 1);
    CHECK(t.released == 4, "still held: %zu", t.released);
    textout_push(&t, "x", 1); /* "STx" is not a stop prefix any more */
    CHECK(t.released == 7, "released after mismatch: %zu", t.released);
    int h = textout_push(&t, " ST", 3);
    CHECK(h == 0 && t.released == 8, "held again: %zu", t.released);
    h = textout_push(&t, "OP tail", 7);
    CHECK(h == 1 && t.stopped && strcmp(t.buf, "abc STx ") == 0 && t.released == 8, "stopped: '%s'", t.buf);
    CHECK(t.stop_index == 0, "stop index of STOP: %d", t.stop_index);
    CHECK(textout_push(&t, "more", 4) == 0 && t.len == 8, "ignored after stop");
    textout_free(&t);

    /* earliest occurrence wins among several stops, even if found in one push */
    const char *s2[] = {"gamma", "beta"};
    CHECK(textout_init(&t, 4, s2, 2) == 0, "init");
    h = textout_push(&t, "alpha beta gamma", 16);
    CHECK(h == 1 && strcmp(t.buf, "alpha ") == 0, "earliest: '%s'", t.buf);
    CHECK(t.stop_index == 1, "stop index names the earliest (beta): %d", t.stop_index);
    textout_free(&t);

    /* a partial stop at the end is text */
    const char *s3[] = {"world"};
    CHECK(textout_init(&t, 4, s3, 1) == 0, "init");
    textout_push(&t, "hello wor", 9);
    CHECK(t.released == 6, "held 'wor'");
    textout_finish(&t);
    CHECK(t.released == 9 && strcmp(t.buf, "hello wor") == 0, "released at end");
    textout_free(&t);

    /* overlapping prefixes: stop "aab" in "aaab" */
    const char *s4[] = {"aab"};
    CHECK(textout_init(&t, 4, s4, 1) == 0, "init");
    textout_push(&t, "a", 1);
    textout_push(&t, "a", 1);
    textout_push(&t, "a", 1);
    CHECK(t.released == 1, "held 'aa' after 'aaa': %zu", t.released);
    h = textout_push(&t, "b", 1);
    CHECK(h == 1 && strcmp(t.buf, "a") == 0, "overlap: '%s'", t.buf);
    textout_free(&t);

    /* multi-byte stop string across a split character */
    const char *s5[] = {"世界"};
    CHECK(textout_init(&t, 4, s5, 1) == 0, "init");
    textout_push(&t, "hi \xE4\xB8", 5);
    textout_push(&t, "\x96\xE7", 2);
    CHECK(t.released == 3, "held: %zu", t.released);
    h = textout_push(&t, "\x95\x8C!", 3);
    CHECK(h == 1 && strcmp(t.buf, "hi ") == 0, "utf8 stop");
    textout_free(&t);

    /* growth: many pushes */
    CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
    for (int i = 0; i < 10000; i++) textout_push(&t, "xy", 2);
    CHECK(t.len == 20000 && t.released == 20000, "growth");
    textout_free(&t);

    /* end mark: the text ends right after the first </tool_call> past </think>,
     * the mark kept; a mark inside the reasoning does not count; split over tokens */
    {
        CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
        textout_set_end(&t, "</tool_call>", "</think>");
        const char *toks[] = {"I'd write </tool", "_call> here.", "</th", "ink>\n\n<tool_call>\n{}\n</to", "ol_call>",
                              "\n<tool_call>", "more"};
        push_all(&t, toks, 7, &hit);
        CHECK(hit == 4 && t.ended && t.stop_index == -1 && t.released == t.len, "end mark at token %d", hit);
        CHECK(strcmp(t.buf, "I'd write </tool_call> here.</think>\n\n<tool_call>\n{}\n</tool_call>") == 0, "end mark text: %s",
              t.buf);
        textout_free(&t);
        /* armed from the start; bytes after the mark in the same token are dropped */
        CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
        textout_set_end(&t, "</tool_call>", NULL);
        CHECK(textout_push(&t, "a</tool_call>b", 14) == 1 && strcmp(t.buf, "a</tool_call>") == 0 && t.ended, "armed: %s", t.buf);
        CHECK(textout_push(&t, "c", 1) == 0 && strcmp(t.buf, "a</tool_call>") == 0, "nothing after the end");
        textout_free(&t);
        /* a stop string that starts before the mark wins (cut before it); one inside the mark loses */
        const char *st1[] = {"x</tool"}, *st2[] = {"call>"};
        CHECK(textout_init(&t, 4, st1, 1) == 0, "init");
        textout_set_end(&t, "</tool_call>", NULL);
        CHECK(textout_push(&t, "ax</tool_call>", 14) == 1 && strcmp(t.buf, "a") == 0 && !t.ended && t.stop_index == 0,
              "stop first: %s", t.buf);
        textout_free(&t);
        CHECK(textout_init(&t, 4, st2, 1) == 0, "init");
        textout_set_end(&t, "</tool_call>", NULL);
        CHECK(textout_push(&t, "a</tool_call>", 13) == 1 && strcmp(t.buf, "a</tool_call>") == 0 && t.ended && t.stop_index == -1,
              "mark first: %s", t.buf);
        textout_free(&t);
        /* never armed: no end */
        CHECK(textout_init(&t, 4, NULL, 0) == 0, "init");
        textout_set_end(&t, "</tool_call>", "</think>");
        const char *toks2[] = {"<tool_call>", "{}", "</tool_call>", "<tool_call>"};
        push_all(&t, toks2, 4, &hit);
        CHECK(hit < 0 && !t.ended && t.len == 36, "unarmed: %zu", t.len);
        textout_free(&t);
    }

    /* validator */
    CHECK(utf8_invalid_at("abc", 3) == (size_t)-1, "ascii ok");
    CHECK(utf8_invalid_at("a\xE4\xB8\x96", 4) == (size_t)-1, "cjk ok");
    CHECK(utf8_invalid_at("a\xFF", 2) == 1, "ff");
    CHECK(utf8_invalid_at("\xED\xA0\x80", 3) == 0, "surrogate");
    CHECK(utf8_invalid_at("\xC0\x80", 2) == 0, "overlong");
    CHECK(utf8_invalid_at("\xF4\x90\x80\x80", 4) == 0, "> U+10FFFF");
    CHECK(utf8_invalid_at("ok\xE4\xB8", 4) == 2, "truncated");
    return check_summary();
}
