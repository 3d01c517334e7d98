/* lrmoe-import: .safetensors and .npy files -> a stream of frames. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "lrmoe.h"
#include "npy.h"

static const char *prog = "lrmoe-import";

static void usage(FILE *fp)
{
    fprintf(fp,
            "Usage: %s [options] FILE|DIR|-...\n"
            "Import .safetensors files (one frame each) and .npy files (grouped into\n"
            "frames by name) into an lrmoe stream. - reads standard input: safetensors\n"
            "blobs back to back, a frame each (safetensors.torch.save() bytes written\n"
            "in a loop).\n"
            "\n"
            "  .npy names:  fN.NAME.npy -> frame N, tensor NAME\n"
            "               NAME.N.npy  -> frame N, tensor NAME\n"
            "               NAME.npy    -> frame 0, tensor NAME\n"
            "  fN.frame.json (written by lrmoe-export) restores frame N's attributes,\n"
            "  tensor order and dtypes. A directory stands for its *.npy,\n"
            "  *.frame.json and *.safetensors files, sorted by name.\n"
            "\n"
            "Options:\n"
            "  -n, --name OLD=NEW      rename tensor OLD to NEW (repeatable)\n"
            "  -t, --dtype [NAME=]DT   reinterpret the bytes of tensor NAME as DT (same\n"
            "                          element size); without NAME, every integer tensor\n"
            "                          of DT's element size (e.g. --dtype bf16 for the\n"
            "                          uint16 arrays PyTorch users save for bfloat16)\n"
            "  -a, --attr KEY=VAL      set a frame attribute on every frame (repeatable)\n"
            "  -1, --one-frame         put every .npy file in one frame (NAME = file\n"
            "                          name without .npy; no frame numbers, no sidecars)\n"
            "  -o, --output FILE       write the stream to FILE (default: stdout)\n"
            "  -l, --level N           zstd level (default 3)\n"
            "  -@, --threads N         zstd worker threads (default 0)\n"
            "      --no-compress       write a raw stream\n"
            "  -f, --force             write binary data to a terminal\n"
            "  -h, --help              show this help\n"
            "  -V, --version           show the version\n",
            prog);
}

typedef struct {
    char *old, *new_;
    int used;
} rename_t;

typedef struct {
    char *name;          /* NULL: every integer tensor of the same size */
    lrmoe_dtype_t dt;
    int used;
} retype_t;

typedef struct {
    rename_t *ren;
    int nren;
    retype_t *ret;
    int nret;
    char **akey, **aval;
    int nattr;
    int one_frame;
} opts_t;

static int split_kv(const char *arg, const char *opt, char **k, char **v)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return lrmoe_err("%s: '%s' is not KEY=VALUE", opt, arg);
    *k = strndup(arg, (size_t)(eq - arg));
    *v = strdup(eq + 1);
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

typedef struct {
    char *path;
    int npy;       /* .npy file or frame sidecar: part of an npy group */
    int sidecar;   /* fN.frame.json */
    int64_t frame; /* npy */
    char *tensor;  /* npy */
} input_t;

typedef struct {
    input_t *v;
    size_t n, cap;
} inputs_t;

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

static int add_arg(inputs_t *in, const char *arg)
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
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
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
            snprintf(p, l, "%s/%s", arg, names[i]);
            rc = add_input(in, p);
            free(p);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

/* ------------------------------------------------------------ import */

static int import_safetensors(const char *path, lrmoe_frame_t *f)
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
            rc = lrmoe_frame_decode(m, len, f);
            if (rc < 0)
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
    return 0;
}

static int write_frame(lrmoe_writer_t *w, lrmoe_frame_t *f, opts_t *o)
{
    if (finish_frame(f, o) < 0)
        return -1;
    return lrmoe_writer_write(w, f);
}

/* Standard input: safetensors blobs back to back, a frame each. */
static int import_stdin(lrmoe_writer_t *w, lrmoe_frame_t *f, opts_t *o)
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
static int import_npy_group(input_t *v, size_t n, lrmoe_writer_t *w, lrmoe_frame_t *f, opts_t *o)
{
    for (size_t i = 0; i < n; i++) {
        const char *base = strrchr(v[i].path, '/');
        base = base ? base + 1 : v[i].path;
        char name[1024];
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
        v[i].tensor = strdup(name);
    }
    /* stable sort by frame (insertion order kept inside a frame) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && cmp_npy(&v[j - 1], &v[j]) > 0; j--) {
            input_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
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

static int run(inputs_t *in, lrmoe_writer_t *w, opts_t *o)
{
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
                    else if (import_safetensors(in->v[k].path, &f) < 0)
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
            if (import_safetensors(in->v[i].path, &f) < 0)
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

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"name", required_argument, 0, 'n'},
        {"dtype", required_argument, 0, 't'},
        {"attr", required_argument, 0, 'a'},
        {"one-frame", no_argument, 0, '1'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        LRMOE_STREAM_LONGOPTS,
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    opts_t o;
    memset(&o, 0, sizeof o);
    int c;
    while ((c = getopt_long(argc, argv, "n:t:a:1hV" LRMOE_STREAM_SHORTOPTS, lopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, c, optarg);
        if (r < 0) {
            fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
            return 2;
        }
        if (r > 0)
            continue;
        char *k, *v;
        switch (c) {
        case 'n':
            if (split_kv(optarg, "--name", &k, &v) < 0 || !*v) {
                fprintf(stderr, "%s: --name: '%s' is not OLD=NEW\n", prog, optarg);
                return 2;
            }
            o.ren = realloc(o.ren, (size_t)(o.nren + 1) * sizeof *o.ren);
            o.ren[o.nren++] = (rename_t){k, v, 0};
            break;
        case 't': {
            retype_t r = {NULL, LRMOE_U8, 0};
            const char *dt = optarg, *eq = strrchr(optarg, '=');
            if (eq) {
                r.name = strndup(optarg, (size_t)(eq - optarg));
                dt = eq + 1;
            }
            if ((eq && eq == optarg) || lrmoe_dtype_parse(dt, &r.dt) < 0) {
                fprintf(stderr, "%s: --dtype: '%s' is not [NAME=]DTYPE\n", prog, optarg);
                return 2;
            }
            o.ret = realloc(o.ret, (size_t)(o.nret + 1) * sizeof *o.ret);
            o.ret[o.nret++] = r;
            break;
        }
        case 'a':
            if (split_kv(optarg, "--attr", &k, &v) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 2;
            }
            o.akey = realloc(o.akey, (size_t)(o.nattr + 1) * sizeof *o.akey);
            o.aval = realloc(o.aval, (size_t)(o.nattr + 1) * sizeof *o.aval);
            o.akey[o.nattr] = k;
            o.aval[o.nattr++] = v;
            break;
        case '1':
            o.one_frame = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "%s: no input files (- for standard input)\n", prog);
        usage(stderr);
        return 2;
    }
    inputs_t in = {0};
    for (int i = optind; i < argc; i++)
        if (add_arg(&in, argv[i]) < 0) {
            fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
            return 1;
        }
    if (lrmoe_check_tty_out(io.out, io.force) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 1;
    }
    lrmoe_writer_t *w = lrmoe_writer_open(io.out, &io.w);
    if (!w) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 1;
    }
    if (run(&in, w, &o) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        lrmoe_writer_abort(w);
        return 1;
    }
    if (lrmoe_writer_close(w) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 1;
    }
    for (size_t i = 0; i < in.n; i++) {
        free(in.v[i].path);
        free(in.v[i].tensor);
    }
    free(in.v);
    return 0;
}
