/* Import: .safetensors and .npy files and standard input -> frames
 * (lib/import.h). Moved from lrmoe-import so every caller shares it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "import.h"
#include "import_hf.h"
#include "npy.h"

typedef struct lrmoe_import_rename {
    char *old, *new_;
    int used;
} rename_t;

typedef struct lrmoe_import_retype {
    char *name;          /* NULL: every integer tensor of the same size */
    lrmoe_dtype_t dt;
    int used;
} retype_t;

typedef lrmoe_import_opts_t opts_t;

static int split_kv(const char *arg, const char *opt, char **k, char **v)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return lrmoe_err("%s: '%s' is not KEY=VALUE", opt, arg);
    *k = strndup(arg, (size_t)(eq - arg));
    *v = strdup(eq + 1);
    if (!*k || !*v) {
        free(*k);
        free(*v);
        return lrmoe_err("out of memory");
    }
    return 0;
}

/* Rename, reinterpret and set attributes on one frame. */
static int finish_frame(lrmoe_frame_t *f, opts_t *o)
{
    for (int i = 0; i < o->nren; i++) {
        lrmoe_tensor_t *t = lrmoe_frame_get(f, o->ren[i].old);
        if (!t)
            continue;
        if (strcmp(o->ren[i].old, o->ren[i].new_) && lrmoe_frame_get(f, o->ren[i].new_))
            return lrmoe_err("--name %s=%s: tensor %s already exists", o->ren[i].old,
                             o->ren[i].new_, o->ren[i].new_);
        char *nn = strdup(o->ren[i].new_);
        if (!nn)
            return lrmoe_err("out of memory");
        free(t->name);
        t->name = nn;
        o->ren[i].used = 1;
    }
    for (int i = 0; i < o->nret; i++) {
        retype_t *r = &o->ret[i];
        for (int j = 0; j < f->ntensors; j++) {
            lrmoe_tensor_t *t = f->tensors[j];
            size_t es = lrmoe_dtype_size(r->dt);
            if (r->name) {
                if (strcmp(t->name, r->name))
                    continue;
                if (lrmoe_dtype_size(t->dtype) != es)
                    return lrmoe_err("--dtype %s=%s: tensor %s is %s, element sizes differ",
                                     r->name, lrmoe_dtype_name(r->dt), t->name,
                                     lrmoe_dtype_name(t->dtype));
            } else if (lrmoe_dtype_is_float(t->dtype) || t->dtype == LRMOE_BOOL ||
                       lrmoe_dtype_size(t->dtype) != es) {
                continue;
            }
            t->dtype = r->dt;
            r->used = 1;
        }
    }
    for (int i = 0; i < o->nattr; i++)
        if (lrmoe_frame_set_attr(f, o->akey[i], o->aval[i]) < 0)
            return -1;
    return 0;
}

/* ------------------------------------------------------------ inputs */

typedef struct lrmoe_import_input {
    char *path;
    int npy;       /* .npy file or frame sidecar: part of an npy group */
    int sidecar;   /* fN.frame.json */
    int64_t frame; /* npy */
    char *tensor;  /* npy */
    size_t ord;    /* npy: position in the argument order, for a stable sort */
} input_t;

typedef lrmoe_import_inputs_t inputs_t;

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int add_input(inputs_t *in, const char *path)
{
    if (in->n == in->cap) {
        size_t c = in->cap ? 2 * in->cap : 16;
        input_t *v = realloc(in->v, c * sizeof *v);
        if (!v)
            return lrmoe_err("out of memory");
        in->v = v;
        in->cap = c;
    }
    input_t *x = &in->v[in->n++];
    memset(x, 0, sizeof *x);
    x->path = strdup(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    x->sidecar = lrmoe_npy_sidecar_name(base, &x->frame);
    x->npy = x->sidecar || ends_with(path, ".npy");
    return x->path ? 0 : lrmoe_err("out of memory");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int lrmoe_import_add(inputs_t *in, const char *arg)
{
    if (!strcmp(arg, "-")) { /* standard input: safetensors blobs */
        for (size_t i = 0; i < in->n; i++)
            if (!strcmp(in->v[i].path, "-"))
                return lrmoe_err("-: standard input named twice");
        return add_input(in, arg);
    }
    struct stat st;
    if (stat(arg, &st) < 0)
        return lrmoe_err("%s: %s", arg, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return add_input(in, arg);
    DIR *d = opendir(arg);
    if (!d)
        return lrmoe_err("%s: %s", arg, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !(ends_with(e->d_name, ".npy") || ends_with(e->d_name, ".safetensors") ||
                                    ends_with(e->d_name, ".frame.json")))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = lrmoe_err("out of memory");
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = lrmoe_err("out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_str);
    if (rc == 0 && n == 0)
        rc = lrmoe_err("%s: directory holds no .npy or .safetensors files", arg);
    size_t nst = 0;
    for (size_t i = 0; i < n; i++)
        nst += ends_with(names[i], ".safetensors");
    if (rc == 0 && nst && nst < n) /* e.g. lrmoe-export --format both */
        rc = lrmoe_err("%s: directory holds both .npy and .safetensors files: "
                       "name the ones to import (%s/*.safetensors or %s/*.npy %s/*.json)",
                       arg, arg, arg, arg);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            size_t l = strlen(arg) + strlen(names[i]) + 2;
            char *p = malloc(l);
            if (!p) {
                rc = lrmoe_err("out of memory");
            } else {
                snprintf(p, l, "%s/%s", arg, names[i]);
                rc = add_input(in, p);
                free(p);
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

/* ------------------------------------------------------------ import */

int lrmoe_import_safetensors(const char *path, lrmoe_frame_t *f)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return lrmoe_err("%s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return lrmoe_err("%s", strerror(errno));
    }
    size_t len = (size_t)st.st_size;
    int rc;
    if (len == 0) {
        rc = lrmoe_err("empty file");
    } else {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = lrmoe_err("%s", strerror(errno));
        } else {
            const unsigned char *b = m;
            if (len >= 4 && !memcmp(b, "PK\003\004", 4))
                rc = lrmoe_err("a zip archive, as torch.save() writes, not safetensors: save "
                               "with safetensors.torch.save_file(tensors, path), or write "
                               "safetensors.torch.save(tensors) bytes to lrmoe-import -");
            else if (len >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
                rc = lrmoe_err("a Python pickle (legacy torch.save()), not safetensors: save "
                               "with safetensors.torch.save_file(tensors, path)");
            else if ((rc = lrmoe_frame_decode(m, len, f)) < 0)
                lrmoe_err_prefix("not a valid safetensors file");
            munmap(m, len);
        }
    }
    close(fd);
    return rc;
}

static int cmp_npy(const void *a, const void *b)
{
    const input_t *x = a, *y = b;
    if (x->frame != y->frame)
        return x->frame < y->frame ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

/* where finished frames go */
typedef struct {
    lrmoe_frame_fn fn;
    void *ctx;
    int64_t index;
} sink_t;

static int write_frame(sink_t *w, lrmoe_frame_t *f, opts_t *o)
{
    if (finish_frame(f, o) < 0)
        return -1;
    return lrmoe_hf_import(f, (lrmoe_hf_map_t)o->map, w->fn, w->ctx, &w->index);
}

/* Standard input: safetensors blobs back to back, a frame each. */
static int import_stdin(sink_t *w, lrmoe_frame_t *f, opts_t *o)
{
    int64_t n = 0;
    int r;
    while ((r = lrmoe_frame_fread(stdin, f)) == 1) {
        if (write_frame(w, f, o) < 0)
            return lrmoe_err_prefix("stdin: frame %" PRId64, n);
        n++;
    }
    if (r < 0)
        return lrmoe_err_prefix("stdin: frame %" PRId64, n);
    if (n == 0)
        return lrmoe_err("stdin: no safetensors data");
    return 0;
}

/* Import the npy inputs v[0..n): grouped by frame number, ascending. */
static int import_npy_group(input_t *v, size_t n, sink_t *w, lrmoe_frame_t *f, opts_t *o)
{
    for (size_t i = 0; i < n; i++) {
        const char *base = strrchr(v[i].path, '/');
        base = base ? base + 1 : v[i].path;
        char name[1024];
        v[i].ord = i;
        if (v[i].sidecar) {
            if (o->one_frame)
                v[i].frame = -1; /* ignored */
            continue;
        }
        if (o->one_frame) {
            size_t l = strlen(base) - 4;
            if (l == 0 || l >= sizeof name)
                return lrmoe_err("%s: bad tensor name", v[i].path);
            memcpy(name, base, l);
            name[l] = 0;
            v[i].frame = 0;
        } else if (lrmoe_npy_name_parse(base, &v[i].frame, name, sizeof name) < 0) {
            return lrmoe_err_prefix("%s", v[i].path);
        }
        free(v[i].tensor);
        if (!(v[i].tensor = strdup(name)))
            return lrmoe_err("out of memory");
    }
    /* by frame, argument order kept inside a frame: O(n log n) (an insertion
     * sort was quadratic on a directory's name order, where f10 sorts before f2) */
    qsort(v, n, sizeof *v, cmp_npy);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        lrmoe_frame_clear(f);
        for (; j < n && v[j].frame == v[i].frame; j++) {
            if (v[j].sidecar)
                continue;
            if (lrmoe_frame_get(f, v[j].tensor))
                return lrmoe_err("%s: duplicate tensor %s in frame %" PRId64, v[j].path,
                                 v[j].tensor, v[j].frame);
            if (lrmoe_npy_load(v[j].path, f, v[j].tensor) < 0)
                return lrmoe_err_prefix("%s", v[j].path);
        }
        if (v[i].frame < 0) { /* --one-frame: sidecars are ignored */
            i = j;
            continue;
        }
        for (size_t k = i; k < j; k++) /* sidecars after the tensors are in */
            if (v[k].sidecar && lrmoe_npy_sidecar_apply(v[k].path, f) < 0)
                return lrmoe_err_prefix("%s", v[k].path);
        if (write_frame(w, f, o) < 0)
            return lrmoe_err_prefix("frame %" PRId64 " (%s)", v[i].frame, v[i].path);
        i = j;
    }
    return 0;
}

int lrmoe_import_run(inputs_t *in, opts_t *o, lrmoe_frame_fn fn, void *ctx)
{
    sink_t sink = {fn, ctx, 0}, *w = &sink;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc = 0;
    size_t i = 0;
    while (rc == 0 && i < in->n) {
        if (in->v[i].npy) {
            size_t j = i;
            while (j < in->n && in->v[j].npy)
                j++;
            if (o->one_frame) { /* every .npy file joins one frame, placed here */
                j = in->n;
                input_t *tmp = malloc((j - i) * sizeof *tmp);
                if (!tmp) {
                    rc = lrmoe_err("out of memory");
                    break;
                }
                size_t m = 0;
                for (size_t k = i; k < j; k++) /* stable partition: npy first */
                    if (in->v[k].npy)
                        tmp[m++] = in->v[k];
                for (size_t k = i, q = m; k < j; k++)
                    if (!in->v[k].npy)
                        tmp[q++] = in->v[k];
                memcpy(in->v + i, tmp, (j - i) * sizeof *tmp);
                free(tmp);
                rc = import_npy_group(in->v + i, m, w, &f, o);
                for (size_t k = i + m; rc == 0 && k < j; k++) {
                    if (!strcmp(in->v[k].path, "-"))
                        rc = import_stdin(w, &f, o);
                    else if (lrmoe_import_safetensors(in->v[k].path, &f) < 0)
                        rc = lrmoe_err_prefix("%s", in->v[k].path);
                    else if (write_frame(w, &f, o) < 0)
                        rc = lrmoe_err_prefix("%s", in->v[k].path);
                }
            } else {
                rc = import_npy_group(in->v + i, j - i, w, &f, o);
            }
            i = j;
        } else if (!strcmp(in->v[i].path, "-")) {
            rc = import_stdin(w, &f, o);
            i++;
        } else {
            if (lrmoe_import_safetensors(in->v[i].path, &f) < 0)
                rc = lrmoe_err_prefix("%s", in->v[i].path);
            else if (write_frame(w, &f, o) < 0)
                rc = lrmoe_err_prefix("%s", in->v[i].path);
            i++;
        }
    }
    lrmoe_frame_clear(&f);
    if (rc == 0) {
        for (int k = 0; k < o->nren; k++)
            if (!o->ren[k].used)
                return lrmoe_err("--name %s=%s: no tensor %s in the input", o->ren[k].old,
                                 o->ren[k].new_, o->ren[k].old);
        for (int k = 0; k < o->nret; k++)
            if (!o->ret[k].used)
                return o->ret[k].name
                    ? lrmoe_err("--dtype %s=%s: no tensor %s in the input", o->ret[k].name,
                                lrmoe_dtype_name(o->ret[k].dt), o->ret[k].name)
                    : lrmoe_err("--dtype %s: no integer tensor of that element size in the input",
                                lrmoe_dtype_name(o->ret[k].dt));
    }
    return rc;
}


/* ------------------------------------------------------------ options */

void lrmoe_import_opts_init(opts_t *o)
{
    memset(o, 0, sizeof *o);
}

void lrmoe_import_opts_free(opts_t *o)
{
    for (int i = 0; i < o->nren; i++) {
        free(o->ren[i].old);
        free(o->ren[i].new_);
    }
    free(o->ren);
    for (int i = 0; i < o->nret; i++)
        free(o->ret[i].name);
    free(o->ret);
    for (int i = 0; i < o->nattr; i++) {
        free(o->akey[i]);
        free(o->aval[i]);
    }
    free(o->akey);
    free(o->aval);
    memset(o, 0, sizeof *o);
}

int lrmoe_import_opts_rename(opts_t *o, const char *arg)
{
    char *k, *v;
    if (split_kv(arg, "--name", &k, &v) < 0)
        return lrmoe_err("--name: '%s' is not OLD=NEW", arg);
    rename_t *r = *v ? realloc(o->ren, (size_t)(o->nren + 1) * sizeof *r) : NULL;
    if (!r) {
        int empty = !*v;
        free(k);
        free(v);
        return empty ? lrmoe_err("--name: '%s' is not OLD=NEW", arg) : lrmoe_err("out of memory");
    }
    o->ren = r;
    o->ren[o->nren++] = (rename_t){k, v, 0};
    return 0;
}

int lrmoe_import_opts_retype(opts_t *o, const char *arg)
{
    retype_t r = {NULL, LRMOE_U8, 0};
    const char *dt = arg, *eq = strrchr(arg, '=');
    if (eq && eq == arg)
        return lrmoe_err("--dtype: '%s' is not [NAME=]DTYPE", arg);
    if (eq) dt = eq + 1;
    if (lrmoe_dtype_parse(dt, &r.dt) < 0)
        return lrmoe_err("--dtype: '%s' is not [NAME=]DTYPE", arg);
    if (eq && !(r.name = strndup(arg, (size_t)(eq - arg))))
        return lrmoe_err("out of memory");
    retype_t *v = realloc(o->ret, (size_t)(o->nret + 1) * sizeof *v);
    if (!v) {
        free(r.name);
        return lrmoe_err("out of memory");
    }
    o->ret = v;
    o->ret[o->nret++] = r;
    return 0;
}

int lrmoe_import_opts_attr(opts_t *o, const char *arg)
{
    char *k, *v;
    if (split_kv(arg, "--attr", &k, &v) < 0) return -1;
    char **nk = realloc(o->akey, (size_t)(o->nattr + 1) * sizeof *nk);
    if (nk) o->akey = nk;
    char **nv = nk ? realloc(o->aval, (size_t)(o->nattr + 1) * sizeof *nv) : NULL;
    if (nv) o->aval = nv;
    if (!nk || !nv) {
        free(k);
        free(v);
        return lrmoe_err("out of memory");
    }
    o->akey[o->nattr] = k;
    o->aval[o->nattr++] = v;
    return 0;
}

void lrmoe_import_inputs_free(inputs_t *in)
{
    for (size_t i = 0; i < in->n; i++) {
        free(in->v[i].path);
        free(in->v[i].tensor);
    }
    free(in->v);
    memset(in, 0, sizeof *in);
}
