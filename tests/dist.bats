#!/usr/bin/env bats
# lrmoe.torch over a real torch.distributed process group (patch(group=pg),
# lrmoe/dist.py, lrmoe_comm_callback_new): torchrun --standalone, gloo, CPU.
# Each rank of tests/python/dist_check.py also runs the simulated
# single-process patch(ranks=P) on the whole batch and compares its share
# bit for bit (outputs, gradients of its tokens and of its native experts,
# the backward all-to-alls' bytes = kept rows x D x 4).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    export LRMOE_LIBRARY="$TOP/build/liblrmoe.so.2"
    export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
    python3 -c 'import torch, transformers' 2>/dev/null ||
        skip "torch and transformers are not installed (tests/deps.sh test installs them)"
    command -v torchrun >/dev/null || skip "torchrun is not on PATH (it comes with torch)"
    python3 -c 'import torch.distributed as d, sys; sys.exit(not (d.is_available() and d.is_gloo_available()))' ||
        skip "this torch has no gloo backend"
    cd "$TOP/tests/python" || return 1
}

# dist NPROC ARGS...: the check under torchrun, every rank ok, and every
# rank's gloo threads joined before its interpreter exits (lrmoe.dist.shutdown:
# else a rank can end in SIGABRT at exit, now and then)
dist() {
    local n=$1
    shift
    run timeout -k 30 600 torchrun --standalone --nproc-per-node "$n" dist_check.py "$@"
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] ||
        { echo "dist: torchrun did not end within 600 s (status $status)"; status=1; }
    [ "$status" -eq 0 ] || { printf '%s\n' "$output" | grep -v '^W[0-9]' | tail -40; return 1; }
    has 'dist: all ok'
    [ "$(printf '%s\n' "$output" | grep -oE 'dist: [0-9]+ ok [1-9][0-9]* checks' | wc -l)" -eq "$n" ]
    [ "$(printf '%s\n' "$output" | grep -oE 'dist: [0-9]+ gloo threads [1-9][0-9]* -> 0' | wc -l)" -eq "$n" ] ||
        { echo "dist: not every rank joined its gloo threads before exit"; return 1; }
}

# has ERE: the output holds it (the ranks' lines can run together: no anchors)
has() {
    printf '%s\n' "$output" | grep -qE -- "$1" || {
        printf 'missing: %s\n' "$1"; printf '%s\n' "$output" | grep -v '^W[0-9]' | tail -20
        return 1
    }
}

@test "2 ranks: the experts op equals the simulated run for fixed, lrmoe, llep, eplb, capacity at rate 1.0 and 0.7" {
    dist 2 experts
}

@test "4 ranks: the experts op equals the simulated run for every planner" {
    dist 4 experts
}

@test "2 ranks: tiny Qwen3-MoE, 10 training steps at rate 1.0 and 0.7: losses and every gradient equal" {
    dist 2 model qwen3_moe 1.0,0.7 10
}

@test "2 ranks: tiny Qwen3-MoE, 10 training steps with llep's replicas at rate 0.7" {
    dist 2 model qwen3_moe 0.7 10 llep
}

@test "2 ranks: tiny Mixtral, 10 training steps at rate 1.0 and 0.7: losses and every gradient equal" {
    dist 2 model mixtral 1.0,0.7 10
}

@test "2 ranks: tiny DeepSeek-V3, 10 training steps at rate 1.0 and 0.7: losses and every gradient equal" {
    dist 2 model deepseek_v3 1.0,0.7 10
}

@test "2 ranks: tiny Qwen3-MoE, 10 training steps with capacity-factor dropping (factor 0.7): losses and every gradient equal" {
    dist 2 model qwen3_moe 0.7 10 capacity
}

@test "README's torchrun training loop (shard=True, dense gradients all-reduced): the one-process run's losses to 1e-5" {
    run timeout -k 30 300 torchrun --standalone --nproc-per-node 2 dist_train.py 6
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] ||
        { echo "train: torchrun did not end within 300 s (status $status)"; status=1; }
    [ "$status" -eq 0 ] || { printf '%s\n' "$output" | grep -v '^W[0-9]' | tail -20; return 1; }
    has 'train: all ok'
    [ "$(printf '%s\n' "$output" | grep -cE '^train: step [0-9]+ loss ')" -eq 6 ]
}

@test "4 ranks: tiny Qwen3-MoE, 10 training steps at rate 0.7" {
    dist 4 model qwen3_moe 0.7 10
}

# die HOW: rank 1 fails; the job ends in bounded time with one clear error
die() {
    local t0=$SECONDS
    # torchrun stops the other ranks once it sees one exit: it looks every 2 s
    # here (its default, 0.1 s, can stop rank 0 before its error on a loaded
    # machine)
    DIST_TIMEOUT=20 run timeout 120 torchrun --standalone --monitor-interval 2 --nproc-per-node 2 \
        dist_check.py die "$1"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ $((SECONDS - t0)) -lt 60 ]
    if has 'dist: all ok' >/dev/null; then return 1; fi
}

@test "a rank that dies before the collectives: the other ends with one clear error" {
    die early
    has 'dist: rank 0: error: [^ ]+: token counts: rank 0 of 2: the process group failed .*did a peer rank die or raise\?'
}

@test "a rank that dies while the other is inside liblrmoe's all-to-all: one clear error" {
    die inexec
    has 'dist: rank 0: error: [^ ]+: forward: rank 0 of 2: the process group failed .*did a peer rank die or raise\?'
}

@test "ranks that plan differently: every rank says so" {
    die plan
    has "dist: rank 0: error: [^ ]+: the ranks disagree on the plan: rank 1's differs from rank 0's"
    has "dist: rank 1: error: [^ ]+: the ranks disagree on the plan"
}

@test "make bench's dist section (quick): a table for both ranks, the backward bytes fall with rho, shard=True holds half the expert bytes" {
    cd "$TOP" || return 1
    BENCH_QUICK=1 REPS=1 run timeout 300 sh tests/bench/dist.sh
    [ "$status" -eq 0 ] || { printf '%s\n' "$output" | tail -20; return 1; }
    has '1024 tokens per rank'
    [ "$(printf '%s\n' "$output" | grep -cE '^group +[01] +(1\.00|0\.70) ')" -eq 4 ]
    [ "$(printf '%s\n' "$output" | grep -cE '^sharded +[01] +0\.70 +25165824 ')" -eq 2 ]
    [ "$(printf '%s\n' "$output" | grep -cE '^simulated +all ')" -eq 2 ]
    has 'verdict: backward all-to-all bytes \(all ranks\) [0-9]+ at rate 0\.7 = 0\.[0-9]+ of [0-9]+ at 1\.0 .*: falls with rho'
    has 'verdict: largest share outside liblrmoe and the collectives [0-9.]+%'
    has 'verdict: shard=True keeps 25165824 expert parameter bytes per rank = 0\.500 of unsharded'
}

@test "2 and 4 ranks: shard=True keeps 1/P of the experts, the same bits as unsharded, full_state_dict loads" {
    dist 2 shard
    dist 4 shard
}

@test "2 and 4 ranks: tiny Qwen3-MoE sharded (llep's replicas), 10 steps: the simulated run's bits, full_state_dict its parameters" {
    dist 2 model qwen3_moe 0.7 10 llep shard
    dist 4 model qwen3_moe 0.7 10 llep shard
}

@test "2 ranks: shard=True on blocks registered with each stacked layout (fused, fused_t, separate, separate_t): the unsharded group run's bits, 1/P of the expert bytes, full_state_dict loads; per-expert layouts refused" {
    dist 2 shard-layouts
}
