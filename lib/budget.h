/* budget: the per-layer memory budget of lrmoe-plan -M from a model config.
 *
 * lrmoe-plan's -M (--hbm) is the memory one MoE layer's replicas, forward
 * rows, saved pre-activations and backward buffers may use on one GPU. This
 * module derives it: from a model (a Hugging Face config.json or a preset),
 * the parallel sizes, dtypes, sequence length and micro-batch, it charges
 * the static memory (weights, gradients, optimizer state), the activations
 * of everything but the routed experts, the logits and a reserve, and
 * divides what is left by the number of MoE layers whose saved expert state
 * is alive at once. lrmoe-budget(1) writes the formula down term by term.
 *
 * The library never prints; errors return <0 with lrmoe_errmsg() set.
 * Since API 2 (0.7.0) the model, options and breakdown structs are the
 * library's own (lib/budget_internal.h): a caller holds a handle.
 */
#ifndef LRMOE_BUDGET_H
#define LRMOE_BUDGET_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>

/* The budget behind an opaque handle (lib/api_budget.c), with options set
 * by lrmoe-budget(1)'s long names, so no caller depends on a struct's
 * layout:
 *   model (one of; each replaces the others): "preset" NAME, "config" a
 *     config.json path, "config-json" its text;
 *   "gpu-mem", "reserve" BYTES (lrmoe(7); "80G");
 *   "tp", "pp", "dp", "ep", "seq", "micro-batch" N; "checkpoint" full|none;
 *   "zero1" (a flag: NULL, or "1"/"0"); "dtype", "grad-dtype" bf16|f16|f32;
 *   "optim-bytes" N;
 * and, for a caller that counts on a live model (lrmoe.torch.budget), not
 * options of the tool: "param-bytes", "grad-bytes", "act-bytes" N, and
 * "expert-params" (of ONE MoE layer), "dense-params" (every other
 * parameter) overriding the model's counts (set after the model).
 * set: 0, or -1 (an unknown name is named with the list; a bad value or a
 * model that does not parse, with why). run: the breakdown (0; a budget
 * that does not fit is not an error: the key "fits" is 0), or -1 when no
 * model or no gpu-mem was set or a size is bad. */
typedef struct lrmoe_budget_cfg lrmoe_budget_cfg_t;
lrmoe_budget_cfg_t *lrmoe_budget_cfg_new(void);
void lrmoe_budget_cfg_free(lrmoe_budget_cfg_t *b);
int lrmoe_budget_cfg_set(lrmoe_budget_cfg_t *b, const char *name, const char *value);
int lrmoe_budget_cfg_run(lrmoe_budget_cfg_t *b);
/* After a run, row i of the breakdown: its key (lrmoe-budget --tsv's
 * column after "model": layers, ..., hbm_bytes, resident_bytes, fits) with
 * its value; NULL past the last row. */
const char *lrmoe_budget_cfg_row(const lrmoe_budget_cfg_t *b, int i, int64_t *value);
/* One value by key: any row key (after a run), the model's (once one is
 * set: "hidden", "vocab", "heads", "experts", "topk", "expert_ffn",
 * "tied", "expert_params", "dense_params") or an option's ("tp", "pp",
 * "dp", "ep", "seq", "micro_batch", "checkpoint" (1 full), "zero1",
 * "param_bytes", "grad_bytes", "optim_bytes_per_param", "act_bytes", "gpu_mem",
 * "reserve"). 0, or -1 for an unknown key or a row before a run. */
int lrmoe_budget_cfg_get(const lrmoe_budget_cfg_t *b, const char *key, int64_t *value);
/* The model's family (its model_type), "" before a model is set. */
const char *lrmoe_budget_cfg_family(const lrmoe_budget_cfg_t *b);
/* The i-th preset name, NULL past the end. */
const char *lrmoe_budget_preset_name(int i);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
