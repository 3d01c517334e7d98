/* lrmoe_cost_cfg_t (cost.h) against lrmoe_cost_eval on the same plan: every
 * summary value by name must equal the struct's; then the misuse cases,
 * each printed with its error. Built against the staged tree. */
#include <stdio.h>
#include <string.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/cost.h>

enum { E = 8, P = 4 };

static void show(const char *what, int rc)
{
    printf("%s: %d %s\n", what, rc, lrmoe_errmsg());
}

int main(void)
{
    uint8_t pl[E * P] = {0};
    int64_t load[E], fwd[E * P] = {0}, quota[E], bwd[E * P] = {0};
    for (int e = 0; e < E; e++) {
        int n = e * P / E;
        load[e] = 100 + 37 * e % 90;
        quota[e] = load[e] * 3 / 4;
        pl[e * P + n] = 1;
        fwd[e * P + n] = load[e];
        bwd[e * P + n] = quota[e];
    }
    pl[0 * P + 3] = 1, fwd[0 * P + 3] = load[0] / 2, fwd[0 * P + 0] -= load[0] / 2;
    lrmoe_cost_model_t m;
    lrmoe_cost_default(&m);
    m.D = 1024, m.F = 512, m.K = 4, m.tokens = 256, m.hbm = 1e9, m.keep_by_rank = 1;
    lrmoe_cost_summary_t s;
    if (lrmoe_cost_eval(&m, E, P, pl, load, fwd, quota, bwd, NULL, &s) < 0) return 1;
    lrmoe_cost_cfg_t *c = lrmoe_cost_cfg_new();
    int rc = lrmoe_cost_cfg_set(c, "D", 1024) | lrmoe_cost_cfg_set(c, "F", 512) |
             lrmoe_cost_cfg_set(c, "K", 4) | lrmoe_cost_cfg_set(c, "tokens", 256) |
             lrmoe_cost_cfg_set(c, "hbm", 1e9) | lrmoe_cost_cfg_set(c, "keep_by_rank", 1);
    double v;
    show("before eval", lrmoe_cost_cfg_get(c, "t_total", &v));
    if (rc || lrmoe_cost_cfg_eval(c, E, P, pl, load, fwd, quota, bwd) < 0) return 1;
    const struct { const char *n; double want; } sum[] = {
        {"mem_peak", s.mem_peak}, {"mem_peak_rank", s.mem_peak_rank},
        {"t_dispatch", s.t_dispatch}, {"t_combine", s.t_combine},
        {"t_bwd_dispatch", s.t_bwd_dispatch}, {"t_bwd_combine", s.t_bwd_combine},
        {"t_weights", s.t_weights}, {"t_comm", s.t_comm}, {"t_fwd_compute", s.t_fwd_compute},
        {"t_bwd_compute", s.t_bwd_compute}, {"t_total", s.t_total},
        {"bytes_total", s.bytes_total}, {"D", 1024}, {"keep_by_rank", 1}};
    int same = 1;
    for (size_t i = 0; i < sizeof sum / sizeof sum[0]; i++)
        if (lrmoe_cost_cfg_get(c, sum[i].n, &v) < 0 || memcmp(&v, &sum[i].want, sizeof v)) {
            printf("%s differs\n", sum[i].n);
            same = 0;
        }
    if (same) printf("same summary\n");
    show("unknown", lrmoe_cost_cfg_set(c, "tokenz", 1));
    show("fraction", lrmoe_cost_cfg_set(c, "K", 2.5));
    show("negative", lrmoe_cost_cfg_set(c, "tokens", -1));
    show("get", lrmoe_cost_cfg_get(c, "nope", &v));
    lrmoe_cost_cfg_free(c);
    lrmoe_cost_cfg_free(NULL);
    return !same;
}
