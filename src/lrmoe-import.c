/* lrmoe-import: .safetensors and .npy files -> a stream of frames. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "import.h"
#include "import_hf.h"
#include "lrmoe.h"
#include "tools.h"

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
            "      --name OLD=NEW      rename tensor OLD to NEW (repeatable)\n"
            "  -t, --dtype [NAME=]DT   reinterpret the bytes of tensor NAME as DT (same\n"
            "                          element size); without NAME, every integer tensor\n"
            "                          of DT's element size (e.g. --dtype bf16 for the\n"
            "                          uint16 arrays PyTorch users save for bfloat16)\n"
            "  -a, --attr KEY=VAL      set a frame attribute on every frame (repeatable)\n"
            "  -1, --one-frame         put every .npy file in one frame (NAME = file\n"
            "                          name without .npy; no frame numbers, no sidecars)\n"
            "      --map MODE          Hugging Face inputs: auto (default: hidden\n"
            "                          [B,S,D] flattened, integer topk_ids to I32 with\n"
            "                          range checks, topk_weights to F32, transformers\n"
            "                          expert weights to w_gate/w_up/w_down per layer),\n"
            "                          hf (also the HF activation names hidden_states,\n"
            "                          top_k_index, top_k_weights), none (as is)\n"
            "  -o, --output FILE       write the stream to FILE (default: stdout)\n"
            "  -l, --level N           zstd level (default: 1 to a file, raw to a pipe)\n"
            "  -@, --threads N         zstd worker threads (default 0)\n"
            "      --no-compress       write a raw stream\n"
            "  -f, --force             write binary data to a terminal\n"
            "  -h, --help              show this help\n"
            "  -V, --version           show the version\n",
            prog);
}

static int write_one(lrmoe_frame_t *f, int64_t index, void *w)
{
    (void)index;
    return lrmoe_writer_write(w, f);
}

/* long only: -n and -m are --renorm and --metric (lrmoe(7)) */
enum { OPT_NAME = 0x100, OPT_MAP };

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"name", required_argument, 0, OPT_NAME},
        {"dtype", required_argument, 0, 't'},
        {"attr", required_argument, 0, 'a'},
        {"one-frame", no_argument, 0, '1'},
        {"map", required_argument, 0, OPT_MAP},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        LRMOE_STREAM_LONGOPTS,
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    lrmoe_import_opts_t o;
    lrmoe_import_opts_init(&o);
    lrmoe_import_inputs_t in = {0};
    lrmoe_writer_t *w = NULL;
    int c, rc = 1;
    while ((c = getopt_long(argc, argv, "t:a:1hV" LRMOE_STREAM_SHORTOPTS, lopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, c, optarg);
        if (r < 0) goto usage_err;
        if (r > 0)
            continue;
        switch (c) {
        case OPT_NAME:
            if (lrmoe_import_opts_rename(&o, optarg) < 0) goto usage_err;
            break;
        case 't':
            if (lrmoe_import_opts_retype(&o, optarg) < 0) goto usage_err;
            break;
        case 'a':
            if (lrmoe_import_opts_attr(&o, optarg) < 0) goto usage_err;
            break;
        case '1':
            o.one_frame = 1;
            break;
        case OPT_MAP: {
            lrmoe_hf_map_t m;
            if (lrmoe_hf_map_parse(optarg, &m) < 0) goto usage_err;
            o.map = (int)m;
            break;
        }
        case 'h':
            usage(stdout);
            rc = 0;
            goto out;
        case 'V':
            printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION);
            rc = 0;
            goto out;
        default:
            rc = lrmoe_usage_error(prog);
            goto out;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "%s: no input files (- for standard input)\n", prog);
        rc = lrmoe_usage_error(prog);
        goto out;
    }
    for (int i = optind; i < argc; i++)
        if (lrmoe_import_add(&in, argv[i]) < 0) goto fail;
    if (lrmoe_check_tty_out(io.out, io.force) < 0) goto fail;
    if (!(w = lrmoe_writer_open(io.out, &io.w))) goto fail;
    if (lrmoe_import_run(&in, &o, write_one, w) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        lrmoe_writer_abort(w);
        goto out;
    }
    if (lrmoe_writer_close(w) < 0) goto fail;
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
    goto out;
usage_err:
    fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
    rc = 2;
out:
    lrmoe_import_inputs_free(&in);
    lrmoe_import_opts_free(&o);
    return rc;
}
