/* lrmoe-budget: the per-layer memory budget (lrmoe-plan -M) of a model on a
 * GPU, with its breakdown (budget.h, lrmoe-budget(1)). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "cost.h"
#include "lrmoe.h"
#include "tools.h"

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

enum { OPT_PRESET = 0x100, OPT_CONFIG, OPT_LIST, OPT_SET, OPT_TSV, OPT_JSON };

/* the table's rows, by the library's row keys (lrmoe_budget_cfg_row) */
static const struct {
    const char *key;
    const char *label; /* NULL: printed in parentheses on the row before */
    int bytes;         /* 1: a size (the table adds GiB) */
} LABELS[] = {
    {"layers", "layers (MoE)", 0},
    {"moe_layers", NULL, 0},
    {"params_total", "parameters of the model", 0},
    {"params_experts_total", "  routed experts", 0},
    {"params_other_total", "  other", 0},
    {"stage_layers", "layers on a stage (MoE)", 0},
    {"stage_moe_layers", NULL, 0},
    {"inflight", "micro-batches in flight", 0},
    {"edp", "expert data-parallel size", 0},
    {"params_other", "parameters per GPU: other", 0},
    {"params_experts", "parameters per GPU: experts", 0},
    {"gpu_mem_bytes", "GPU memory", 1},
    {"reserve_bytes", "- reserve", 1},
    {"weights_bytes", "- weights", 1},
    {"grads_bytes", "- gradients", 1},
    {"optim_bytes", "- optimizer state", 1},
    {"act_stored_bytes", "- activations kept", 1},
    {"act_working_bytes", "- layer recomputed", 1},
    {"logits_bytes", "- logits (FP32)", 1},
    {"free_bytes", "= free for MoE state", 1},
    {"alive", "MoE layers alive at once", 0},
    {"hbm_bytes", "per-layer budget -M", 1},
    {"resident_bytes", "--resident", 1},
    {"fits", NULL, 0},
};
#define NLABELS ((int)(sizeof LABELS / sizeof LABELS[0]))

static int64_t get(const lrmoe_budget_cfg_t *b, const char *key)
{
    int64_t v = 0;
    lrmoe_budget_cfg_get(b, key, &v);
    return v;
}

static void print_tsv(const lrmoe_budget_cfg_t *b)
{
    int64_t v;
    printf("model");
    for (int i = 0; lrmoe_budget_cfg_row(b, i, NULL); i++)
        printf("\t%s", lrmoe_budget_cfg_row(b, i, NULL));
    printf("\nmodel");
    for (int i = 0; lrmoe_budget_cfg_row(b, i, &v); i++)
        printf("\t%lld", (long long)v);
    printf("\n");
}

static void print_json(const lrmoe_budget_cfg_t *b, const char *preset)
{
    int64_t v;
    const char *k;
    printf("{\"model\": \"%s\", \"family\": \"%s\"", preset ? preset : "config",
           lrmoe_budget_cfg_family(b));
    for (int i = 0; (k = lrmoe_budget_cfg_row(b, i, &v)); i++)
        printf(", \"%s\": %lld", k, (long long)v);
    printf("}\n");
}

static void print_table(const lrmoe_budget_cfg_t *b, const char *name)
{
    printf("%s (%s): %lld layers, %lld MoE; D %lld, E %lld, top-%lld, F %lld, V %lld\n", name,
           lrmoe_budget_cfg_family(b), (long long)get(b, "layers"),
           (long long)get(b, "moe_layers"), (long long)get(b, "hidden"),
           (long long)get(b, "experts"), (long long)get(b, "topk"),
           (long long)get(b, "expert_ffn"), (long long)get(b, "vocab"));
    printf("tp %lld, pp %lld, dp %lld, ep %lld; S %lld, micro-batch %lld; checkpoint %s; "
           "zero1 %s; bytes/param %lld + grad %lld + optimizer %lld; act %lld\n",
           (long long)get(b, "tp"), (long long)get(b, "pp"), (long long)get(b, "dp"),
           (long long)get(b, "ep"), (long long)get(b, "seq"), (long long)get(b, "micro_batch"),
           get(b, "checkpoint") ? "full" : "none", get(b, "zero1") ? "on" : "off",
           (long long)get(b, "param_bytes"), (long long)get(b, "grad_bytes"),
           (long long)get(b, "optim_bytes_per_param"), (long long)get(b, "act_bytes"));
    for (int i = 0; i < NLABELS; i++) {
        int64_t v = get(b, LABELS[i].key);
        if (!LABELS[i].label)
            continue;
        if (LABELS[i].bytes)
            printf("%-30s %18lld B %12.3f GiB\n", LABELS[i].label, (long long)v,
                   (double)v / (1024.0 * 1024.0 * 1024.0));
        else if (i + 1 < NLABELS && !LABELS[i + 1].label)
            printf("%-30s %18lld (%lld)\n", LABELS[i].label, (long long)v,
                   (long long)get(b, LABELS[i + 1].key));
        else
            printf("%-30s %18lld\n", LABELS[i].label, (long long)v);
    }
}

/* The model, then the breakdown, printed: the exit status. */
static int run(lrmoe_budget_cfg_t *b, const char *preset, const char *config, int tsv, int json)
{
    if (lrmoe_budget_cfg_set(b, preset ? "preset" : "config", preset ? preset : config) < 0 ||
        lrmoe_budget_cfg_run(b) < 0)
        return lrmoe_tool_fail(prog, 1);
    if (tsv)
        print_tsv(b);
    else if (json)
        print_json(b, preset);
    else
        print_table(b, preset ? preset : config);
    char s1[32], s2[32], s3[32];
    const int64_t gpu = get(b, "gpu_mem"), free_b = get(b, "free_bytes");
    if (!get(b, "fits")) {
        fprintf(stderr, "%s: does not fit: %s short of the %s GPU (%s used before any MoE "
                "layer state)\n", prog, lrmoe_cost_fmt_bytes((double)-free_b, s1, sizeof s1),
                lrmoe_cost_fmt_bytes((double)gpu, s2, sizeof s2),
                lrmoe_cost_fmt_bytes((double)(gpu - free_b), s3, sizeof s3));
        fclose(stdout);
        return 1;
    }
    if (!tsv && !json)
        printf("lrmoe-plan -M %lld  (= --gpu-mem %lld --resident %lld)\n",
               (long long)get(b, "hbm_bytes"), (long long)gpu,
               (long long)get(b, "resident_bytes"));
    if (fclose(stdout)) {
        fprintf(stderr, "%s: standard output: write error\n", prog);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"preset", required_argument, 0, OPT_PRESET},
        {"config", required_argument, 0, OPT_CONFIG},
        {"list-presets", no_argument, 0, OPT_LIST},
        {"gpu-mem", required_argument, 0, OPT_SET},
        {"reserve", required_argument, 0, OPT_SET},
        {"tp", required_argument, 0, OPT_SET},
        {"pp", required_argument, 0, OPT_SET},
        {"dp", required_argument, 0, OPT_SET},
        {"ep", required_argument, 0, OPT_SET},
        {"seq", required_argument, 0, OPT_SET},
        {"micro-batch", required_argument, 0, OPT_SET},
        {"checkpoint", required_argument, 0, OPT_SET},
        {"zero1", no_argument, 0, OPT_SET},
        {"dtype", required_argument, 0, OPT_SET},
        {"grad-dtype", required_argument, 0, OPT_SET},
        {"optim-bytes", required_argument, 0, OPT_SET},
        {"tsv", no_argument, 0, OPT_TSV},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    const char *preset = NULL, *config = NULL;
    int c, li, tsv = 0, json = 0, have_mem = 0;
    lrmoe_budget_cfg_t *b = lrmoe_budget_cfg_new();
    if (!b)
        return lrmoe_tool_fail(prog, 1);
    while ((c = getopt_long(argc, argv, "hV", lopts, &li)) != -1) {
        switch (c) {
        case OPT_PRESET: preset = optarg; break;
        case OPT_CONFIG: config = optarg; break;
        case OPT_LIST:
            for (int i = 0; lrmoe_budget_preset_name(i); i++)
                printf("%s\n", lrmoe_budget_preset_name(i));
            lrmoe_budget_cfg_free(b);
            return fclose(stdout) ? 1 : 0;
        case OPT_SET:
            /* every other option is the library's by its long name */
            if (lrmoe_budget_cfg_set(b, lopts[li].name, optarg) < 0) {
                lrmoe_budget_cfg_free(b);
                return lrmoe_tool_fail(prog, 2);
            }
            have_mem |= !strcmp(lopts[li].name, "gpu-mem");
            break;
        case OPT_TSV: tsv = 1; break;
        case OPT_JSON: json = 1; break;
        case 'h': usage(stdout); lrmoe_budget_cfg_free(b); return 0;
        case 'V':
            printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION);
            lrmoe_budget_cfg_free(b);
            return 0;
        default: lrmoe_budget_cfg_free(b); return lrmoe_usage_error(prog);
        }
    }
    const char *why = optind < argc ? "unexpected argument"
                      : !preset == !config ? "give one of --preset NAME and --config FILE"
                      : !have_mem || get(b, "gpu_mem") < 1
                          ? "--gpu-mem: the memory of one GPU is required (e.g. 80G)"
                      : tsv && json ? "--tsv and --json exclude each other" : NULL;
    if (why) {
        if (optind < argc)
            fprintf(stderr, "%s: %s '%s'\n", prog, why, argv[optind]);
        else
            fprintf(stderr, "%s: %s\n", prog, why);
        lrmoe_budget_cfg_free(b);
        return 2;
    }
    int rc = run(b, preset, config, tsv, json);
    lrmoe_budget_cfg_free(b);
    return rc;
}
