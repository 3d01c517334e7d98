/* Frames: ordered named tensors plus string attributes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* the output pool's O_CLOEXEC, O_NOFOLLOW, MAP_POPULATE; strdup */
#endif
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "alloc.h"
#include "lrmoe.h"

int64_t lrmoe_tensor_numel(const lrmoe_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static const char *dims_str(int ndim, const int64_t *dims, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ",%" PRId64 : "%" PRId64, dims[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

const char *lrmoe_shape_str(const lrmoe_tensor_t *t, char *buf, size_t len)
{
    return dims_str(t->ndim, t->shape, buf, len);
}

int lrmoe_tensor_check(const lrmoe_tensor_t *t, int ndim, const int64_t *dims)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (dims[i] >= 0 && dims[i] != t->shape[i]) ok = 0;
    if (ok) return 0;
    char a[128], c[128];
    size_t o = 0;                 /* expected dims, wildcards shown as '*' */
    c[0] = 0;
    for (int i = 0; i < ndim && o < sizeof c; i++)
        o += (size_t)(dims[i] < 0 ? snprintf(c + o, sizeof c - o, "%s*", i ? "," : "")
                                   : snprintf(c + o, sizeof c - o, i ? ",%" PRId64 : "%" PRId64, dims[i]));
    return lrmoe_err("tensor %s: shape %s, expected [%s]", t->name,
                     lrmoe_shape_str(t, a, sizeof a), c);
}

int lrmoe_tensor_dim_int(const lrmoe_tensor_t *t, int d, int *out)
{
    if (d < 0 || d >= t->ndim)
        return lrmoe_err("tensor %s: no dimension %d (it has %d)", t->name, d, t->ndim);
    if (t->shape[d] > INT_MAX)
        return lrmoe_err("tensor %s: dimension %d is %" PRId64 ", more than %d", t->name, d,
                         t->shape[d], INT_MAX);
    *out = (int)t->shape[d];
    return 0;
}

int lrmoe_experts_from_ids(const int32_t *ids, int64_t n, int *E)
{
    int32_t m = -1;
    int64_t at = 0;
    for (int64_t u = 0; u < n; u++)
        if (ids[u] > m) {
            m = ids[u];
            at = u;
        }
    if (m >= LRMOE_MAX_EXPERTS)
        return lrmoe_err("topk_ids: expert %d at pair %" PRId64 ": more than %d experts", (int)m,
                         at, LRMOE_MAX_EXPERTS);
    *E = m < 0 ? 0 : m + 1;
    return 0;
}

int lrmoe_tensor_dim_count(const lrmoe_tensor_t *t, int d, int *out)
{
    int n = 0;
    if (lrmoe_tensor_dim_int(t, d, &n) < 0)
        return -1;
    if (n < 1)
        return lrmoe_err("tensor %s: dimension %d is %d (it counts experts or ranks: at least 1)",
                         t->name, d, n);
    *out = n;
    return 0;
}

float *lrmoe_tensor_f32(const lrmoe_tensor_t *t)
{
    size_t n = (size_t)lrmoe_tensor_numel(t);
    float *p = malloc(n ? n * sizeof *p : 1);
    if (!p) { lrmoe_err("out of memory converting %s", t->name); return NULL; }
    lrmoe_convert_to_f32(t->dtype, t->data, p, n);
    return p;
}

int64_t *lrmoe_tensor_i64(const lrmoe_tensor_t *t)
{
    size_t n = (size_t)lrmoe_tensor_numel(t);
    int64_t *p = malloc(n ? n * sizeof *p : 1);
    if (!p) { lrmoe_err("out of memory converting %s", t->name); return NULL; }
    lrmoe_convert_to_i64(t->dtype, t->data, p, n);
    return p;
}

float *lrmoe_frame_bwd_alpha(const lrmoe_frame_t *f, const lrmoe_tensor_t *tw, int64_t T,
                             int64_t K)
{
    const lrmoe_tensor_t *pw = lrmoe_frame_get(f, "pair_weight");
    if (pw && (pw->dtype != LRMOE_F32 || lrmoe_tensor_check(pw, 2, (int64_t[]){T, K}) < 0)) {
        if (pw->dtype != LRMOE_F32)
            lrmoe_err("tensor pair_weight: dtype %s, expected F32", lrmoe_dtype_name(pw->dtype));
        return NULL;
    }
    float *a = lrmoe_tensor_f32(tw);
    if (!a || !pw) return a;
    const float *w = pw->data;
    for (int64_t u = 0; u < T * K; u++) {
        if (!(w[u] > 0) || !isfinite(w[u])) {
            free(a);
            lrmoe_err("pair_weight[%lld,%lld] is %g: a backward weight must be finite and "
                      "positive", (long long)(u / K), (long long)(u % K), (double)w[u]);
            return NULL;
        }
        a[u] *= w[u];
    }
    return a;
}

void lrmoe_frame_init(lrmoe_frame_t *f)
{
    memset(f, 0, sizeof *f);
}

static void tensor_free(lrmoe_tensor_t *t)
{
    if (!t) return;
    free(t->name);
    if (!lrmoe_pool_free(t->data)) free(t->data);
    free(t);
}

void lrmoe_frame_clear(lrmoe_frame_t *f)
{
    for (int i = 0; i < f->ntensors; i++) tensor_free(f->tensors[i]);
    for (int i = 0; i < f->nattrs; i++) { free(f->keys[i]); free(f->vals[i]); }
    free(f->tensors);
    free(f->keys);
    free(f->vals);
    lrmoe_frame_init(f);
}

static int find(const lrmoe_frame_t *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i]->name, name)) return i;
    return -1;
}

lrmoe_tensor_t *lrmoe_frame_get(const lrmoe_frame_t *f, const char *name)
{
    int i = find(f, name);
    return i < 0 ? NULL : f->tensors[i];
}

lrmoe_tensor_t *lrmoe_frame_need(const lrmoe_frame_t *f, const char *name)
{
    lrmoe_tensor_t *t = lrmoe_frame_get(f, name);
    const char *by = t ? NULL : lrmoe_producer(name);
    if (!t && by && !strncmp(by, "lrmoe-", 6))
        lrmoe_err("missing tensor %s (%s writes it: run that first)", name, by);
    else if (!t && by) lrmoe_err("missing tensor %s (it comes from %s)", name, by);
    else if (!t) lrmoe_err("missing tensor %s", name);
    return t;
}

/* Append t, whose name the caller knows is not in f yet. */
static lrmoe_tensor_t *append(lrmoe_frame_t *f, lrmoe_tensor_t *t)
{
    if (f->ntensors >= LRMOE_MAX_TENSORS) {
        lrmoe_err("tensor %s: more than %d tensors in one frame", t->name, LRMOE_MAX_TENSORS);
        tensor_free(t);
        return NULL;
    }
    if (f->ntensors == f->tcap) {
        int cap = f->tcap ? 2 * f->tcap : 16;
        lrmoe_tensor_t **p = realloc(f->tensors, (size_t)cap * sizeof *p);
        if (!p) { tensor_free(t); lrmoe_err("out of memory"); return NULL; }
        f->tensors = p;
        f->tcap = cap;
    }
    f->tensors[f->ntensors++] = t;
    return t;
}

/* Insert t (replacing a same-named tensor in place). */
static lrmoe_tensor_t *insert(lrmoe_frame_t *f, lrmoe_tensor_t *t)
{
    int i = find(f, t->name);
    if (i >= 0) {
        tensor_free(f->tensors[i]);
        f->tensors[i] = t;
        return t;
    }
    return append(f, t);
}

static lrmoe_tensor_t *tensor_new(const char *name, lrmoe_dtype_t dtype, int ndim,
                                  const int64_t *shape, size_t *nbytes)
{
    if ((unsigned)dtype >= LRMOE_NDTYPES) { lrmoe_err("tensor %s: bad dtype", name); return NULL; }
    if (ndim < 0 || ndim > LRMOE_MAX_DIMS) {
        lrmoe_err("tensor %s: %d dimensions (at most %d)", name, ndim, LRMOE_MAX_DIMS);
        return NULL;
    }
    uint64_t n = lrmoe_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) { lrmoe_err("tensor %s: negative dimension", name); return NULL; }
        if (shape[i] && n > UINT64_MAX / 2 / (uint64_t)shape[i]) {
            lrmoe_err("tensor %s: size overflows", name);
            return NULL;
        }
        n *= (uint64_t)shape[i];
    }
    lrmoe_tensor_t *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name))) { free(t); lrmoe_err("out of memory"); return NULL; }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = (size_t)n;
    *nbytes = (size_t)n;
    return t;
}

static int g_thp = -1;
static const char *g_thp_why;
static pthread_once_t g_thp_once = PTHREAD_ONCE_INIT;

/* a virtio balloon (device id 5) that negotiated free page reporting
 * (feature bit 5, VIRTIO_BALLOON_F_REPORTING) */
static int balloon_reports(void)
{
    DIR *d = opendir("/sys/bus/virtio/devices");
    if (!d) return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[512], buf[256];
        snprintf(path, sizeof path, "/sys/bus/virtio/devices/%s/device", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ok = fgets(buf, sizeof buf, f) && strtol(buf, NULL, 0) == 5;
        fclose(f);
        if (!ok) continue;
        snprintf(path, sizeof path, "/sys/bus/virtio/devices/%s/features", de->d_name);
        if (!(f = fopen(path, "r"))) continue;
        if (fgets(buf, sizeof buf, f) && strlen(buf) > 5 && buf[5] == '1') found = 1;
        fclose(f);
    }
    closedir(d);
    return found;
}

static void thp_decide(void)
{
    const char *e = getenv("LRMOE_THP");
    if (e && (!strcmp(e, "0") || !strcmp(e, "1"))) {
        g_thp = e[0] == '1';
        g_thp_why = "LRMOE_THP";
        return;
    }
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    if (strstr(buf, "[never]")) {
        g_thp = 0;
        g_thp_why = "THP never";
    } else if (balloon_reports()) {
        g_thp = 0;
        g_thp_why = "free page reporting";
    } else {
        g_thp = 1;
        g_thp_why = "default";
    }
}

int lrmoe_alloc_thp(const char **why)
{
    pthread_once(&g_thp_once, thp_decide);
    if (why) *why = g_thp_why;
    return g_thp;
}

int lrmoe_alloc_prefault(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    unsigned char v = 1;
    if (b > a && !mincore((void *)a, (size_t)pg, &v) && !(v & 1))
        return !madvise((void *)a, (size_t)(b - a), MADV_POPULATE_WRITE);
#else
    (void)p; (void)n;
#endif
    return 0;
}

void *lrmoe_alloc_big(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    if (n < 2 * huge)
        return malloc(n ? n : 1);
    size_t m = (n + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, m);
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    if (p)
        madvise(p, m, lrmoe_alloc_thp(NULL) ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
    return p;
}

/* ---- the output pool (alloc.h) */

enum { POOL_SLOTS = 32, POOL_MIN = 4 << 20 };

static struct { void *p; size_t n; int fd; } g_pool[POOL_SLOTS];
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_pool_live;   /* slots in use: every tensor_free reads it, without the lock */

/* slot i's file (made when create), locked for this process; -1 when
 * locked by another (or absent, or not openable); *size gets its size */
static int pool_open(const char *dir, int i, int create, off_t *size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/lrmoe-pool-%u-%d", dir, (unsigned)getuid(), i);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
    if (fd < 0) return -1;
    struct stat st;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != getuid()) {
        close(fd);
        return -1;
    }
    *size = st.st_size;
    return fd;
}

void *lrmoe_alloc_out(size_t n)
{
    const char *dir = getenv("LRMOE_POOL");
    if (!dir || !*dir || n < POOL_MIN) return lrmoe_alloc_big(n);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), m = (n + pg - 1) / pg * pg;
    void *p = NULL;
    pthread_mutex_lock(&g_pool_mu);
    int t = 0;
    while (t < POOL_SLOTS && g_pool[t].p) t++;
    /* a file of this size first (its pages are resident: mapping them costs
     * page-table entries, no zeroing), else a new (or empty) file, else any
     * free one resized (whose pages another size had) */
    for (int pass = 0; t < POOL_SLOTS && !p && pass < 3; pass++)
        for (int i = 0; i < POOL_SLOTS && !p; i++) {
            off_t size;
            int fd = pool_open(dir, i, pass > 0, &size);
            if (fd < 0) continue;
            if ((pass == 0 && (size_t)size != m) || (pass == 1 && size != 0) ||
                (pass > 0 && ftruncate(fd, (off_t)m) < 0)) {
                close(fd);
                continue;
            }
            p = mmap(NULL, m, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
            if (p == MAP_FAILED) {
                p = NULL;
                close(fd);
                continue;
            }
            g_pool[t].p = p;
            g_pool[t].n = m;
            g_pool[t].fd = fd;
            __atomic_add_fetch(&g_pool_live, 1, __ATOMIC_RELEASE);
        }
    pthread_mutex_unlock(&g_pool_mu);
    return p ? p : lrmoe_alloc_big(n);
}

int lrmoe_pool_free(void *p)
{
    /* no pool buffer in this process (the common case): nothing to look up */
    if (!p || !__atomic_load_n(&g_pool_live, __ATOMIC_ACQUIRE)) return 0;
    int hit = 0;
    pthread_mutex_lock(&g_pool_mu);
    for (int t = 0; t < POOL_SLOTS && !hit; t++)
        if (g_pool[t].p == p) {
            munmap(p, g_pool[t].n);
            close(g_pool[t].fd);   /* the lock goes with it; the file and its pages stay */
            g_pool[t].p = NULL;
            __atomic_sub_fetch(&g_pool_live, 1, __ATOMIC_RELEASE);
            hit = 1;
        }
    pthread_mutex_unlock(&g_pool_mu);
    return hit;
}

lrmoe_tensor_t *lrmoe_frame_put(lrmoe_frame_t *f, const char *name,
                                lrmoe_dtype_t dtype, int ndim, const int64_t *shape)
{
    size_t nb;
    lrmoe_tensor_t *t = tensor_new(name, dtype, ndim, shape, &nb);
    if (!t) return NULL;
    if (nb) {
        if (!(t->data = lrmoe_alloc_big(nb))) {
            lrmoe_err("out of memory: %zu bytes for tensor %s", nb, name);
            tensor_free(t);
            return NULL;
        }
        memset(t->data, 0, nb);
    }
    return insert(f, t);
}

lrmoe_tensor_t *lrmoe_frame_put_f32(lrmoe_frame_t *f, const char *name,
                                    lrmoe_dtype_t dtype, int ndim,
                                    const int64_t *shape, const float *src)
{
    lrmoe_tensor_t *t = lrmoe_frame_put(f, name, dtype, ndim, shape);
    if (t) lrmoe_convert_from_f32(dtype, src, t->data, (size_t)lrmoe_tensor_numel(t));
    return t;
}

static lrmoe_tensor_t *adopt(lrmoe_frame_t *f, const char *name, lrmoe_dtype_t dtype,
                             int ndim, const int64_t *shape, void *data, int is_new)
{
    size_t nb;
    lrmoe_tensor_t *t = tensor_new(name, dtype, ndim, shape, &nb);
    if (!t) { free(data); return NULL; }
    t->data = data;
    if (!nb) { free(data); t->data = NULL; }
    return is_new ? append(f, t) : insert(f, t);
}

lrmoe_tensor_t *lrmoe_frame_adopt(lrmoe_frame_t *f, const char *name,
                                  lrmoe_dtype_t dtype, int ndim,
                                  const int64_t *shape, void *data)
{
    return adopt(f, name, dtype, ndim, shape, data, 0);
}

lrmoe_tensor_t *lrmoe_frame_adopt_new(lrmoe_frame_t *f, const char *name,
                                      lrmoe_dtype_t dtype, int ndim,
                                      const int64_t *shape, void *data)
{
    return adopt(f, name, dtype, ndim, shape, data, 1);
}

int lrmoe_frame_del(lrmoe_frame_t *f, const char *name)
{
    int i = find(f, name);
    if (i < 0) return 0;
    tensor_free(f->tensors[i]);
    memmove(f->tensors + i, f->tensors + i + 1,
            (size_t)(f->ntensors - i - 1) * sizeof *f->tensors);
    f->ntensors--;
    return 1;
}

const char *lrmoe_frame_attr(const lrmoe_frame_t *f, const char *key)
{
    for (int i = 0; i < f->nattrs; i++)
        if (!strcmp(f->keys[i], key)) return f->vals[i];
    return NULL;
}

static int set_attr(lrmoe_frame_t *f, const char *key, const char *val, int is_new)
{
    char *v = strdup(val);
    if (!v) return lrmoe_err("out of memory");
    for (int i = 0; !is_new && i < f->nattrs; i++)
        if (!strcmp(f->keys[i], key)) {
            free(f->vals[i]);
            f->vals[i] = v;
            return 0;
        }
    if (f->nattrs >= LRMOE_MAX_ATTRS) {
        free(v);
        return lrmoe_err("attribute %s: more than %d attributes in one frame", key, LRMOE_MAX_ATTRS);
    }
    if (f->nattrs == f->acap) {
        int cap = f->acap ? 2 * f->acap : 16;
        char **k = realloc(f->keys, (size_t)cap * sizeof *k);
        if (k) f->keys = k;
        char **vv = k ? realloc(f->vals, (size_t)cap * sizeof *vv) : NULL;
        if (!vv) { free(v); return lrmoe_err("out of memory"); }
        f->vals = vv;
        f->acap = cap;
    }
    if (!(f->keys[f->nattrs] = strdup(key))) { free(v); return lrmoe_err("out of memory"); }
    f->vals[f->nattrs++] = v;
    return 0;
}

int lrmoe_frame_set_attr(lrmoe_frame_t *f, const char *key, const char *val)
{
    return set_attr(f, key, val, 0);
}

int lrmoe_frame_set_attr_new(lrmoe_frame_t *f, const char *key, const char *val)
{
    return set_attr(f, key, val, 1);
}

int lrmoe_frame_set_attrf(lrmoe_frame_t *f, const char *key, const char *fmt, ...)
{
    char buf[4096], *p = buf;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return lrmoe_err("attribute %s: cannot format its value", key);
    if ((size_t)n >= sizeof buf) {   /* long value: format it again, whole */
        if (!(p = malloc((size_t)n + 1))) return lrmoe_err("out of memory");
        va_start(ap, fmt);
        vsnprintf(p, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    int rc = lrmoe_frame_set_attr(f, key, p);
    if (p != buf) free(p);
    return rc;
}

int lrmoe_frame_attr_i64(const lrmoe_frame_t *f, const char *key, int64_t *out)
{
    const char *s = lrmoe_frame_attr(f, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return lrmoe_err("attribute %s: '%s' is not an integer", key, s);
    *out = v;
    return 1;
}

int lrmoe_frame_attr_f64(const lrmoe_frame_t *f, const char *key, double *out)
{
    const char *s = lrmoe_frame_attr(f, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE || end == s || *end)
        return lrmoe_err("attribute %s: '%s' is not a number", key, s);
    *out = v;
    return 1;
}
