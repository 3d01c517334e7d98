/* The launch table of kernels/: every kernel's block size, the most dynamic
 * shared memory a launcher asks for, and its local-memory budget.
 *
 * One row per __global__ function (a template counts once, all its
 * instantiations share the row). The kernel is launched with exactly
 * KCU_THREADS(k) threads per block; a kernel of more than 256 threads a
 * block is also declared __launch_bounds__(KCU_THREADS(k)), so ptxas fits
 * its registers to the size it runs at. (The 256-thread kernels carry no
 * bound: any register count fits 256 threads, and a bound alone makes ptxas
 * aim at full occupancy, 32 registers, and spill: k_swiglu_bwd and
 * k_gather<uint32_t> did.) tests/gpu/check-resources.sh reads this table
 * (through tests/gpu/launch-table.c) and the ptxas report of every .cu in
 * kernels/, and fails when a kernel cannot launch at its row's size on the
 * target architecture (registers per block, shared memory per block),
 * spills past its budget, is missing from the table, lacks the bound it
 * needs, or is launched with a block size that is not KCU_THREADS of
 * itself.
 *
 * Plain C (no CUDA types): tests/gpu/launch-table.c includes it too.
 */
#ifndef LRMOE_KCU_LAUNCH_H
#define LRMOE_KCU_LAUNCH_H

/* Elementwise and warp-per-row kernels: 256 threads (8 warps). */
#define KCU_TPB 256
/* Single-block 64-bit scans (k_scan_small, k_counts_offsets): 512 threads.
 * cub::BlockScan<long long, 1024> needs ~90 registers a thread, and
 * 1024 x 90 is above the 65,536 registers of a block; at 512 they fit
 * unbounded and without spills. */
#define KCU_SCAN_TPB 512
/* k_select: one block of 256 threads per expert (cub::BlockScan<int, 256>). */
#define KCU_SELECT_TPB 256
/* k_sample: one block of a warp per expert, its first thread working (the CPU's sequential draw, bit for bit:
 * its sums and the systematic walk are in ascending pair order). */
#define KCU_SAMPLE_TPB 32
/* k_pack_walk: WALK_WARPS warps per expert, up to WALK_MAX_P ranks; its
 * dynamic shared memory for P ranks is WALK_SMEM(P): alloc, totals and
 * cumulative remainders (3*P long long) and the per-warp table
 * (WALK_WARPS*P int). */
#define WALK_WARPS 32
#define WALK_MAX_P 256
#define WALK_SMEM(P) ((unsigned long)(P) * (3 * 8 + WALK_WARPS * 4))
/* k_widen (gemm.cu): 256 threads. */
#define KCU_WIDEN_TPB 256

/* X(kernel, threads per block, most dynamic shared memory in bytes,
 *   local memory (stack frame, spills included) budget in bytes a thread) */
#define KCU_LAUNCH_TABLE(X)                                   \
    X(k_bf16_to_f32,        KCU_TPB,        0, 0)             \
    X(k_f32_to_bf16,        KCU_TPB,        0, 0)             \
    X(k_mask_rows,          KCU_TPB,        0, 0)             \
    X(k_add,                KCU_TPB,        0, 0)             \
    X(k_seq_i64,            KCU_TPB,        0, 0)             \
    X(k_invert_i64,         KCU_TPB,        0, 0)             \
    X(k_pair_score,         KCU_TPB,        0, 0)             \
    X(k_row_sqnorm,         KCU_TPB,        0, 0)             \
    X(k_expert_hist,        KCU_TPB,        0, 0)             \
    X(k_iota,               KCU_TPB,        0, 0)             \
    X(k_scan_small,         KCU_SCAN_TPB,   0, 0)             \
    X(k_select,             KCU_SELECT_TPB, 0, 0)             \
    X(k_sample,             KCU_SAMPLE_TPB, 0, 0)             \
    X(k_load_out,           KCU_TPB,        0, 0)             \
    X(k_check_pairs,        KCU_TPB,        0, 0)             \
    X(k_alloc_forward,      KCU_TPB,        0, 0)             \
    X(k_counts_offsets,     KCU_SCAN_TPB,   0, 0)             \
    X(k_pack_walk,          WALK_WARPS * 32, WALK_SMEM(WALK_MAX_P), 0) \
    X(k_gather,             KCU_TPB,        0, 0)             \
    X(k_gather_scaled,      KCU_TPB,        0, 0)             \
    X(k_gather_scaled_bf16, KCU_TPB,        0, 0)             \
    X(k_inverse,            KCU_TPB,        0, 0)             \
    X(k_unpack,             KCU_TPB,        0, 0)             \
    X(k_swiglu_fwd,         KCU_TPB,        0, 0)             \
    X(k_swiglu_bwd,         KCU_TPB,        0, 0)             \
    X(k_swiglu_bwd_bf16,    KCU_TPB,        0, 0)             \
    X(k_combine,            KCU_TPB,        0, 0)             \
    X(k_pair_dot,           KCU_TPB,        0, 0)             \
    X(k_widen,              KCU_WIDEN_TPB,  0, 0)             \
    X(k_gg_setup,           KCU_TPB,        0, 0)             \
    X(k_gg_zero,            KCU_TPB,        0, 0)

#define KCU_THREADS_ENUM_(k, threads, dsmem, local) KCU_THREADS_##k = (threads),
#define KCU_DSMEM_ENUM_(k, threads, dsmem, local) KCU_DSMEM_##k = (dsmem),
enum { KCU_LAUNCH_TABLE(KCU_THREADS_ENUM_) };
enum { KCU_LAUNCH_TABLE(KCU_DSMEM_ENUM_) };
#undef KCU_THREADS_ENUM_
#undef KCU_DSMEM_ENUM_

/* Threads per block kernel k is bounded by and launched with. */
#define KCU_THREADS(k) KCU_THREADS_##k
/* The most dynamic shared memory (bytes) a launch of k may ask for. */
#define KCU_DSMEM(k) KCU_DSMEM_##k

#endif
