/* One CUTLASS 3.x sm90 grouped (ptr-array) GEMM, BF16 A/B, F32 accumulation,
 * C/D F32 or BF16 by GG_CBF16, A transposed by GG_TA, B by GG_TB (lrmoe's
 * row-major convention, lrmoe_gemm_t). Compiled once per variant by the
 * Makefile (-DGG_TA= -DGG_TB= -DGG_CBF16=, -gencode arch=compute_90a),
 * only when the CUTLASS headers are found (tests/gpu/cutlass-inc.sh).
 *
 * Kernel: TMA warp-specialized cooperative, 128x128x64 tiles, cluster 1x1,
 * persistent over the device's SMs; problem sizes read on the device only
 * (no host copy of them: GroupProblemShape with a null host pointer). */
#include <stdint.h>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "ggemm_sm90.h"

#if !defined(GG_TA) || !defined(GG_TB) || !defined(GG_CBF16)
#error "GG_TA, GG_TB and GG_CBF16 must be defined"
#endif

using namespace cute;

namespace {

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using ElementAB = cutlass::bfloat16_t;
using ElementC = std::conditional_t<GG_CBF16, cutlass::bfloat16_t, float>;
using Acc = float;
/* A (M,K): ta = 0 stored (M,K) row-major = CUTLASS RowMajor (K-major) */
using LayoutA = std::conditional_t<GG_TA, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
/* B (K,N): tb = 0 stored (K,N) row-major = CUTLASS RowMajor (N-major) */
using LayoutB = std::conditional_t<GG_TB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
using LayoutC = cutlass::layout::RowMajor;
constexpr int AlignAB = 8;                       /* 16 bytes */
constexpr int AlignC = 16 / sizeof(ElementC);
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, ElementC, LayoutC *, AlignC,
    ElementC, LayoutC *, AlignC, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<ElementC, Acc>>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA *, AlignAB, ElementAB,
    LayoutB *, AlignAB, Acc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                        CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideC = typename GemmKernel::InternalStrideC;
using StrideD = typename GemmKernel::InternalStrideD;
/* ggemm.cu's setup kernel writes one int64 row stride per group: each
 * stride type must be exactly one dynamic int64 (the others static) */
static_assert(sizeof(StrideA) == 8 && sizeof(StrideB) == 8 && sizeof(StrideC) == 8 &&
              sizeof(StrideD) == 8, "a CUTLASS stride is not one int64");
static_assert(sizeof(typename ProblemShape::UnderlyingProblemShape) == 3 * sizeof(int),
              "problem shape is not 3 ints");
/* what the launch asks of sm_90: dynamic shared memory within the 227 KB a
 * block may opt in to (232,448 bytes), 384 threads (two consumer warpgroups
 * and a producer) */
static_assert(GemmKernel::SharedStorageSize <= 232448, "shared storage above sm_90's 227 KB");
static_assert(GemmKernel::MaxThreadsPerBlock == 384, "not the 3-warpgroup cooperative kernel");

typename Gemm::Arguments make_args(const kcu_gg_sm90_args *x)
{
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = x->sm_count;
    typename Gemm::Arguments args;
    decltype(args.epilogue.thread) fusion;
    fusion.alpha = x->alpha;
    fusion.beta = x->beta;
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    args = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {x->ngroups, reinterpret_cast<typename ProblemShape::UnderlyingProblemShape *>(x->shapes),
         nullptr},
        {reinterpret_cast<const ElementAB **>(x->a), reinterpret_cast<StrideA *>(x->lda),
         reinterpret_cast<const ElementAB **>(x->b), reinterpret_cast<StrideB *>(x->ldb)},
        {fusion, (const ElementC **)(x->c), reinterpret_cast<StrideC *>(x->ldc),
         reinterpret_cast<ElementC **>(x->c), reinterpret_cast<StrideD *>(x->ldc)},
        hw};
    return args;
}

int64_t gg_workspace(const kcu_gg_sm90_args *x)
{
    typename Gemm::Arguments args = make_args(x);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return -1;
    return (int64_t)Gemm::get_workspace_size(args);
}

int gg_run(const kcu_gg_sm90_args *x, void *ws, cudaStream_t s, const char **why)
{
    typename Gemm::Arguments args = make_args(x);
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(args);
    if (st == cutlass::Status::kSuccess) st = gemm.initialize(args, ws, s);
    if (st == cutlass::Status::kSuccess) st = gemm.run(s);
    if (st != cutlass::Status::kSuccess) {
        *why = cutlassGetStatusString(st);
        return -1;
    }
    return 0;
}

} /* namespace */

#define GG_V (GG_TA * 4 + GG_TB * 2 + GG_CBF16)
#if GG_V == 0
#define GG_SYM kcu_gg_sm90_0
#elif GG_V == 1
#define GG_SYM kcu_gg_sm90_1
#elif GG_V == 2
#define GG_SYM kcu_gg_sm90_2
#elif GG_V == 3
#define GG_SYM kcu_gg_sm90_3
#elif GG_V == 4
#define GG_SYM kcu_gg_sm90_4
#elif GG_V == 5
#define GG_SYM kcu_gg_sm90_5
#else
#error "variant not built (ta = tb = 1)"
#endif
extern const kcu_gg_sm90_fn GG_SYM = {gg_workspace, gg_run};
