/* diff: frames compared tensor by tensor (see diff.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "diff.h"

#define CHUNK 4096

/* One pair of elements as doubles. */
static void pair_f64(lrmoe_diff_t *d, int64_t i, double x, double y, double atol, double rtol)
{
    if (x == y || (isnan(x) && isnan(y))) return;
    double ad = fabs(x - y);
    if (!isnan(ad) && ad <= atol + rtol * fabs(y)) return;
    if (d->first < 0) d->first = i;
    d->ndiff++;
    if (isnan(x) || isnan(y)) {
        d->nan_only++;
        return;
    }
    /* inf - inf of the same sign was caught by x == y; opposite signs give inf */
    double rel = y != 0 ? ad / fabs(y) : INFINITY;
    if (ad > d->max_abs) d->max_abs = ad;
    if (rel > d->max_rel) d->max_rel = rel;
}

static void pair_int(lrmoe_diff_t *d, int64_t i, double ad, double ay, double atol, double rtol)
{
    if (ad <= atol + rtol * ay) return;
    if (d->first < 0) d->first = i;
    d->ndiff++;
    double rel = ay != 0 ? ad / ay : INFINITY;
    if (ad > d->max_abs) d->max_abs = ad;
    if (rel > d->max_rel) d->max_rel = rel;
}

int lrmoe_diff_tensor(const lrmoe_tensor_t *a, const lrmoe_tensor_t *b, double atol, double rtol,
                      lrmoe_diff_t *d)
{
    memset(d, 0, sizeof *d);
    d->first = -1;
    int64_t n = lrmoe_tensor_numel(a);
    if (n != lrmoe_tensor_numel(b))
        return lrmoe_err("tensor %s: %lld and %lld elements: not comparable", a->name,
                         (long long)n, (long long)lrmoe_tensor_numel(b));
    d->n = n;
    const uint8_t *pa = a->data, *pb = b->data;
    size_t sa = lrmoe_dtype_size(a->dtype), sb = lrmoe_dtype_size(b->dtype);
    int ia = !lrmoe_dtype_is_float(a->dtype), ib = !lrmoe_dtype_is_float(b->dtype);
    if (ia && ib && (a->dtype == LRMOE_U64) == (b->dtype == LRMOE_U64)) {
        int u = a->dtype == LRMOE_U64;
        int64_t xa[CHUNK], xb[CHUNK];
        for (int64_t o = 0; o < n; o += CHUNK) {
            size_t m = (size_t)(n - o < CHUNK ? n - o : CHUNK);
            if (u) {
                memcpy(xa, pa + (size_t)o * 8, m * 8);
                memcpy(xb, pb + (size_t)o * 8, m * 8);
            } else {
                lrmoe_convert_to_i64(a->dtype, pa + (size_t)o * sa, xa, m);
                lrmoe_convert_to_i64(b->dtype, pb + (size_t)o * sb, xb, m);
            }
            for (size_t k = 0; k < m; k++) {
                if (xa[k] == xb[k]) continue;
                double ad, ay;
                if (u) {
                    uint64_t x = (uint64_t)xa[k], y = (uint64_t)xb[k];
                    ad = (double)(x > y ? x - y : y - x);
                    ay = (double)y;
                } else {
                    /* the difference as u64: exact even across the whole i64 range */
                    uint64_t ud = xa[k] > xb[k] ? (uint64_t)xa[k] - (uint64_t)xb[k]
                                                : (uint64_t)xb[k] - (uint64_t)xa[k];
                    ad = (double)ud;
                    ay = fabs((double)xb[k]);
                }
                pair_int(d, o + (int64_t)k, ad, ay, atol, rtol);
            }
        }
        return 0;
    }
    double xa[CHUNK], xb[CHUNK];
    for (int64_t o = 0; o < n; o += CHUNK) {
        size_t m = (size_t)(n - o < CHUNK ? n - o : CHUNK);
        lrmoe_convert_to_f64(a->dtype, pa + (size_t)o * sa, xa, m);
        lrmoe_convert_to_f64(b->dtype, pb + (size_t)o * sb, xb, m);
        for (size_t k = 0; k < m; k++) pair_f64(d, o + (int64_t)k, xa[k], xb[k], atol, rtol);
    }
    return 0;
}

/* ------------------------------------------------------------ frames */

typedef struct {
    const char *name;
    int idx;
} name_ix_t;

static int cmp_key(const void *x, const void *y)
{
    return strcmp(((const name_ix_t *)x)->name, ((const name_ix_t *)y)->name);
}

/* Names sorted for lookups: attributes (tensors = 0) or tensor names. */
static name_ix_t *sorted(const lrmoe_frame_t *f, int tensors, int *n)
{
    *n = tensors ? f->ntensors : f->nattrs;
    name_ix_t *k = malloc((size_t)(*n ? *n : 1) * sizeof *k);
    if (!k) {
        lrmoe_err("out of memory");
        return NULL;
    }
    for (int i = 0; i < *n; i++) {
        k[i].name = tensors ? f->tensors[i]->name : f->keys[i];
        k[i].idx = i;
    }
    qsort(k, (size_t)*n, sizeof *k, cmp_key);
    return k;
}

static int lookup(const name_ix_t *k, int n, const char *name)
{
    name_ix_t q = {name, 0};
    const name_ix_t *h = bsearch(&q, k, (size_t)n, sizeof *k, cmp_key);
    return h ? h->idx : -1;
}

/* s as a whole number (decimal, no hex, no surrounding space): 1 with *v,
 * *iv and *is_int (an integer that fits int64), else 0 */
static int as_number(const char *s, double *v, int64_t *iv, int *is_int)
{
    if (!*s || isspace((unsigned char)*s) || strpbrk(s, "xX"))
        return 0;
    char *end;
    errno = 0;
    long long i = strtoll(s, &end, 10);
    *is_int = !*end && errno == 0;
    *iv = i;
    *v = strtod(s, &end);
    return !*end;
}

int lrmoe_diff_attr(const char *a, const char *b, double atol, double rtol)
{
    if (!strcmp(a, b))
        return 1;
    double x, y;
    int64_t ix, iy;
    int ia, ib;
    if (!as_number(a, &x, &ix, &ia) || !as_number(b, &y, &iy, &ib))
        return 0;
    lrmoe_diff_t d;
    memset(&d, 0, sizeof d);
    d.first = -1;
    if (ia && ib) { /* exact as integers (2^53 + 1 is not 2^53) */
        if (ix == iy)
            return 1;
        double ad = ix > iy ? (double)((uint64_t)ix - (uint64_t)iy)
                            : (double)((uint64_t)iy - (uint64_t)ix);
        pair_int(&d, 0, ad, fabs((double)iy), atol, rtol);
    } else {
        pair_f64(&d, 0, x, y, atol, rtol);
    }
    return d.ndiff == 0;
}

int64_t lrmoe_diff_frames(const lrmoe_frame_t *a, const lrmoe_frame_t *b, double atol, double rtol,
                          lrmoe_diff_fn fn, void *ctx)
{
    int na, nb, nta, ntb;
    name_ix_t *ka = sorted(a, 0, &na), *kb = sorted(b, 0, &nb);
    name_ix_t *ta = sorted(a, 1, &nta), *tb = sorted(b, 1, &ntb);
    int64_t ndiff = 0;
    int rc = 0;
    if (!ka || !kb || !ta || !tb) {
        rc = -1;
        goto out;
    }
    lrmoe_diff_item_t it;
    for (int i = 0; i < a->nattrs && !rc; i++) {
        int j = lookup(kb, nb, a->keys[i]);
        if (j >= 0 && lrmoe_diff_attr(a->vals[i], b->vals[j], atol, rtol)) continue;
        it = (lrmoe_diff_item_t){j < 0 ? LRMOE_DIFF_ATTR_ONLY_A : LRMOE_DIFF_ATTR_VALUE,
                                 a->keys[i], a->vals[i], j < 0 ? NULL : b->vals[j], NULL, NULL, NULL};
        ndiff++;
        rc = fn(&it, ctx) < 0 ? -1 : 0;
    }
    for (int j = 0; j < b->nattrs && !rc; j++) {
        if (lookup(ka, na, b->keys[j]) >= 0) continue;
        it = (lrmoe_diff_item_t){LRMOE_DIFF_ATTR_ONLY_B, b->keys[j], NULL, b->vals[j], NULL, NULL, NULL};
        ndiff++;
        rc = fn(&it, ctx) < 0 ? -1 : 0;
    }
    for (int i = 0; i < a->ntensors && !rc; i++) {
        const lrmoe_tensor_t *x = a->tensors[i];
        int j = lookup(tb, ntb, x->name);
        const lrmoe_tensor_t *y = j < 0 ? NULL : b->tensors[j];
        lrmoe_diff_t d;
        it = (lrmoe_diff_item_t){LRMOE_DIFF_TENSOR_ONLY_A, x->name, NULL, NULL, x, y, NULL};
        if (y) {
            int same_shape = x->ndim == y->ndim &&
                             !memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof *x->shape);
            if (!same_shape) {
                it.kind = LRMOE_DIFF_SHAPE;
            } else {
                if (lrmoe_diff_tensor(x, y, atol, rtol, &d) < 0) {
                    rc = -1;
                    break;
                }
                it.d = &d;
                it.kind = x->dtype != y->dtype ? LRMOE_DIFF_DTYPE : LRMOE_DIFF_VALUES;
                if (it.kind == LRMOE_DIFF_VALUES && !d.ndiff) continue;
            }
        }
        ndiff++;
        rc = fn(&it, ctx) < 0 ? -1 : 0;
    }
    for (int j = 0; j < b->ntensors && !rc; j++) {
        if (lookup(ta, nta, b->tensors[j]->name) >= 0) continue;
        it = (lrmoe_diff_item_t){LRMOE_DIFF_TENSOR_ONLY_B, b->tensors[j]->name, NULL, NULL, NULL,
                                 b->tensors[j], NULL};
        ndiff++;
        rc = fn(&it, ctx) < 0 ? -1 : 0;
    }
out:
    free(ka);
    free(kb);
    free(ta);
    free(tb);
    return rc < 0 ? -1 : ndiff;
}
