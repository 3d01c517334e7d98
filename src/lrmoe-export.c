/* lrmoe-export: frames of a stream -> .npy and/or .safetensors files. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "lrmoe.h"
#include "tools.h"
#include "npy.h"

static const char *prog = "lrmoe-export";

static void usage(FILE *fp)
{
    fprintf(fp,
            "Usage: %s [options] [FILE]\n"
            "Write the frames of an lrmoe stream (stdin when no FILE or '-') as files\n"
            "NumPy and PyTorch read: DIR/fNNN.NAME.npy per tensor (plus\n"
            "DIR/fNNN.frame.json: attributes, tensor order, dtypes) and/or\n"
            "DIR/fNNN.safetensors per frame (NNN = frame index, at least 3 digits).\n"
            "\n"
            "Options:\n"
            "  -d, --dir DIR           output directory (created; default .)\n"
            "  -O, --format FMT        npy, safetensors or both (default npy)\n"
            "  -F, --frame N[-M]       export frame N (or frames N..M); repeatable\n"
            "  -T, --tensor NAME       export tensor NAME only; repeatable\n"
            "      --bf16-as TYPE      BF16 in .npy as u16 (raw bits, default) or f32\n"
            "  -v, --verbose           name each file written on stderr\n"
            "  -h, --help              show this help\n"
            "  -V, --version           show the version\n",
            prog);
}

typedef struct {
    const char *dir;
    int npy, st, bf16_f32, verbose;
    lrmoe_select_t sel;
} opts_t;

/* One frame as a .safetensors file with no copy of the data: a raw stream
 * holding the frame, closed without its trailer, is exactly the frame's
 * safetensors blob (lrmoe-stream(5)). The abort does not report the final
 * flush, so the file size is checked against the blob's. */
static int write_safetensors(const char *path, const lrmoe_frame_t *f)
{
    lrmoe_wopts_t wo;
    lrmoe_wopts_default(&wo);
    wo.compress = 0;
    lrmoe_writer_t *w = lrmoe_writer_open(path, &wo);
    if (!w)
        return -1;
    lrmoe_writer_set_digests(w, 0);   /* the blob alone: no digest record */
    int rc = lrmoe_writer_write(w, f);
    lrmoe_writer_abort(w);
    if (rc < 0)
        return -1;
    uint64_t data = 0, hlen = 0;
    for (int i = 0; i < f->ntensors; i++)
        data += f->tensors[i]->nbytes;
    uint8_t h8[8] = {0};
    struct stat st;
    FILE *fp = fopen(path, "rb");
    int ok = fp && fread(h8, 1, 8, fp) == 8 && fstat(fileno(fp), &st) == 0;
    if (fp)
        fclose(fp);
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | h8[i];
    if (!ok || (uint64_t)st.st_size != 8 + hlen + data)
        return lrmoe_err("%s: write error: the file is short (disk full?)", path);
    return 0;
}

static int export_frame(lrmoe_frame_t *f, int64_t index, opts_t *o)
{
    /* drop the tensors not selected (the frame is ours to change) */
    for (int i = 0; i < f->ntensors;) {
        if (!lrmoe_select_tensor(&o->sel, f->tensors[i]->name))
            lrmoe_frame_del(f, f->tensors[i]->name);
        else
            i++;
    }
    size_t dl = strlen(o->dir);
    char path[4096], base[2048];
    if (o->npy)
        for (int i = 0; i < f->ntensors; i++) {
            const lrmoe_tensor_t *t = f->tensors[i];
            if (lrmoe_npy_name_make(index, t->name, base, sizeof base) < 0)
                return -1;
            snprintf(path, sizeof path, "%s/%s", o->dir, base);
            if (lrmoe_npy_save(path, t, o->bf16_f32) < 0)
                return lrmoe_err_prefix("%s", path);
            if (o->verbose)
                fprintf(stderr, "%s\n", path);
        }
    if (o->npy) { /* what .npy cannot hold: attributes, order, dtypes */
        snprintf(path, sizeof path, "%.*s/f%03" PRId64 ".frame.json", (int)dl, o->dir, index);
        if (lrmoe_npy_sidecar_write(path, f) < 0)
            return lrmoe_err_prefix("%s", path);
        if (o->verbose)
            fprintf(stderr, "%s\n", path);
    }
    if (o->st) {
        snprintf(path, sizeof path, "%.*s/f%03" PRId64 ".safetensors", (int)dl, o->dir, index);
        if (write_safetensors(path, f) < 0)
            return -1;
        if (o->verbose)
            fprintf(stderr, "%s\n", path);
    }
    return 0;
}

static int run(const char *in, opts_t *o)
{
    lrmoe_reader_t *r = lrmoe_reader_open(in);
    if (!r)
        return -1;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int64_t i = 0;
    int rc;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        if (lrmoe_select_frame(&o->sel, i) && export_frame(&f, i, o) < 0) {
            lrmoe_err_prefix("frame %" PRId64, i);
            rc = -1;
            break;
        }
        if (++i > o->sel.last) { /* past the last selected frame */
            rc = 0;
            break;
        }
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    if (rc < 0)
        return -1;
    if (o->sel.nranges && o->sel.last >= i)
        return lrmoe_err("--frame %" PRId64 ": the stream has %" PRId64 " frame%s", o->sel.last, i,
                         i == 1 ? "" : "s");
    for (int k = 0; k < o->sel.ntensors; k++)
        if (!o->sel.seen[k])
            return lrmoe_err("--tensor %s: no such tensor in the selected frames", o->sel.tensors[k]);
    return 0;
}

/* long only: -b is --best-effort (lrmoe(7)) */
enum { OPT_BF16_AS = 0x100 };

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"dir", required_argument, 0, 'd'},
        {"format", required_argument, 0, 'O'},
        {"frame", required_argument, 0, 'F'},
        {"tensor", required_argument, 0, 'T'},
        {"bf16-as", required_argument, 0, OPT_BF16_AS},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    opts_t o;
    memset(&o, 0, sizeof o);
    lrmoe_select_init(&o.sel);
    o.dir = ".";
    o.npy = 1;
    int c;
    while ((c = getopt_long(argc, argv, "d:O:F:T:vhV", lopts, NULL)) != -1) {
        int sel = lrmoe_select_opt(&o.sel, c, optarg);
        if (sel < 0) /* -1: a bad --frame, a usage error */
            return lrmoe_tool_fail(prog, sel == -1 ? 2 : 1);
        if (sel > 0)
            continue;
        switch (c) {
        case 'd':
            o.dir = optarg;
            break;
        case 'O':
            if (!strcmp(optarg, "npy"))
                o.npy = 1, o.st = 0;
            else if (!strcmp(optarg, "safetensors"))
                o.npy = 0, o.st = 1;
            else if (!strcmp(optarg, "both"))
                o.npy = 1, o.st = 1;
            else {
                fprintf(stderr, "%s: --format: '%s' is not npy, safetensors or both\n", prog, optarg);
                return 2;
            }
            break;
        case OPT_BF16_AS:
            if (!strcmp(optarg, "u16") || !strcmp(optarg, "uint16"))
                o.bf16_f32 = 0;
            else if (!strcmp(optarg, "f32") || !strcmp(optarg, "float32"))
                o.bf16_f32 = 1;
            else {
                fprintf(stderr, "%s: --bf16-as: '%s' is not u16 or f32\n", prog, optarg);
                return 2;
            }
            break;
        case 'v':
            o.verbose = 1;
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error(prog);
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "%s: one input stream at most\n", prog);
        return lrmoe_usage_error(prog);
    }
    const char *in = optind < argc ? argv[optind] : "-";
    if (mkdir(o.dir, 0777) < 0 && errno != EEXIST) {
        fprintf(stderr, "%s: %s: %s\n", prog, o.dir, strerror(errno));
        return 1;
    }
    struct stat st;
    if (stat(o.dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s: not a directory\n", prog, o.dir);
        return 1;
    }
    int rc = run(in, &o) < 0 ? 1 : 0;
    if (rc) fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
    lrmoe_select_free(&o.sel);
    return rc;
}
