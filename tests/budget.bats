#!/usr/bin/env bats
# lrmoe-budget (issue 40 item 2; lib/budget.c, lrmoe-budget(1)): the
# parameter counts against Hugging Face models built from each config
# (tiny random-init ones, and the presets on the meta device), every byte
# term against the formula restated in tests/helpers/budget_ref.py, the
# errors (a missing field named, ep/pp/dp sizes, does not fit by how much),
# and the worked example of the man page and README against the tool.

bats_require_minimum_version 1.5.0
load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup_file() {
    python3 -c 'import torch, transformers' 2>/dev/null || return 0
    python3 -W ignore "$BATS_TEST_DIRNAME/helpers/budget_oracle.py" "$BATS_FILE_TMPDIR/hf" \
        > "$BATS_FILE_TMPDIR/oracle.txt" 2>/dev/null
}

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    BIN="$TOP/bin"
    T="$BATS_TEST_TMPDIR"
    HF="$BATS_FILE_TMPDIR/hf"
    ORACLE="$BATS_FILE_TMPDIR/oracle.txt"
    REF="python3 $BATS_TEST_DIRNAME/helpers/budget_ref.py"
    [ -x "$BIN/lrmoe-budget" ] || skip "tools not built (run make)"
}

need_oracle() {
    [ -s "$ORACLE" ] || skip "torch and transformers are not installed"
}

# the column NAME of lrmoe-budget --tsv output in FILE
col() {
    awk -F'\t' -v k="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == k) c = i }
                          NR == 2 { print $c }' "$1"
}

@test "budget: parameter counts equal the numel of the Hugging Face model of each config and preset" {
    need_oracle
    n=0
    while read -r name expert other; do
        if [ -d "$HF/$name" ] && [ -f "$HF/$name/config.json" ] && [[ "$name" != *-* ]]; then
            run "$BIN/lrmoe-budget" --config "$HF/$name/config.json" --gpu-mem 1P --tsv
        else
            run "$BIN/lrmoe-budget" --preset "$name" --gpu-mem 1P --tsv
        fi
        assert_success
        printf '%s\n' "$output" > "$T/b.tsv"
        [ "$(col "$T/b.tsv" params_experts_total)" = "$expert" ] ||
            fail "$name: experts $(col "$T/b.tsv" params_experts_total), HF $expert"
        [ "$(col "$T/b.tsv" params_other_total)" = "$other" ] ||
            fail "$name: other $(col "$T/b.tsv" params_other_total), HF $other"
        n=$((n + 1))
    done < "$ORACLE"
    [ "$n" -eq 10 ]
    # the published totals: Qwen3-30B-A3B 30.5B, DeepSeek-V3 671B (without MTP)
    run "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem 1P --tsv
    printf '%s\n' "$output" > "$T/q.tsv"
    [ "$(col "$T/q.tsv" params_total)" = 30532122624 ]
    run "$BIN/lrmoe-budget" --preset deepseek-v3 --gpu-mem 1P --tsv
    printf '%s\n' "$output" > "$T/d.tsv"
    [ "$(col "$T/d.tsv" params_total)" = 671026404352 ]
}

@test "budget: every byte term equals the formula restated independently" {
    need_oracle
    check() { # CASE "tool options" "ref options"
        read -r _ e o < <(grep "^$1 " "$ORACLE")
        local args=(--config "$HF/$1/config.json")
        [[ "$1" == *-* ]] && args=(--preset "$1")
        "$BIN/lrmoe-budget" "${args[@]}" $2 --tsv > "$T/b.tsv" || [ $? -eq 1 ]
        run $REF "$HF/$1/config.json" "$e" "$o" $3 < "$T/b.tsv"
        assert_success
        assert_output "ok 14 terms"
    }
    check qwen3-30b-a3b "--gpu-mem 80G --dp 8 --ep 8 --zero1" "gpu=85899345920 dp=8 ep=8 zero1=1"
    check qwen3-30b-a3b "--gpu-mem 80G --tp 2 --pp 4 --dp 4 --ep 8 --checkpoint none --seq 2048 --micro-batch 2 --reserve 3G" \
        "gpu=85899345920 tp=2 pp=4 dp=4 ep=8 ckpt=none seq=2048 mb=2 reserve=3221225472"
    check deepseek_v3 "--gpu-mem 1G --pp 2 --dp 4 --ep 4 --zero1 --checkpoint none --seq 64 --micro-batch 3" \
        "gpu=1073741824 pp=2 dp=4 ep=4 zero1=1 ckpt=none seq=64 mb=3"
    check qwen3_moe_mixed "--gpu-mem 1G --tp 2 --pp 2 --dp 3 --ep 6 --seq 100 --reserve 1M --dtype f32 --grad-dtype bf16 --optim-bytes 8" \
        "gpu=1073741824 tp=2 pp=2 dp=3 ep=6 seq=100 reserve=1048576 pb=4 ab=4 gb=2 ob=8"
    check deepseek_v2 "--gpu-mem 1G --pp 4 --dp 8 --ep 8" "gpu=1073741824 pp=4 dp=8 ep=8"
    check qwen2_moe "--gpu-mem 1G --dp 2 --ep 2 --checkpoint none --zero1" \
        "gpu=1073741824 dp=2 ep=2 ckpt=none zero1=1"
    check mixtral "--gpu-mem 2M --tp 4 --ep 4 --seq 8" "gpu=2097152 tp=4 ep=4 seq=8"
    check deepseek_v3_noq "--gpu-mem 1G --pp 2 --seq 512" "gpu=1073741824 pp=2 seq=512"
}

@test "budget: the printed -M is --gpu-mem minus --resident, the pair to give lrmoe-plan" {
    run "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem 80G --dp 8 --ep 8 --zero1
    assert_success
    line=$(printf '%s\n' "$output" | grep '^lrmoe-plan -M ')
    M=$(echo "$line" | awk '{ print $3 }')
    G=$(echo "$line" | sed 's/.*--gpu-mem \([0-9]*\).*/\1/')
    R=$(echo "$line" | sed 's/.*--resident \([0-9]*\)).*/\1/')
    [ "$G" = 85899345920 ]
    [ $((G - R)) -eq "$M" ]
    [ "$M" -gt 0 ]
}

@test "budget: a missing or bad config field is named; bad parallel sizes; no MoE layer" {
    need_oracle
    c="$HF/qwen3_moe/config.json"
    for f in num_key_value_heads hidden_size moe_intermediate_size mlp_only_layers \
             tie_word_embeddings attention_bias; do
        python3 -c "import json,sys; d=json.load(open('$c')); del d['$f']; json.dump(d, open('$T/c.json','w'))"
        run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
        assert_failure 1
        assert_output "lrmoe-budget: $T/c.json: config: field '$f' missing"
    done
    python3 -c "import json; d=json.load(open('$c')); del d['num_local_experts']; json.dump(d, open('$T/c.json','w'))"
    run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
    assert_failure 1
    assert_output "lrmoe-budget: $T/c.json: config: field 'num_experts' (or 'num_local_experts') missing"
    python3 -c "import json; d=json.load(open('$c')); d['hidden_size']='32'; json.dump(d, open('$T/c.json','w'))"
    run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
    assert_failure 1
    assert_output "lrmoe-budget: $T/c.json: config: field 'hidden_size' is not an integer"
    python3 -c "import json; d=json.load(open('$c')); d['model_type']='llama'; json.dump(d, open('$T/c.json','w'))"
    run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
    assert_failure 1
    assert_output --partial "config: model_type 'llama' is not one lrmoe-budget knows"
    python3 -c "import json; d=json.load(open('$HF/deepseek_v3/config.json')); d['first_k_dense_replace']=4; json.dump(d, open('$T/c.json','w'))"
    run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
    assert_failure 1
    assert_output "lrmoe-budget: $T/c.json: config: no MoE layer (every layer is dense)"
    printf '{"model_type": ' > "$T/c.json"
    run "$BIN/lrmoe-budget" --config "$T/c.json" --gpu-mem 1G
    assert_failure 1
    assert_output --regexp "^lrmoe-budget: $T/c.json: line 1: "
    # parallel sizes (qwen3-30b-a3b: 128 experts, 48 layers)
    q=(--preset qwen3-30b-a3b --gpu-mem 80G)
    run "$BIN/lrmoe-budget" "${q[@]}" --ep 3 --dp 3
    assert_failure 1
    assert_output "lrmoe-budget: budget: ep 3 does not divide the 128 experts"
    run "$BIN/lrmoe-budget" "${q[@]}" --pp 5
    assert_failure 1
    assert_output "lrmoe-budget: budget: pp 5 does not divide the 48 layers"
    run "$BIN/lrmoe-budget" "${q[@]}" --ep 8 --dp 4
    assert_failure 1
    assert_output --partial "budget: ep 8 does not divide dp*tp = 4"
    run "$BIN/lrmoe-budget" "${q[@]}" --dp 0
    assert_failure 2
    run "$BIN/lrmoe-budget" --preset qwen3-30b-a3b
    assert_failure 2
    assert_output --partial "--gpu-mem: the memory of one GPU is required"
    run "$BIN/lrmoe-budget" --gpu-mem 1G
    assert_failure 2
    run "$BIN/lrmoe-budget" "${q[@]}" --checkpoint some
    assert_failure 2
    run "$BIN/lrmoe-budget" --preset gpt-oss-20b --gpu-mem 1G
    assert_failure 1
    assert_output --partial "unknown budget preset 'gpt-oss-20b'"
}

@test "budget: a model that does not fit says by how much, prints the table, exits 1" {
    run --separate-stderr "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem 80G --dp 8 --ep 8 --tsv
    assert_failure 1
    printf '%s\n' "$output" > "$T/b.tsv"
    free=$(col "$T/b.tsv" free_bytes)
    [ "$free" -lt 0 ]
    [ "$(col "$T/b.tsv" fits)" = 0 ]
    [ "$(col "$T/b.tsv" hbm_bytes)" = 0 ]
    short=$(python3 -c "print(f'{-$free / 2**30:.3g} GiB')")
    [ "$stderr" = "lrmoe-budget: does not fit: $short short of the 80 GiB GPU ($(python3 -c "print(f'{(80*2**30 - $free) / 2**30:.3g} GiB')") used before any MoE layer state)" ] ||
        fail "stderr: $stderr (short $short)"
    # exactly what it needs fits (free 0), one byte less does not
    need=$((85899345920 - free))
    run "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem "$need" --dp 8 --ep 8 --tsv
    assert_success
    printf '%s\n' "$output" > "$T/c.tsv"
    [ "$(col "$T/c.tsv" free_bytes)" = 0 ]
    run "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem "$((need - 1))" --dp 8 --ep 8 --tsv
    assert_failure 1
}

@test "budget: the worked example of lrmoe-budget(1) and README.md is what the tool prints" {
    "$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem 80G --reserve 2G \
        --dp 8 --ep 8 --zero1 --seq 4096 --micro-batch 1 --checkpoint full > "$T/ex.txt"
    # README: the lines after the command in the fenced block
    awk '/^\$ lrmoe-budget --preset qwen3-30b-a3b/ { f = 1; getline; next }
         f && /^```/ { exit } f' "$TOP/README.md" > "$T/readme.txt"
    run diff "$T/ex.txt" "$T/readme.txt"
    assert_success
    # the man page: the lines after the command in the example (roff escapes undone)
    awk '/^\$ lrmoe\\-budget \\-\\-preset qwen3/ { f = 1; getline; next }
         f && /^\.EE/ { exit } f' "$TOP/man/man1/lrmoe-budget.1" |
        sed -e 's/\\-/-/g' -e 's/\\e/\\/g' > "$T/man.txt"
    run diff "$T/ex.txt" "$T/man.txt"
    assert_success
    [ "$(wc -l < "$T/ex.txt")" -eq 24 ]
}
