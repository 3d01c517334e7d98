/* SwiGLU elementwise references (CPU). The CUDA kernels in kernels/ mirror
 * these signatures and are tested against them.
 *
 *   silu(g) = g * sigmoid(g),   phi = silu(g) * u
 *   d phi / d u = silu(g)
 *   d phi / d g = u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
 */
#ifndef LRMOE_SWIGLU_H
#define LRMOE_SWIGLU_H

#include <stddef.h>
#include <stdint.h>

/* phi = silu(g) * u for n rows of F; g, u, phi are (n,F).
 * sqnorm: NULL or (n), ||phi_row||^2 accumulated in double, stored as float. */
void lrmoe_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u,
                      float *phi, float *sqnorm);

/* Backward for n rows of F: from dphi (n,F) and the saved g, u (n,F):
 *   dg = dphi * u * silu'(g), du = dphi * silu(g),
 * phi (optional, NULL to skip) = silu(g) * u recomputed (for dW_down).
 * All buffers are distinct (no aliasing). */
void lrmoe_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u,
                      const float *dphi, float *dg, float *du, float *phi);

/* Strided forms used by the fused gate/up GEMM (one GEMM with N = 2F writes
 * [h_g | h_u] as an (n,2F) matrix): row i of g is g + i*ldi (likewise u),
 * row i of phi is phi + i*ldp. Same math as the contiguous forms.
 * Forward: phi = silu(g) * u, sqnorm as above. */
void lrmoe_swiglu_fwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, float *phi, int64_t ldp, float *sqnorm);
/* Backward: g, u rows at stride ldi; dphi and phi (optional) at stride F;
 * dg, du rows at stride ldo (dg and du may interleave in one (n,2F) buffer). */
void lrmoe_swiglu_bwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, const float *dphi, float *dg, float *du,
                         int64_t ldo, float *phi);

/* Backward on BF16 saved state with BF16 outputs (the bf16 compute's GEMM
 * operands, made in one pass): row i of g and u at g[i], u[i] (F BF16
 * values each), dphi (n,F) F32; dg, du rows at stride ldo, phi (optional,
 * NULL to skip) (n,F), all BF16. The bits of widening g and u to F32,
 * lrmoe_swiglu_bwd, then rounding each output with lrmoe_f32_to_bf16. */
void lrmoe_swiglu_bwd_bf16_rows(int64_t n, int64_t F, const uint16_t *const *g,
                                const uint16_t *const *u, const float *dphi, uint16_t *dg,
                                uint16_t *du, int64_t ldo, uint16_t *phi);

/* 1 when the rows run the AVX-512 form (the CPU has AVX-512F, it matched
 * libm's expf in the self-check, and LRMOE_SWIGLU_VEC is not "0" in the
 * environment); 0: the scalar loop. Either way the bits are the same. */
int lrmoe_swiglu_vec(void);

#endif
