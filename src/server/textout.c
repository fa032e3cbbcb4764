/* server/textout.c — UTF-8 repair and stop-string hold-back for generated text
 * (see textout.h). Kept apart from the scheduler so it is unit-tested alone. */
#include "server/textout.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

int textout_init(struct textout *t, size_t cap, const char *const *stops, int n_stops) {
    memset(t, 0, sizeof *t);
    t->stop_index = -1;
    if (cap < 64) cap = 64;
    t->buf = malloc(cap);
    if (!t->buf) return ST_NOMEM;
    t->cap = cap;
    t->buf[0] = 0;
    for (int i = 0; i < n_stops && t->n_stops < TEXTOUT_MAX_STOPS; i++) {
        size_t l = strlen(stops[i]);
        if (!l) continue;
        t->stops[t->n_stops] = stops[i];
        t->stop_lens[t->n_stops++] = l;
    }
    return ST_OK;
}

void textout_free(struct textout *t) {
    free(t->buf);
    t->buf = NULL;
}

static int reserve(struct textout *t, size_t extra) {
    if (t->len + extra + 1 <= t->cap) return ST_OK;
    size_t c = t->cap * 2;
    while (c < t->len + extra + 1) c *= 2;
    char *p = realloc(t->buf, c);
    if (!p) return ST_NOMEM;
    t->buf = p;
    t->cap = c;
    return ST_OK;
}

static void put(struct textout *t, const void *p, size_t n) {
    memcpy(t->buf + t->len, p, n);
    t->len += n;
}

static const unsigned char k_fffd[3] = {0xEF, 0xBF, 0xBD};

/* Expected total length of a sequence starting with lead byte b (0 = invalid lead). */
static int lead_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Is b valid as continuation number `pos` (1-based) after lead? */
static bool cont_ok(unsigned char lead, int pos, unsigned char b) {
    if (pos == 1) {
        if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
        if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
        if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
        if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
    }
    return b >= 0x80 && b <= 0xBF;
}

/* Decodes bytes into t->buf (capacity reserved by the caller: 3 bytes per input byte). */
static void decode_bytes(struct textout *t, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char b = s[i];
        if (t->npend) {
            if (cont_ok(t->pend[0], t->npend, b)) {
                t->pend[t->npend++] = b;
                if (t->npend == t->need) {
                    put(t, t->pend, (size_t)t->npend);
                    t->npend = 0;
                }
                continue;
            }
            put(t, k_fffd, 3);
            t->npend = 0;
        }
        int l = lead_len(b);
        if (l == 1) {
            t->buf[t->len++] = (char)b;
        } else if (l == 0) {
            put(t, k_fffd, 3);
        } else {
            t->pend[0] = b;
            t->npend = 1;
            t->need = l;
        }
    }
    t->buf[t->len] = 0;
}

static bool is_stop_prefix(const struct textout *t, size_t from) {
    size_t tail = t->len - from;
    for (int s = 0; s < t->n_stops; s++)
        if (tail < t->stop_lens[s] && memcmp(t->buf + from, t->stops[s], tail) == 0) return true;
    return false;
}

void textout_set_end(struct textout *t, const char *mark, const char *arm) {
    t->end_mark = mark && *mark ? mark : NULL;
    t->end_len = t->end_mark ? strlen(mark) : 0;
    t->end_arm = arm && *arm ? arm : NULL;
    t->arm_len = t->end_arm ? strlen(arm) : 0;
    t->armed_at = t->end_arm ? (size_t)-1 : 0;
    t->end_scan = 0;
}

/* Where the text ends after the end mark ((size_t)-1: not (yet) there). Each
 * search starts a needle's length short of where the last one stopped, so a
 * mark split over tokens is found once whole and nothing is scanned twice more. */
static size_t end_mark_at(struct textout *t) {
    if (!t->end_mark) return (size_t)-1;
    if (t->armed_at == (size_t)-1) {
        const char *p = memmem(t->buf + t->end_scan, t->len - t->end_scan, t->end_arm, t->arm_len);
        if (!p) {
            if (t->len >= t->arm_len) t->end_scan = t->len - t->arm_len + 1;
            return (size_t)-1;
        }
        t->armed_at = t->end_scan = (size_t)(p - t->buf) + t->arm_len;
    }
    if (t->end_scan < t->armed_at) t->end_scan = t->armed_at;
    const char *p = memmem(t->buf + t->end_scan, t->len - t->end_scan, t->end_mark, t->end_len);
    if (p) return (size_t)(p - t->buf) + t->end_len;
    if (t->len >= t->end_len && t->len - t->end_len + 1 > t->end_scan) t->end_scan = t->len - t->end_len + 1;
    return (size_t)-1;
}

/* The text ends at len: everything before it released, nothing more taken. */
static void cut_at(struct textout *t, size_t len) {
    t->len = len;
    t->buf[t->len] = 0;
    t->released = t->len;
    t->npend = 0;
    t->stopped = true;
}

int textout_push(struct textout *t, const char *bytes, size_t n) {
    if (t->stopped) return 0;
    if (reserve(t, 3 * n + 3)) return ST_NOMEM;
    size_t start = t->released;
    decode_bytes(t, (const unsigned char *)bytes, n);
    const size_t end = end_mark_at(t);
    /* Earliest stop occurrence starting at or after `released`. */
    size_t best = (size_t)-1;
    int best_stop = -1;
    for (int s = 0; s < t->n_stops; s++) {
        size_t sl = t->stop_lens[s];
        if (t->len - start < sl) continue;
        const char *p = memmem(t->buf + start, t->len - start, t->stops[s], sl);
        if (p && (size_t)(p - t->buf) < best) {
            best = (size_t)(p - t->buf);
            best_stop = s;
        }
    }
    if (end != (size_t)-1 && (best == (size_t)-1 || best >= end - t->end_len)) {
        /* the mark came first (a stop starting inside it loses: the mark completed) */
        cut_at(t, end);
        t->ended = true;
        return 1;
    }
    if (best != (size_t)-1) {
        cut_at(t, best);
        t->stop_index = best_stop;
        return 1;
    }
    /* Hold back the earliest suffix that is a proper prefix of a stop. */
    size_t rel = t->len;
    size_t maxl = 0;
    for (int s = 0; s < t->n_stops; s++)
        if (t->stop_lens[s] > maxl) maxl = t->stop_lens[s];
    size_t q = t->len > maxl ? t->len - maxl + 1 : 0;
    if (q < start) q = start;
    for (; q < t->len; q++)
        if (is_stop_prefix(t, q)) {
            rel = q;
            break;
        }
    t->released = rel;
    return 0;
}

int textout_finish(struct textout *t) {
    if (!t->stopped && t->npend) {
        if (reserve(t, 3)) return ST_NOMEM;
        put(t, k_fffd, 3);
        t->buf[t->len] = 0;
        t->npend = 0;
    }
    t->released = t->len;
    return ST_OK;
}

size_t utf8_invalid_at(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int l = lead_len(b);
        if (l == 0 || i + (size_t)l > n) return i;
        for (int k = 1; k < l; k++)
            if (!cont_ok(b, k, s[i + k])) return i;
        i += (size_t)l;
    }
    return (size_t)-1;
}
