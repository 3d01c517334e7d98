#!/usr/bin/env bats
# Last file of `make check SANITIZE=1` (tests/run.sh): the sanitizer reports
# the suite's tool runs left in $LRMOE_SAN_REPORTS, grouped by kind and by
# the first frame in lrmoe code. Fails when there is any.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

@test "sanitizers: no ASan, UBSan or LSan report from any tool run of the suite" {
    [ -n "${LRMOE_SAN_REPORTS:-}" ] || skip "not a SANITIZE=1 run (LRMOE_SAN_REPORTS unset)"
    run sh -c '
        cd "$1" || exit 0
        for f in *; do
            [ -f "$f" ] || continue
            tool=$(echo "$f" | sed "s/^[a-z]*\.\(.*\)\.[0-9]*$/\1/")
            kind=$(grep -m1 -oE "ERROR: [A-Za-z]+Sanitizer: [a-z-]+|runtime error: .*|ERROR: LeakSanitizer: [a-z ]+" "$f" | cut -c1-90)
            where=$(grep -m1 -oE "in [A-Za-z_0-9]+ [^ ]*(lib|src)/[a-z_0-9-]+\.c:[0-9]+" "$f" ||
                    grep -m1 -oE "^[^ ]*(lib|src)/[a-z_0-9-]+\.c:[0-9]+" "$f" || echo "?")
            echo "$tool: $kind: $where"
        done | sort | uniq -c | sort -rn' _ "$LRMOE_SAN_REPORTS"
    n=$(ls "$LRMOE_SAN_REPORTS" | wc -l)
    if [ "$n" -gt 0 ]; then
        echo "$n sanitizer report(s) in $LRMOE_SAN_REPORTS (count, tool, kind, first lrmoe frame):"
        echo "$output"
        false
    fi
}
