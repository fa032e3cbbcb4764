/* text/tokenizer.c — byte-level BPE from a HF tokenizer.json (see tokenizer.h).
 *
 * Encode pipeline, in the order HF `tokenizers` runs it for this family:
 *   1. reject invalid UTF-8;
 *   2. split the raw text on added tokens (leftmost match, longest at a
 *      position; the token becomes its id and is not normalised);
 *   3. NFC-normalise each remaining segment (utf8proc; ASCII is skipped);
 *   4. pre-tokenise the segment with the Split regex (PCRE2, UTF+UCP+JIT),
 *      behaviour "isolated": every match and every gap is a piece;
 *   5. BPE each piece: start from one symbol per byte (the id of the byte's
 *      GPT-2 char), then repeatedly merge the adjacent pair with the lowest
 *      merge rank, leftmost first (HF's Word::merge_all order), using a hash map
 *      (left id, right id) -> (rank, merged id). Pieces up to CACHE_KEY bytes
 *      go through a direct-mapped cache piece -> ids.
 *
 * Memory: token strings and token bytes live in two arenas indexed by id;
 * hash maps are open-addressed arrays. Everything is built once at load and
 * read-only afterwards, except the cache (mutex-guarded).
 */
#include "text/tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <utf8proc.h>

#include "runtime/fileio.h"
#include "runtime/status.h"
#include "text/utf8.h"

#define CACHE_SLOTS (1u << 15)
#define CACHE_KEY 40 /* pieces longer than this are not cached */
#define CACHE_IDS 14 /* ... nor pieces that need more ids than this */
#define SMALL_BPE 48 /* pieces up to this many bytes use the O(n^2) scan, longer use a heap */

typedef struct cache_slot {
    uint8_t klen, nids;
    char key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_slot;

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    int special;
} added_token;

struct tokenizer {
    int32_t n_ids;          /* highest id + 1 */
    uint32_t *str_off;      /* [n_ids] offset into strs, UINT32_MAX = unused id */
    char *strs;             /* NUL-terminated token strings as in tokenizer.json */
    uint32_t *byte_off;     /* [n_ids + 1] offsets into bytes (token raw bytes) */
    char *bytes;
    uint8_t *flags;         /* [n_ids] bit0 added, bit1 special */

    uint32_t *str_len;      /* [n_ids] strlen of each token string */

    /* string -> id (open addressing, value id+1, 0 empty; smap_tag holds the
     * upper hash bits so most probes skip the string compare) */
    struct sslot { int32_t id1; uint32_t tag; } *smap;
    uint32_t smap_mask;

    /* (a,b) -> rank, merged id */
    uint64_t *mkeys; /* key = (a << 32 | b) + 1, 0 empty */
    uint32_t *mrank;
    int32_t *mnew;
    uint32_t mmask;

    int32_t byte_id[256];
    int ignore_merges;

    added_token *added;
    int n_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */

    pcre2_code *re;
    int normalize_nfc;

    int32_t eos_id, pad_id;
    char *chat_template;

    cache_slot *cache;
    pthread_mutex_t cache_mu;
};

/* ---------------------------------------------------------------- helpers */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the 68
 * others to U+0100.. in increasing byte order. u2b inverts it (cp < 0x144). */
static void byte_level_tables(uint32_t b2u[256], int16_t u2b[0x144]) {
    int extra = 0;
    for (int i = 0; i < 0x144; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(0x100 + extra++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

static int32_t smap_get(const tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    uint32_t i = (uint32_t)h & t->smap_mask, tag = (uint32_t)(h >> 32);
    for (;;) {
        int32_t v = t->smap[i].id1;
        if (!v) return -1;
        if (t->smap[i].tag == tag && t->str_len[v - 1] == n && memcmp(t->strs + t->str_off[v - 1], s, n) == 0)
            return v - 1;
        i = (i + 1) & t->smap_mask;
    }
}

/* Maps id's own string (t->strs + str_off[id]) to id; a later put of the same
 * string wins. */
static void smap_put(tokenizer *t, int32_t id) {
    const char *s = t->strs + t->str_off[id];
    size_t n = t->str_len[id];
    uint64_t h = hash_bytes(s, n);
    uint32_t i = (uint32_t)h & t->smap_mask, tag = (uint32_t)(h >> 32);
    while (t->smap[i].id1) {
        int32_t v = t->smap[i].id1;
        if (t->smap[i].tag == tag && t->str_len[v - 1] == n && memcmp(t->strs + t->str_off[v - 1], s, n) == 0) {
            t->smap[i].id1 = id + 1;
            return;
        }
        i = (i + 1) & t->smap_mask;
    }
    t->smap[i].id1 = id + 1;
    t->smap[i].tag = tag;
}

static inline int merge_get(const tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = (uint32_t)hash_u64(key) & t->mmask;
    for (;;) {
        uint64_t k = t->mkeys[i];
        if (k == key) {
            *rank = t->mrank[i];
            *nid = t->mnew[i];
            return 1;
        }
        if (!k) return 0;
        i = (i + 1) & t->mmask;
    }
}

/* Later duplicates overwrite earlier ones, as HF's HashMap collect does. */
static void merge_put(tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t nid) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = (uint32_t)hash_u64(key) & t->mmask;
    while (t->mkeys[i] && t->mkeys[i] != key) i = (i + 1) & t->mmask;
    t->mkeys[i] = key;
    t->mrank[i] = rank;
    t->mnew[i] = nid;
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int json_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* "" or null or absent */
static int json_empty(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && !v->valuestring[0]);
}

/* ------------------------------------------------- fast tokenizer.json reading
 *
 * cJSON needs ~300 ms for the 11 MB file because it allocates a node per
 * vocab entry and merge. We scan the document ourselves: model.vocab and
 * model.merges are streamed into flat arrays (strings unescaped into one
 * arena), and every other value is handed to cJSON (small), assembled into a
 * cJSON tree of the same shape minus those two members.
 */

typedef struct raw_model {
    buf arena;          /* NUL-terminated unescaped strings */
    uint32_t *voff;     /* vocab: string offset in arena */
    int64_t *vid;       /* vocab: id */
    size_t nv, vcap;
    uint32_t *moff;     /* merges: 2 offsets (left, right) per merge */
    size_t nm, mcap;
    int have_vocab, have_merges;
} raw_model;

static void raw_free(raw_model *r) {
    buf_free(&r->arena);
    free(r->voff);
    free(r->vid);
    free(r->moff);
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static int hexval(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Parses a JSON string at p (pointing at the quote); appends the unescaped
 * bytes and a NUL to arena. Returns the position after the closing quote. */
static const char *parse_jstr(const char *p, buf *arena) {
    if (*p != '"') return NULL;
    p++;
    for (;;) {
        const char *q = p;
        while (*q != '"' && *q != '\\' && *q) q++;
        buf_append(arena, p, (size_t)(q - p));
        if (*q == '"') {
            buf_putc(arena, 0);
            return q + 1;
        }
        if (!*q) return NULL;
        q++; /* backslash */
        char c = *q++, tmp[4];
        switch (c) {
        case '"': case '\\': case '/': buf_putc(arena, c); break;
        case 'b': buf_putc(arena, '\b'); break;
        case 'f': buf_putc(arena, '\f'); break;
        case 'n': buf_putc(arena, '\n'); break;
        case 'r': buf_putc(arena, '\r'); break;
        case 't': buf_putc(arena, '\t'); break;
        case 'u': {
            uint32_t cp, lo;
            if (hexval(q, &cp)) return NULL;
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && q[0] == '\\' && q[1] == 'u' && !hexval(q + 2, &lo) &&
                lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                q += 6;
            }
            buf_append(arena, tmp, (size_t)utf8_encode(cp, tmp));
            break;
        }
        default: return NULL;
        }
        p = q;
    }
}

static const char *parse_vocab(const char *p, raw_model *r) {
    p = skip_ws(p);
    if (*p != '{') return NULL;
    p = skip_ws(p + 1);
    if (*p == '}') return p + 1;
    for (;;) {
        if (r->nv == r->vcap) {
            r->vcap = r->vcap ? r->vcap * 2 : 1024;
            uint32_t *o = realloc(r->voff, r->vcap * sizeof *o);
            if (o) r->voff = o;
            int64_t *v = realloc(r->vid, r->vcap * sizeof *v);
            if (v) r->vid = v;
            if (!o || !v) return NULL;
        }
        r->voff[r->nv] = (uint32_t)r->arena.len;
        p = parse_jstr(p, &r->arena);
        if (!p) return NULL;
        p = skip_ws(p);
        if (*p != ':') return NULL;
        char *end;
        long long id = strtoll(skip_ws(p + 1), &end, 10);
        if (end == p + 1 || *end == '.' || *end == 'e' || *end == 'E') return NULL;
        r->vid[r->nv++] = id;
        p = skip_ws(end);
        if (*p == '}') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1);
    }
}

static const char *parse_merges(const char *p, raw_model *r) {
    p = skip_ws(p);
    if (*p != '[') return NULL;
    p = skip_ws(p + 1);
    if (*p == ']') return p + 1;
    for (;;) {
        if (r->nm == r->mcap) {
            r->mcap = r->mcap ? r->mcap * 2 : 1024;
            uint32_t *o = realloc(r->moff, 2 * r->mcap * sizeof *o);
            if (!o) return NULL;
            r->moff = o;
        }
        uint32_t *m = r->moff + 2 * r->nm;
        if (*p == '"') { /* "a b": split at the one space */
            size_t start = r->arena.len;
            p = parse_jstr(p, &r->arena);
            if (!p || r->arena.oom) return NULL;
            char *sp = memchr(r->arena.data + start, ' ', r->arena.len - start - 1);
            if (!sp) return NULL;
            *sp = 0;
            m[0] = (uint32_t)start;
            m[1] = (uint32_t)(sp + 1 - r->arena.data);
        } else if (*p == '[') {
            p = skip_ws(p + 1);
            m[0] = (uint32_t)r->arena.len;
            p = parse_jstr(p, &r->arena);
            if (!p) return NULL;
            p = skip_ws(p);
            if (*p != ',') return NULL;
            p = skip_ws(p + 1);
            m[1] = (uint32_t)r->arena.len;
            p = parse_jstr(p, &r->arena);
            if (!p) return NULL;
            p = skip_ws(p);
            if (*p != ']') return NULL;
            p++;
        } else {
            return NULL;
        }
        r->nm++;
        p = skip_ws(p);
        if (*p == ']') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1);
    }
}

/* Object members one by one; `model` recursion handles vocab/merges. */
static const char *parse_object(const char *p, cJSON *obj, raw_model *r, int is_model) {
    p = skip_ws(p);
    if (*p != '{') return NULL;
    p = skip_ws(p + 1);
    if (*p == '}') return p + 1;
    buf key = {0};
    for (;;) {
        key.len = 0;
        p = parse_jstr(p, &key);
        if (!p || key.oom) break;
        p = skip_ws(p);
        if (*p != ':') { p = NULL; break; }
        p = skip_ws(p + 1);
        if (is_model && strcmp(key.data, "vocab") == 0) {
            p = parse_vocab(p, r);
            r->have_vocab = 1;
        } else if (is_model && strcmp(key.data, "merges") == 0) {
            p = parse_merges(p, r);
            r->have_merges = 1;
        } else if (!is_model && obj && strcmp(key.data, "model") == 0 && *p == '{') {
            cJSON *m = cJSON_CreateObject();
            if (!m) { p = NULL; break; }
            cJSON_AddItemToObject(obj, "model", m);
            p = parse_object(p, m, r, 1);
        } else {
            const char *end = NULL;
            cJSON *v = cJSON_ParseWithOpts(p, &end, 0);
            if (!v) { p = NULL; break; }
            cJSON_AddItemToObject(obj, key.data, v);
            p = end;
        }
        if (!p) break;
        p = skip_ws(p);
        if (*p == '}') { p++; break; }
        if (*p != ',') { p = NULL; break; }
        p = skip_ws(p + 1);
    }
    buf_free(&key);
    return p;
}

/* ------------------------------------------------------------ the sections */

static int check_normalizer(tokenizer *t, const cJSON *n, const char *path, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = json_str(n, "type");
    if (type && strcmp(type, "NFC") == 0) {
        t->normalize_nfc = 1;
        return 0;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            int rc = check_normalizer(t, it, path, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    return errorf(err, errlen, ST_UNSUPPORTED, "%s: normalizer type %s is not supported (only NFC)",
                  path, type ? type : "?");
}

static int check_byte_level(const cJSON *p, const char *path, const char *what, char *err, size_t errlen) {
    if (json_true(p, "add_prefix_space") || json_true(p, "use_regex"))
        return errorf(err, errlen, ST_UNSUPPORTED,
                      "%s: %s ByteLevel with add_prefix_space/use_regex is not supported", path, what);
    return 0;
}

static int compile_regex(tokenizer *t, const char *pat, const char *path, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return errorf(err, errlen, ST_FORMAT, "%s: pre-tokenizer regex at offset %zu: %s", path,
                      (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */
    return 0;
}

static int check_pre_tokenizer(tokenizer *t, const cJSON *p, const char *path, char *err, size_t errlen) {
    const char *type = p ? json_str(p, "type") : NULL;
    if (!type || strcmp(type, "Sequence") != 0)
        return errorf(err, errlen, ST_UNSUPPORTED,
                      "%s: pre_tokenizer must be Sequence[Split, ByteLevel] (got %s)", path,
                      type ? type : "none");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    int n = cJSON_GetArraySize(list), have_split = 0, have_bl = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(list, i);
        const char *ty = json_str(it, "type");
        if (ty && strcmp(ty, "Split") == 0 && !have_split && !have_bl) {
            const char *beh = json_str(it, "behavior");
            const char *re = json_str(cJSON_GetObjectItemCaseSensitive(it, "pattern"), "Regex");
            if (!re || !beh || strcmp(beh, "Isolated") != 0 || json_true(it, "invert"))
                return errorf(err, errlen, ST_UNSUPPORTED,
                              "%s: only Split{pattern: Regex, behavior: Isolated} is supported", path);
            int rc = compile_regex(t, re, path, err, errlen);
            if (rc) return rc;
            have_split = 1;
        } else if (ty && strcmp(ty, "ByteLevel") == 0 && !have_bl) {
            int rc = check_byte_level(it, path, "pre_tokenizer", err, errlen);
            if (rc) return rc;
            have_bl = 1;
        } else {
            return errorf(err, errlen, ST_UNSUPPORTED, "%s: pre_tokenizer %s is not supported here",
                          path, ty ? ty : "?");
        }
    }
    if (!have_split || !have_bl)
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: pre_tokenizer needs Split then ByteLevel", path);
    return 0;
}

/* Raw bytes of a token string: byte-level chars map back to bytes; a string
 * with any other char is taken as its own UTF-8 bytes (HF ByteLevel decoder). */
static void token_raw_bytes(const char *s, const int16_t u2b[0x144], buf *out) {
    size_t n = strlen(s), start = out->len;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_seq_len(u + i, n - i);
        if (!l) goto raw;
        utf8_decode(u + i, &cp);
        if (cp >= 0x144 || u2b[cp] < 0) goto raw;
        buf_putc(out, (char)u2b[cp]);
        i += (size_t)l;
    }
    return;
raw:
    out->len = start;
    buf_append(out, s, n);
}

static int load_config(tokenizer *t, const char *dir, char *err, size_t errlen) {
    char path[4200]; /* dir is < 4096 */
    char *text = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (file_read_all(path, 0, &text, NULL, NULL, 0) == 0) t->chat_template = text;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_read_all(path, 0, &text, NULL, NULL, 0) != 0) return 0; /* optional */
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (!cfg) return errorf(err, errlen, ST_FORMAT, "%s: invalid JSON", path);
    const char *names[2] = {"eos_token", "pad_token"};
    int32_t *dst[2] = {&t->eos_id, &t->pad_id};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, names[k]);
        const char *s = cJSON_IsString(v) ? v->valuestring : json_str(v, "content");
        if (s) *dst[k] = tokenizer_token_to_id(t, s);
    }
    if (!t->chat_template) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *s = cJSON_IsString(ct) ? ct->valuestring : NULL;
        if (cJSON_IsArray(ct)) { /* [{name, template}]: take "default" */
            const cJSON *it;
            cJSON_ArrayForEach(it, ct) {
                const char *nm = json_str(it, "name");
                if (nm && strcmp(nm, "default") == 0) s = json_str(it, "template");
            }
        }
        if (s && !(t->chat_template = strdup(s))) {
            cJSON_Delete(cfg);
            return errorf(err, errlen, ST_NOMEM, "out of memory");
        }
    }
    cJSON_Delete(cfg);
    return 0;
}

static int build(tokenizer *t, cJSON *root, raw_model *rm, const char *path, char *err, size_t errlen) {
    int rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mtype = json_str(model, "type");
    if (!model || (mtype && strcmp(mtype, "BPE") != 0))
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: model type %s is not supported (only BPE)", path,
                      mtype ? mtype : "?");
    if (json_true(model, "byte_fallback") || !json_empty(model, "continuing_subword_prefix") ||
        !json_empty(model, "end_of_word_suffix") || !json_empty(model, "unk_token"))
        return errorf(err, errlen, ST_UNSUPPORTED,
                      "%s: BPE with byte_fallback, unk_token or subword affixes is not supported", path);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0.0))
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: BPE dropout is not supported", path);
    t->ignore_merges = json_true(model, "ignore_merges");
    if ((rc = check_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), path, err, errlen)))
        return rc;
    if ((rc = check_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), path, err,
                                  errlen)))
        return rc;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dtype = json_str(dec, "type");
    if (!dtype || strcmp(dtype, "ByteLevel") != 0)
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: decoder must be ByteLevel", path);

    /* ids: vocab and added tokens */
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!rm->have_vocab || !rm->have_merges)
        return errorf(err, errlen, ST_FORMAT, "%s: model.vocab or model.merges missing", path);
    const char *ar = rm->arena.data;
    int64_t max_id = -1;
    size_t str_total = 0;
    const cJSON *it;
    for (size_t i = 0; i < rm->nv; i++) {
        if (rm->vid[i] < 0 || rm->vid[i] > 100000000)
            return errorf(err, errlen, ST_FORMAT, "%s: vocab entry %s has a bad id", path, ar + rm->voff[i]);
        if (rm->vid[i] > max_id) max_id = rm->vid[i];
        str_total += strlen(ar + rm->voff[i]) + 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const char *c = json_str(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 || !c || !c[0])
            return errorf(err, errlen, ST_FORMAT, "%s: bad added_tokens entry", path);
        if (json_true(it, "lstrip") || json_true(it, "rstrip") || json_true(it, "single_word"))
            return errorf(err, errlen, ST_UNSUPPORTED, "%s: added token %s uses lstrip/rstrip/single_word",
                          path, c);
        if (id->valueint > max_id) max_id = id->valueint;
        str_total += strlen(c) + 1;
        t->n_added++;
    }
    t->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)t->n_ids;
    t->str_off = malloc(n * sizeof *t->str_off);
    t->str_len = calloc(n, sizeof *t->str_len);
    t->flags = calloc(n, 1);
    t->strs = malloc(str_total + 1);
    t->added = calloc((size_t)t->n_added + 1, sizeof *t->added);
    uint32_t sm = 1;
    while (sm < 2 * n + 16) sm <<= 1;
    t->smap = calloc(sm, sizeof *t->smap);
    t->smap_mask = sm - 1;
    if (!t->str_off || !t->str_len || !t->flags || !t->strs || !t->added || !t->smap)
        return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    memset(t->str_off, 0xFF, n * sizeof *t->str_off);
    size_t off = 0;
    for (size_t i = 0; i < rm->nv; i++) {
        size_t l = strlen(ar + rm->voff[i]) + 1;
        memcpy(t->strs + off, ar + rm->voff[i], l);
        t->str_off[rm->vid[i]] = (uint32_t)off;
        t->str_len[rm->vid[i]] = (uint32_t)(l - 1);
        off += l;
    }
    /* string -> id for the vocab (added tokens are put after, so they win) */
    for (size_t i = 0; i < rm->nv; i++) smap_put(t, (int32_t)rm->vid[i]);
    int ai = 0;
    cJSON_ArrayForEach(it, added) {
        const char *c = json_str(it, "content");
        int32_t id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        size_t l = strlen(c) + 1;
        memcpy(t->strs + off, c, l);
        t->str_off[id] = (uint32_t)off; /* an added token shadows a vocab entry with its id */
        t->str_len[id] = (uint32_t)(l - 1);
        off += l;
        added_token *a = &t->added[ai++];
        a->content = t->strs + t->str_off[id];
        a->len = l - 1;
        a->id = id;
        a->special = json_true(it, "special");
        t->flags[id] = (uint8_t)(1 | (a->special ? 2 : 0));
        t->added_first[(unsigned char)c[0]] = 1;
    }
    /* added tokens after the vocab: token_to_id prefers them, as HF does */
    for (int i = 0; i < t->n_added; i++) smap_put(t, t->added[i].id);
    /* longest first so the first hit at a position is the longest match */
    for (int i = 1; i < t->n_added; i++)
        for (int j = i; j > 0 && t->added[j].len > t->added[j - 1].len; j--) {
            added_token tmp = t->added[j];
            t->added[j] = t->added[j - 1];
            t->added[j - 1] = tmp;
        }

    /* raw bytes per id */
    uint32_t b2u[256];
    int16_t u2b[0x144];
    byte_level_tables(b2u, u2b);
    t->byte_off = malloc((n + 1) * sizeof *t->byte_off);
    buf bytes = {0};
    buf_reserve(&bytes, str_total);
    if (!t->byte_off) return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    for (size_t id = 0; id < n; id++) {
        t->byte_off[id] = (uint32_t)bytes.len;
        if (t->str_off[id] != UINT32_MAX) token_raw_bytes(t->strs + t->str_off[id], u2b, &bytes);
    }
    t->byte_off[n] = (uint32_t)bytes.len;
    if (bytes.oom) {
        buf_free(&bytes);
        return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    }
    t->bytes = bytes.data;
    if (!t->bytes && !(t->bytes = calloc(1, 1))) return errorf(err, errlen, ST_NOMEM, "out of memory");

    for (int b = 0; b < 256; b++) {
        char s[4];
        int l = utf8_encode(b2u[b], s);
        t->byte_id[b] = -1;
        /* only base vocab counts: HF's BPE model looks the char up in its own vocab */
        int32_t id = smap_get(t, s, (size_t)l);
        if (id >= 0 && (t->flags[id] & 1)) {
            id = -1;
            for (size_t i = 0; i < rm->nv; i++)
                if (strlen(ar + rm->voff[i]) == (size_t)l && memcmp(ar + rm->voff[i], s, (size_t)l) == 0)
                    id = (int32_t)rm->vid[i];
        }
        if (id < 0)
            return errorf(err, errlen, ST_UNSUPPORTED, "%s: byte 0x%02X has no token (byte-level vocab expected)",
                          path, b);
        t->byte_id[b] = id;
    }

    /* merges: ["a b", ...] or [["a","b"], ...] */
    size_t nm = rm->nm;
    uint32_t mm = 1;
    while (mm < 2u * (uint32_t)nm + 16) mm <<= 1;
    t->mkeys = calloc(mm, sizeof *t->mkeys);
    t->mrank = malloc(mm * sizeof *t->mrank);
    t->mnew = malloc(mm * sizeof *t->mnew);
    t->mmask = mm - 1;
    if (!t->mkeys || !t->mrank || !t->mnew) return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    char tmp[1024];
    uint32_t rank = 0;
    for (size_t mi = 0; mi < nm; mi++) {
        const char *a = ar + rm->moff[2 * mi], *b = ar + rm->moff[2 * mi + 1];
        size_t la = strlen(a), lb = strlen(b);
        if (la + lb >= sizeof tmp) return errorf(err, errlen, ST_FORMAT, "%s: merge %u too long", path, rank);
        int32_t ia = smap_get(t, a, la), ib = smap_get(t, b, lb);
        memcpy(tmp, a, la);
        memcpy(tmp + la, b, lb);
        int32_t im = smap_get(t, tmp, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return errorf(err, errlen, ST_FORMAT, "%s: merge %u (%.*s %.*s) uses a token not in the vocab", path,
                          rank, (int)la, a, (int)lb, b);
        merge_put(t, ia, ib, rank, im);
        rank++;
    }

    t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
    if (!t->cache) return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    return 0;
}

int tokenizer_load(tokenizer **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    char dir[4096], file[4096];
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return errorf(err, errlen, ST_IO, "%s: %s", path ? path : "(null)", strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    char *text;
    int rc = file_read_all(file, 0, &text, NULL, err, errlen);
    if (rc) return rc;
    raw_model rm = {0};
    cJSON *root = cJSON_CreateObject();
    const char *end = root ? parse_object(text, root, &rm, 0) : NULL;
    free(text);
    if (!end || rm.arena.oom) {
        cJSON_Delete(root);
        raw_free(&rm);
        return errorf(err, errlen, ST_FORMAT, "%s: invalid JSON", file);
    }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        raw_free(&rm);
        return errorf(err, errlen, ST_NOMEM, "out of memory");
    }
    t->eos_id = t->pad_id = -1;
    pthread_mutex_init(&t->cache_mu, NULL);
    rc = build(t, root, &rm, file, err, errlen);
    cJSON_Delete(root);
    raw_free(&rm);
    if (!rc) rc = load_config(t, dir, err, errlen);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->str_off);
    free(t->str_len);
    free(t->strs);
    free(t->byte_off);
    free(t->bytes);
    free(t->flags);
    free(t->smap);
    free(t->mkeys);
    free(t->mrank);
    free(t->mnew);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    free(t->chat_template);
    free(t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    free(t);
}

/* ------------------------------------------------------------------ encode */

typedef struct ids_vec {
    int32_t *v;
    size_t n, cap;
    int oom;
} ids_vec;

static void ids_push(ids_vec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *p = realloc(o->v, cap * sizeof *p);
        if (!p) {
            o->oom = 1;
            return;
        }
        o->v = p;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* Scratch for one encode call (one thread). */
typedef struct bpe_work {
    int32_t *sym;  /* current symbol ids */
    uint32_t *rk;  /* rank of pair (i, next(i)), UINT32_MAX none (small path) */
    int32_t *nx, *pv;
    uint64_t *heap; /* (rank << 32 | pos) min-heap (large path) */
    size_t cap, hcap, hn;
} bpe_work;

static int work_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *s = realloc(w->sym, cap * sizeof *s);
    if (s) w->sym = s;
    uint32_t *r = realloc(w->rk, cap * sizeof *r);
    if (r) w->rk = r;
    int32_t *x = realloc(w->nx, cap * sizeof *x);
    if (x) w->nx = x;
    int32_t *p = realloc(w->pv, cap * sizeof *p);
    if (p) w->pv = p;
    if (!s || !r || !x || !p) return -1;
    w->cap = cap;
    return 0;
}

static void work_free(bpe_work *w) {
    free(w->sym);
    free(w->rk);
    free(w->nx);
    free(w->pv);
    free(w->heap);
}

static int heap_push(bpe_work *w, uint64_t v) {
    if (w->hn == w->hcap) {
        size_t cap = w->hcap ? w->hcap * 2 : 256;
        uint64_t *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return -1;
        w->heap = h;
        w->hcap = cap;
    }
    size_t i = w->hn++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (w->heap[p] <= v) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = v;
    return 0;
}

static uint64_t heap_pop(bpe_work *w) {
    uint64_t top = w->heap[0], last = w->heap[--w->hn];
    size_t i = 0, n = w->hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= last) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* BPE of one piece (raw bytes). Appends ids to out. Returns -1 on OOM. */
static int bpe_piece(const tokenizer *t, const unsigned char *s, size_t n, bpe_work *w, ids_vec *out) {
    if (n == 1) {
        ids_push(out, t->byte_id[s[0]]);
        return 0;
    }
    if (t->ignore_merges) {
        /* the whole piece as one token (its byte-level string) */
        char tmp[256 * 2];
        size_t l = 0;
        if (n < 128) {
            for (size_t i = 0; i < n; i++) {
                const char *bs = t->strs + t->str_off[t->byte_id[s[i]]];
                size_t bl = strlen(bs);
                memcpy(tmp + l, bs, bl);
                l += bl;
            }
            int32_t id = smap_get(t, tmp, l);
            if (id >= 0 && !(t->flags[id] & 1)) {
                ids_push(out, id);
                return 0;
            }
        }
    }
    if (work_reserve(w, n)) return -1;
    int32_t *sym = w->sym;
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[s[i]];
    if (n <= SMALL_BPE) {
        /* compact array; rk[i] = rank of (sym[i], sym[i+1]) */
        size_t m = n;
        uint32_t *rk = w->rk;
        int32_t nid = -1;
        for (size_t i = 0; i + 1 < m; i++)
            if (!merge_get(t, sym[i], sym[i + 1], &rk[i], &nid)) rk[i] = UINT32_MAX;
        for (;;) {
            uint32_t best = UINT32_MAX;
            size_t bi = 0;
            for (size_t i = 0; i + 1 < m; i++)
                if (rk[i] < best) {
                    best = rk[i];
                    bi = i;
                }
            if (best == UINT32_MAX) break;
            uint32_t r;
            merge_get(t, sym[bi], sym[bi + 1], &r, &nid);
            sym[bi] = nid;
            memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
            memmove(rk + bi + 1, rk + bi + 2, (m - bi - 2) * sizeof *rk);
            m--;
            if (bi > 0 && !merge_get(t, sym[bi - 1], sym[bi], &rk[bi - 1], &nid)) rk[bi - 1] = UINT32_MAX;
            if (bi + 1 < m) {
                if (!merge_get(t, sym[bi], sym[bi + 1], &rk[bi], &nid)) rk[bi] = UINT32_MAX;
            } else {
                rk[bi] = UINT32_MAX;
            }
        }
        for (size_t i = 0; i < m; i++) ids_push(out, sym[i]);
        return 0;
    }
    /* large piece: linked list + min-heap of (rank, position), stale entries skipped */
    int32_t *nx = w->nx, *pv = w->pv;
    w->hn = 0;
    for (size_t i = 0; i < n; i++) {
        nx[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        pv[i] = (int32_t)i - 1;
    }
    uint32_t r;
    int32_t nid;
    for (size_t i = 0; i + 1 < n; i++)
        if (merge_get(t, sym[i], sym[i + 1], &r, &nid) && heap_push(w, ((uint64_t)r << 32) | i)) return -1;
    while (w->hn) {
        uint64_t top = heap_pop(w);
        uint32_t trank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top;
        if (sym[pos] < 0 || nx[pos] < 0) continue;
        int32_t nxt = nx[pos];
        if (!merge_get(t, sym[pos], sym[nxt], &r, &nid) || r != trank) continue;
        sym[pos] = nid;
        sym[nxt] = -1;
        nx[pos] = nx[nxt];
        if (nx[pos] >= 0) pv[nx[pos]] = pos;
        if (pv[pos] >= 0 && merge_get(t, sym[pv[pos]], sym[pos], &r, &nid) &&
            heap_push(w, ((uint64_t)r << 32) | (uint32_t)pv[pos]))
            return -1;
        if (nx[pos] >= 0 && merge_get(t, sym[pos], sym[nx[pos]], &r, &nid) &&
            heap_push(w, ((uint64_t)r << 32) | (uint32_t)pos))
            return -1;
    }
    for (int32_t i = 0; i >= 0; i = nx[i]) ids_push(out, sym[i]);
    return 0;
}

static int encode_piece(const tokenizer *t, const unsigned char *s, size_t n, bpe_work *w, ids_vec *out) {
    if (n == 0) return 0;
    if (n > CACHE_KEY) return bpe_piece(t, s, n, w, out);
    tokenizer *mt = (tokenizer *)t; /* the cache is the one mutable part */
    uint32_t slot = (uint32_t)hash_bytes(s, n) & (CACHE_SLOTS - 1);
    cache_slot *c = &mt->cache[slot];
    pthread_mutex_lock(&mt->cache_mu);
    if (c->klen == n && memcmp(c->key, s, n) == 0) {
        for (int i = 0; i < c->nids; i++) ids_push(out, c->ids[i]);
        pthread_mutex_unlock(&mt->cache_mu);
        return 0;
    }
    pthread_mutex_unlock(&mt->cache_mu);
    size_t before = out->n;
    if (bpe_piece(t, s, n, w, out)) return -1;
    size_t k = out->n - before;
    if (k <= CACHE_IDS && !out->oom) {
        pthread_mutex_lock(&mt->cache_mu);
        c->klen = (uint8_t)n;
        c->nids = (uint8_t)k;
        memcpy(c->key, s, n);
        memcpy(c->ids, out->v + before, k * sizeof(int32_t));
        pthread_mutex_unlock(&mt->cache_mu);
    }
    return 0;
}

static int is_ascii(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80) return 0;
    return 1;
}

/* Normalise + pre-tokenise + BPE one segment that holds no added token. */
static int encode_segment(const tokenizer *t, const char *s, size_t n, pcre2_match_data *md,
                          pcre2_match_context *mctx, bpe_work *w, ids_vec *out, char *err, size_t errlen) {
    if (n == 0) return 0;
    utf8proc_uint8_t *norm = NULL;
    if (t->normalize_nfc && !is_ascii((const unsigned char *)s, n)) {
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) return errorf(err, errlen, ST_INVALID, "NFC: %s", utf8proc_errmsg(r));
        s = (const char *)norm;
        n = (size_t)r;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t pos = 0;
    int rc = 0;
    pcre2_jit_stack *big = NULL;
    while (pos < n) {
        int m = pcre2_match(t->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mctx);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !big) {
            big = pcre2_jit_stack_create(1 << 16, 256 << 20, NULL);
            if (!big) {
                rc = errorf(err, errlen, ST_NOMEM, "out of memory");
                break;
            }
            pcre2_jit_stack_assign(mctx, NULL, big);
            continue;
        }
        if (m == PCRE2_ERROR_NOMATCH) {
            if (encode_piece(t, u + pos, n - pos, w, out)) rc = ST_NOMEM;
            break;
        }
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = errorf(err, errlen, ST_INTERNAL, "pre-tokenizer regex: %s", (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > pos && encode_piece(t, u + pos, ms - pos, w, out)) { rc = ST_NOMEM; break; } /* gap */
        if (me == ms) { /* empty match: HF skips it; step one char */
            size_t l = 1;
            while (ms + l < n && (u[ms + l] & 0xC0) == 0x80) l++;
            if (encode_piece(t, u + ms, l, w, out)) { rc = ST_NOMEM; break; }
            pos = ms + l;
            continue;
        }
        if (encode_piece(t, u + ms, me - ms, w, out)) { rc = ST_NOMEM; break; }
        pos = me;
    }
    if (big) {
        pcre2_jit_stack_assign(mctx, NULL, NULL);
        pcre2_jit_stack_free(big);
    }
    free(norm);
    if (rc == ST_NOMEM) return errorf(err, errlen, ST_NOMEM, "out of memory");
    return rc;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                     char *err, size_t errlen) {
    *ids = NULL;
    *n = 0;
    size_t bad = utf8_validate(text, len);
    if (bad != len)
        return errorf(err, errlen, ST_INVALID, "text is not valid UTF-8 (byte 0x%02X at offset %zu)",
                      (unsigned char)text[bad], bad);
    ids_vec out = {0};
    bpe_work w = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    pcre2_match_context *mctx = pcre2_match_context_create(NULL);
    int rc = 0;
    if (!md || !mctx) rc = errorf(err, errlen, ST_NOMEM, "out of memory");
    size_t seg = 0, i = 0;
    while (!rc && i < len) {
        if (t->added_first[(unsigned char)text[i]]) {
            const added_token *hit = NULL;
            for (int k = 0; k < t->n_added; k++) {
                const added_token *a = &t->added[k];
                if (a->len <= len - i && memcmp(text + i, a->content, a->len) == 0) {
                    hit = a;
                    break;
                }
            }
            if (hit) {
                rc = encode_segment(t, text + seg, i - seg, md, mctx, &w, &out, err, errlen);
                ids_push(&out, hit->id);
                i += hit->len;
                seg = i;
                continue;
            }
        }
        i++;
    }
    if (!rc) rc = encode_segment(t, text + seg, len - seg, md, mctx, &w, &out, err, errlen);
    if (!rc && out.oom) rc = errorf(err, errlen, ST_NOMEM, "out of memory");
    if (md) pcre2_match_data_free(md);
    if (mctx) pcre2_match_context_free(mctx);
    work_free(&w);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v && !(out.v = malloc(sizeof(int32_t)))) return errorf(err, errlen, ST_NOMEM, "out of memory");
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* ------------------------------------------------------------------ decode */

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                     size_t *len, char *err, size_t errlen) {
    *text = NULL;
    buf raw = {0}, outb = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->str_off[id] == UINT32_MAX) continue; /* HF skips unknown ids */
        if (skip_special && (t->flags[id] & 2)) continue;
        buf_append(&raw, t->bytes + t->byte_off[id], t->byte_off[id + 1] - t->byte_off[id]);
    }
    buf_reserve(&outb, raw.len + 16);
    buf_append_lossy(&outb, (const unsigned char *)raw.data, raw.len);
    buf_free(&raw);
    if (!outb.data) buf_append(&outb, "", 0);
    if (outb.oom) {
        buf_free(&outb);
        return errorf(err, errlen, ST_NOMEM, "out of memory");
    }
    *text = outb.data;
    if (len) *len = outb.len;
    return 0;
}

/* ----------------------------------------------------------------- lookups */

int32_t tokenizer_token_to_id(const tokenizer *t, const char *token) {
    return token ? smap_get(t, token, strlen(token)) : -1;
}

const char *tokenizer_id_to_token(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->str_off[id] == UINT32_MAX) return NULL;
    return t->strs + t->str_off[id];
}

const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->str_off[id] == UINT32_MAX) return NULL;
    if (len) *len = t->byte_off[id + 1] - t->byte_off[id];
    return t->bytes + t->byte_off[id];
}

int tokenizer_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & 2) != 0;
}

int tokenizer_is_added(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & 1) != 0;
}

int32_t tokenizer_vocab_size(const tokenizer *t) { return t->n_ids; }
int32_t tokenizer_eos_id(const tokenizer *t) { return t->eos_id; }
int32_t tokenizer_pad_id(const tokenizer *t) { return t->pad_id; }
const char *tokenizer_chat_template(const tokenizer *t) { return t->chat_template; }

/* ------------------------------------------------------ streaming detokenizer */

struct detok_stream {
    const tokenizer *tok;
    int skip_special;
    unsigned char held[4]; /* incomplete UTF-8 tail carried to the next push (<= 3 bytes) */
    size_t nheld;
    buf out; /* what the last push/flush returned */
};

int detok_stream_new(detok_stream **out, const tokenizer *tok, int skip_special, char *err, size_t errlen) {
    detok_stream *s = calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "out of memory");
    s->tok = tok;
    s->skip_special = skip_special;
    *out = s;
    return 0;
}

void detok_stream_free(detok_stream *s) {
    if (!s) return;
    buf_free(&s->out);
    free(s);
}

void detok_reset(detok_stream *s) { s->nheld = 0; }

int detok_push(detok_stream *s, int32_t id, const char **text, size_t *len, char *err, size_t errlen) {
    s->out.len = 0;
    if (s->out.data) s->out.data[0] = 0;
    size_t tl = 0;
    const char *tb = tokenizer_token_bytes(s->tok, id, &tl);
    if (!tb || (s->skip_special && tokenizer_is_special(s->tok, id))) tl = 0;
    /* pending = held tail + this token's bytes; emit all but a new incomplete tail */
    unsigned char small[64];
    unsigned char *p = small;
    size_t n = s->nheld + tl;
    if (n > sizeof small && !(p = malloc(n))) return errorf(err, errlen, ST_NOMEM, "out of memory");
    memcpy(p, s->held, s->nheld);
    if (tl) memcpy(p + s->nheld, tb, tl);
    size_t keep = utf8_incomplete_tail(p, n);
    buf_append_lossy(&s->out, p, n - keep);
    memcpy(s->held, p + n - keep, keep);
    s->nheld = keep;
    if (p != small) free(p);
    if (s->out.oom) return errorf(err, errlen, ST_NOMEM, "out of memory");
    *text = s->out.data ? s->out.data : "";
    *len = s->out.len;
    return 0;
}

int detok_flush(detok_stream *s, const char **text, size_t *len) {
    s->out.len = 0;
    if (s->out.data) s->out.data[0] = 0;
    buf_append_lossy(&s->out, s->held, s->nheld);
    s->nheld = 0;
    *text = s->out.data ? s->out.data : "";
    *len = s->out.oom ? 0 : s->out.len;
    return s->out.oom ? ST_NOMEM : 0;
}
