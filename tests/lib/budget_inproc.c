/* lrmoe_budget_cfg_t (budget.h) from a C program built against the staged
 * tree: argv[1..] are NAME=VALUE (or NAME for a flag) set in order, then the
 * rows are printed as lrmoe-budget --tsv prints them (without the model
 * column); "errors" instead runs the misuse cases and prints each error. */
#include <stdio.h>
#include <string.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/budget.h>

/* the call first, then its error (printf's arguments have no order) */
static void show(const char *what, int rc)
{
    printf("%s: %d %s\n", what, rc, lrmoe_errmsg());
}

static void misuse(void)
{
    lrmoe_budget_cfg_t *b = lrmoe_budget_cfg_new();
    int64_t v;
    show("run", lrmoe_budget_cfg_run(b));
    show("unknown", lrmoe_budget_cfg_set(b, "gpu_mem", "80G"));
    show("params", lrmoe_budget_cfg_set(b, "expert-params", "5"));
    show("hidden", lrmoe_budget_cfg_get(b, "hidden", &v));
    show("preset", lrmoe_budget_cfg_set(b, "preset", "nope"));
    show("tp", lrmoe_budget_cfg_set(b, "tp", "0"));
    lrmoe_budget_cfg_set(b, "preset", "qwen3-30b-a3b");
    show("mem", lrmoe_budget_cfg_run(b));
    printf("row: %s\n", lrmoe_budget_cfg_row(b, 0, &v) ? "a row" : "none before a run");
    show("fits", lrmoe_budget_cfg_get(b, "fits", &v));
    lrmoe_budget_cfg_set(b, "gpu-mem", "80G");
    lrmoe_budget_cfg_set(b, "ep", "3"); /* does not divide E = 128 */
    show("ep", lrmoe_budget_cfg_run(b));
    lrmoe_budget_cfg_free(b);
    lrmoe_budget_cfg_free(NULL);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "errors")) {
        misuse();
        return 0;
    }
    lrmoe_budget_cfg_t *b = lrmoe_budget_cfg_new();
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *eq = strchr(argv[i], '=');
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - argv[i]) : (int)strlen(argv[i]),
                 argv[i]);
        if (lrmoe_budget_cfg_set(b, name, eq ? eq + 1 : NULL) < 0) {
            fprintf(stderr, "budget: %s\n", lrmoe_errmsg());
            return 1;
        }
    }
    if (lrmoe_budget_cfg_run(b) < 0) {
        fprintf(stderr, "budget: %s\n", lrmoe_errmsg());
        return 1;
    }
    int64_t v;
    const char *k;
    for (int i = 0; (k = lrmoe_budget_cfg_row(b, i, NULL)); i++)
        printf("%s%s", i ? "\t" : "", k);
    printf("\n");
    for (int i = 0; lrmoe_budget_cfg_row(b, i, &v); i++)
        printf("%s%lld", i ? "\t" : "", (long long)v);
    printf("\n");
    lrmoe_budget_cfg_free(b);
    return 0;
}
