/* api_abi: the library version and the sizes of the public structs, for
 * bindings that mirror them (see api.h, lrmoe(3) ABI). */
#include <string.h>

#include "api.h"
#include "cost.h"
#include "exec.h"
#include "pack.h"
#include "route.h"
#include "score.h"

#define LRMOE_STR_(x) #x
#define LRMOE_STR(x) LRMOE_STR_(x)
_Static_assert(sizeof LRMOE_VERSION == sizeof(LRMOE_STR(LRMOE_VERSION_MAJOR) "."
                                              LRMOE_STR(LRMOE_VERSION_MINOR) "."
                                              LRMOE_STR(LRMOE_VERSION_PATCH)),
               "LRMOE_VERSION and its numbers disagree (lrmoe.h)");

const char *lrmoe_version(void)
{
    return LRMOE_VERSION;
}

int lrmoe_version_number(void)
{
    /* the string and the numbers are one version (lib.bats compares them) */
    return LRMOE_VERSION_NUMBER;
}

#define SIZE(T) {#T, sizeof(T)}
static const struct {
    const char *name;
    size_t size;
} sizes[] = {
    SIZE(lrmoe_tensor_t), SIZE(lrmoe_frame_t), SIZE(lrmoe_wopts_t),
    SIZE(lrmoe_route_opts_t), SIZE(lrmoe_score_opts_t), SIZE(lrmoe_score_stats_t),
    SIZE(lrmoe_pack_opts_t), SIZE(lrmoe_pack_in_t), SIZE(lrmoe_pack_plan_t),
    SIZE(lrmoe_exec_dims_t), SIZE(lrmoe_exec_cfg_t),
    SIZE(lrmoe_exec_weights_t), SIZE(lrmoe_exec_plan_t), SIZE(lrmoe_exec_fwd_t),
    SIZE(lrmoe_exec_bwd_t), SIZE(lrmoe_cost_model_t), SIZE(lrmoe_cost_summary_t),
    SIZE(lrmoe_fidelity_t),
};

size_t lrmoe_abi_sizeof(const char *type)
{
    for (size_t i = 0; type && i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(sizes[i].name, type))
            return sizes[i].size;
    return 0;
}
