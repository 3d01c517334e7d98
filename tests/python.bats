#!/usr/bin/env bats
# The lrmoe Python package (lib/python): `pip install ./lib/python` works,
# and the unittest suites of tests/python run against build/liblrmoe.so.2,
# one bats test per module (stream I/O, route/plan/score/pack against the
# tools, patch() against the Hugging Face blocks, dump() and the CLI).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    export LRMOE_LIBRARY="$TOP/build/liblrmoe.so.2"
    export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
}

need_torch() {
    python3 -c 'import torch, transformers' 2>/dev/null ||
        skip "torch and transformers are not installed (tests/deps.sh test installs them)"
}

# torch, and the fake CUDA module (tests/gpu/build-fake-module.sh: the CUDA
# backend's host code on the kernels' CPU references) built into
# $BATS_TEST_TMPDIR/fm (the tests name it in LRMOE_CUDA_MODULE), or skip saying why
fake_module() {
    need_torch
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH (the fake module needs the CUDA headers)"
    [ -f "$TOP/build/lib/cuda_module.o" ] || skip "liblrmoe.so.2 built without CUDA (no module loader)"
    run sh "$TOP/tests/gpu/build-fake-module.sh" "$BATS_TEST_TMPDIR/fm"
    assert_success
}

unit() {
    cd "$TOP/tests/python" || return 1
    run python3 -W ignore::ResourceWarning -m unittest -v "$@"
    [ "$status" -eq 0 ] || { printf '%s\n' "$output"; return 1; }
    assert_line --regexp '^OK'
}

@test "pip install ./lib/python installs the lrmoe package, which loads the library" {
    cp -r "$TOP/lib/python" "$BATS_TEST_TMPDIR/src"
    run python3 -m pip install -q --no-deps --no-build-isolation --target "$BATS_TEST_TMPDIR/site" \
        "$BATS_TEST_TMPDIR/src"
    assert_success
    [ -f "$BATS_TEST_TMPDIR/site/lrmoe/torch.py" ]
    [ -f "$BATS_TEST_TMPDIR/site/lrmoe/py.typed" ]  # PEP 561: its type hints are used
    cd "$BATS_TEST_TMPDIR"
    run env PYTHONPATH="$BATS_TEST_TMPDIR/site" python3 -c \
        'import lrmoe, os; print(lrmoe.__version__, os.path.dirname(lrmoe.__file__))'
    assert_success
    assert_output "$(sed -n 's/^#define LRMOE_VERSION "\(.*\)"/\1/p' "$TOP/lib/lrmoe.h") $BATS_TEST_TMPDIR/site/lrmoe"
}

@test "python: streams through liblrmoe's reader and writer" {
    unit test_stream
}

@test "python: route/plan/score/pack return the tools' tensors bit for bit" {
    unit test_ops
}

@test "python: bad arguments raise lrmoe.Error naming them (dtype vs itemsize, shapes, huge ints, NUL, closed objects, NaN weights), never a crash" {
    unit test_harden
}

@test "python: property test (hypothesis): random dtypes, shapes, strides, sizes and huge ints into every public function give a result or lrmoe.Error" {
    python3 -c 'import hypothesis' 2>/dev/null ||
        skip "hypothesis is not installed (tests/deps.sh test installs it)"
    unit test_fuzz
}

@test "python: patch() equals the unpatched HF blocks (six families, f32/bf16), drops like the reference, trains alike" {
    need_torch
    unit test_patch
}

@test "python: patch() installs an nn.Module (print, state_dict, unpatch), saves for backward (in-place check, saved-tensor hooks), passes gradcheck, and torch.compile(fullgraph=True) runs it" {
    need_torch
    unit test_torch_api
}

@test "python: lrmoe.torch.register: a torchtitan-style GroupedExperts block and a custom transposed-layout block patched (plain torch autograd at rate 1 to 1e-6, the drop reference at rate < 1), dumped, and bad registrations refused" {
    need_torch
    unit test_register
}

@test "python: lrmoe.torch.register_megatron: Megatron-Core's MoELayer (SequentialMLP) built on the CPU and patched equals Megatron's own forward/backward at rate 1 (1e-6), the drop reference at rate < 1; unmappable config fields refused" {
    need_torch
    python3 -W ignore -c 'import megatron.core' 2>/dev/null ||
        skip "megatron-core does not import (tests/deps.sh test installs megatron-core==0.16.1)"
    unit test_megatron
}

@test "python: lrmoe.budget and lrmoe.torch.budget (a live model and optimizer) equal lrmoe-budget" {
    need_torch
    unit test_budget
}

@test "python: dump() frames, weights, pipes, and the CLI pipeline reproduces the patched layer" {
    need_torch
    unit test_dump
}

# The bug of liblrmoe linking the toolkit's libnccl.so.2: imported before
# torch, it shadowed PyTorch's by soname and libtorch_cuda failed on an
# undefined NCCL symbol. Now the CUDA backend is the module
# liblrmoe-cuda.so.1, loaded on first use.
@test "python: import lrmoe before torch (and after) works, a patched block runs, the CUDA module uses torch's CUDA libraries" {
    need_torch
    D="$BATS_TEST_TMPDIR"
    B="$TOP/bin"
    step=-
    if [ -f "$TOP/build/liblrmoe-cuda.so.1" ]; then
        "$B/lrmoe-gen" --tokens 64 --experts 8 --topk 2 --hidden 16 --ffn 8 --seed 1 \
            --weights "$D/w.lrm" | "$B/lrmoe-route" --topk 2 |
            "$B/lrmoe-plan" --ranks 2 --ffn 8 -o "$D/p.lrm"
        step="$D/p.lrm,$D/w.lrm"
    else
        echo "# CPU-only build (no build/liblrmoe-cuda.so.1): the CUDA module checks are left out" >&3
    fi
    cd "$D"
    for order in lrmoe-first torch-first; do
        run env PYTHONPATH="$TOP/lib/python:$TOP/tests/python" python3 -W ignore \
            "$TOP/tests/python/import_order.py" "$order" "$step"
        [ "$status" -eq 0 ] || { printf '%s\n' "$output"; return 1; }
        [ "$order" = torch-first ] || assert_line "ok import lrmoe maps no CUDA library"
        assert_line "ok $order: import torch and import lrmoe"
        assert_line --regexp "^ok patched forward and backward equal torch's"
        [ "$step" = - ] || assert_line --regexp "^ok the CUDA module (uses|loaded)"
    done
}

@test "python: patch() on a plan that keeps by forward rank keeps, moves and trains like the tool pipeline" {
    need_torch
    unit test_byrank
}

@test "lrmoe-python(3) documents every public function and class of lrmoe and lrmoe.torch, and every unit-suffixed stats key" {
    need_torch
    page=$(mandoc -T ascii "$TOP/man/man3/lrmoe-python.3" | col -b)
    names=$(cd "$TOP/lib/python" && python3 -c '
import inspect, lrmoe, lrmoe.torch as lt
for n in lrmoe.__all__:
    if n != "__version__":
        print("lrmoe." + n if n not in ("Error", "LibraryNotFound") else n)
for n, o in sorted(vars(lt).items()):
    if not n.startswith("_") and (inspect.isfunction(o) or inspect.isclass(o)) and \
            o.__module__ in ("lrmoe.torch", "lrmoe.adapters"):
        print(n)
for n in lt.UNIT_KEYS.values():
    print(n)
')
    [ "$(printf '%s\n' "$names" | wc -l)" -ge 40 ]
    for n in $names; do
        printf '%s' "$page" | grep -qF -- "$n" || fail "$n is not in lrmoe-python(3)"
    done
}

@test "python: lrmoe.torch's CUDA path (device pointers, one executor a layer, the current stream) on the fake CUDA module equals the CPU path (rate 1 model with 2 SGD steps, a block at rate 1 and 0.7, P 1 and 2, f32/bf16, the same pairs kept)" {
    fake_module
    cd "$TOP/tests/gpu" || return 1
    # the CUDA backend's GEMMs take BF16 operands (kernels/exec_cuda.cu):
    # ~1e-3..1e-2 from the CPU backend's F32 ones, bounded by 3e-2 as
    # tests/gpu/check-gpu.sh bounds it; a wrong row, weight or scale is O(1)
    run env LRMOE_CUDA_MODULE="$BATS_TEST_TMPDIR/fm/liblrmoe-cuda.so.1" \
        python3 torch_cuda.py fake 3e-2
    printf '%s\n' "$output"
    assert_success
    assert_output --partial "torch_cuda (fake): PASS"
    refute_output --partial "FAIL"
    # what crosses per layer call (24 tokens, K=2, D=32, int64 ids):
    # forward ids 384 + alpha 192 B; backward those + the scores 192 B
    # (scored on the device: neither g nor ||phi||^2 crosses)
    assert_output --partial "fwd 576 d2h, bwd 768 d2h + 576 h2d"
}

@test "python: patch(group=) with CUDA tensors under torchrun (2 ranks, gloo, the fake CUDA module: one CUDA executor a rank on the group's callback communicator) equals the simulated ranks=2 run bit for bit, and shard=True (1/P of the expert parameters, replicas' weights and gradients by p2p) the unsharded group run (lrmoe, llep's replicas, fixed; rate 1 and 0.7; topk, sample; float32, and bfloat16 for one; metrics lrm, gradnorm, absgrad; 3 SGD steps); blocks registered with each stacked layout (fused, fused_t, separate, separate_t; llep at 0.7) sharded the same bits as unsharded, repeated forwards sending no weight again; expert parameters changed on one rank only refresh every rank's resident weights and replicas (no hang)" {
    fake_module
    command -v torchrun >/dev/null 2>&1 || skip "torchrun is not on PATH (it comes with torch)"
    cd "$TOP/tests/gpu" || return 1
    run env LRMOE_CUDA_MODULE="$BATS_TEST_TMPDIR/fm/liblrmoe-cuda.so.1" \
        timeout -k 30 300 torchrun --standalone --nproc-per-node 2 dist_cuda.py fake 0
    printf '%s\n' "$output"
    assert_success
    assert_output --partial "dist_cuda (fake): PASS"
    refute_output --partial "FAIL"
}

@test "python: a patch(group=, shard=True) sharded on the device path (the fake CUDA module) runs the CPU group path too once the tensors are CPU ones (a one-process gloo group): the unsharded CPU run's output and gradients bit for bit" {
    fake_module
    cd "$TOP/tests/python" || return 1
    run env LRMOE_CUDA_MODULE="$BATS_TEST_TMPDIR/fm/liblrmoe-cuda.so.1" LRMOE_TORCH_FAKE_DEVICE=1 \
        timeout 120 python3 -c '
import copy, os, tiny, torch, lrmoe.torch as lt, lrmoe.dist as ld
import torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
b = tiny.block("qwen3_moe", seed=3)
ref = copy.deepcopy(b)
h = lt.patch(b, rate=1.0, group=dist.group.WORLD, shard=True)  # the device path: shard_device
os.environ.pop("LRMOE_TORCH_FAKE_DEVICE")
hr = lt.patch(ref, rate=1.0)  # the CPU path
h.fake_device = False  # the patched model now computes on CPU tensors
x = torch.randn(6, 32)
ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 6], [3, 0]])
w = torch.softmax(torch.randn(6, 2), -1)
outs = []
for m in (b, ref):
    xm = x.clone().requires_grad_()
    y = m.experts(xm, ids, w)
    y.backward(torch.ones_like(y))
    outs.append((y.detach(), xm.grad, m.experts.gate_up_proj.grad, m.experts.down_proj.grad))
print("cpu path:", h.stats[-1].get("device"), "equal:", all(torch.equal(a, c) for a, c in zip(*outs)))
del h, hr, b, ref
ld.shutdown()
'
    printf '%s\n' "$output"
    assert_success
    assert_line "cpu path: None equal: True"
}

@test "python: the CUDA path scores the backward's pairs on the device (lrmoe_exec_cuda_score): bit for bit the host scores on the fake CUDA module (lrm, gradnorm, absgrad; F32, BF16 g), the CPU path's keep masks for every metric, only the scores cross" {
    fake_module
    cd "$TOP/tests/gpu" || return 1
    run env LRMOE_CUDA_MODULE="$BATS_TEST_TMPDIR/fm/liblrmoe-cuda.so.1" \
        python3 score_device.py fake 0
    printf '%s\n' "$output"
    assert_success
    assert_output --partial "score_device (fake): PASS"
    refute_output --partial "FAIL"
    assert_line "ok score lrm g bfloat16 T=24 D=37: device == host bitwise"
    assert_line "ok score gradnorm g float32 T=24 D=37: device == host bitwise"
    assert_line "ok score absgrad g float32 T=24 D=37: device == host bitwise"
    assert_line "ok score absgrad g bfloat16 T=24 D=32: device == host bitwise"
    # 24 tokens, K=2: routing 576 B, then the scores (192 B) for lrm,
    # gradnorm and absgrad (g stays on the device), nothing for random and
    # uniform; to the device only the kept rows' pair and alpha (33*12 B)
    assert_line --partial "ok block metric=lrm select=sample: kept 33 (cpu 33, masks equal), bwd 768 B d2h"
    assert_line --partial "ok block metric=absgrad select=topk: kept 33 (cpu 33, masks equal), bwd 768 B d2h (want 576 routing + 192), 396 B h2d"
    assert_line --partial "ok block metric=gradnorm select=topk: kept 33 (cpu 33, masks equal), bwd 768 B d2h (want 576 routing + 192), 396 B h2d"
    assert_line --partial "ok block metric=random select=topk: kept 33 (cpu 33, masks equal), bwd 576 B d2h"
}

@test "python: lrmoe.torch's CUDA path without a loadable CUDA module, or with a non-contiguous or foreign-device buffer, is one lrmoe.Error" {
    need_torch
    [ -f "$TOP/build/lib/cuda_module.o" ] || skip "liblrmoe.so.2 built without CUDA (no module loader)"
    cd "$TOP/tests/python" || return 1
    run env LRMOE_CUDA_MODULE="$BATS_TEST_TMPDIR/none/liblrmoe-cuda.so.1" LRMOE_TORCH_FAKE_DEVICE=1 \
        python3 -c '
import tiny, torch, lrmoe, lrmoe.torch as lt
b = tiny.block("qwen3_moe")
h = lt.patch(b, rate=1.0)
x = torch.randn(4, 32)
try:
    b.experts(x, torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 2))
except lrmoe.Error as e:
    print("Error:", e)
for t in (torch.zeros(4, 4).t(), torch.zeros(4, device="meta")):
    try:
        lt._dptr("buf", t, 0, True)
    except lrmoe.Error as e:
        print("Error:", e)
'
    assert_success
    assert_line --partial "Error: Qwen3MoeSparseMoeBlock: CUDA executor: backend cuda: cannot load the CUDA module"
    assert_line "Error: buf: a non-contiguous tensor (stride (1, 4)); the CUDA executor reads dense row-major arrays"
    assert_line "Error: buf: a tensor on meta; this layer's CUDA executor runs on cpu"
}
