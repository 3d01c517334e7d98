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
