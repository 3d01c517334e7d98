/* SwiGLU elementwise references (see swiglu.h). */
#include <math.h>
#include "swiglu.h"

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void lrmoe_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u,
                      float *phi, float *sqnorm)
{
    for (int64_t i = 0; i < n; i++) {
        const float *gi = g + i * F, *ui = u + i * F;
        float *pi = phi + i * F;
        double s = 0;
        for (int64_t j = 0; j < F; j++) {
            float v = gi[j] * sigmoidf_(gi[j]) * ui[j];
            pi[j] = v;
            s += (double)v * v;
        }
        if (sqnorm) sqnorm[i] = (float)s;
    }
}

void lrmoe_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u,
                      const float *dphi, float *dg, float *du, float *phi)
{
    int64_t m = n * F;
    for (int64_t j = 0; j < m; j++) {
        float sg = sigmoidf_(g[j]);
        float si = g[j] * sg;
        du[j] = dphi[j] * si;
        dg[j] = dphi[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
        if (phi) phi[j] = si * u[j];
    }
}

void lrmoe_swiglu_fwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, float *phi, int64_t ldp, float *sqnorm)
{
    for (int64_t i = 0; i < n; i++) {
        const float *gi = g + i * ldi, *ui = u + i * ldi;
        float *pi = phi + i * ldp;
        double s = 0;
        for (int64_t j = 0; j < F; j++) {
            float v = gi[j] * sigmoidf_(gi[j]) * ui[j];
            pi[j] = v;
            s += (double)v * v;
        }
        if (sqnorm) sqnorm[i] = (float)s;
    }
}

void lrmoe_swiglu_bwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, const float *dphi, float *dg, float *du,
                         int64_t ldo, float *phi)
{
    for (int64_t i = 0; i < n; i++) {
        const float *gi = g + i * ldi, *ui = u + i * ldi, *di = dphi + i * F;
        float *dgi = dg + i * ldo, *dui = du + i * ldo, *pi = phi ? phi + i * F : NULL;
        for (int64_t j = 0; j < F; j++) {
            float sg = sigmoidf_(gi[j]);
            float si = gi[j] * sg;
            dui[j] = di[j] * si;
            dgi[j] = di[j] * ui[j] * sg * (1.0f + gi[j] * (1.0f - sg));
            if (pi) pi[j] = si * ui[j];
        }
    }
}
