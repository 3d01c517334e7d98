/* The variants of the CUTLASS grouped GEMM (ggemm_sm90.h): one per
 * (ta, tb, c_bf16). */
#ifndef LRMOE_GGEMM_VARIANT_H
#define LRMOE_GGEMM_VARIANT_H
#define KCU_GG_VARIANT(ta, tb, cbf) ((ta) * 4 + (tb) * 2 + (cbf))
#define KCU_GG_NVARIANTS 8
#endif
