/* lrmoe-budget: the per-layer memory budget (lrmoe-plan -M) of a model on a
 * GPU, with its breakdown (budget.h, lrmoe-budget(1)). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "cost.h"
#include "lrmoe.h"
#include "parse.h"

static const char *prog = "lrmoe-budget";

static void usage(FILE *fp)
{
    fprintf(fp,
            "Usage: %s (--preset NAME | --config FILE) --gpu-mem BYTES [options]\n"
            "The per-layer memory budget of lrmoe-plan -M (--hbm) for one MoE layer's\n"
            "replicas, token buffers and saved state: what one GPU has left after the\n"
            "weights, gradients, optimizer state, the other activations, the logits and\n"
            "a reserve, divided by the MoE layers whose saved state is alive at once.\n"
            "Prints the breakdown and the -M and --resident values (lrmoe-budget(1)).\n"
            "\n"
            "Model:\n"
            "      --preset NAME       a built-in model (--list-presets)\n"
            "      --config FILE       a Hugging Face config.json (qwen3_moe, qwen2_moe,\n"
            "                          mixtral, deepseek_v2, deepseek_v3)\n"
            "      --list-presets      list the presets and exit\n"
            "Cluster and run:\n"
            "      --gpu-mem BYTES     memory of one GPU (required; 80G)\n"
            "      --reserve BYTES     kept back for the CUDA context, allocator and\n"
            "                          NCCL (default 0; printed as a term)\n"
            "      --tp N              tensor-parallel size (default 1)\n"
            "      --pp N              pipeline-parallel size (default 1)\n"
            "      --dp N              data-parallel size (default 1)\n"
            "      --ep N              expert-parallel size (default 1; divides E and dp*tp)\n"
            "      --seq S             tokens per sequence (default 4096)\n"
            "      --micro-batch B     sequences per micro-batch (default 1)\n"
            "      --checkpoint MODE   activation checkpointing: full (default) or none\n"
            "      --zero1             shard the optimizer state (distributed optimizer)\n"
            "      --dtype DT          parameters and activations: bf16 (default), f16, f32\n"
            "      --grad-dtype DT     gradients: f32 (default), bf16, f16\n"
            "      --optim-bytes N     optimizer state per parameter (default 12: FP32\n"
            "                          master weights and Adam's two moments)\n"
            "Output (standard output):\n"
            "      --tsv               one header line and one row of named columns\n"
            "      --json              one JSON object\n"
            "  -h, --help              show this help\n"
            "  -V, --version           show the version\n"
            "Exit status: 0, 1 when the model does not fit (the table says by how\n"
            "much) or the config is bad, 2 on a usage error.\n",
            prog);
}

enum {
    OPT_PRESET = 0x100, OPT_CONFIG, OPT_LIST, OPT_GPU_MEM, OPT_RESERVE, OPT_TP, OPT_PP,
    OPT_DP, OPT_EP, OPT_SEQ, OPT_MB, OPT_CKPT, OPT_ZERO1, OPT_DTYPE, OPT_GDTYPE, OPT_OPTIM,
    OPT_TSV, OPT_JSON
};

typedef struct {
    const char *key;  /* TSV column / JSON key */
    const char *label; /* table row */
    int64_t v;
    int bytes;        /* 1: a size (the table adds GiB) */
} row_t;

static int dtype_bytes(const char *opt, const char *s, int64_t *out)
{
    lrmoe_dtype_t d;
    if (lrmoe_dtype_parse(s, &d) < 0 || !(d == LRMOE_BF16 || d == LRMOE_F16 || d == LRMOE_F32)) {
        fprintf(stderr, "%s: %s: '%s' is not bf16, f16 or f32\n", prog, opt, s);
        return -1;
    }
    *out = (int64_t)lrmoe_dtype_size(d);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"preset", required_argument, 0, OPT_PRESET},
        {"config", required_argument, 0, OPT_CONFIG},
        {"list-presets", no_argument, 0, OPT_LIST},
        {"gpu-mem", required_argument, 0, OPT_GPU_MEM},
        {"reserve", required_argument, 0, OPT_RESERVE},
        {"tp", required_argument, 0, OPT_TP},
        {"pp", required_argument, 0, OPT_PP},
        {"dp", required_argument, 0, OPT_DP},
        {"ep", required_argument, 0, OPT_EP},
        {"seq", required_argument, 0, OPT_SEQ},
        {"micro-batch", required_argument, 0, OPT_MB},
        {"checkpoint", required_argument, 0, OPT_CKPT},
        {"zero1", no_argument, 0, OPT_ZERO1},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"grad-dtype", required_argument, 0, OPT_GDTYPE},
        {"optim-bytes", required_argument, 0, OPT_OPTIM},
        {"tsv", no_argument, 0, OPT_TSV},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_budget_opts_t o;
    lrmoe_budget_opts_default(&o);
    const char *preset = NULL, *config = NULL;
    int c, tsv = 0, json = 0, have_mem = 0;
    double d;
    while ((c = getopt_long(argc, argv, "hV", lopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case OPT_PRESET: preset = optarg; break;
        case OPT_CONFIG: config = optarg; break;
        case OPT_LIST:
            for (int i = 0; lrmoe_budget_preset_name(i); i++)
                printf("%s\n", lrmoe_budget_preset_name(i));
            return fclose(stdout) ? 1 : 0;
        case OPT_GPU_MEM:
            bad = lrmoe_parse_bytes("--gpu-mem", optarg, &d) < 0;
            o.gpu_mem = (int64_t)d;
            have_mem = 1;
            break;
        case OPT_RESERVE:
            bad = lrmoe_parse_bytes("--reserve", optarg, &d) < 0;
            o.reserve = (int64_t)d;
            break;
        case OPT_TP: bad = lrmoe_parse_i64("--tp", optarg, 1, 1 << 20, &o.tp) < 0; break;
        case OPT_PP: bad = lrmoe_parse_i64("--pp", optarg, 1, 1 << 20, &o.pp) < 0; break;
        case OPT_DP: bad = lrmoe_parse_i64("--dp", optarg, 1, 1 << 24, &o.dp) < 0; break;
        case OPT_EP: bad = lrmoe_parse_i64("--ep", optarg, 1, 1 << 20, &o.ep) < 0; break;
        case OPT_SEQ:
            bad = lrmoe_parse_i64("--seq", optarg, 1, (int64_t)1 << 32, &o.seq) < 0;
            break;
        case OPT_MB:
            bad = lrmoe_parse_i64("--micro-batch", optarg, 1, 1 << 20, &o.micro_batch) < 0;
            break;
        case OPT_CKPT:
            if (!strcmp(optarg, "full"))
                o.checkpoint = LRMOE_BUDGET_CKPT_FULL;
            else if (!strcmp(optarg, "none"))
                o.checkpoint = LRMOE_BUDGET_CKPT_NONE;
            else {
                fprintf(stderr, "%s: --checkpoint: '%s' is not full or none\n", prog, optarg);
                return 2;
            }
            break;
        case OPT_ZERO1: o.zero1 = 1; break;
        case OPT_DTYPE:
            if (dtype_bytes("--dtype", optarg, &o.param_bytes) < 0)
                return 2;
            o.act_bytes = o.param_bytes;
            break;
        case OPT_GDTYPE:
            if (dtype_bytes("--grad-dtype", optarg, &o.grad_bytes) < 0)
                return 2;
            break;
        case OPT_OPTIM:
            bad = lrmoe_parse_i64("--optim-bytes", optarg, 0, 1024, &o.optim_bytes) < 0;
            break;
        case OPT_TSV: tsv = 1; break;
        case OPT_JSON: json = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return 2;
    }
    if (!preset == !config) {
        fprintf(stderr, "%s: give one of --preset NAME and --config FILE\n", prog);
        return 2;
    }
    if (!have_mem || o.gpu_mem < 1) {
        fprintf(stderr, "%s: --gpu-mem: the memory of one GPU is required (e.g. 80G)\n", prog);
        return 2;
    }
    if (tsv && json) {
        fprintf(stderr, "%s: --tsv and --json exclude each other\n", prog);
        return 2;
    }
    lrmoe_budget_model_t m;
    int rc = preset ? lrmoe_budget_model_preset(preset, &m, NULL)
                    : lrmoe_budget_model_file(config, &m);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 1;
    }
    lrmoe_budget_t b;
    if (lrmoe_budget_compute(&m, &o, &b) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 1;
    }
    const int64_t expert_total = m.expert_params * m.moe_layers;
    const row_t rows[] = {
        {"layers", "layers (MoE)", m.layers, 0},
        {"moe_layers", NULL, m.moe_layers, 0},
        {"params_total", "parameters of the model", m.dense_params + expert_total, 0},
        {"params_experts_total", "  routed experts", expert_total, 0},
        {"params_other_total", "  other", m.dense_params, 0},
        {"stage_layers", "layers on a stage (MoE)", b.stage_layers, 0},
        {"stage_moe_layers", NULL, b.stage_moe_layers, 0},
        {"inflight", "micro-batches in flight", b.inflight, 0},
        {"edp", "expert data-parallel size", b.edp, 0},
        {"params_other", "parameters per GPU: other", b.params_dense, 0},
        {"params_experts", "parameters per GPU: experts", b.params_expert, 0},
        {"gpu_mem_bytes", "GPU memory", o.gpu_mem, 1},
        {"reserve_bytes", "- reserve", b.reserve, 1},
        {"weights_bytes", "- weights", b.weights, 1},
        {"grads_bytes", "- gradients", b.grads, 1},
        {"optim_bytes", "- optimizer state", b.optim, 1},
        {"act_stored_bytes", "- activations kept", b.act_stored, 1},
        {"act_working_bytes", "- layer recomputed", b.act_working, 1},
        {"logits_bytes", "- logits (FP32)", b.logits, 1},
        {"free_bytes", "= free for MoE state", b.free_bytes, 1},
        {"alive", "MoE layers alive at once", b.alive, 0},
        {"hbm_bytes", "per-layer budget -M", b.hbm, 1},
        {"resident_bytes", "--resident", b.resident, 1},
        {"fits", NULL, b.fits, 0},
    };
    const int nrows = (int)(sizeof rows / sizeof rows[0]);
    const char *name = preset ? preset : config;
    if (tsv) {
        printf("model");
        for (int i = 0; i < nrows; i++)
            printf("\t%s", rows[i].key);
        printf("\nmodel");
        for (int i = 0; i < nrows; i++)
            printf("\t%lld", (long long)rows[i].v);
        printf("\n");
    } else if (json) {
        printf("{\"model\": \"%s\", \"family\": \"%s\"", preset ? preset : "config", m.family);
        for (int i = 0; i < nrows; i++)
            printf(", \"%s\": %lld", rows[i].key, (long long)rows[i].v);
        printf("}\n");
    } else {
        printf("%s (%s): %lld layers, %lld MoE; D %lld, E %lld, top-%lld, F %lld, V %lld\n",
               name, m.family, (long long)m.layers, (long long)m.moe_layers,
               (long long)m.hidden, (long long)m.experts, (long long)m.topk,
               (long long)m.expert_ffn, (long long)m.vocab);
        printf("tp %lld, pp %lld, dp %lld, ep %lld; S %lld, micro-batch %lld; checkpoint %s; "
               "zero1 %s; bytes/param %lld + grad %lld + optimizer %lld; act %lld\n",
               (long long)o.tp, (long long)o.pp, (long long)o.dp, (long long)o.ep,
               (long long)o.seq, (long long)o.micro_batch,
               o.checkpoint == LRMOE_BUDGET_CKPT_FULL ? "full" : "none", o.zero1 ? "on" : "off",
               (long long)o.param_bytes, (long long)o.grad_bytes, (long long)o.optim_bytes,
               (long long)o.act_bytes);
        for (int i = 0; i < nrows; i++) {
            if (!rows[i].label)
                continue;
            if (rows[i].bytes)
                printf("%-30s %18lld B %12.3f GiB\n", rows[i].label, (long long)rows[i].v,
                       (double)rows[i].v / (1024.0 * 1024.0 * 1024.0));
            else if (i + 1 < nrows && !rows[i + 1].label)
                printf("%-30s %18lld (%lld)\n", rows[i].label, (long long)rows[i].v,
                       (long long)rows[i + 1].v);
            else
                printf("%-30s %18lld\n", rows[i].label, (long long)rows[i].v);
        }
    }
    char s1[32], s2[32], s3[32];
    if (!b.fits) {
        fprintf(stderr, "%s: does not fit: %s short of the %s GPU (%s used before any MoE "
                "layer state)\n", prog, lrmoe_cost_fmt_bytes((double)-b.free_bytes, s1, sizeof s1),
                lrmoe_cost_fmt_bytes((double)o.gpu_mem, s2, sizeof s2),
                lrmoe_cost_fmt_bytes((double)(o.gpu_mem - b.free_bytes), s3, sizeof s3));
        fclose(stdout);
        return 1;
    }
    if (!tsv && !json)
        printf("lrmoe-plan -M %lld  (= --gpu-mem %lld --resident %lld)\n", (long long)b.hbm,
               (long long)o.gpu_mem, (long long)b.resident);
    if (fclose(stdout)) {
        fprintf(stderr, "%s: standard output: write error\n", prog);
        return 1;
    }
    return 0;
}
