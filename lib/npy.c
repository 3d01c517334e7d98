/* NumPy .npy read/write (format 1.0/2.0/3.0), see npy.h. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include "npy.h"

static const uint8_t npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* ------------------------------------------------------------ dtype text */

/* descr type code (without the byte-order char) for each dtype. */
static const char *npy_code(lrmoe_dtype_t d)
{
    switch (d) {
    case LRMOE_BOOL: return "b1";
    case LRMOE_U8:   return "u1";
    case LRMOE_I8:   return "i1";
    case LRMOE_U16:  return "u2";
    case LRMOE_I16:  return "i2";
    case LRMOE_U32:  return "u4";
    case LRMOE_I32:  return "i4";
    case LRMOE_U64:  return "u8";
    case LRMOE_I64:  return "i8";
    case LRMOE_F16:  return "f2";
    case LRMOE_F32:  return "f4";
    case LRMOE_F64:  return "f8";
    default:         return NULL;
    }
}

static int npy_descr_parse(const char *s, lrmoe_dtype_t *d, int *swap)
{
    char order = s[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return lrmoe_err("unsupported dtype '%s' (no byte-order character)", s);
    const char *code = s + 1;
    if (!strcmp(code, "?"))
        code = "b1";
    for (int i = 0; i < LRMOE_NDTYPES; i++) {
        const char *c = npy_code((lrmoe_dtype_t)i);
        if (c && !strcmp(c, code)) {
            *d = (lrmoe_dtype_t)i;
            *swap = order == '>' && lrmoe_dtype_size(*d) > 1;
            return 0;
        }
    }
    return lrmoe_err("unsupported dtype '%s'", s);
}

/* ------------------------------------------------------------ header dict */

/* A tiny parser for the Python dict literal of a .npy header:
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } */
typedef struct {
    const char *p, *end;
} cur_t;

static void skip_ws(cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int parse_str(cur_t *c, char *out, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return -1;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap)
            return -1;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return -1;
    c->p++;
    out[n] = 0;
    return 0;
}

static int parse_word(cur_t *c, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, w, n)) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int parse_shape(cur_t *c, lrmoe_npy_info_t *info)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p != '(')
        return lrmoe_err("shape is not a tuple");
    c->p++;
    info->ndim = 0;
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == ')') {
            c->p++;
            return 0;
        }
        if (c->p >= c->end || !isdigit((unsigned char)*c->p))
            return lrmoe_err("bad shape entry");
        int64_t v = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            if (v > (INT64_MAX - 9) / 10)
                return lrmoe_err("shape entry too large");
            v = v * 10 + (*c->p++ - '0');
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l'))
            c->p++; /* Python 2 long */
        if (info->ndim >= LRMOE_MAX_DIMS)
            return lrmoe_err("shape has more than %d dimensions", LRMOE_MAX_DIMS);
        info->shape[info->ndim++] = v;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == ')')
            continue;
        return lrmoe_err("bad shape tuple");
    }
}

static int parse_dict(const char *s, size_t n, lrmoe_npy_info_t *info)
{
    cur_t c = {s, s + n};
    int have_descr = 0, have_fo = 0, have_shape = 0, fortran = 0;
    char descr[64];
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{')
        return lrmoe_err("not a dict");
    c.p++;
    for (;;) {
        skip_ws(&c);
        if (c.p < c.end && *c.p == '}') {
            c.p++;
            break;
        }
        char key[32];
        if (parse_str(&c, key, sizeof key) < 0)
            return lrmoe_err("bad key");
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':')
            return lrmoe_err("missing ':' after '%s'", key);
        c.p++;
        skip_ws(&c);
        if (!strcmp(key, "descr")) {
            if (c.p < c.end && *c.p == '[')
                return lrmoe_err("unsupported dtype: structured arrays are not supported");
            if (parse_str(&c, descr, sizeof descr) < 0)
                return lrmoe_err("bad descr");
            have_descr = 1;
        } else if (!strcmp(key, "fortran_order")) {
            if (parse_word(&c, "True"))
                fortran = 1;
            else if (parse_word(&c, "False"))
                fortran = 0;
            else
                return lrmoe_err("fortran_order is not True/False");
            have_fo = 1;
        } else if (!strcmp(key, "shape")) {
            if (parse_shape(&c, info) < 0)
                return -1;
            have_shape = 1;
        } else {
            return lrmoe_err("unexpected key '%s'", key);
        }
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (c.p < c.end && *c.p == '}')
            continue;
        return lrmoe_err("expected ',' or '}'");
    }
    skip_ws(&c);
    if (c.p != c.end)
        return lrmoe_err("trailing characters after the dict");
    if (!have_descr || !have_fo || !have_shape)
        return lrmoe_err("missing '%s'",
                         !have_descr ? "descr" : !have_fo ? "fortran_order" : "shape");
    if (fortran)
        return lrmoe_err("Fortran-order arrays are not supported (save with np.ascontiguousarray)");
    if (npy_descr_parse(descr, &info->dtype, &info->byteswap) < 0)
        return -1;
    size_t es = lrmoe_dtype_size(info->dtype), nb = es;
    for (int i = 0; i < info->ndim; i++) {
        uint64_t d = (uint64_t)info->shape[i];
        if (d && nb > SIZE_MAX / d)
            return lrmoe_err("shape too large");
        nb *= d;
    }
    info->nbytes = nb;
    return 0;
}

int lrmoe_npy_parse(const uint8_t *buf, size_t len, lrmoe_npy_info_t *info)
{
    memset(info, 0, sizeof *info);
    if (len < 10) {
        if (memcmp(buf, npy_magic, len < 6 ? len : 6))
            return lrmoe_err("not a .npy file (bad magic)");
        info->data_offset = 10;
        return 1;
    }
    if (memcmp(buf, npy_magic, 6))
        return lrmoe_err("not a .npy file (bad magic)");
    int major = buf[6], minor = buf[7];
    size_t pre, hlen;
    if (major == 1) {
        pre = 10;
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if (major == 2 || major == 3) {
        pre = 12;
        if (len < 12) {
            info->data_offset = 12;
            return 1;
        }
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    } else {
        return lrmoe_err("unsupported .npy format version %d.%d", major, minor);
    }
    if (minor != 0)
        return lrmoe_err("unsupported .npy format version %d.%d", major, minor);
    if (hlen > LRMOE_NPY_MAX_HEADER)
        return lrmoe_err("header length %zu exceeds the limit of %u bytes", hlen,
                         LRMOE_NPY_MAX_HEADER);
    info->version = major;
    info->data_offset = pre + hlen;
    if (len < pre + hlen)
        return 1;
    const char *h = (const char *)buf + pre;
    for (size_t i = 0; i < hlen; i++)
        if (h[i] == 0 || (major < 3 && (unsigned char)h[i] >= 0x80))
            return lrmoe_err("bad .npy header: non-ASCII bytes");
    if (parse_dict(h, hlen, info) < 0)
        return lrmoe_err_prefix("bad .npy header");
    info->version = major;
    info->data_offset = pre + hlen;
    return 0;
}

/* ------------------------------------------------------------ reading */

static void swap_bytes(void *data, size_t n, size_t es)
{
    uint8_t *p = data;
    for (size_t i = 0; i < n; i++, p += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

int lrmoe_npy_fload(FILE *fp, lrmoe_frame_t *f, const char *name)
{
    off_t start = ftello(fp);
    uint8_t pre[12];
    size_t got = fread(pre, 1, 10, fp);
    if (got < 10) {
        if (ferror(fp))
            return lrmoe_err("read error: %s", strerror(errno));
        if (got == 0)
            return lrmoe_err("empty file");
        if (memcmp(pre, npy_magic, got < 6 ? got : 6))
            return lrmoe_err("not a .npy file (bad magic)");
        return lrmoe_err("truncated .npy preamble");
    }
    lrmoe_npy_info_t info;
    size_t have = 10;
    if (!memcmp(pre, npy_magic, 6) && (pre[6] == 2 || pre[6] == 3)) {
        if (fread(pre + 10, 1, 2, fp) != 2)
            return lrmoe_err("truncated .npy preamble");
        have = 12;
    }
    int rc = lrmoe_npy_parse(pre, have, &info);
    if (rc < 0)
        return -1;
    size_t need = info.data_offset;
    uint8_t *hdr = malloc(need > have ? need : have);
    if (!hdr)
        return lrmoe_err("out of memory");
    memcpy(hdr, pre, have);
    if (need > have && fread(hdr + have, 1, need - have, fp) != need - have) {
        free(hdr);
        return lrmoe_err("truncated .npy header");
    }
    rc = lrmoe_npy_parse(hdr, need, &info);
    free(hdr);
    if (rc < 0)
        return -1;
    /* A regular file tells its size: check what the header announces
     * before allocating it (a 100-byte file may announce terabytes). */
    struct stat st;
    int fd = fileno(fp);
    if (fd >= 0 && start >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode)) {
        long long left = (long long)st.st_size - (long long)start - (long long)info.data_offset;
        if (left < 0 || (unsigned long long)left < info.nbytes)
            return lrmoe_err("data size mismatch: header announces %zu bytes, file holds %lld",
                             info.nbytes, left < 0 ? 0 : left);
    }
    if (rc > 0)
        return lrmoe_err("truncated .npy header");
    void *data = NULL;
    if (info.nbytes) {
        data = malloc(info.nbytes);
        if (!data)
            return lrmoe_err("out of memory for %zu bytes", info.nbytes);
        size_t n = fread(data, 1, info.nbytes, fp);
        if (n != info.nbytes) {
            int e = ferror(fp) ? errno : 0;
            free(data);
            if (e)
                return lrmoe_err("read error: %s", strerror(e));
            return lrmoe_err("data size mismatch: header announces %zu bytes, file holds %zu",
                             info.nbytes, n);
        }
    }
    if (fgetc(fp) != EOF) {
        free(data);
        return lrmoe_err("data size mismatch: trailing bytes after the %zu bytes of data",
                         info.nbytes);
    }
    if (info.byteswap)
        swap_bytes(data, info.nbytes / lrmoe_dtype_size(info.dtype), lrmoe_dtype_size(info.dtype));
    if (!lrmoe_frame_adopt(f, name, info.dtype, info.ndim, info.shape, data)) {
        free(data);
        return -1;
    }
    return 0;
}

int lrmoe_npy_load(const char *path, lrmoe_frame_t *f, const char *name)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return lrmoe_err("%s", strerror(errno));
    int rc = lrmoe_npy_fload(fp, f, name);
    fclose(fp);
    return rc;
}

/* ------------------------------------------------------------ writing */

int lrmoe_npy_header(lrmoe_dtype_t d, int ndim, const int64_t *shape,
                     char *buf, size_t *len)
{
    const char *code = npy_code(d);
    if (!code)
        return lrmoe_err("dtype %s has no NumPy equivalent", lrmoe_dtype_name(d));
    if (ndim < 0 || ndim > LRMOE_MAX_DIMS)
        return lrmoe_err("bad rank %d", ndim);
    /* The dict exactly as numpy.lib.format writes it (keys sorted, repr()
     * values, a trailing ", "), then spare space for growing axis 0. */
    char dict[400], sh[256];
    size_t n = 0;
    sh[n++] = '(';
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(sh + n, sizeof sh - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (ndim == 1)
        sh[n++] = ',';
    sh[n++] = ')';
    sh[n] = 0;
    char order = lrmoe_dtype_size(d) == 1 ? '|' : '<';
    int dl = snprintf(dict, sizeof dict, "{'descr': '%c%s', 'fortran_order': False, 'shape': %s, }",
                      order, code, sh);
    if (ndim > 0) {
        char first[32];
        int fl = snprintf(first, sizeof first, "%lld", (long long)shape[0]);
        for (int i = fl; i < 21; i++)
            dict[dl++] = ' ';
        dict[dl] = 0;
    }
    size_t hlen = (size_t)dl + 1; /* + '\n' */
    size_t prelen = 10;
    size_t pad = 64 - ((prelen + hlen) % 64);
    if (hlen + pad > 65535) {
        prelen = 12;
        pad = 64 - ((prelen + hlen) % 64);
    }
    size_t total = hlen + pad;
    memcpy(buf, npy_magic, 6);
    buf[6] = prelen == 10 ? 1 : 2;
    buf[7] = 0;
    buf[8] = (char)(total & 0xff);
    buf[9] = (char)((total >> 8) & 0xff);
    if (prelen == 12) {
        buf[10] = (char)((total >> 16) & 0xff);
        buf[11] = (char)((total >> 24) & 0xff);
    }
    memcpy(buf + prelen, dict, (size_t)dl);
    memset(buf + prelen + dl, ' ', pad);
    buf[prelen + total - 1] = '\n';
    *len = prelen + total;
    return 0;
}

int lrmoe_npy_fsave(FILE *fp, const lrmoe_tensor_t *t, int bf16_as_f32)
{
    lrmoe_dtype_t d = t->dtype;
    int conv = 0;
    if (d == LRMOE_BF16) {
        d = bf16_as_f32 ? LRMOE_F32 : LRMOE_U16;
        conv = bf16_as_f32;
    }
    char hdr[LRMOE_NPY_HEADER_CAP];
    size_t hl;
    if (lrmoe_npy_header(d, t->ndim, t->shape, hdr, &hl) < 0)
        return -1;
    if (fwrite(hdr, 1, hl, fp) != hl)
        return lrmoe_err("write error: %s", strerror(errno));
    if (!conv) {
        if (t->nbytes && fwrite(t->data, 1, t->nbytes, fp) != t->nbytes)
            return lrmoe_err("write error: %s", strerror(errno));
        return 0;
    }
    /* BF16 -> F32 in chunks: no second full copy of a large tensor. */
    enum { CHUNK = 1 << 16 };
    float *buf = malloc(CHUNK * sizeof *buf);
    if (!buf)
        return lrmoe_err("out of memory");
    size_t n = t->nbytes / 2;
    const uint16_t *src = t->data;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        lrmoe_convert_to_f32(LRMOE_BF16, src + i, buf, m);
        if (fwrite(buf, sizeof *buf, m, fp) != m) {
            free(buf);
            return lrmoe_err("write error: %s", strerror(errno));
        }
    }
    free(buf);
    return 0;
}

int lrmoe_npy_save(const char *path, const lrmoe_tensor_t *t, int bf16_as_f32)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return lrmoe_err("%s", strerror(errno));
    if (lrmoe_npy_fsave(fp, t, bf16_as_f32) < 0) {
        fclose(fp);
        return -1;
    }
    if (fclose(fp) != 0)
        return lrmoe_err("write error: %s", strerror(errno));
    return 0;
}

/* ------------------------------------------------------------ file names */

static int all_digits(const char *s, size_t n)
{
    if (n == 0 || n > 12)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

int lrmoe_npy_name_parse(const char *base, int64_t *frame, char *name, size_t cap)
{
    size_t n = strlen(base);
    if (n < 4 || strcmp(base + n - 4, ".npy"))
        return lrmoe_err("'%s' does not end in .npy", base);
    n -= 4; /* stem is base[0..n) */
    const char *stem = base, *nm = stem;
    size_t nl = n;
    *frame = 0;
    const char *dot = memchr(stem, '.', n);
    const char *last = NULL;
    for (size_t i = 0; i < n; i++)
        if (stem[i] == '.')
            last = stem + i;
    if (dot && stem[0] == 'f' && all_digits(stem + 1, (size_t)(dot - stem - 1)) &&
        dot + 1 < stem + n) {
        *frame = strtoll(stem + 1, NULL, 10);
        nm = dot + 1;
        nl = n - (size_t)(nm - stem);
    } else if (last && last > stem && all_digits(last + 1, n - (size_t)(last + 1 - stem))) {
        *frame = strtoll(last + 1, NULL, 10);
        nl = (size_t)(last - stem);
    }
    if (nl == 0)
        return lrmoe_err("'%s' leaves an empty tensor name", base);
    if (nl + 1 > cap)
        return lrmoe_err("'%s': tensor name too long", base);
    memcpy(name, nm, nl);
    name[nl] = 0;
    return 0;
}

int lrmoe_npy_name_make(int64_t frame, const char *tensor, char *buf, size_t cap)
{
    if (!*tensor || !strcmp(tensor, ".") || !strcmp(tensor, "..") || strchr(tensor, '/'))
        return lrmoe_err("tensor '%s': name cannot be used in a file name", tensor);
    int n = snprintf(buf, cap, "f%03lld.%s.npy", (long long)frame, tensor);
    if (n < 0 || (size_t)n >= cap)
        return lrmoe_err("tensor '%s': file name too long", tensor);
    return 0;
}

/* ------------------------------------------------------------ sidecar */

int lrmoe_npy_sidecar_name(const char *base, int64_t *frame)
{
    size_t n = strlen(base);
    const char *suf = ".frame.json";
    size_t sl = strlen(suf);
    if (n <= sl + 1 || strcmp(base + n - sl, suf) || base[0] != 'f' ||
        !all_digits(base + 1, n - sl - 1))
        return 0;
    *frame = strtoll(base + 1, NULL, 10);
    return 1;
}

int lrmoe_npy_sidecar_write(const char *path, const lrmoe_frame_t *f)
{
    json_t *root = json_object(), *attrs = json_object(), *ts = json_array();
    for (int i = 0; i < f->nattrs; i++)
        json_object_set_new(attrs, f->keys[i], json_string(f->vals[i]));
    json_object_set_new(root, "attrs", attrs);
    for (int i = 0; i < f->ntensors; i++)
        json_array_append_new(ts, json_pack("{s:s,s:s}", "name", f->tensors[i]->name, "dtype",
                                            lrmoe_dtype_name(f->tensors[i]->dtype)));
    json_object_set_new(root, "tensors", ts);
    FILE *fp = fopen(path, "w");
    if (!fp) {
        json_decref(root);
        return lrmoe_err("%s", strerror(errno));
    }
    int bad = json_dumpf(root, fp, JSON_INDENT(1) | JSON_PRESERVE_ORDER) < 0 || fputc('\n', fp) == EOF;
    int e = errno;
    json_decref(root);
    if (fclose(fp) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? lrmoe_err("write error: %s", strerror(e)) : 0;
}

static int restore_dtype(lrmoe_tensor_t *t, lrmoe_dtype_t want)
{
    if (t->dtype == want)
        return 0;
    size_t es = lrmoe_dtype_size(want);
    if (lrmoe_dtype_size(t->dtype) == es && !lrmoe_dtype_is_float(t->dtype)) {
        t->dtype = want; /* the bits are the value: BF16 exported as <u2 */
        return 0;
    }
    if (t->dtype == LRMOE_F32 && (want == LRMOE_BF16 || want == LRMOE_F16)) {
        size_t n = t->nbytes / 4; /* F32 -> 16 bits in place, front to back */
        const float *src = t->data;
        uint16_t *dst = t->data;
        for (size_t i = 0; i < n; i++) {
            float v = src[i];
            lrmoe_convert_from_f32(want, &v, &dst[i], 1);
        }
        t->dtype = want;
        t->nbytes = n * 2;
        return 0;
    }
    return lrmoe_err("tensor %s is %s in its .npy file, the sidecar says %s", t->name,
                     lrmoe_dtype_name(t->dtype), lrmoe_dtype_name(want));
}

typedef struct {
    const char *name;
    int pos;
} by_name_t;

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const by_name_t *)a)->name, ((const by_name_t *)b)->name);
}

int lrmoe_npy_sidecar_apply(const char *path, lrmoe_frame_t *f)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lrmoe_err("malformed JSON: %s (line %d)", jerr.text, jerr.line);
    int rc = -1, n = f->ntensors;
    /* the frame's tensors sorted by name, so each sidecar entry is found in
     * O(log n) (a sidecar of n tensors costs O(n log n), not O(n^2)) */
    by_name_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    lrmoe_tensor_t **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    char *placed = calloc((size_t)(n ? n : 1), 1);
    if (!idx || !order || !placed) {
        lrmoe_err("out of memory");
        goto out;
    }
    for (int j = 0; j < n; j++)
        idx[j] = (by_name_t){f->tensors[j]->name, j};
    qsort(idx, (size_t)n, sizeof *idx, cmp_by_name);
    json_t *attrs = json_object_get(root, "attrs"), *ts = json_object_get(root, "tensors");
    if (!json_is_object(root) || (attrs && !json_is_object(attrs)) || (ts && !json_is_array(ts))) {
        lrmoe_err("not a frame sidecar ({\"attrs\":{...},\"tensors\":[...]})");
        goto out;
    }
    const char *k;
    json_t *v;
    int fresh = f->nattrs == 0; /* keys are unique (JSON_REJECT_DUPLICATES) */
    json_object_foreach(attrs, k, v) {
        if (!json_is_string(v)) {
            lrmoe_err("attribute %s is not a string", k);
            goto out;
        }
        if ((fresh ? lrmoe_frame_set_attr_new : lrmoe_frame_set_attr)(f, k, json_string_value(v)) < 0)
            goto out;
    }
    int nplaced = 0;
    size_t i;
    json_array_foreach(ts, i, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        lrmoe_dtype_t d;
        if (!name || !dt) {
            lrmoe_err("tensor entry %zu needs a name and a dtype", i);
            goto out;
        }
        if (lrmoe_dtype_parse(dt, &d) < 0) {
            lrmoe_err_prefix("tensor %s", name);
            goto out;
        }
        by_name_t key = {name, 0}, *hit = bsearch(&key, idx, (size_t)n, sizeof *idx, cmp_by_name);
        if (!hit || placed[hit->pos])
            continue; /* not exported or removed (or named twice): skip */
        lrmoe_tensor_t *t = f->tensors[hit->pos];
        if (restore_dtype(t, d) < 0)
            goto out;
        placed[hit->pos] = 1;
        order[nplaced++] = t;
    }
    /* the sidecar's tensors first, in its order, then the others as they were */
    for (int j = 0; j < n; j++)
        if (!placed[j])
            order[nplaced++] = f->tensors[j];
    memcpy(f->tensors, order, (size_t)n * sizeof *order);
    rc = 0;
out:
    free(idx);
    free(order);
    free(placed);
    json_decref(root);
    return rc;
}
