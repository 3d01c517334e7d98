#!/usr/bin/env bats
# The table of who writes each stream tensor (lib/producers.c) behind every
# "missing tensor" error: equal to lrmoe-stream(5)'s TENSORS table, and named
# by the tools' errors.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    L="$BATS_TEST_DIRNAME/../lib"
    T="$BATS_TEST_TMPDIR"
}

@test "producers: lib/producers.c names the same stage as lrmoe-stream(5) for every tensor of its table" {
    cat > "$T/p.c" <<'CEOF'
#include <stdio.h>
#include "lrmoe.h"
int main(void)
{
    const char *t, *p;
    for (int i = 0; (p = lrmoe_producer_at(i, &t)); i++) printf("%s\t%s\n", t, p);
    return 0;
}
CEOF
    cc -std=c11 -I"$L" -o "$T/p" "$T/p.c" "$L/producers.c"
    "$T/p" > "$T/table.tsv"
    # the man page's rows: tool <tab> tensor[, tensor] <tab> shape <tab> dtype
    sed -n '/^\.SH TENSORS/,/^\.TE/p' "$BATS_TEST_DIRNAME/../man/man5/lrmoe-stream.5" |
        awk -F'\t' 'NF >= 4 && $1 != "tool" { n = split($2, a, ", "); for (i = 1; i <= n; i++) print $1 "\t" a[i] }' \
        > "$T/man.tsv"
    [ "$(wc -l < "$T/man.tsv")" -ge 35 ]
    run python3 - "$T/table.tsv" "$T/man.tsv" <<'PY'
import sys
table = dict(l.rstrip("\n").split("\t") for l in open(sys.argv[1]))
want = {"gen": "the input", "weights": "the weights stream"}
bad = []
seen = set()
for line in open(sys.argv[2]):
    tool, tensor = line.rstrip("\n").split("\t")
    tool = tool.replace("\\-", "-")
    seen.add(tensor)
    prefix = want.get(tool, "lrmoe-" + tool.split()[0])
    if not table.get(tensor, "").startswith(prefix):
        bad.append(f"{tensor}: man page says {tool}, table says {table.get(tensor)}")
bad += [f"{t}: in the table, not in lrmoe-stream(5)" for t in table if t not in seen]
print("\n".join(bad) or "ok")
PY
    assert_output "ok"
}

@test "producers: a missing tensor names the stage that writes it" {
    [ -x "$BIN/lrmoe-gen" ] || skip "bin/lrmoe-gen not built"
    "$BIN/lrmoe-gen" --tokens 16 --experts 4 --topk 2 --hidden 8 --ffn 4 --no-compress -o "$T/g.lrm"
    run "$BIN/lrmoe-plan" -P 2 -o "$T/o.lrm" "$T/g.lrm"
    assert_failure 1
    assert_output --partial "missing tensor expert_load (lrmoe-route writes it: run that first)"
    run "$BIN/lrmoe-pack" -P 2 -o "$T/o.lrm" "$T/g.lrm"
    assert_failure 1
    assert_output --partial "writes it: run that first"
}
