# The bf16 GEMM kernels this CPU can run (lib/gemm_cpu.h, lrmoe_kernel_t),
# one line each: the name lrmoe-exec reports in exec.bf16 (and the unit
# tests print), then the environment that forces it here. A developer's CPU
# thus checks the kernels other users' CPUs take by default; tests/README
# lists which CPU covers which. Loaded by tests/exec.bats, mpi.bats,
# blas.bats (bats: load helpers/bf16_kernels), read on fd 7 (bats keeps 3)
# (while read -r k e <&7; do ...; done 7< <(bf16_kernels)) so that mpirun,
# which forwards its stdin to rank 0, cannot eat the list.
#
#   amx              LRMOE_BF16_EMULATE=0 (an AMX CPU's default: it never
#                    emulates unless LRMOE_BF16_EMULATE=1 or LRMOE_AMX=0)
#   dpbf16           LRMOE_AMX=0 LRMOE_BF16_EMULATE=0 (AVX512_BF16: lrmoe's
#                    vdpbf16ps kernel, the default of Zen 4)
#   native           LRMOE_DPBF16=0 LRMOE_AMX=0 LRMOE_BF16_EMULATE=0 (oneDNN
#                    on its best ISA)
#   native           DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 ... on an AMX CPU:
#                    oneDNN's AVX512_BF16 brgemm
#   emulated-avx512  LRMOE_BF16_EMULATE=1 (AVX-512F)
#   emulated-avx2    LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=256 (AVX2 and FMA):
#                    Zen 3's default
#   emulated-sgemm   LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=0 (any CPU)
bf16_kernels() {
    local f
    f=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    if [[ $f == *" amx_bf16 "* && $f == *" amx_tile "* ]]; then
        echo "amx LRMOE_BF16_EMULATE=0"
        [[ $f == *" avx512_bf16 "* ]] && echo "dpbf16 LRMOE_AMX=0 LRMOE_BF16_EMULATE=0"
        echo "native LRMOE_DPBF16=0 LRMOE_AMX=0 LRMOE_BF16_EMULATE=0"
        echo "native DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 LRMOE_DPBF16=0 LRMOE_AMX=0 LRMOE_BF16_EMULATE=0"
    elif [[ $f == *" avx512_bf16 "* ]]; then
        echo "dpbf16 LRMOE_BF16_EMULATE=0"
        echo "native LRMOE_DPBF16=0 LRMOE_BF16_EMULATE=0"
    fi
    [[ $f == *" avx512f "* ]] && echo "emulated-avx512 LRMOE_BF16_EMULATE=1"
    [[ $f == *" avx2 "* && $f == *" fma "* ]] &&
        echo "emulated-avx2 LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=256"
    echo "emulated-sgemm LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=0"
}
