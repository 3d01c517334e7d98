/* Streams of safetensors frames with a trailer; zstd on write by default,
 * auto-detected on read. The byte layout is in man/man5/lrmoe-stream.5. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>
#include <jansson.h>
#define ZSTD_STATIC_LINKING_ONLY   /* ZSTD_d_forceIgnoreChecksum */
#include <zstd.h>
#include "lrmoe.h"
#include "alloc.h"
#include "crc64.h"
#include "xxh64.h"
#include "tools.h"

static const char TRAILER_MAGIC[8] = {'L', 'R', 'M', 'O', 'E', 'E', 'N', 'D'};
/* The digest record before each frame: one of these 8 bytes and the
 * CRC-64/NVME (written by default) or the XXH64 (earlier writers) of
 * the frame's bytes (lrmoe-stream(5), Integrity). Read as a header length,
 * like the trailer's, either exceeds the limit by far. */
static const char CRC_MAGIC[8] = {'L', 'R', 'M', 'O', 'E', 'C', 'R', 'C'};
static const char XXH_MAGIC[8] = {'L', 'R', 'M', 'O', 'E', 'X', 'X', 'H'};
/* A record of CRC-64s by part: "LRMOECRT", the tensor count n, the CRC of
 * the frame's header (its length and JSON), then each tensor's CRC in data
 * order; they combine into the frame's CRC-64 (crc(A B) is crc(A) times
 * x^(8|B|) plus crc(B)), which is what a reader of the stream checks, so
 * that a mapped reader can check the header alone or one tensor
 * (lib/weights_map.c). Written for frames of TENSOR_DIGEST_MIN data or
 * more. */
static const char CRT_MAGIC[8] = {'L', 'R', 'M', 'O', 'E', 'C', 'R', 'T'};
#define TENSOR_DIGEST_MIN ((uint64_t)64 << 20)
#define IOBUF (1u << 20)
#define HASH_CHUNK (1u << 20) /* raw reads straight into a tensor, hashed while cached */
#define PF_PIECE ((size_t)4 << 20) /* a large tensor is faulted in this much at a time */
/* A frame with at least this much data is hashed by the reader's hasher
 * thread while the rest of it is read (struct hasher); a smaller one inline, as
 * it arrives: the handoff would cost more than the overlap saves. */
#ifndef HASH_THREAD_MIN   /* tests/bench/stream_threshold.sh builds the reader with others */
#define HASH_THREAD_MIN (4u << 20)
#endif

/* The kind of digest record that p (8 bytes) starts, or 0 */
static int digest_kind(const void *p)
{
    if (!memcmp(p, CRC_MAGIC, 8)) return LRMOE_DIGEST_CRC64;
    if (!memcmp(p, XXH_MAGIC, 8)) return LRMOE_DIGEST_XXH64;
    if (!memcmp(p, CRT_MAGIC, 8)) return LRMOE_DIGEST_CRC64_TENSORS;
    return 0;
}

/* A frame's digest as it is computed, of either kind */
typedef struct {
    int kind;
    uint64_t crc;
    lrmoe_xxh64_t xxh;
} digest_t;

static void dg_reset(digest_t *d, int kind)
{
    d->kind = kind;
    d->crc = 0;
    if (kind == LRMOE_DIGEST_XXH64) lrmoe_xxh64_reset(&d->xxh);
}

static void dg_update(digest_t *d, const void *p, size_t n)
{
    if (d->kind == LRMOE_DIGEST_CRC64) d->crc = lrmoe_crc64_update(d->crc, p, n);
    else lrmoe_xxh64_update(&d->xxh, p, n);
}

static uint64_t dg_final(const digest_t *d)
{
    return d->kind == LRMOE_DIGEST_CRC64 ? d->crc : lrmoe_xxh64_digest(&d->xxh);
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ------------------------------------------------------------ encoding */

/* The frame's JSON header, padded with spaces so that its data starts on a
 * 64-byte boundary of the stream: at is the stream offset where the frame
 * starts (bytes written before it, uncompressed), so at + 8 + hlen is a
 * multiple of 64. Tensors whose earlier neighbours' sizes are multiples of 64
 * then sit 64-byte aligned in a mapped raw file (lrmoe-stream(5)). */
static int frame_header(const lrmoe_frame_t *f, uint64_t at, char **hdr, size_t *hlen,
                        size_t *datalen)
{
    json_t *root = json_object();
    if (!root) return lrmoe_err("out of memory");
    if (f->nattrs) {
        json_t *m = json_object();
        json_object_set_new(root, "__metadata__", m);
        for (int i = 0; i < f->nattrs; i++)
            json_object_set_new(m, f->keys[i], json_string(f->vals[i]));
    }
    size_t off = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const lrmoe_tensor_t *t = f->tensors[i];
        if (!strcmp(t->name, "__metadata__")) {
            json_decref(root);
            return lrmoe_err("tensor name __metadata__ is reserved");
        }
        json_t *e = json_object(), *sh = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        json_object_set_new(e, "dtype", json_string(lrmoe_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + t->nbytes)));
        json_object_set_new(root, t->name, e);
        off += t->nbytes;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!s) return lrmoe_err("out of memory encoding frame header");
    size_t n = strlen(s), pad = (size_t)((64 - (at + 8 + n) % 64) % 64);
    if (n + pad > LRMOE_MAX_HEADER) {
        free(s);
        return lrmoe_err("frame header of %zu bytes: beyond the %u-byte limit", n + pad,
                         LRMOE_MAX_HEADER);
    }
    char *h = realloc(s, n + pad + 1);
    if (!h) { free(s); return lrmoe_err("out of memory"); }
    memset(h + n, ' ', pad);
    h[n + pad] = 0;
    *hdr = h;
    *hlen = n + pad;
    *datalen = off;
    return 0;
}

typedef struct { const char *name; lrmoe_dtype_t dt; int ndim; int64_t shape[LRMOE_MAX_DIMS];
                 uint64_t b, e; } entry_t;

static int cmp_entry(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return 0;
}

static int get_uint(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Parse and validate a header into the empty frame f; on success f holds the
 * attributes and the tensors (data allocated, not filled) in data order;
 * *datalen the byte size. avail is how many data bytes the input can still
 * hold (UINT64_MAX: unknown, a pipe or compressed input): a header that
 * declares more is "truncated" before anything is allocated. Linear in the header: jansson rejects duplicate
 * names with its hash table, so the frame is built by appending. */
static int parse_header(const char *hdr, size_t hlen, lrmoe_frame_t *f, uint64_t *datalen,
                        uint64_t avail)
{
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lrmoe_err("malformed JSON header: %s (column %d)", jerr.text, jerr.column);
    int rc = -1;
    size_t n = json_object_size(root);
    entry_t *ents = NULL;
    if (!json_is_object(root)) { lrmoe_err("JSON header is not an object"); goto out; }
    if (n > (size_t)LRMOE_MAX_TENSORS + 1) {
        lrmoe_err("%zu entries: more than %d tensors in one frame", n, LRMOE_MAX_TENSORS);
        goto out;
    }
    ents = calloc(n ? n : 1, sizeof *ents);
    if (!ents) { lrmoe_err("out of memory"); goto out; }
    size_t ne = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) { lrmoe_err("__metadata__ is not an object"); goto out; }
            if (json_object_size(val) > LRMOE_MAX_ATTRS) {
                lrmoe_err("__metadata__: %zu attributes, more than %d in one frame",
                          json_object_size(val), LRMOE_MAX_ATTRS);
                goto out;
            }
            const char *k;
            json_t *v;
            json_object_foreach(val, k, v) {
                if (!json_is_string(v)) { lrmoe_err("__metadata__ %s is not a string", k); goto out; }
                /* keys are unique (JSON_REJECT_DUPLICATES), f was empty */
                if (lrmoe_frame_set_attr_new(f, k, json_string_value(v)) < 0) goto out;
            }
            continue;
        }
        entry_t *e = &ents[ne++];
        e->name = key;
        if (!*key) { lrmoe_err("empty tensor name"); goto out; }
        json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
               *off = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(dt) || !json_is_array(sh) ||
            !json_is_array(off) || json_array_size(off) != 2) {
            lrmoe_err("tensor %s: entry needs dtype, shape and data_offsets [begin,end]", key);
            goto out;
        }
        if (lrmoe_dtype_parse(json_string_value(dt), &e->dt) < 0) {
            lrmoe_err_prefix("tensor %s", key);
            goto out;
        }
        if (json_array_size(sh) > LRMOE_MAX_DIMS) {
            lrmoe_err("tensor %s: %zu dimensions (at most %d)", key, json_array_size(sh), LRMOE_MAX_DIMS);
            goto out;
        }
        e->ndim = (int)json_array_size(sh);
        uint64_t need = lrmoe_dtype_size(e->dt);
        for (int d = 0; d < e->ndim; d++) {
            uint64_t x;
            if (get_uint(json_array_get(sh, (size_t)d), &x) < 0) {
                lrmoe_err("tensor %s: shape must hold non-negative integers", key);
                goto out;
            }
            if (x && need > (UINT64_MAX >> 2) / x) { lrmoe_err("tensor %s: size overflows", key); goto out; }
            need *= x;
            e->shape[d] = (int64_t)x;
        }
        if (get_uint(json_array_get(off, 0), &e->b) < 0 || get_uint(json_array_get(off, 1), &e->e) < 0 ||
            e->e < e->b) {
            lrmoe_err("tensor %s: data_offsets must be [begin,end] with 0 <= begin <= end", key);
            goto out;
        }
        if (e->e - e->b != need) {
            lrmoe_err("tensor %s: data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64
                      " bytes but shape x dtype needs %" PRIu64, key, e->b, e->e, e->e - e->b, need);
            goto out;
        }
    }
    qsort(ents, ne, sizeof *ents, cmp_entry);
    uint64_t pos = 0;
    for (size_t i = 0; i < ne; i++) {
        if (ents[i].b < pos) { lrmoe_err("tensor %s: data_offsets overlap the previous tensor", ents[i].name); goto out; }
        if (ents[i].b > pos) { lrmoe_err("tensor %s: gap in data before it (offset %" PRIu64 ", expected %" PRIu64 ")", ents[i].name, ents[i].b, pos); goto out; }
        pos = ents[i].e;
    }
    if (pos > avail) {
        lrmoe_err("truncated: the tensors need %" PRIu64 " bytes of data, the input holds %" PRIu64,
                  pos, avail);
        goto out;
    }
    for (size_t i = 0; i < ne; i++) {
        entry_t *e = &ents[i];
        size_t nb = (size_t)(e->e - e->b);
        void *data = nb ? lrmoe_alloc_big(nb) : NULL;
        if (nb && !data) { lrmoe_err("out of memory: %zu bytes for tensor %s", nb, e->name); goto out; }
        if (!lrmoe_frame_adopt_new(f, e->name, e->dt, e->ndim, e->shape, data)) goto out;
    }
    *datalen = pos;
    rc = 0;
out:
    free(ents);
    json_decref(root);
    return rc;
}

int lrmoe_frame_encode(const lrmoe_frame_t *f, uint8_t **buf, size_t *len)
{
    char *hdr;
    size_t hlen, dlen;
    if (frame_header(f, 0, &hdr, &hlen, &dlen) < 0) return -1;
    uint8_t *b = malloc(8 + hlen + dlen);
    if (!b) { free(hdr); return lrmoe_err("out of memory"); }
    put_le64(b, hlen);
    memcpy(b + 8, hdr, hlen);
    free(hdr);
    size_t o = 8 + hlen;
    for (int i = 0; i < f->ntensors; i++) {
        if (f->tensors[i]->nbytes) memcpy(b + o, f->tensors[i]->data, f->tensors[i]->nbytes);
        o += f->tensors[i]->nbytes;
    }
    *buf = b;
    *len = o;
    return 0;
}

int lrmoe_frame_decode(const uint8_t *buf, size_t len, lrmoe_frame_t *f)
{
    lrmoe_frame_clear(f);
    if (len < 8) return lrmoe_err("too short for a safetensors header (%zu bytes)", len);
    uint64_t hlen = get_le64(buf);
    if (hlen > LRMOE_MAX_HEADER || hlen > len - 8)
        return lrmoe_err("header length %" PRIu64 " beyond the file (%zu bytes) or limit", hlen, len);
    uint64_t dlen;
    if (parse_header((const char *)buf + 8, (size_t)hlen, f, &dlen, (uint64_t)(len - 8 - hlen)) < 0)
        goto fail;
    if (dlen != len - 8 - hlen) {
        lrmoe_err("data is %" PRIu64 " bytes but the tensors need %" PRIu64, (uint64_t)(len - 8 - hlen), dlen);
        goto fail;
    }
    const uint8_t *d = buf + 8 + hlen;
    for (int i = 0; i < f->ntensors; i++) {
        if (f->tensors[i]->nbytes) memcpy(f->tensors[i]->data, d, f->tensors[i]->nbytes);
        d += f->tensors[i]->nbytes;
    }
    return 0;
fail:
    lrmoe_frame_clear(f);
    return -1;
}

/* fread of exactly n bytes: 0, or -1 with "truncated ..." or the I/O error */
static int read_exact(FILE *fp, void *buf, size_t n, const char *what)
{
    size_t got = n ? fread(buf, 1, n, fp) : 0;
    if (got == n) return 0;
    if (ferror(fp)) return lrmoe_err("read error in %s: %s", what, strerror(errno));
    return lrmoe_err("truncated: %s ends after %zu of %zu bytes", what, got, n);
}

int lrmoe_frame_fread(FILE *fp, lrmoe_frame_t *f)
{
    lrmoe_frame_clear(f);
    uint8_t h8[8];
    size_t got = fread(h8, 1, 8, fp);
    if (got == 0 && !ferror(fp)) return 0;
    if (got < 8) {
        if (ferror(fp)) return lrmoe_err("read error: %s", strerror(errno));
        return lrmoe_err("truncated: %zu bytes where a safetensors header length (8) starts", got);
    }
    if (!memcmp(h8, TRAILER_MAGIC, 8) || digest_kind(h8))
        return lrmoe_err("this is an lrmoe stream (its %s), not safetensors: "
                         "lrmoe-cat reads streams", digest_kind(h8) ? "digest record" : "trailer");
    if (!memcmp(h8, "\x28\xb5\x2f\xfd", 4))
        return lrmoe_err("zstd-compressed data, not safetensors (an lrmoe stream? lrmoe-cat "
                         "reads those)");
    if (!memcmp(h8, "\x93NUMPY", 6))
        return lrmoe_err(".npy data: import an .npy array from a file named NAME.npy");
    uint64_t hlen = get_le64(h8);
    if (hlen > LRMOE_MAX_HEADER)
        return lrmoe_err("header length %" PRIu64 " beyond the limit (not safetensors?)", hlen);
    char *hdr = malloc(hlen ? hlen : 1);
    if (!hdr) return lrmoe_err("out of memory");
    uint64_t dlen;
    int rc = read_exact(fp, hdr, (size_t)hlen, "the safetensors header");
    if (rc == 0 && (rc = parse_header(hdr, (size_t)hlen, f, &dlen, UINT64_MAX)) < 0)
        lrmoe_err_prefix("not a valid safetensors header");
    free(hdr);
    for (int i = 0; rc == 0 && i < f->ntensors; i++) {
        char what[300];
        snprintf(what, sizeof what, "the data of tensor %s", f->tensors[i]->name);
        rc = read_exact(fp, f->tensors[i]->data, f->tensors[i]->nbytes, what);
    }
    if (rc < 0) {
        lrmoe_frame_clear(f);
        return -1;
    }
    return 1;
}

/* ------------------------------------------------------------ reader */

/* Input is read with read(2), never mapped: a mapped file that shrinks while
 * it is read (a generator re-run onto the same path) raises SIGBUS, where a
 * read just ends early and the stream is reported truncated. Large raw
 * tensors are read straight into their buffers, so raw input is copied once,
 * as from a mapping; compressed input is copied once into inbuf, which costs
 * little beside decompressing it (tests/bench/stream.sh). */
struct lrmoe_reader {
    FILE *fp;
    int own, zstd, done;
    char label[512];
    ZSTD_DCtx *dctx;
    uint8_t *inbuf;
    ZSTD_inBuffer in;       /* buffered input (raw or compressed) */
    size_t last_ret;        /* last ZSTD_decompressStream result: 0 at a frame end */
    int64_t nframes;
    int regular;            /* a regular file: its size is known and fixed */
    int st_name;            /* ... named *.safetensors: may be a plain safetensors file */
    uint64_t avail;         /* raw regular file: bytes left after what rd delivered */
    uint64_t start, got;    /* raw regular file: offset at open, bytes rd delivered */
    int plain;              /* read as one plain safetensors file (no trailer) */
    int nothing;            /* not one byte arrived */
    int digests;            /* a digest record came: every frame must have one */
    int hashing;            /* rd() adds what it delivers to hs */
    int async;              /* rd() hands what it delivers to the hasher thread */
    digest_t hs;            /* the frame's digest so far */
    struct hasher *hasher;  /* started by the first frame of HASH_THREAD_MIN data */
    int noverify;           /* lrmoe_reader_set_verify(r, on <= 0): records read, not
                               checked; 2 (on < 0): nor zstd's checksum */
    int zstart;             /* zstd: the next input byte starts a zstd frame */
    uint64_t *tcrc;         /* an LRMOECRT record: the header's CRC, then each */
    size_t tcap;            /* tensor's (tcap allocated) */
    int last_digest;        /* the record kind of the frame last returned */
};

/* The hasher thread of a reader: it hashes a frame's data into r->hs while
 * the reader thread reads the rest of it, so that a large frame costs about
 * the longer of reading and hashing it, not their sum. The reader publishes
 * how many of the frame's data bytes have arrived (ready; the tensors fill
 * in order); the hasher hashes up to there and sleeps until there is more.
 * The reader compares the digest only after the hasher has caught up
 * (hasher_finish), so no frame is returned before its bytes are verified,
 * and on every error path it also waits for the hasher before the frame's
 * buffers are freed. All shared fields are under mu. */
struct hasher {
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t work, caught_up;
    digest_t *hs;
    lrmoe_frame_t *f;       /* the frame being hashed; NULL: no job */
    uint64_t ready, done;   /* data bytes arrived, hashed */
    size_t piece;           /* the reader reads and hands over this much at a time */
    int ti;                 /* the hasher's place: tensor ti, byte toff */
    size_t toff;
    int sleeping, waiting, quit;
};

static void *hasher_main(void *arg)
{
    struct hasher *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->quit && !(h->f && h->done < h->ready)) {
            h->sleeping = 1;
            pthread_cond_wait(&h->work, &h->mu);
            h->sleeping = 0;
        }
        if (h->quit) break;
        uint64_t from = h->done, to = h->ready;
        lrmoe_frame_t *f = h->f;
        pthread_mutex_unlock(&h->mu);
        for (uint64_t left = to - from; left;) {
            lrmoe_tensor_t *t = f->tensors[h->ti];
            size_t c = t->nbytes - h->toff;
            if (c > left) c = (size_t)left;
            if (c) dg_update(h->hs, (const uint8_t *)t->data + h->toff, c);
            h->toff += c;
            left -= c;
            if (h->toff == t->nbytes) h->ti++, h->toff = 0;
        }
        pthread_mutex_lock(&h->mu);
        h->done = to;
        if (h->waiting) pthread_cond_signal(&h->caught_up);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Hand frame f's data (header already in r->hs) to the hasher, starting it
 * on first use; -1 when no thread can be had (the caller hashes inline). */
static int hasher_begin(lrmoe_reader_t *r, lrmoe_frame_t *f, uint64_t dlen)
{
    /* a sixteenth of the frame at a time, 1 to 8 MiB: a wake-up of the
     * thread per MiB cost a 256 MiB frame 1-3% of its reading time on a
     * 2-core VM, 8 MiB pieces under 1%; the last piece is hashed after it
     * arrives, so a small frame takes small ones */
    size_t piece = dlen / 16 < IOBUF ? IOBUF : dlen / 16 > (8u << 20) ? (8u << 20) : (size_t)(dlen / 16);
    struct hasher *h = r->hasher;
    if (!h) {
        if (!(h = calloc(1, sizeof *h))) return -1;
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->work, NULL);
        pthread_cond_init(&h->caught_up, NULL);
        if (pthread_create(&h->tid, NULL, hasher_main, h) != 0) {
            pthread_cond_destroy(&h->caught_up);
            pthread_cond_destroy(&h->work);
            pthread_mutex_destroy(&h->mu);
            free(h);
            return -1;
        }
        r->hasher = h;
    }
    pthread_mutex_lock(&h->mu);
    h->hs = &r->hs;
    h->f = f;
    h->ready = h->done = 0;
    h->piece = piece;
    h->ti = 0;
    h->toff = 0;
    pthread_mutex_unlock(&h->mu);
    r->async = 1;
    return 0;
}

/* n more data bytes of the frame have arrived */
static void hasher_publish(struct hasher *h, size_t n)
{
    if (!n) return;
    pthread_mutex_lock(&h->mu);
    h->ready += n;
    if (h->sleeping && h->ready - h->done >= h->piece) pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
}

/* Wait until every published byte is hashed; the job ends and r->hs is the
 * reader thread's again. */
static void hasher_finish(lrmoe_reader_t *r)
{
    struct hasher *h = r->hasher;
    if (!r->async) return;
    r->async = 0;
    pthread_mutex_lock(&h->mu);
    h->waiting = 1;
    if (h->sleeping && h->done < h->ready) pthread_cond_signal(&h->work);
    while (h->done < h->ready) pthread_cond_wait(&h->caught_up, &h->mu);
    h->waiting = 0;
    h->f = NULL;
    pthread_mutex_unlock(&h->mu);
}

static void hasher_stop(struct hasher *h)
{
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->quit = 1;
    pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->tid, NULL);
    pthread_cond_destroy(&h->caught_up);
    pthread_cond_destroy(&h->work);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* One read(2) of at most n bytes: what a pipe holds now, without waiting
 * for all n (fread waits for n bytes or the end, so a live stream's last
 * frame would sit in the pipe until the next one pushed it). The reader
 * never reads through stdio, so no stdio buffer hides bytes from it.
 * Returns the count, 0 at the end of input, -1 on error (errno set). */
static ssize_t read_some(FILE *fp, void *buf, size_t n)
{
    ssize_t m;
    do m = read(fileno(fp), buf, n);
    while (m < 0 && errno == EINTR);
    return m;
}

static int fill(lrmoe_reader_t *r)
{
    ssize_t n = read_some(r->fp, r->inbuf, IOBUF);
    if (n < 0) return lrmoe_err("read error: %s", strerror(errno));
    r->in.src = r->inbuf;
    r->in.size = (size_t)n;
    r->in.pos = 0;
    return (int)(n > 0);
}

/* zstd's content checksum is the XXH64 of its frame's whole content,
 * checked once at the frame's end (for an lrmoe stream: after the trailer),
 * so it never stops a bad frame before the frame is handed on; the digest
 * records do. When a zstd frame's content starts with a digest record,
 * every byte of it is covered without zstd's checksum: each frame by its
 * record (once a record has come, every later frame needs one), each
 * record's magic and the trailer by their checks (an impossible header
 * length, the count, nothing after it), each record's digest by the
 * comparison. The decoder then skips computing its checksum, the same hash
 * over the same bytes a second time (lrmoe-stream(5), Integrity). This
 * decodes the frame's first 8 bytes, then rewinds: r->in holds the frame's
 * start, and the decoder is between frames. Reads only what the decoder
 * needs for them (the first block), which the reader waits for anyway.
 * Errors here are left for the real decoding to report; a libzstd without
 * the parameter verifies as before. */
static void zstd_frame_peek(lrmoe_reader_t *r)
{
    ZSTD_DCtx_reset(r->dctx, ZSTD_reset_session_only);
    ZSTD_DCtx_setParameter(r->dctx, ZSTD_d_forceIgnoreChecksum, ZSTD_d_validateChecksum);
    if (r->in.pos) {   /* the frame's start to the buffer's, to read more after it */
        size_t have = r->in.size - r->in.pos;
        memmove(r->inbuf, (const uint8_t *)r->in.src + r->in.pos, have);
        r->in.src = r->inbuf;
        r->in.pos = 0;
        r->in.size = have;
    }
    uint8_t head[8];
    ZSTD_outBuffer o = {head, 8, 0};
    ZSTD_inBuffer in = r->in;
    for (;;) {
        size_t ib = in.pos, ob = o.pos;
        size_t ret = ZSTD_decompressStream(r->dctx, &o, &in);
        if (ZSTD_isError(ret) || ret == 0 || o.pos == 8) break;
        if (in.pos != ib || o.pos != ob) continue;
        /* no progress: the decoder needs more input */
        if (in.pos < in.size || r->in.size == IOBUF) break;
        ssize_t m = read_some(r->fp, r->inbuf + r->in.size, IOBUF - r->in.size);
        if (m <= 0) break;   /* errors, the end: the real decoding reports them */
        r->in.size += (size_t)m;
        in.size = r->in.size;
    }
    int rec = o.pos == 8 && digest_kind(head) && r->noverify != 1;
    ZSTD_DCtx_reset(r->dctx, ZSTD_reset_session_only);
    if (rec) ZSTD_DCtx_setParameter(r->dctx, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
}

/* At the start of a zstd frame (r->in holds at least one byte of it): a
 * frame without zstd's content checksum is refused (lrmoe-stream(5):
 * lrmoe's writers always set it; "zstd --no-check" output would otherwise
 * pass unverified). Skippable frames carry no data and pass. Reads until
 * the frame header's descriptor byte (the fifth) is in the buffer. */
static int zstd_frame_check(lrmoe_reader_t *r)
{
    while (r->in.size - r->in.pos < 5) {
        size_t have = r->in.size - r->in.pos;
        memmove(r->inbuf, (const uint8_t *)r->in.src + r->in.pos, have);
        r->in.src = r->inbuf;
        r->in.pos = 0;
        r->in.size = have;
        ssize_t m = read_some(r->fp, r->inbuf + have, IOBUF - have);
        if (m < 0) return lrmoe_err("read error: %s", strerror(errno));
        if (m == 0) break;   /* zstd reports the short frame */
        r->in.size += (size_t)m;
    }
    const uint8_t *p = (const uint8_t *)r->in.src + r->in.pos;
    r->zstart = 0;
    if (r->in.size - r->in.pos >= 5 && !memcmp(p, "\x28\xb5\x2f\xfd", 4) && !(p[4] & 4))
        return lrmoe_err("a zstd frame without its content checksum (lrmoe's writers set it; "
                         "zstd --no-check output is refused): recompress it with zstd");
    if (r->in.size - r->in.pos >= 5 && !memcmp(p, "\x28\xb5\x2f\xfd", 4)) zstd_frame_peek(r);
    return 0;
}

/* Read up to n bytes; returns the count (< n only at end of input) or -1. */
static int64_t rd(lrmoe_reader_t *r, void *dst, size_t n)
{
    if (!r->zstd) {
        size_t got = 0;
        while (got < n) {
            if (r->in.pos == r->in.size) {
                /* large: straight into dst, unless a CRC-64 is taken (see
                 * lrmoe_reader_next: through inbuf, copied and hashed in
                 * one pass, it is faster than a straight read alone) */
                if (n - got >= IOBUF && !(r->hashing && r->hs.kind == LRMOE_DIGEST_CRC64)) {
                    size_t want = n - got;
                    /* hashed: in pieces, but never leaving less than IOBUF
                     * for a straight read (a rest below it would go through
                     * inbuf, and its fill take the next frame's first MiB
                     * through inbuf too: measured, 2 MiB frames read at half
                     * the speed that way) */
                    size_t piece = r->async ? r->hasher->piece : HASH_CHUNK;
                    if ((r->hashing || r->async) && want >= piece + IOBUF) want = piece;
                    ssize_t m = read_some(r->fp, (uint8_t *)dst + got, want);
                    if (m < 0) return lrmoe_err("read error: %s", strerror(errno));
                    if (r->hashing) dg_update(&r->hs, (uint8_t *)dst + got, (size_t)m);
                    if (r->async) hasher_publish(r->hasher, (size_t)m);
                    got += (size_t)m;
                    if (m == 0 || got == n) break;
                    continue;
                }
                int k = fill(r);
                if (k < 0) return -1;
                if (!k) break;
            }
            size_t c = r->in.size - r->in.pos;
            if (c > n - got) c = n - got;
            if (r->hashing && r->hs.kind == LRMOE_DIGEST_CRC64)   /* copied and hashed in one pass */
                r->hs.crc = lrmoe_crc64_copy(r->hs.crc, (uint8_t *)dst + got,
                                             (const uint8_t *)r->in.src + r->in.pos, c);
            else {
                memcpy((uint8_t *)dst + got, (const uint8_t *)r->in.src + r->in.pos, c);
                if (r->hashing) dg_update(&r->hs, (uint8_t *)dst + got, c);
            }
            if (r->async) hasher_publish(r->hasher, c);
            r->in.pos += c;
            got += c;
        }
        if (r->regular) r->avail = r->avail > got ? r->avail - got : 0;
        r->got += got;
        return (int64_t)got;
    }
    ZSTD_outBuffer out = {dst, n, 0};
    int starved = 0;
    while (out.pos < n) {
        /* read only when the decoder is out of work: it may still hold
         * decoded bytes of a block whose input it has consumed, and a read
         * then would wait on a live pipe for the next frame. After a zstd
         * frame's end (last_ret 0) it holds nothing. */
        if (r->in.pos == r->in.size && (starved || r->last_ret == 0)) {
            int k = fill(r);
            if (k < 0) return -1;
            if (!k) {
                if (r->last_ret != 0) return lrmoe_err("truncated inside a zstd frame");
                break;
            }
        }
        if (r->zstart && zstd_frame_check(r) < 0) return -1;
        size_t before = out.pos;
        size_t ret = ZSTD_decompressStream(r->dctx, &out, &r->in);
        if (ZSTD_isError(ret)) return lrmoe_err("zstd: %s", ZSTD_getErrorName(ret));
        if (r->hashing) dg_update(&r->hs, (uint8_t *)dst + before, out.pos - before);
        if (r->async) hasher_publish(r->hasher, out.pos - before);
        r->last_ret = ret;
        r->zstart = ret == 0;
        starved = out.pos == before;
    }
    return (int64_t)out.pos;
}

static lrmoe_reader_t *reader_new(FILE *fp, int own, const char *label)
{
    lrmoe_reader_t *r = calloc(1, sizeof *r);
    if (!r || !(r->inbuf = malloc(IOBUF))) {
        free(r);
        lrmoe_err("out of memory");
        return NULL;
    }
    r->fp = fp;
    r->own = own;
    snprintf(r->label, sizeof r->label, "%s", label);
    r->in.src = r->inbuf;
    /* Sniff the zstd magic (28 b5 2f fd) from the first bytes. */
    size_t n = 0;
    ssize_t m = 0;
    while (n < 4 && (m = read_some(fp, r->inbuf + n, 4 - n)) > 0) n += (size_t)m;
    if (m < 0) {
        lrmoe_err("%s: read error: %s", label, strerror(errno));
        lrmoe_reader_close(r);
        return NULL;
    }
    const uint8_t *head = r->inbuf;
    r->in.size = n;
    struct stat st;
    off_t at = lseek(fileno(fp), 0, SEEK_CUR);
    r->regular = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && at >= 0 && st.st_size >= at;
    r->avail = r->regular ? (uint64_t)(st.st_size - at) + n : UINT64_MAX;
    r->start = r->regular ? (uint64_t)at - n : 0;
    r->nothing = n == 0;
    size_t ll = strlen(label);
    r->st_name = r->regular && fp != stdin && ll > 12 && !strcasecmp(label + ll - 12, ".safetensors");
    static const uint8_t zmagic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (n == 4 && !memcmp(head, zmagic, 4)) {
        r->zstd = 1;
        r->dctx = ZSTD_createDCtx();
        if (!r->dctx) {
            lrmoe_err("out of memory");
            lrmoe_reader_close(r);
            return NULL;
        }
        r->last_ret = 1;
        r->zstart = 1;
    }
    return r;
}

lrmoe_reader_t *lrmoe_reader_open(const char *path)
{
    if (!path || !strcmp(path, "-")) return reader_new(stdin, 0, "<stdin>");
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        lrmoe_err("%s: %s", path, strerror(errno));
        return NULL;
    }
    return reader_new(fp, 1, path);
}

lrmoe_reader_t *lrmoe_reader_fdopen(FILE *fp, const char *label)
{
    return reader_new(fp, 0, label ? label : "<stream>");
}

int lrmoe_inputs_check(int n, char *const *paths)
{
    int stdin_seen = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], "-")) {
            if (stdin_seen)
                return lrmoe_err("-: standard input named twice (it can be read only once)");
            stdin_seen = 1;
        }
    return 0;
}

int64_t lrmoe_reader_index(const lrmoe_reader_t *r) { return r->nframes; }
int lrmoe_reader_compressed(const lrmoe_reader_t *r) { return r->zstd; }

static int read_trailer(lrmoe_reader_t *r)
{
    uint8_t c[8];
    int64_t n = rd(r, c, 8);
    if (n < 0) return -1;
    if (n < 8) return lrmoe_err("truncated inside the trailer");
    uint64_t count = get_le64(c);
    if (count != (uint64_t)r->nframes)
        return lrmoe_err("trailer counts %" PRIu64 " frames but %" PRId64 " were read", count, r->nframes);
    uint8_t extra;
    n = rd(r, &extra, 1);   /* also lets zstd consume and verify its checksum */
    if (n < 0) return -1;
    if (n > 0) return lrmoe_err("data after the trailer");
    if (r->zstd && r->last_ret != 0) return lrmoe_err("truncated inside a zstd frame");
    r->done = 1;
    return 0;
}

/* The end of input where a frame or the trailer should start. Three cases
 * are not the plain "truncated": nothing at all arrived (the stage before
 * failed, or the file is empty); exactly one raw frame filling a whole
 * regular file named *.safetensors (a plain safetensors file: accepted as
 * a one-frame stream, lrmoe-stream(5)); one raw frame anywhere else, which
 * stays an error that says what to do: byte for byte it is also a raw
 * stream cut after its first frame (a stage that failed on frame 1, a file
 * cut under the reader), and only the name tells them apart. */
static int at_end(lrmoe_reader_t *r)
{
    if (r->nframes == 0) {
        if (r->fp == stdin)
            lrmoe_err("%s: empty input (no frame, no trailer): the previous stage failed", r->label);
        else if (r->nothing)
            lrmoe_err("%s: empty file (no frame, no trailer)", r->label);
        else
            lrmoe_err("%s: empty stream (no frame, no trailer): the stage that wrote it failed",
                      r->label);
        return -2;
    }
    struct stat st;
    if (r->nframes == 1 && !r->zstd && r->st_name && fstat(fileno(r->fp), &st) == 0 &&
        (uint64_t)st.st_size == r->start + r->got) {  /* and the file did not change */
        r->plain = 1;
        r->done = 1;
        return 0;
    }
    if (r->nframes == 1 && !r->zstd)
        return lrmoe_err("truncated: the stream ends without a trailer after one raw frame (if it "
                         "is a plain safetensors file: readers take one as a frame when it is "
                         "named *.safetensors, and lrmoe-import -o x.lrm FILE converts it)");
    return lrmoe_err("truncated: the stream ends without a trailer");
}

int lrmoe_reader_next(lrmoe_reader_t *r, lrmoe_frame_t *f)
{
    lrmoe_frame_clear(f);
    if (r->done) return 0;
    uint8_t h8[8];
    char *hdr = NULL;
    int64_t n = rd(r, h8, 8);
    if (n < 0) goto fail;
    if (n == 0) {
        int e = at_end(r);
        if (e == 0) return 0;
        if (e == -2) return -1;  /* "empty input": no frame to name */
        goto fail;
    }
    if (n < 8) { lrmoe_err("truncated inside the frame header"); goto fail; }
    uint64_t digest = 0;
    size_t ntcrc = 0;       /* an LRMOECRT record's CRCs (r->tcrc) */
    int has_digest = digest_kind(h8);
    if (has_digest) {   /* the record, then the frame it covers, hashed as it arrives */
        uint8_t d8[8];
        n = rd(r, d8, 8);
        if (n < 0) goto fail;
        if (n < 8) { lrmoe_err("truncated inside the digest record"); goto fail; }
        digest = get_le64(d8);
        if (has_digest == LRMOE_DIGEST_CRC64_TENSORS) {   /* n, then n + 1 CRCs */
            if (digest > LRMOE_MAX_TENSORS) {
                lrmoe_err("digest record for %" PRIu64 " tensors (at most %d in a frame)",
                          digest, LRMOE_MAX_TENSORS);
                goto fail;
            }
            ntcrc = (size_t)digest + 1;
            if (ntcrc > r->tcap) {
                uint64_t *t = realloc(r->tcrc, ntcrc * sizeof *t);
                if (!t) { lrmoe_err("out of memory"); goto fail; }
                r->tcrc = t;
                r->tcap = ntcrc;
            }
            for (size_t k = 0; k < ntcrc; k++) {
                n = rd(r, d8, 8);
                if (n < 0) goto fail;
                if (n < 8) { lrmoe_err("truncated inside the digest record"); goto fail; }
                r->tcrc[k] = get_le64(d8);
            }
        }
        r->digests = 1;
        dg_reset(&r->hs, has_digest == LRMOE_DIGEST_XXH64 ? has_digest : LRMOE_DIGEST_CRC64);
        r->hashing = !r->noverify;
        n = rd(r, h8, 8);
        if (n < 0) goto fail;
        if (n < 8) { lrmoe_err("truncated after the digest record"); goto fail; }
        if (!memcmp(h8, TRAILER_MAGIC, 8) || digest_kind(h8)) {
            lrmoe_err("a digest record without a frame after it");
            goto fail;
        }
    } else if (!memcmp(h8, TRAILER_MAGIC, 8)) {
        if (read_trailer(r) < 0) goto fail;
        return 0;
    } else if (r->digests) {
        lrmoe_err("no digest record before the frame, where every frame before it had one");
        goto fail;
    }
    uint64_t hlen = get_le64(h8);
    if (hlen < 2 || hlen > LRMOE_MAX_HEADER) {
        lrmoe_err("header length %" PRIu64 " beyond the sane limit (%u)%s", hlen,
                  LRMOE_MAX_HEADER, r->nframes ? "" : ": not an lrmoe stream or safetensors file");
        goto fail;
    }
    if (!r->zstd && hlen > r->avail) {  /* before allocating what cannot arrive */
        lrmoe_err("truncated inside the frame header (%" PRIu64 " bytes declared, %" PRIu64
                  " left in the file)", hlen, r->avail);
        goto fail;
    }
    hdr = malloc(hlen);
    if (!hdr) { lrmoe_err("out of memory"); goto fail; }
    n = rd(r, hdr, hlen);
    if (n < 0) goto fail;
    if ((uint64_t)n < hlen) { lrmoe_err("truncated inside the frame header"); goto fail; }
    uint64_t dlen;
    if (parse_header(hdr, hlen, f, &dlen, r->zstd ? UINT64_MAX : r->avail) < 0) goto fail;
    free(hdr);
    hdr = NULL;
    if (ntcrc && ntcrc - 1 != (size_t)f->ntensors) {
        lrmoe_err("the digest record lists %zu tensors, the frame has %d", ntcrc - 1,
                  f->ntensors);
        goto fail;
    }
    /* A large frame of a raw stream with a CRC-64 record is hashed inline:
     * read into inbuf a MiB at a time and copied out with the CRC in the
     * same pass (rd), it read 256 MiB at 1.02-1.04 times the throughput of
     * reading it straight into its tensors without any check, on one
     * core, where the hasher thread beside straight reads reached 0.98-1.00
     * with a second core free and 0.96 without (tests/bench/stream_digest.sh:
     * a straight read's page faults are taken inside the kernel's copy,
     * slower than the stores of the copy loop). Other large frames (zstd,
     * XXH64 records) are hashed by the hasher thread. */
    if (r->hashing && dlen >= HASH_THREAD_MIN &&
        (r->zstd || r->hs.kind != LRMOE_DIGEST_CRC64) && hasher_begin(r, f, dlen) == 0)
        r->hashing = 0;     /* the data goes to the hasher thread */
    /* zstd: a tensor of PF_PIECE bytes or more (lrmoe_alloc_big's own
     * buffers) is decoded a piece at a time, each piece faulted in with one
     * lrmoe_alloc_prefault call just before its bytes land (no exception
     * per page: one 256 MiB frame read in 0.336-0.343 s instead of
     * 0.374-0.394). Only the piece about to be written is touched, so a
     * header that declares more than arrives still costs address space, not
     * memory. The last piece takes the rest (under 2 pieces). Raw frames
     * are not prefaulted: a raw frame with a CRC-64 record is copied out of
     * inbuf with its CRC in one pass, which prefaulting a straight read
     * would overtake (the record then cost 5-9% instead of none,
     * tests/bench/stream_digest.sh). */
    for (int i = 0; i < f->ntensors; i++) {
        lrmoe_tensor_t *t = f->tensors[i];
        const int pf = r->zstd && t->nbytes >= PF_PIECE;
        for (size_t off = 0; off < t->nbytes;) {
            size_t c = t->nbytes - off;
            if (pf && c >= 2 * PF_PIECE) c = PF_PIECE;
            if (pf) lrmoe_alloc_prefault((uint8_t *)t->data + off, c);
            n = rd(r, (uint8_t *)t->data + off, c);
            if (n < 0) goto fail;
            if ((size_t)n < c) { lrmoe_err("truncated inside the frame data (tensor %s)", t->name); goto fail; }
            off += c;
        }
    }
    if (has_digest && !r->noverify) {
        r->hashing = 0;
        hasher_finish(r);
        uint64_t got = dg_final(&r->hs);
        if (ntcrc) {    /* the header's CRC and the tensors', combined in order */
            digest = r->tcrc[0];
            for (int i = 0; i < f->ntensors; i++)
                digest = lrmoe_crc64_combine(digest, r->tcrc[i + 1], f->tensors[i]->nbytes);
        }
        if (got != digest) {
            lrmoe_err("digest mismatch: the frame's %s is %016" PRIx64 ", its digest record"
                      "%s %016" PRIx64 " (the stream changed after it was written)",
                      has_digest == LRMOE_DIGEST_XXH64 ? "XXH64" : "CRC-64", got,
                      ntcrc ? "'s header and tensor CRCs combine to" : " says", digest);
            goto fail;
        }
    }
    r->nframes++;
    r->last_digest = has_digest;
    return 1;
fail:
    r->hashing = 0;
    hasher_finish(r);       /* before f's buffers go */
    free(hdr);
    lrmoe_frame_clear(f);
    return lrmoe_err_prefix("%s: frame %" PRId64, r->label, r->nframes);
}

int lrmoe_reader_plain(const lrmoe_reader_t *r) { return r->plain; }

int lrmoe_reader_digest(const lrmoe_reader_t *r) { return r->last_digest; }

void lrmoe_reader_set_verify(lrmoe_reader_t *r, int on) { r->noverify = on > 0 ? 0 : on == 0 ? 1 : 2; }

void lrmoe_reader_close(lrmoe_reader_t *r)
{
    if (!r) return;
    hasher_stop(r->hasher);
    if (r->own) fclose(r->fp);
    ZSTD_freeDCtx(r->dctx);
    free(r->inbuf);
    free(r->tcrc);
    free(r);
}

/* ------------------------------------------------------------ writer */

struct lrmoe_writer {
    FILE *fp;
    int own, compress;
    char label[512];
    ZSTD_CCtx *cctx;
    uint8_t *outbuf;
    size_t outcap;
    int64_t count;
    uint64_t at;            /* bytes of the uncompressed stream written so far */
    int digest;             /* the records' kind, 0: none (lrmoe_writer_set_digests) */
};

void lrmoe_writer_set_digests(lrmoe_writer_t *w, int kind)
{
    w->digest = kind == LRMOE_DIGEST_XXH64 || kind == LRMOE_DIGEST_CRC64_TENSORS ||
                kind == LRMOE_DIGEST_CRC64_FRAME ? kind : kind ? LRMOE_DIGEST_CRC64 : 0;
}

void lrmoe_wopts_default(lrmoe_wopts_t *o)
{
    o->compress = 1;
    o->level = LRMOE_LEVEL_AUTO;
    o->threads = 0;
}

/* The default level by where the stream goes (lrmoe(7), COMPRESSION): a
 * regular file keeps it, so zstd level 1 (measured: level 3's size within
 * 1% on activations and gradients, for 70-85% of its CPU time); anything
 * else (a pipe to the next stage, a terminal, /dev/null) is read once, at
 * memory speed, so compressing it only costs CPU: raw. */
static int auto_level(FILE *fp, int *compress)
{
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) *compress = 0;
    return 1;
}

/* The error of a failed write; a closed reading end (EPIPE: the tools
 * ignore SIGPIPE, see lrmoe_cli_init) says so in words. */
static int write_failed(const lrmoe_writer_t *w)
{
    if (errno == EPIPE)
        return lrmoe_err("%s: write failed: broken pipe (the next stage stopped reading)", w->label);
    return lrmoe_err("%s: write failed: %s", w->label, strerror(errno));
}

static int wr_raw(lrmoe_writer_t *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->fp) != n) return write_failed(w);
    return 0;
}

/* The output file, opened as fopen(path, "wb") would (O_TRUNC: an existing
 * file is emptied at once), then opened a second time and the first
 * descriptor closed. ext4 (auto_da_alloc) and btrfs take a file truncated to
 * 0 and rewritten for a replace-via-truncate: the truncate marks the inode,
 * and the next close of any of its descriptors writes all of its data out.
 * Closing the first descriptor while the file is still empty spends that
 * mark on nothing, so the stream's own close does not wait for its data to
 * reach the disk (measured on ext4: 43-282 ms for a 288 MiB stream over an
 * existing file, 6 us this way). The trailer, not the file, says whether a
 * stream is whole, so that crash insurance buys nothing here. A path that
 * names another file by the second open (replaced in between) keeps the
 * first descriptor. */
static FILE *open_out(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return NULL;
    struct stat a, b;
    int fd2 = fstat(fd, &a) == 0 && S_ISREG(a.st_mode) ? open(path, O_WRONLY | O_CLOEXEC) : -1;
    if (fd2 >= 0 && fstat(fd2, &b) == 0 && b.st_dev == a.st_dev && b.st_ino == a.st_ino) {
        close(fd);
        fd = fd2;
    } else if (fd2 >= 0) {
        close(fd2);
    }
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return fp;
}

static int wr_zstd(lrmoe_writer_t *w, const void *p, size_t n, ZSTD_EndDirective end)
{
    ZSTD_inBuffer in = {p, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {w->outbuf, w->outcap, 0};
        size_t ret = ZSTD_compressStream2(w->cctx, &out, &in, end);
        if (ZSTD_isError(ret)) return lrmoe_err("%s: zstd: %s", w->label, ZSTD_getErrorName(ret));
        if (wr_raw(w, w->outbuf, out.pos) < 0) return -1;
        if (end == ZSTD_e_continue ? in.pos == in.size : ret == 0) return 0;
    }
}

static int wr(lrmoe_writer_t *w, const void *p, size_t n)
{
    w->at += n;
    return w->compress ? wr_zstd(w, p, n, ZSTD_e_continue) : wr_raw(w, p, n);
}

lrmoe_writer_t *lrmoe_writer_open(const char *path, const lrmoe_wopts_t *o)
{
    lrmoe_wopts_t def;
    if (!o) { lrmoe_wopts_default(&def); o = &def; }
    lrmoe_writer_t *w = calloc(1, sizeof *w);
    if (!w) { lrmoe_err("out of memory"); return NULL; }
    w->digest = LRMOE_DIGEST_CRC64;
    if (!path || !strcmp(path, "-")) {
        w->fp = stdout;
        snprintf(w->label, sizeof w->label, "<stdout>");
    } else {
        w->fp = open_out(path);
        if (!w->fp) {
            lrmoe_err("%s: %s", path, strerror(errno));
            free(w);
            return NULL;
        }
        w->own = 1;
        snprintf(w->label, sizeof w->label, "%s", path);
    }
    w->compress = o->compress;
    int level = o->level;
    if (w->compress && level == LRMOE_LEVEL_AUTO) level = auto_level(w->fp, &w->compress);
    if (w->compress) {
        w->cctx = ZSTD_createCCtx();
        w->outcap = ZSTD_CStreamOutSize();
        w->outbuf = malloc(w->outcap);
        if (!w->cctx || !w->outbuf) { lrmoe_err("out of memory"); goto fail; }
        size_t r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, level);
        if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1);
        if (ZSTD_isError(r)) { lrmoe_err("zstd level %d: %s", level, ZSTD_getErrorName(r)); goto fail; }
        if (o->threads > 0) {
            r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_nbWorkers, o->threads);
            if (ZSTD_isError(r)) { lrmoe_err("zstd threads %d: %s", o->threads, ZSTD_getErrorName(r)); goto fail; }
        }
    }
    return w;
fail:
    lrmoe_writer_abort(w);
    return NULL;
}

int lrmoe_writer_write(lrmoe_writer_t *w, const lrmoe_frame_t *f)
{
    char *hdr;
    size_t hlen, dlen;
    /* the frame starts after its digest record: 16 bytes, or 24 and 8 a
     * tensor for CRC-64s by part */
    uint64_t data = 0;
    for (int i = 0; i < f->ntensors; i++) data += f->tensors[i]->nbytes;
    const int parts = w->digest == LRMOE_DIGEST_CRC64_TENSORS ||
                      (w->digest == LRMOE_DIGEST_CRC64 && data >= TENSOR_DIGEST_MIN);
    size_t rl = !w->digest ? 0 : parts ? 24 + 8 * (size_t)f->ntensors : 16;
    if (frame_header(f, w->at + rl, &hdr, &hlen, &dlen) < 0) return -1;
    uint8_t h8[8];
    put_le64(h8, hlen);
    int rc = 0;
    if (rl) {
        uint8_t *rec = malloc(rl);
        if (!rec) { free(hdr); return lrmoe_err("out of memory"); }
        if (parts) {
            memcpy(rec, CRT_MAGIC, 8);
            put_le64(rec + 8, (uint64_t)f->ntensors);
            put_le64(rec + 16, lrmoe_crc64_update(lrmoe_crc64_update(0, h8, 8), hdr, hlen));
            for (int i = 0; i < f->ntensors; i++)
                put_le64(rec + 24 + 8 * (size_t)i,
                         lrmoe_crc64_update(0, f->tensors[i]->data, f->tensors[i]->nbytes));
        } else {
            digest_t hs;
            dg_reset(&hs, w->digest == LRMOE_DIGEST_XXH64 ? w->digest : LRMOE_DIGEST_CRC64);
            dg_update(&hs, h8, 8);
            dg_update(&hs, hdr, hlen);
            for (int i = 0; i < f->ntensors; i++)
                if (f->tensors[i]->nbytes) dg_update(&hs, f->tensors[i]->data, f->tensors[i]->nbytes);
            memcpy(rec, w->digest == LRMOE_DIGEST_XXH64 ? XXH_MAGIC : CRC_MAGIC, 8);
            put_le64(rec + 8, dg_final(&hs));
        }
        rc = wr(w, rec, rl);
        free(rec);
    }
    if (!rc) rc = wr(w, h8, 8);
    if (!rc) rc = wr(w, hdr, hlen);
    free(hdr);
    for (int i = 0; !rc && i < f->ntensors; i++)
        rc = wr(w, f->tensors[i]->data, f->tensors[i]->nbytes);
    /* Complete the frame on the wire: end the zstd block (the frame and its
     * window go on, so the ratio barely moves) and empty stdio's buffer, so
     * the next stage of a live pipe gets frame n before frame n+1 exists. */
    if (!rc && w->compress) rc = wr_zstd(w, NULL, 0, ZSTD_e_flush);
    if (!rc && fflush(w->fp) != 0) rc = write_failed(w);
    if (!rc) w->count++;
    return rc;
}

int64_t lrmoe_writer_count(const lrmoe_writer_t *w) { return w->count; }

static void writer_free(lrmoe_writer_t *w)
{
    ZSTD_freeCCtx(w->cctx);
    free(w->outbuf);
    free(w);
}

int lrmoe_writer_close(lrmoe_writer_t *w)
{
    uint8_t t[16];
    memcpy(t, TRAILER_MAGIC, 8);
    put_le64(t + 8, (uint64_t)w->count);
    int rc = wr(w, t, 16);
    if (!rc && w->compress) rc = wr_zstd(w, NULL, 0, ZSTD_e_end);
    if (fflush(w->fp) != 0 && !rc) rc = write_failed(w);
    if (ferror(w->fp) && !rc) rc = lrmoe_err("%s: write failed", w->label);
    if (fclose(w->fp) != 0 && !rc) rc = lrmoe_err("%s: close failed: %s", w->label, strerror(errno));
    writer_free(w);
    return rc;
}

void lrmoe_writer_abort(lrmoe_writer_t *w)
{
    if (!w) return;
    if (w->compress && w->cctx) {
        /* finish the zstd frame so what was written decodes, but with no
         * trailer the stream stays truncated for the reader */
        wr_zstd(w, NULL, 0, ZSTD_e_end);
    }
    fflush(w->fp);
    if (w->own) fclose(w->fp);
    writer_free(w);
}
