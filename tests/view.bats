#!/usr/bin/env bats
# lrmoe-view: statistics checked against NumPy, values against the exact
# stored numbers, layout, selection and failures.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
bats_require_minimum_version 1.5.0

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    export PYTHONPATH="$H"
    T="$BATS_TEST_TMPDIR"
    # three frames written by the independent Python writer: BF16 with
    # NaN/Inf, F32, F16, F64, integers of every width, BOOL, empty, scalar.
    python3 - "$T/s.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
rng = np.random.default_rng(5)
h = (rng.standard_normal((33, 17)) * 3 + 0.5).astype(np.float32)
h[0, :3] = [np.nan, np.inf, -np.inf]; h[5, 5] = np.nan
f0 = ({"hidden": s.f32_to_bf16(h),
       "router_logits": rng.standard_normal((33, 8)).astype(np.float32),
       "half": rng.standard_normal((4, 4)).astype(np.float16),
       "dbl": rng.standard_normal(10) * 1e3},
      {"layer": 0, "step": 4, "model": "test model"}, {"hidden": "BF16"})
f1 = ({"ids": rng.integers(-5, 100, (7, 3), dtype=np.int32),
       "load": np.array([2**62, -3, 7], np.int64),
       "u64": np.array([2**64 - 1, 5], np.uint64),
       "u8": np.array([0, 200, 255], np.uint8), "i8": np.array([-128, 3], np.int8),
       "u16": np.array([65535, 1], np.uint16), "i16": np.array([-300, 2], np.int16),
       "u32": np.array([4000000000, 1], np.uint32),
       "keep": np.array([1, 0, 1, 1], np.uint8),
       "empty": np.zeros((0, 4), np.float32),
       "allnan": np.full(3, np.nan, np.float32),
       "scalar": np.array(7.25, np.float64)},
      {"layer": 1}, {"keep": "BOOL"})
f2 = ({"big": (rng.standard_normal(300001) * 2 + 1e4).astype(np.float32)}, {"layer": 2})
s.write_stream(sys.argv[1], [f0, f1, f2])
PY
}

@test "help and version" {
    run "$BIN/lrmoe-view" --help
    assert_success
    assert_output --partial "Usage: lrmoe-view"
    run "$BIN/lrmoe-view" --version
    assert_output --regexp "^lrmoe-view \(lrmoe\) [0-9]"
    run "$BIN/lrmoe-view" --frame x "$T/s.lrm"
    assert_failure 2
}

@test "--json statistics match NumPy (finite values; NaN and Inf counted)" {
    "$BIN/lrmoe-view" --json "$T/s.lrm" > "$T/v.json"
    python3 - "$T" <<'PY'
import sys, json, numpy as np, lrmoe_stream as s
d = sys.argv[1]
frames = s.read_stream(f"{d}/s.lrm", with_dtypes=True)
lines = open(f"{d}/v.json").read().splitlines()
assert len(lines) == len(frames) == 3
for i, (line, (t, attrs, dt)) in enumerate(zip(lines, frames)):
    o = json.loads(line)
    # numeric attributes are JSON numbers (see the --json attributes test)
    assert o["frame"] == i and {k: str(v) for k, v in o["attrs"].items()} == attrs
    assert [e["name"] for e in o["tensors"]] == list(t)
    for e in o["tensors"]:
        a = t[e["name"]]
        assert e["dtype"] == dt[e["name"]] and e["shape"] == list(a.shape)
        assert e["bytes"] == a.nbytes
        if dt[e["name"]] == "BF16":
            a = s.bf16_to_f32(a)
        exact_int = a.dtype.kind in "iu"
        x = a.astype(np.float64).ravel()
        fin = x[np.isfinite(x)]
        assert e["nan"] == int(np.isnan(x).sum()), e
        assert e["inf"] == int(np.isinf(x).sum()), e
        if fin.size == 0:
            assert e["min"] is None and e["mean"] is None, e
            continue
        if exact_int:  # exact, even beyond 2**53 (U64 above 2**63-1: a JSON real)
            for k, v in (("min", int(a.min())), ("max", int(a.max()))):
                assert e[k] == (float(v) if v > 2**63 - 1 else v) and type(e[k]) is type(float(v) if v > 2**63 - 1 else v), e
        else:
            assert e["min"] == fin.min() and e["max"] == fin.max(), e
        mean, std = fin.mean(), fin.std()
        tol = 1e-12 * max(1.0, abs(mean), std)
        assert abs(e["mean"] - mean) <= tol, (e, mean)
        assert abs(e["std"] - std) <= 1e-9 * max(std, 1e-300) + tol, (e, std)
PY
}

@test "--values N prints the exact stored values (text and JSON)" {
    "$BIN/lrmoe-view" --json --values 40 -F 0 -T hidden -T half "$T/s.lrm" > "$T/v.json"
    "$BIN/lrmoe-view" --values 40 -F 0 -T hidden -T half "$T/s.lrm" > "$T/v.txt"
    python3 - "$T" <<'PY'
import sys, json, re, numpy as np, lrmoe_stream as s
d = sys.argv[1]
(t, a, dt), = s.read_stream(f"{d}/s.lrm", with_dtypes=True)[:1]
ref = {"hidden": s.bf16_to_f32(t["hidden"]).ravel()[:40], "half": t["half"].ravel()[:16]}
o = json.loads(open(f"{d}/v.json").read())
def num(v):
    return float(v) if isinstance(v, str) else v
for e in o["tensors"]:
    got = np.array([num(v) for v in e["values"]], dtype=np.float64)
    r = ref[e["name"]].astype(np.float64)
    assert got.shape == r.shape
    assert np.array_equal(got, r, equal_nan=True), e["name"]
# text: rows of the last dimension (the first 40 rows of the first 40
# values), shortest decimals that round back to the same stored value
txt = open(f"{d}/v.txt").read()
for name, conv in (("hidden", lambda v: s.f32_to_bf16(np.float32(v).reshape(1))[0]),
                   ("half", lambda v: np.float16(v).view(np.uint16))):
    m = re.search(r"^  %s .*\n((?:    .*\n)+)" % name, txt, re.M)
    rows = re.split(r"\n    (?=\[)", m.group(1).strip())
    want = t[name][:40, :40]
    assert len(rows) == want.shape[0], (name, len(rows))
    for i, (row, w) in enumerate(zip(rows, want)):
        head, vals = row.split("]:", 1)
        assert head == "[%d" % i, head
        vals = vals.split()
        assert len(vals) == len(w), (name, i, len(vals))
        for v, x in zip(vals, w):
            bits = x if name == "hidden" else np.float16(x).view(np.uint16)
            if np.isnan(float(v)):
                assert v == "nan"
            else:
                assert conv(float(v)) == bits, (name, v, x)
PY
}

@test "text layout: aligned columns, attributes, summary line" {
    run "$BIN/lrmoe-view" "$T/s.lrm"
    assert_success
    assert_line --index 0 --regexp '^frame 0  \(4 tensors, .*; 3 attributes\)$'
    assert_line --index 1 '  layer=0'
    assert_line --index 2 '  step=4'
    assert_line --index 3 '  model="test model"'
    assert_line --regexp '^  tensor +dtype +shape +size +min +max +mean +std +nan +inf$'
    assert_line --regexp '^  hidden +BF16 +\[33,17\] +1.1 KiB .* 2 +2$'
    assert_line --regexp '^  load +I64 +\[3\] +24 B +-3 +4611686018427387904 '
    assert_line --regexp '^  u64 +U64 +\[2\] +16 B +5 +18446744073709551615 '
    assert_line --regexp '^  empty +F32 +\[0,4\] +0 B +- +- +- +- +0 +0$'
    assert_line --regexp '^  allnan +F32 +\[3\] +12 B +- +- +- +- +3 +0$'
    assert_line --regexp '^  scalar +F64 +\[\] +8 B +7.25 +7.25 +7.25 +0 +0 +0$'
    assert_line --regexp '^# 3 frames, 17 tensors, .*; raw stream, clean end; no digest records$'
    # every row of a table has its columns at the header's positions
    printf '%s\n' "${lines[@]}" | awk '
        /^  tensor / { hdr = $0; pd = index($0, "dtype"); ps = index($0, "shape"); pn = length($0); next }
        /^  [^ ]/ && hdr { if (substr($0, pd - 1, 1) != " " || substr($0, pd, 1) == " " ||
                                substr($0, ps, 1) == " " || length($0) != pn) { print "misaligned: " $0; bad = 1 } }
        /^frame / { hdr = "" }
        END { exit bad }'
}

@test "the summary counts the frames' digest records by kind (lrmoe_reader_digest)" {
    # s.lrm's three frames with each kind of record, spliced into one stream
    "$BIN/lrmoe-cat" --no-compress -o "$T/c.lrm" "$T/s.lrm"
    "$BIN/lrmoe-cat" --digests tensors --no-compress -o "$T/t.lrm" "$T/s.lrm"
    python3 -c "
import struct, lrmoe_stream as s
s.write_stream('$T/x.lrm', s.read_stream('$T/s.lrm', True), digests='xxh')
def frames(p):
    b, pos, out = open(p, 'rb').read(), 0, []
    while b[pos:pos + 8] != s.TRAILER:
        e = s.decode_frame(b, pos)[3]; out.append(b[pos:e]); pos = e
    return out
c, x, t = frames('$T/c.lrm'), frames('$T/x.lrm'), frames('$T/t.lrm')
open('$T/mix.lrm', 'wb').write(t[0] + c[1] + x[2] + t[2] + c[0] + s.TRAILER + struct.pack('<Q', 5))"
    run "$BIN/lrmoe-view" --no-stats "$T/mix.lrm"
    assert_success
    assert_line --regexp '^# 5 frames, .*; raw stream, clean end; digest records: 2 CRC-64, 1 XXH64, 2 CRC-64 by parts$'
    run "$BIN/lrmoe-view" --no-stats "$T/t.lrm"
    assert_line --regexp '; digest records: 3 CRC-64 by parts$'
    run "$BIN/lrmoe-view" --no-stats -F 0 "$T/t.lrm"
    assert_line --regexp '^# 1 frame read, .*reading stopped after the last selected frame; digest records: 1 CRC-64 by parts$'
}

@test "--frame, --tensor and --no-stats select what is shown" {
    run "$BIN/lrmoe-view" -F 1 -T load -T ids "$T/s.lrm"
    assert_success
    refute_line --partial "frame 0"
    assert_line --regexp '^frame 1 '
    assert_line --regexp '^  ids '
    refute_line --regexp '^  u8 '
    assert_line --partial "reading stopped after the last selected frame"
    run "$BIN/lrmoe-view" --frame 0-1 --json --no-stats "$T/s.lrm"
    assert_equal "${#lines[@]}" 2
    refute_output --partial '"mean"'
    run "$BIN/lrmoe-view" -F 9 "$T/s.lrm"
    assert_failure 1
    assert_line --regexp '^lrmoe-view: --frame 9: the stream has 3 frames$'
    run "$BIN/lrmoe-view" -T nosuch "$T/s.lrm"
    assert_failure 1
    assert_line --regexp '^lrmoe-view: --tensor nosuch: '
}

@test "reads stdin and zstd streams; several files get headers" {
    zstd -q -c "$T/s.lrm" > "$T/z.lrm"
    run sh -c "'$BIN/lrmoe-view' --no-stats < '$T/z.lrm'"
    assert_success
    assert_line --regexp '^# 3 frames, 17 tensors, .*; zstd stream, clean end; no digest records$'
    run "$BIN/lrmoe-view" --no-stats "$T/s.lrm" "$T/z.lrm"
    assert_line "==> $T/s.lrm <=="
    assert_line "==> $T/z.lrm <=="
}

@test "bad streams: one error line, exit 1; a full stdout fails too" {
    size=$(stat -c %s "$T/s.lrm")
    head -c $((size - 16)) "$T/s.lrm" > "$T/notrailer.lrm"
    head -c $((size / 2)) "$T/s.lrm" > "$T/half.lrm"
    printf 'not a stream at all' > "$T/garbage.lrm"
    : > "$T/empty.lrm"
    for f in notrailer half garbage empty; do
        run --separate-stderr "$BIN/lrmoe-view" "$T/$f.lrm"
        assert_failure 1
        [ "$(printf '%s\n' "$stderr" | wc -l)" -eq 1 ]
        [[ "$stderr" =~ ^lrmoe-view:\ .+:\ .+ ]]
    done
    run "$BIN/lrmoe-view" "$T/nonexistent.lrm"
    assert_failure 1
    run sh -c "'$BIN/lrmoe-view' '$T/s.lrm' > /dev/full"
    assert_failure 1
    assert_output --partial "lrmoe-view: "
}

@test "a full disk names the write error, text and --json, small and large output" {
    python3 - "$T/wide.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"x%d" % i: np.zeros(1, np.float32) for i in range(3000)}, {})])
PY
    for f in s wide; do
        for opt in "" --json; do
            run --separate-stderr sh -c "'$BIN/lrmoe-view' $opt '$T/$f.lrm' > /dev/full"
            assert_failure 1
            [ "$stderr" = "lrmoe-view: write error on stdout: No space left on device" ]
        done
    done
}

@test "standard input named twice: exit 2 before anything is read" {
    run --separate-stderr "$BIN/lrmoe-view" - - < "$T/s.lrm"
    assert_failure 2
    [ "$stderr" = "lrmoe-view: -: standard input named twice (it can be read only once)" ]
    [ -z "$output" ]
}

@test "attributes: one per line, unprefixed first, then grouped by prefix in order of first appearance" {
    python3 - "$T/a.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
attrs = {"plan.rho": "0.9", "layer": "3", "route.topk": "8", "plan.planner": "lrmoe",
         "step": "7", "exec.ranks": "4", "route.router": "softmax", "plan.note": "two words"}
s.write_stream(sys.argv[1], [({"x": np.zeros(2, np.float32)}, attrs)])
PY
    run "$BIN/lrmoe-view" --no-stats "$T/a.lrm"
    assert_success
    want=('frame 0  (1 tensor, 8 B; 8 attributes)' '  layer=3' '  step=7' '  plan.rho=0.9'
          '  plan.planner=lrmoe' '  plan.note="two words"' '  route.topk=8' '  route.router=softmax'
          '  exec.ranks=4')
    for i in "${!want[@]}"; do
        assert_line --index "$i" "${want[$i]}"
    done
    assert_line --index 9 --regexp '^  tensor +dtype'
}

@test "--values: matrices and higher as rows of the last dimension, saying what was left out" {
    python3 - "$T/m.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"m": np.arange(50, dtype=np.int32).reshape(5, 10),
                               "c": np.arange(24, dtype=np.int64).reshape(2, 3, 4),
                               "v": np.arange(7, dtype=np.int16),
                               "e": np.zeros((3, 0), np.float32)}, {})])
PY
    run "$BIN/lrmoe-view" --no-stats --values 3 "$T/m.lrm"
    assert_success
    assert_line '    [0]: 0 1 2 ... (+7 more)'
    assert_line '    [2]: 20 21 22 ... (+7 more)'
    refute_line --partial '    [3]:'
    assert_line '    ... (+2 more rows of 10)'
    assert_line '    [0,0]: 0 1 2 ... (+1 more)'
    assert_line '    [0,2]: 8 9 10 ... (+1 more)'
    assert_line '    ... (+3 more rows of 4)'
    assert_line '    values[0:3]: 0 1 2 ... (+4 more)'
    assert_line '    [0]:'
    run "$BIN/lrmoe-view" --no-stats --values 10 -T m "$T/m.lrm"
    assert_line '    [4]: 40 41 42 43 44 45 46 47 48 49'
    refute_output --partial 'more'
}

# a pair of streams that differ in known places
mk_pair() {
    python3 - "$T" <<'PY'
import sys, numpy as np, lrmoe_stream as s
d = sys.argv[1]
x = np.arange(12, dtype=np.float32).reshape(3, 4)
y = x.copy(); y[1, 2] = 6.5; y[2, 3] = np.nan; y[2, 0] = 7.0   # 6 -> 6.5, 11 -> nan, 8 -> 7
ids = np.array([1, 2, 3], np.int32)
a = [({"x": x, "ids": ids, "only_a": np.zeros(2, np.uint8)}, {"layer": 0, "k": "1"}),
     ({"x": x}, {"layer": 1}), ({"x": x}, {"layer": 2})]
b = [({"ids": ids.astype(np.int64), "x": y, "only_b": np.zeros((2, 2), np.float32)},
      {"layer": 0, "k": "2", "new": "yes"}),
     ({"x": x.reshape(4, 3)}, {"layer": 1})]
s.write_stream(f"{d}/a.lrm", a)
s.write_stream(f"{d}/b.lrm", b)
s.write_stream(f"{d}/a2.lrm", a[:2])
PY
}

@test "--diff: per tensor count, max abs, max rel, first index; missing and extra tensors and attributes; exit 1" {
    mk_pair
    run --separate-stderr "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/b.lrm"
    assert_failure 1
    [ -z "$stderr" ]
    want=("frame 0: attribute k: 1 vs 2"
          "frame 0: attribute new only in $T/b.lrm: yes"
          "frame 0: tensor x: 3 of 12 values differ, max abs 1, max rel 0.142857, 1 NaN on one side; first at [1,2]: 6 vs 6.5"
          "frame 0: tensor ids: dtype I32 vs I64; the values are the same as numbers"
          "frame 0: tensor only_a only in $T/a.lrm (U8 [2])"
          "frame 0: tensor only_b only in $T/b.lrm (F32 [2,2])"
          "frame 1: tensor x: shape [3,4] vs [4,3] (values not compared)"
          "frames 2 on: 1 only in $T/a.lrm ($T/b.lrm ends after 2 frames)"
          "# 2 frames compared: 2 attribute and 5 tensor differences, 1 frame in one stream only")
    for i in "${!want[@]}"; do
        assert_line --index "$i" "${want[$i]}"
    done
    assert_equal "${#lines[@]}" "${#want[@]}"
}

@test "--diff: the same stream (raw vs zstd) is exit 0; tolerances; --frame and --tensor select; trouble is exit 2" {
    mk_pair
    "$BIN/lrmoe-cat" -o "$T/az.lrm" "$T/a.lrm"
    run "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/az.lrm"
    assert_success
    assert_output "# 3 frames compared: the same"
    # only frame 0's x: 6 vs 6.5 and 8 vs 7 are within atol 1, the NaN never is;
    # so is the numeric attribute k, 1 vs 2
    run "$BIN/lrmoe-view" --diff --frame 0 --tensor x --atol 1 "$T/a.lrm" "$T/b.lrm"
    assert_failure 1
    assert_line --index 0 "frame 0: attribute new only in $T/b.lrm: yes"
    assert_line --index 1 "frame 0: tensor x: 1 of 12 values differ, 1 NaN on one side; first at [2,3]: 11 vs nan"
    # rtol is against B: |6-6.5|/6.5 = 0.077, |8-7|/7 = 0.143
    run "$BIN/lrmoe-view" --diff --frame 0 --tensor x --rtol 0.1 "$T/a.lrm" "$T/b.lrm"
    assert_line --index 2 --partial "tensor x: 2 of 12 values differ, max abs 1, max rel 0.142857"
    run "$BIN/lrmoe-view" --diff --frame 0-1 "$T/a2.lrm" "$T/a.lrm"
    assert_success
    assert_output "# 2 frames compared: the same"
    run "$BIN/lrmoe-view" --diff "$T/a2.lrm" "$T/a.lrm"
    assert_failure 1
    assert_line "frames 2 on: 1 only in $T/a.lrm ($T/a2.lrm ends after 2 frames)"
    # trouble: exit 2 (cmp's convention), also for usage
    head -c 100 "$T/a.lrm" > "$T/cut.lrm"
    run --separate-stderr "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/cut.lrm"
    assert_failure 2
    [[ "$stderr" == "lrmoe-view: $T/cut.lrm: frame 0: truncated"* ]]
    run "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/nonexistent.lrm"
    assert_failure 2
    run "$BIN/lrmoe-view" --diff "$T/a.lrm"
    assert_failure 2
    assert_output --partial "--diff compares two streams"
    run "$BIN/lrmoe-view" --diff --tensor nosuch "$T/a.lrm" "$T/a.lrm"
    assert_failure 2
    run "$BIN/lrmoe-view" --diff --atol -1 "$T/a.lrm" "$T/a.lrm"
    assert_failure 2
}

@test "lrmoe_diff_tensor: max abs/rel, first index, NaN, integers beyond 2^53 (the library's pure core)" {
    L="$BATS_TEST_DIRNAME/../lib"
    cat > "$T/d.c" <<'C'
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "diff.h"
static lrmoe_tensor_t mk(lrmoe_dtype_t dt, void *p, int64_t n)
{
    lrmoe_tensor_t t = {"t", dt, 1, {n}, (size_t)n * lrmoe_dtype_size(dt), p};
    return t;
}
int main(void)
{
    float a[5] = {1, -0.0f, NAN, INFINITY, 4}, b[5] = {1, 0.0f, NAN, INFINITY, 0};
    lrmoe_tensor_t ta = mk(LRMOE_F32, a, 5), tb = mk(LRMOE_F32, b, 5);
    lrmoe_diff_t d;
    lrmoe_diff_tensor(&ta, &tb, 0, 0, &d);
    printf("%lld %lld %lld %g %g\n", (long long)d.ndiff, (long long)d.first, (long long)d.nan_only, d.max_abs, d.max_rel);
    b[4] = 4; a[0] = NAN;
    lrmoe_diff_tensor(&ta, &tb, 0, 0, &d);
    printf("%lld %lld %lld\n", (long long)d.ndiff, (long long)d.first, (long long)d.nan_only);
    long long x[2] = {(1LL << 62) + 1, -5}, y[2] = {1LL << 62, -5};
    lrmoe_tensor_t xa = mk(LRMOE_I64, x, 2), ya = mk(LRMOE_I64, y, 2);
    lrmoe_diff_tensor(&xa, &ya, 0, 0, &d);
    printf("%lld %lld %g\n", (long long)d.ndiff, (long long)d.first, d.max_abs);
    return 0;
}
C
    cc -std=c11 -O2 -I"$L" -o "$T/d" "$T/d.c" "$L/diff.c" "$L/dtype.c" "$L/error.c" "$L/frame.c" "$L/producers.c" -lm
    run "$T/d"
    assert_success
    assert_line --index 0 "1 4 0 4 inf"
    assert_line --index 1 "1 0 1"
    assert_line --index 2 "1 0 1"
}

@test "--diff: attributes that are both numbers compare as numbers (1 is 1.000000, with --atol/--rtol), others as text" {
    python3 - "$T" <<'PY'
import sys, numpy as np, lrmoe_stream as s
d = sys.argv[1]
x = np.zeros(2, np.float32)
a = {"one": "1", "sci": "1e3", "neg": "-0", "inf": "inf", "half": "2", "big": "9007199254740993",
     "word": "abc", "hex": "0x10", "pad": "5", "planner": "lrmoe"}
b = {"one": "1.000000", "sci": "1000", "neg": "0", "inf": "inf", "half": "2.5",
     "big": "9007199254740992", "word": "abd", "hex": "16", "pad": " 5", "planner": "lrmoe"}
s.write_stream(f"{d}/na.lrm", [({"x": x}, a)])
s.write_stream(f"{d}/nb.lrm", [({"x": x}, b)])
PY
    run --separate-stderr "$BIN/lrmoe-view" --diff "$T/na.lrm" "$T/nb.lrm"
    assert_failure 1
    # the same as numbers: one, sci, neg, inf; different: half, big (exact as
    # integers although equal as doubles), and text: word, hex, pad
    want=("frame 0: attribute half: 2 vs 2.5"
          "frame 0: attribute big: 9007199254740993 vs 9007199254740992"
          "frame 0: attribute word: abc vs abd"
          "frame 0: attribute hex: 0x10 vs 16"
          "frame 0: attribute pad: 5 vs \" 5\""
          "# 1 frame compared: 5 attribute and 0 tensor differences")
    for i in "${!want[@]}"; do
        assert_line --index "$i" "${want[$i]}"
    done
    assert_equal "${#lines[@]}" "${#want[@]}"
    # tolerances apply to numeric attributes as to values (B is the reference)
    run "$BIN/lrmoe-view" --diff --atol 0.5 "$T/na.lrm" "$T/nb.lrm"
    refute_line --partial "attribute half"
    assert_line --partial "attribute big"
    assert_line --partial "attribute word"
    run "$BIN/lrmoe-view" --diff --rtol 0.19 "$T/na.lrm" "$T/nb.lrm"
    assert_line "frame 0: attribute half: 2 vs 2.5"
    run "$BIN/lrmoe-view" --diff --rtol 0.2 "$T/na.lrm" "$T/nb.lrm"
    refute_line --partial "attribute half"
    refute_line --partial "attribute big" # 1 / 2^53 is within rtol 0.2
}

@test "--json: numeric attributes are JSON numbers; words, lists, per-rank lists of one, nan, hex and ids stay strings" {
    python3 - "$T/a.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
a = {"layer": "3", "plan.rho": "1.000000", "neg": "-2.5e-3", "big": "12345678901234567890",
     "model": "qwen3-30b-a3b", "empty": "", "nan": "nan", "inf": "inf", "hex": "0x10",
     "plus": "+1", "lead": "007", "dot": "1.", "list": "1,2,3", "gen.hot": "7",
     "pack.rank_rows": "12", "exec.backward.total_s": "0.5", "exec.backward.critical_s": "0.5",
     "exec.forward.wall_s": "2", "zero": "0", "e": "1e5"}
s.write_stream(sys.argv[1], [({"x": np.zeros(1, np.float32)}, a)])
PY
    "$BIN/lrmoe-view" --json --no-stats "$T/a.lrm" > "$T/a.json"
    run python3 - "$T/a.json" <<'PY'
import json, sys
a = json.loads(open(sys.argv[1]).read())["attrs"]
num = {"layer": 3, "plan.rho": 1.0, "neg": -2.5e-3,
       "exec.backward.critical_s": 0.5, "exec.forward.wall_s": 2, "zero": 0, "e": 1e5}
for k, v in num.items():
    assert a[k] == v and not isinstance(a[k], str), (k, a[k])
assert isinstance(a["layer"], int) and isinstance(a["plan.rho"], float)
for k in ("model", "empty", "nan", "inf", "hex", "plus", "lead", "dot", "list", "gen.hot", "big",
          "pack.rank_rows", "exec.backward.total_s"):
    assert isinstance(a[k], str), (k, a[k])
# what the benches do with them keeps working
float(a["plan.rho"]), float(a["exec.backward.critical_s"]), a["exec.backward.total_s"].split(",")
print("ok")
PY
    assert_success
    assert_output ok
}
