/* Mapped raw weights streams (lib/weights_map.h). The layout is
 * lrmoe-stream(5): safetensors frames (8-byte little-endian header length,
 * JSON header, data), each after its digest record ("LRMOECRC" + the
 * CRC-64/NVME or "LRMOEXXH" + the XXH64 of its bytes, or "LRMOECRT" + the
 * tensor count + the CRC-64 of its header and of each tensor, verified
 * here) in streams written since the records exist, checked when the
 * frame, or for "LRMOECRT" the part, is first used) and the trailer
 * "LRMOEEND" + 8-byte frame count. The
 * mapping is accepted only when every frame parses exactly as the stream
 * reader would accept it; any doubt answers 0 and the reader runs instead,
 * so errors keep the reader's wording (a digest that does not match too:
 * lrmoe_weights_map_check says what the reader says). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "weights_map.h"
#include "crc64.h"
#include "crc64_par.h"
#include "xxh64.h"
#include "lrmoe.h"

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

typedef struct {
    const char *name;
    lrmoe_dtype_t dt;
    int ndim;
    int64_t shape[LRMOE_MAX_DIMS];
    uint64_t b, e;
} ent_t;

static int by_begin(const void *x, const void *y)
{
    const ent_t *a = x, *b = y;
    return a->b < b->b ? -1 : a->b > b->b;
}

/* One tensor entry of the header; 0 or -1 (not exactly valid). */
static int entry(const char *key, json_t *val, ent_t *e)
{
    json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
           *off = json_object_get(val, "data_offsets");
    if (!*key || !json_is_object(val) || !json_is_string(dt) || !json_is_array(sh) ||
        !json_is_array(off) || json_array_size(off) != 2 ||
        json_array_size(sh) > LRMOE_MAX_DIMS)
        return -1;
    const char *dn = json_string_value(dt);
    int found = 0;
    for (int i = 0; i < LRMOE_NDTYPES && !found; i++)
        if (!strcmp(dn, lrmoe_dtype_name((lrmoe_dtype_t)i))) { e->dt = (lrmoe_dtype_t)i; found = 1; }
    if (!found) return -1;
    e->name = key;
    e->ndim = (int)json_array_size(sh);
    uint64_t need = lrmoe_dtype_size(e->dt);
    for (int d = 0; d < e->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0) return -1;
        uint64_t v = (uint64_t)json_integer_value(x);
        if (v && need > (UINT64_MAX >> 2) / v) return -1;
        need *= v;
        e->shape[d] = (int64_t)v;
    }
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return -1;
    e->b = (uint64_t)json_integer_value(b);
    e->e = (uint64_t)json_integer_value(en);
    return e->e - e->b == need ? 0 : -1;
}

/* The frame whose header is hdr[0..hlen) and whose data starts at data
 * (avail bytes left in the file) into the empty f; its data length into
 * *dlen. 0 or -1. */
static int frame_at(const char *hdr, size_t hlen, const uint8_t *data, uint64_t avail,
                    lrmoe_frame_t *f, uint64_t *dlen)
{
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, NULL);
    ent_t *ents = NULL;
    int rc = -1;
    size_t n = root ? json_object_size(root) : 0;
    if (!json_is_object(root) || n > (size_t)LRMOE_MAX_TENSORS + 1 ||
        !(ents = calloc(n ? n : 1, sizeof *ents)))
        goto out;
    size_t ne = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__")) {
            if (entry(key, val, &ents[ne++]) < 0) goto out;
            continue;
        }
        if (!json_is_object(val) || json_object_size(val) > LRMOE_MAX_ATTRS) goto out;
        const char *k;
        json_t *v;
        json_object_foreach(val, k, v)
            if (!json_is_string(v) || lrmoe_frame_set_attr_new(f, k, json_string_value(v)) < 0)
                goto out;
    }
    qsort(ents, ne, sizeof *ents, by_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < ne; i++) {
        if (ents[i].b != pos) goto out;   /* a gap or an overlap */
        pos = ents[i].e;
    }
    if (pos > avail) goto out;             /* truncated */
    for (size_t i = 0; i < ne; i++) {
        const ent_t *e = &ents[i];
        const uint8_t *p = e->e > e->b ? data + e->b : NULL;
        if (p && (uintptr_t)p % lrmoe_dtype_size(e->dt)) goto out; /* misaligned */
        if (!lrmoe_frame_adopt_new(f, e->name, e->dt, e->ndim, e->shape, (void *)p)) goto out;
    }
    *dlen = pos;
    rc = 0;
out:
    free(ents);
    json_decref(root);
    return rc;
}

static void frames_drop(lrmoe_weights_t *w)
{
    for (int i = 0; i < w->n; i++)
        for (int j = 0; j < w->frames[i].ntensors; j++) w->frames[i].tensors[j]->data = NULL;
    lrmoe_weights_free(w);
}

static void recs_free(lrmoe_wmap_t *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->rec[i].toff);
        free(m->rec[i].tlen);
        free(m->rec[i].tcrc);
        free(m->rec[i].twant);
        free(m->rec[i].tstate);
        free(m->rec[i].tname);
    }
    free(m->rec);
    m->rec = NULL;
    m->n = 0;
}

static int walk(const uint8_t *b, size_t len, lrmoe_weights_t *w, lrmoe_wmap_t *m)
{
    static const char TRAILER[8] = {'L', 'R', 'M', 'O', 'E', 'E', 'N', 'D'};
    size_t at = 0;
    int cap = 0, digests = 0;
    for (;;) {
        if (len - at < 8) return -1;
        if (!memcmp(b + at, TRAILER, 8))
            return len - at == 16 && le64(b + at + 8) == (uint64_t)w->n ? 0 : -1;
        /* a digest record: every frame has one or none does */
        int rec = !memcmp(b + at, "LRMOECRC", 8) ? 1 : !memcmp(b + at, "LRMOEXXH", 8) ? 2
                : !memcmp(b + at, "LRMOECRT", 8) ? 3 : 0;
        if (w->n && !rec != !digests) return -1;
        digests = rec;
        uint64_t digest = 0, parts = 0;
        const uint8_t *crcs = NULL;   /* kind 3: the header's CRC, then each tensor's */
        if (rec == 3) {
            if (len - at < 32) return -1;
            parts = le64(b + at + 8);
            if (parts > LRMOE_MAX_TENSORS || (len - at - 32) / 8 < parts) return -1;
            crcs = b + at + 16;
            at += 24 + 8 * (size_t)parts;
        } else if (rec) {
            if (len - at < 24) return -1;
            digest = le64(b + at + 8);
            at += 16;
        }
        uint64_t hlen = le64(b + at);
        if (hlen < 2 || hlen > LRMOE_MAX_HEADER || hlen > len - at - 8) return -1;
        if (w->n == cap) {
            cap = cap ? 2 * cap : 8;
            lrmoe_frame_t *fr = realloc(w->frames, (size_t)cap * sizeof *fr);
            if (fr) w->frames = fr;
            int64_t *ly = fr ? realloc(w->layer, (size_t)cap * sizeof *ly) : NULL;
            if (ly) w->layer = ly;
            lrmoe_wmap_rec_t *rc = ly ? realloc(m->rec, (size_t)cap * sizeof *rc) : NULL;
            if (!rc) return -1;
            m->rec = rc;
        }
        lrmoe_frame_t *f = &w->frames[w->n];
        lrmoe_frame_init(f);
        w->layer[w->n++] = 0;
        const size_t d0 = at + 8 + (size_t)hlen;
        uint64_t dlen = 0;
        if (frame_at((const char *)b + at + 8, (size_t)hlen, b + d0, len - d0, f, &dlen) < 0)
            return -1;
        lrmoe_wmap_rec_t *r = &m->rec[w->n - 1];
        memset(r, 0, sizeof *r);
        r->off = at;
        r->len = 8 + (size_t)hlen + (size_t)dlen;
        r->digest = digest;
        r->kind = (unsigned char)rec;
        m->n = w->n;
        const int nt = f->ntensors;
        const size_t na = (size_t)(nt ? nt : 1);
        if (!(r->toff = calloc(na, sizeof *r->toff)) || !(r->tlen = calloc(na, sizeof *r->tlen)) ||
            !(r->tcrc = calloc(na, sizeof *r->tcrc)))
            return -1;
        if (rec == 3) {     /* a CRC for the header and for each tensor */
            if (parts != (uint64_t)nt || !(r->twant = calloc(na, sizeof *r->twant)) ||
                !(r->tstate = calloc(na, 1)) || !(r->tname = calloc(na, sizeof *r->tname)))
                return -1;
            r->hlen = 8 + (size_t)hlen;
            r->hwant = le64(crcs);
            for (int k = 0; k < nt; k++) {
                r->twant[k] = le64(crcs + 8 * (size_t)(k + 1));
                r->tname[k] = f->tensors[k]->name;
            }
        }
        r->nt = nt;
        for (int k = 0; k < nt; k++) { /* adopted in data order (frame_at) */
            const lrmoe_tensor_t *t = f->tensors[k];
            if (!t->nbytes) continue;   /* empty: no bytes, offset 0 */
            r->toff[k] = (size_t)((const uint8_t *)t->data - b);
            r->tlen[k] = t->nbytes;
        }
        int64_t l = w->n - 1;
        if (lrmoe_frame_attr_i64(f, "layer", &l) < 0) return -1;
        for (int i = 0; i + 1 < w->n; i++)
            if (w->layer[i] == l) return -1;
        w->layer[w->n - 1] = l;
        at = d0 + (size_t)dlen;
    }
}

int lrmoe_weights_map_pieces(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads,
                             size_t piece)
{
    memset(w, 0, sizeof *w);
    memset(m, 0, sizeof *m);
    if (!path || !strcmp(path, "-")) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    void *p = MAP_FAILED;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= 16)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return 0;
    const size_t len = (size_t)st.st_size;
    /* no read-around on faults (MADV_RANDOM) until a frame is used: a
     * fault on a header would read up to read_ahead_kb (8 MiB on the VMs
     * measured) of the data around it, all of a small frame that no one may
     * use. A used frame's bytes get the usual read-around back
     * (lrmoe_weights_map_check): a file not in the page cache is read in
     * large requests, not a page per fault (1.2 GB: 1.0 s and 4 major faults
     * against 12.7-14.3 s and 293,000 with MADV_RANDOM kept, measured), and
     * at most about 16 MiB past the frame's end with it. */
    (void)madvise(p, len, MADV_RANDOM);
    if (!memcmp(p, "\x28\xb5\x2f\xfd", 4)) { munmap(p, len); return 0; } /* zstd */
    m->threads = threads;
    m->piece = piece;
    if (walk(p, len, w, m) < 0 || !(m->path = strdup(path))) {
        frames_drop(w);
        munmap(p, len);
        recs_free(m);
        memset(m, 0, sizeof *m);
        return 0;
    }
    m->base = p;
    m->len = len;
    return 1;
}

int lrmoe_weights_map(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads)
{
    return lrmoe_weights_map_pieces(path, w, m, threads, LRMOE_WMAP_PIECE);
}

/* The CRC-64 of frame r's bytes, a tensor at a time (each tensor's CRC
 * kept in r->tcrc), combined in order with the header's. */
static uint64_t frame_crc(const lrmoe_wmap_t *m, lrmoe_wmap_rec_t *r)
{
    const uint8_t *b = m->base;
    size_t at = r->off;
    const size_t end = r->off + r->len;
    uint64_t crc = 0;
    for (int k = 0; k < r->nt; k++) {
        if (!r->tlen[k]) continue;
        if (r->toff[k] < at || r->toff[k] + r->tlen[k] > end) { /* not in data order */
            r->nt = 0;
            return lrmoe_crc64_par(0, b + r->off, r->len, m->threads, m->piece);
        }
        crc = lrmoe_crc64_par(crc, b + at, r->toff[k] - at, m->threads, m->piece);
        r->tcrc[k] = lrmoe_crc64_par(0, b + r->toff[k], r->tlen[k], m->threads, m->piece);
        crc = lrmoe_crc64_combine(crc, r->tcrc[k], r->tlen[k]);
        at = r->toff[k] + r->tlen[k];
    }
    return lrmoe_crc64_par(crc, b + at, end - at, m->threads, m->piece);
}

int lrmoe_weights_map_crc(const lrmoe_wmap_t *m, const void *p, size_t n, uint64_t *crc)
{
    if (!m || !m->base || (const uint8_t *)p < (const uint8_t *)m->base) return 0;
    const size_t off = (size_t)((const uint8_t *)p - (const uint8_t *)m->base);
    for (int i = 0; i < m->n; i++) {
        const lrmoe_wmap_rec_t *r = &m->rec[i];
        if (off < r->off || off >= r->off + r->len) continue;
        if (r->kind != 1 && r->kind != 3) return 0;
        for (int k = 0; k < r->nt; k++)
            if (n && r->toff[k] == off && r->tlen[k] == n &&
                (r->kind == 1 ? r->state == 1 : r->tstate[k] == 1)) {
                *crc = r->tcrc[k];
                return 1;
            }
        return 0;
    }
    return 0;
}

/* Bytes about to be read: read ahead as usual from here on (the rest of
 * the mapping stays MADV_RANDOM) */
static void advise_normal(const lrmoe_wmap_t *m, size_t off, size_t n)
{
    const uint8_t *p = (const uint8_t *)m->base + off;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(pg - 1);
    (void)madvise((void *)a, (uintptr_t)p + n - a, MADV_NORMAL);
}

/* A record by parts (kind 3): the header's check, then tensor k's (once
 * each); 0 or -1 with the error naming the part. */
static int part_error(const lrmoe_wmap_t *m, int i, const char *what, const char *name,
                      uint64_t got, uint64_t want)
{
    return lrmoe_err("%s: frame %d: %s%s: digest mismatch: its CRC-64 is %016" PRIx64
                     ", the digest record says %016" PRIx64
                     " (the stream changed after it was written)",
                     m->path, i, what, name, got, want);
}

static int check_header(const lrmoe_wmap_t *m, int i, lrmoe_wmap_rec_t *r)
{
    if (!r->hstate) {
        r->hgot = lrmoe_crc64_update(0, (const uint8_t *)m->base + r->off, r->hlen);
        r->hstate = r->hgot == r->hwant ? 1 : 2;
    }
    return r->hstate == 1 ? 0 : part_error(m, i, "header", "", r->hgot, r->hwant);
}

static int check_part(const lrmoe_wmap_t *m, int i, lrmoe_wmap_rec_t *r, int k)
{
    if (!r->tstate[k]) {
        if (r->tlen[k]) {
            advise_normal(m, r->toff[k], r->tlen[k]);
            r->tcrc[k] = lrmoe_crc64_par(0, (const uint8_t *)m->base + r->toff[k], r->tlen[k],
                                         m->threads, m->piece);
        }
        r->tstate[k] = r->tcrc[k] == r->twant[k] ? 1 : 2;
    }
    return r->tstate[k] == 1 ? 0 : part_error(m, i, "tensor ", r->tname[k], r->tcrc[k], r->twant[k]);
}

int lrmoe_weights_map_check_tensors(const lrmoe_wmap_t *m, int i, const char *const *names,
                                    int nn)
{
    if (!m->base || i < 0 || i >= m->n) return 0;
    lrmoe_wmap_rec_t *r = &m->rec[i];
    if (r->kind != 3) return lrmoe_weights_map_check(m, i);
    if (check_header(m, i, r) < 0) return -1;
    for (int j = 0; j < nn; j++)
        for (int k = 0; k < r->nt; k++)
            if (!strcmp(r->tname[k], names[j]) && check_part(m, i, r, k) < 0) return -1;
    return 0;
}

int lrmoe_weights_map_check(const lrmoe_wmap_t *m, int i)
{
    if (!m->base || i < 0 || i >= m->n) return 0;
    lrmoe_wmap_rec_t *r = &m->rec[i];
    if (r->kind == 3) {     /* every part, the header first (each tensor's
                             * check advises its own bytes) */
        int rc = check_header(m, i, r);
        for (int k = 0; rc == 0 && k < r->nt; k++) rc = check_part(m, i, r, k);
        r->state = rc == 0 ? 1 : 2;
        return rc;
    }
    if (!r->state) {
        advise_normal(m, r->off, r->len);
        if (r->kind == 1)
            r->got = frame_crc(m, r);
        else if (r->kind == 2)
            r->got = lrmoe_xxh64((const uint8_t *)m->base + r->off, r->len);
        r->state = !r->kind || r->got == r->digest ? 1 : 2;
    }
    if (r->state == 1) return 0;
    return lrmoe_err("%s: frame %d: digest mismatch: the frame's %s is %016" PRIx64
                     ", its digest record says %016" PRIx64
                     " (the stream changed after it was written)",
                     m->path, i, r->kind == 1 ? "CRC-64" : "XXH64", r->got, r->digest);
}

void lrmoe_weights_unmap(lrmoe_weights_t *w, lrmoe_wmap_t *m)
{
    frames_drop(w);
    if (m->base) munmap(m->base, m->len);
    recs_free(m);
    free(m->path);
    memset(m, 0, sizeof *m);
}

int lrmoe_weights_open(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads)
{
    if (lrmoe_weights_map(path, w, m, threads)) return 0;
    return lrmoe_weights_load(path, w);
}

void lrmoe_weights_close(lrmoe_weights_t *w, lrmoe_wmap_t *m)
{
    if (m->base) lrmoe_weights_unmap(w, m);
    else lrmoe_weights_free(w);
    memset(w, 0, sizeof *w);
    memset(m, 0, sizeof *m);
}

int lrmoe_weights_use(const lrmoe_wmap_t *m, const lrmoe_weights_t *w, const lrmoe_frame_t *wf)
{
    if (!m || !m->base || !wf) return 0;
    return lrmoe_weights_map_check(m, (int)(wf - w->frames));
}

int lrmoe_weights_use_tensors(const lrmoe_wmap_t *m, const lrmoe_weights_t *w,
                              const lrmoe_frame_t *wf, const char *const *names, int nn)
{
    if (!m || !m->base || !wf) return 0;
    return lrmoe_weights_map_check_tensors(m, (int)(wf - w->frames), names, nn);
}
