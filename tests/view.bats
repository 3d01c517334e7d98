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
    assert o["frame"] == i and o["attrs"] == attrs
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
# text: shortest decimal that rounds back to the same stored value
txt = open(f"{d}/v.txt").read()
for name, conv in (("hidden", lambda v: s.f32_to_bf16(np.float32(v).reshape(1))[0]),
                   ("half", lambda v: np.float16(v).view(np.uint16))):
    m = re.search(r"^  %s .*\n((?:    .*\n)+)" % name, txt, re.M)
    vals = " ".join(m.group(1).split()).split("]:", 1)[1].split()
    vals = [v for v in vals if v != "..."]
    want = t[name].ravel()[:40]
    assert len(vals) == len(want), (name, len(vals))
    for v, w in zip(vals, want):
        got = conv(float(v))
        bits = w if name == "hidden" else np.float16(w).view(np.uint16)
        if np.isnan(float(v)):
            assert v == "nan"
        else:
            assert got == bits, (name, v, w)
PY
}

@test "text layout: aligned columns, attributes, summary line" {
    run "$BIN/lrmoe-view" "$T/s.lrm"
    assert_success
    assert_line --index 0 --regexp '^frame 0  \(4 tensors, .*\)  layer=0 step=4 model="test model"$'
    assert_line --regexp '^  tensor +dtype +shape +size +min +max +mean +std +nan +inf$'
    assert_line --regexp '^  hidden +BF16 +\[33,17\] +1.1 KiB .* 2 +2$'
    assert_line --regexp '^  load +I64 +\[3\] +24 B +-3 +4611686018427387904 '
    assert_line --regexp '^  u64 +U64 +\[2\] +16 B +5 +18446744073709551615 '
    assert_line --regexp '^  empty +F32 +\[0,4\] +0 B +- +- +- +- +0 +0$'
    assert_line --regexp '^  allnan +F32 +\[3\] +12 B +- +- +- +- +3 +0$'
    assert_line --regexp '^  scalar +F64 +\[\] +8 B +7.25 +7.25 +7.25 +0 +0 +0$'
    assert_line --regexp '^# 3 frames, 17 tensors, .*; raw stream, clean end$'
    # every row of a table has its columns at the header's positions
    printf '%s\n' "${lines[@]}" | awk '
        /^  tensor / { hdr = $0; pd = index($0, "dtype"); ps = index($0, "shape"); pn = length($0); next }
        /^  [^ ]/ && hdr { if (substr($0, pd - 1, 1) != " " || substr($0, pd, 1) == " " ||
                                substr($0, ps, 1) == " " || length($0) != pn) { print "misaligned: " $0; bad = 1 } }
        /^frame / { hdr = "" }
        END { exit bad }'
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
    assert_line --regexp '^# 3 frames, 17 tensors, .*; zstd stream, clean end$'
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
