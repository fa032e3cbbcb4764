/* tests/fuzz/fuzz_json_grammar.c — libFuzzer target: a JSON Schema and a document
 * through the constrained-output recognizer (text/json_grammar.h).
 *
 * Input: the schema text, a NUL byte, then the document bytes (no NUL: the
 * schema is NULL, i.e. json_object, and the whole input is the document). A
 * schema cJSON cannot parse, or the recognizer refuses, ends the run (the
 * refusal must carry a message).
 * Invariants:
 *   - the document fed whole, in pseudo-random chunks and byte by byte gives the
 *     same verdict, and a state that died stays dead;
 *   - a document the recognizer calls complete is valid JSON (cJSON parses it,
 *     and it holds valid UTF-8), so constrained output always parses;
 *   - with no schema, a complete document is an object.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/json_grammar.h"
#include "text/utf8.h"

static jg_state a, b, c;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    cJSON *schema = NULL;
    const char *doc = (const char *)data;
    size_t n = size;
    if (nul) {
        schema = cJSON_ParseWithLength((const char *)data, (size_t)(nul - data));
        if (!schema) return 0;
        doc = (const char *)nul + 1;
        n = size - (size_t)(nul - data) - 1;
    }
    jg_grammar *g = NULL;
    char err[320] = "";
    if (jg_compile(schema, &g, err, sizeof err)) {
        if (!err[0]) abort(); /* a refusal names its reason */
        cJSON_Delete(schema);
        return 0;
    }
    jg_start(g, &a);
    bool alive_whole = jg_feed(g, &a, doc, n);
    bool done_whole = alive_whole && jg_complete(g, &a);

    jg_start(g, &b);
    bool alive_bytes = true;
    for (size_t i = 0; i < n; i++) {
        bool ok = jg_feed(g, &b, doc + i, 1);
        if (!alive_bytes && ok) abort(); /* dead stays dead */
        alive_bytes = ok;
    }
    jg_start(g, &c);
    bool alive_chunks = true;
    uint32_t x = (uint32_t)n * 2654435761u + 1;
    for (size_t i = 0; i < n;) {
        x = x * 1103515245u + 12345u;
        size_t k = 1 + (x >> 16) % 7;
        if (k > n - i) k = n - i;
        alive_chunks = jg_feed(g, &c, doc + i, k) && alive_chunks;
        i += k;
    }
    if (alive_whole != alive_bytes || alive_whole != alive_chunks) abort();
    if (done_whole != (alive_bytes && jg_complete(g, &b))) abort();
    if (done_whole != (alive_chunks && jg_complete(g, &c))) abort();
    if (done_whole) {
        if (utf8_validate(doc, n) != n) abort();
        cJSON *v = cJSON_ParseWithLength(doc, n);
        if (!v) abort();
        if (!schema && !cJSON_IsObject(v)) abort();
        cJSON_Delete(v);
    }
    jg_free(g);
    cJSON_Delete(schema);
    return 0;
}
