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
