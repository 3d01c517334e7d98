/* Keep or drop a frame's tensors by name or shell glob (lrmoe-route
 * --loads-only, lrmoe-cat --keep/--drop, any filter that thins a stream). */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

/* The index of the first of pats[0..n) that name matches (exactly, or as
 * an fnmatch(3) pattern), or -1. */
static int matching(const char *name, const char *const *pats, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(name, pats[i]) || !fnmatch(pats[i], name, 0)) return i;
    return -1;
}

int lrmoe_frame_thin(lrmoe_frame_t *f, const char *const *pats, int n, int keep, int64_t *hits)
{
    int deleted = 0;
    for (int i = f->ntensors - 1; i >= 0; i--) {
        const char *nm = f->tensors[i]->name;
        int k = matching(nm, pats, n);
        if (k >= 0 && hits) hits[k]++;
        if ((k >= 0) != (keep != 0)) {
            if (lrmoe_frame_del(f, nm) != 1)
                return lrmoe_err("tensor %s: could not be removed", nm);
            deleted++;
        }
    }
    return deleted;
}

int lrmoe_frame_keep_only(lrmoe_frame_t *f, const char *const *names, int n)
{
    return lrmoe_frame_thin(f, names, n, 1, NULL);
}

int lrmoe_frame_drop(lrmoe_frame_t *f, const char *const *names, int n)
{
    return lrmoe_frame_thin(f, names, n, 0, NULL);
}

int lrmoe_names_add(lrmoe_names_t *l, const char *list)
{
    const char *p = list;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!len) return lrmoe_err("'%s': an empty name in the list", list);
        char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
        if (v) l->v = v;
        int64_t *h = v ? realloc(l->hits, (size_t)(l->n + 1) * sizeof *h) : NULL;
        if (h) l->hits = h;
        char *s = h ? strndup(p, len) : NULL;
        if (!s) return lrmoe_err("out of memory");
        l->v[l->n] = s;
        l->hits[l->n++] = 0;
        if (!e) return 0;
        p = e + 1;
    }
}

int lrmoe_names_unmatched(const lrmoe_names_t *l, const char *opt)
{
    for (int i = 0; i < l->n; i++)
        if (!l->hits[i])
            return lrmoe_err("%s %s: no tensor %s in any frame", opt, l->v[i],
                             strpbrk(l->v[i], "*?[") ? "matches it" : "of that name");
    return 0;
}

void lrmoe_names_free(lrmoe_names_t *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    free(l->hits);
    memset(l, 0, sizeof *l);
}
