/* server/textout.h — one request's generated text on its way out: raw token
 * bytes in, valid UTF-8 out (an incomplete multi-byte character is held until
 * it completes; bytes that cannot form UTF-8 become U+FFFD, one per maximal
 * invalid subpart, like Python's errors="replace"), with stop strings: the
 * text is cut at the earliest stop occurrence, and bytes that could still be
 * the start of a stop string are held back (never released) until they cannot.
 * An end mark (textout_set_end) ends the text right after its first occurrence
 * instead, the mark kept — the server's one-tool-call limit ("</tool_call>",
 * once the reasoning's "</think>" has passed); it is not a stop string.
 *
 * `released` only grows; text[0, released) is final. The buffer grows by
 * doubling (amortised; no allocation on most tokens).
 */
#ifndef ORCHID_SERVER_TEXTOUT_H
#define ORCHID_SERVER_TEXTOUT_H

#include <stdbool.h>
#include <stddef.h>

#define TEXTOUT_MAX_STOPS 8

struct textout {
    char *buf;
    size_t len, cap;
    size_t released;
    unsigned char pend[4];
    int npend, need;
    const char *stops[TEXTOUT_MAX_STOPS];
    size_t stop_lens[TEXTOUT_MAX_STOPS];
    int n_stops;
    bool stopped; /* a stop string (or the end mark) was found; text ends at it */
    int stop_index; /* which of stops[] cut the text (-1: none); the earliest occurrence,
                       the first listed of those starting there */
    const char *end_mark, *end_arm; /* borrowed; NULL: none / armed from the start */
    size_t end_len, arm_len;
    size_t armed_at;   /* where end_mark may start ((size_t)-1: end_arm not seen yet) */
    size_t end_scan;   /* end_mark / end_arm searched up to here (no rescans) */
    bool ended;        /* the text ended at the end mark */
};

/* stops are borrowed (must outlive the textout). Returns 0 or ST_NOMEM. */
int textout_init(struct textout *t, size_t cap, const char *const *stops, int n_stops);
void textout_free(struct textout *t);
/* Sets the end mark: the text ends right after the first `mark` that starts at
 * or after the end of the first `arm` (arm NULL: anywhere), unless a stop
 * string's occurrence starts before the mark does (then the stop cuts the text
 * as usual). Both borrowed. Call before the first push. */
void textout_set_end(struct textout *t, const char *mark, const char *arm);
/* Appends a token's raw bytes. Returns 1 when a stop string or the end mark
 * completed (text cut, everything released), 0 otherwise, ST_NOMEM on allocation failure.
 * After a stop, further pushes are ignored. */
int textout_push(struct textout *t, const char *bytes, size_t n);
/* End of generation: an incomplete trailing character becomes U+FFFD and all
 * text is released (a held partial stop string is not a stop). */
int textout_finish(struct textout *t);

/* Validates UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF). Returns
 * the offset of the first invalid byte, or (size_t)-1 when valid. */
size_t utf8_invalid_at(const char *s, size_t n);

#endif
