#!/usr/bin/env bats
# The stream reader every tool shares (lib/stream.c): empty input names the
# failed stage instead of "frame 0: truncated"; a plain safetensors file is
# one frame on every reader, bounded by its size; a raw stream cut after its
# first frame is still an error.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
bats_require_minimum_version 1.5.0

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    export PYTHONPATH="$H"
    T="$BATS_TEST_TMPDIR"
}

need_safetensors() {
    python3 -c 'import safetensors' 2>/dev/null ||
        skip "Python package safetensors missing (pip install safetensors)"
}

# every tool that reads a stream, with the options it needs to get that far
readers() {
    cat <<EOF
lrmoe-route
lrmoe-plan --ranks 4
lrmoe-score
lrmoe-pack
lrmoe-exec --phase forward --weights $T/w.lrm
lrmoe-export --dir $T/ex
lrmoe-sim --ranks 4
lrmoe-view
lrmoe-cat
EOF
}

@test "empty input on every reader: 'empty input: the previous stage failed', not frame 0" {
    "$BIN/lrmoe-gen" --tokens 16 --steps 1 --weights "$T/w.lrm" -o /dev/null
    n=0
    while read -r tool args; do
        # nothing at all (the stage before died before its first byte)
        run --separate-stderr sh -c ": | '$BIN/$tool' $args > '$T/out'"
        assert_failure 1
        [ "$stderr" = "$tool: <stdin>: empty input (no frame, no trailer): the previous stage failed" ] ||
            fail "$tool (nothing): $stderr"
        # a compressed stream without a frame or trailer (what a stage that
        # fails on its first frame leaves: an ended zstd frame)
        run --separate-stderr sh -c "'$BIN/lrmoe-plan' --ranks 4 --hbm 1 < '$T/w.lrm' 2>/dev/null |
                                     '$BIN/$tool' $args > '$T/out'"
        assert_failure 1
        [ "$stderr" = "$tool: <stdin>: empty input (no frame, no trailer): the previous stage failed" ] ||
            fail "$tool (empty zstd): $stderr"
        n=$((n + 1))
    done < <(readers)
    [ "$n" -eq 9 ]
    # named files say what they are
    : > "$T/empty.lrm"
    run "$BIN/lrmoe-cat" -o /dev/null "$T/empty.lrm"
    assert_failure 1
    assert_output "lrmoe-cat: $T/empty.lrm: empty file (no frame, no trailer)"
    "$BIN/lrmoe-plan" --ranks 4 --hbm 1 -o "$T/failed.lrm" "$T/w.lrm" 2>/dev/null || true
    run "$BIN/lrmoe-view" "$T/failed.lrm"
    assert_failure 1
    assert_output "lrmoe-view: $T/failed.lrm: empty stream (no frame, no trailer): the stage that wrote it failed"
    run "$BIN/lrmoe-route" --weights "$T/empty.lrm" -o /dev/null "$T/w.lrm"
    assert_failure 1
    assert_output --partial "$T/empty.lrm: empty file"
}

@test "a plain safetensors file written by Python's safetensors is one frame on every reader" {
    need_safetensors
    python3 - "$T" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(3)
save_file({"hidden": rng.standard_normal((32, 16)).astype(np.float32),
           "router_logits": rng.standard_normal((32, 8)).astype(np.float32),
           "grad_output": rng.standard_normal((32, 16)).astype(np.float32)},
          f"{sys.argv[1]}/x.safetensors", metadata={"layer": "0", "topk": "2"})
PY
    run "$BIN/lrmoe-view" "$T/x.safetensors"
    assert_success
    assert_line --regexp '^  hidden +F32 +\[32,16\] '
    assert_line '  layer=0'
    assert_line --regexp '^# 1 frame, 3 tensors, .*; plain safetensors file, one frame, no trailer$'
    # the filters take it as a one-frame stream and write a proper stream
    "$BIN/lrmoe-route" -o "$T/r.lrm" "$T/x.safetensors"
    run "$BIN/lrmoe-view" --no-stats "$T/r.lrm"
    assert_line --regexp '^  topk_ids +I32 +\[32,2\]'
    assert_line --regexp '^# 1 frame, .*; zstd stream, clean end; digest records: 1 CRC-64$'
    "$BIN/lrmoe-cat" -o "$T/c.lrm" "$T/x.safetensors"
    run "$BIN/lrmoe-view" --diff "$T/x.safetensors" "$T/c.lrm"
    assert_success
    run "$BIN/lrmoe-export" --dir "$T/ex" "$T/x.safetensors"
    assert_success
    run "$BIN/lrmoe-sim" --ranks 4 --ffn 64 "$T/r.lrm"
    assert_success
    # standard input redirected from the file is the file
    run sh -c "'$BIN/lrmoe-view' --no-stats < '$T/x.safetensors'"
    assert_failure 1   # no name, so no *.safetensors: the hint says what to do
    assert_output --partial "<stdin>: frame 1: truncated: the stream ends without a trailer after one raw frame (if it is a plain safetensors file: readers take one as a frame when it is named *.safetensors, and lrmoe-import -o x.lrm FILE converts it)"
    # through a pipe: refused the same way
    run sh -c "cat '$T/x.safetensors' | '$BIN/lrmoe-route' > /dev/null"
    assert_failure 1
    assert_output --partial "lrmoe-import -o x.lrm FILE converts it"
}

@test "a hand-written safetensors file: trailing bytes, a short file and a header that overstates the data are errors" {
    python3 - "$T" <<'PY'
import sys, json, struct
d = sys.argv[1]
def st(hd, data):
    h = json.dumps(hd).encode(); h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data
ok = st({"__metadata__": {"layer": "1"},
         "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
        struct.pack("<4f", 1, 2, 3, 4))
open(f"{d}/ok.safetensors", "wb").write(ok)
open(f"{d}/ok.lrm", "wb").write(ok)                        # the same bytes, a stream's name
open(f"{d}/junk.safetensors", "wb").write(ok + b"junk")    # trailing garbage
open(f"{d}/two.safetensors", "wb").write(ok + ok)          # two frames, no trailer
open(f"{d}/short.safetensors", "wb").write(ok[:-3])
big = st({"x": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4 << 40]}}, b"")
open(f"{d}/big.safetensors", "wb").write(big)
PY
    run "$BIN/lrmoe-view" --values 4 "$T/ok.safetensors"
    assert_success
    assert_line '    [0]: 1 2'
    assert_line '    [1]: 3 4'
    run "$BIN/lrmoe-view" "$T/junk.safetensors"
    assert_failure 1
    assert_output --partial "$T/junk.safetensors: frame 1: truncated"
    # two blobs back to back are a stream without its trailer, not a file
    run "$BIN/lrmoe-view" "$T/two.safetensors"
    assert_failure 1
    assert_output --partial "$T/two.safetensors: frame 2: truncated: the stream ends without a trailer"
    run "$BIN/lrmoe-cat" -o /dev/null "$T/short.safetensors"
    assert_failure 1
    assert_output "lrmoe-cat: $T/short.safetensors: frame 0: truncated: the tensors need 16 bytes of data, the input holds 13"
    # 4 TiB declared in a 100-byte file: refused before anything is allocated
    run "$BIN/lrmoe-cat" -o /dev/null "$T/big.safetensors"
    assert_failure 1
    assert_output --partial "frame 0: truncated: the tensors need 4398046511104 bytes of data, the input holds 0"
    # byte for byte a raw stream cut after frame 0: only the name tells them apart
    run "$BIN/lrmoe-cat" -o /dev/null "$T/ok.lrm"
    assert_failure 1
    assert_output --partial "$T/ok.lrm: frame 1: truncated: the stream ends without a trailer after one raw frame"
    # compressed, it is never a plain file
    zstd -q -c "$T/ok.safetensors" > "$T/z.safetensors"
    run "$BIN/lrmoe-cat" -o /dev/null "$T/z.safetensors"
    assert_failure 1
    assert_output --partial "frame 1: truncated: the stream ends without a trailer"
}

@test "lrmoe.Reader (Python) yields the frames before a flipped bit and raises at the frame that holds it" {
    [ -z "${SANITIZE:-}" ] || skip "loads the plain liblrmoe into python3 (tests/run.sh)"
    TOP="$BATS_TEST_DIRNAME/.."
    python3 -c "
import numpy as np, lrmoe_stream as s
r = np.random.default_rng(3)
s.write_stream('$T/src.raw', [({'x': r.standard_normal((32, 16)).astype(np.float32)}, {'step': i}) for i in range(3)])"
    "$BIN/lrmoe-cat" --no-compress -o "$T/g.raw" "$T/src.raw"
    "$BIN/lrmoe-cat" -o "$T/g.zst" "$T/src.raw"
    # the last data byte of frame 1
    off=$(python3 -c "
import lrmoe_stream as s
b = open('$T/g.raw', 'rb').read(); pos = 0
for i in range(2): pos = s.decode_frame(b, pos)[3]
print(pos - 1)")
    python3 -c "import sys; f = open('$T/g.raw', 'r+b'); f.seek($off); c = f.read(1); f.seek($off); f.write(bytes([c[0] ^ 0x10]))"
    for f in g.raw g.zst; do
        run env LRMOE_LIBRARY="$TOP/build/liblrmoe.so.2" PYTHONPATH="$TOP/lib/python" python3 -c "
import lrmoe
got = []
try:
    for fr in lrmoe.Reader('$T/$f'): got.append(fr.attrs['step'])
    print('no error', got)
except lrmoe.Error as e:
    print('steps', got, 'then', e)"
        assert_success
        if [ $f = g.raw ]; then
            assert_output --regexp "^steps \['0'\] then .*g.raw: frame 1: digest mismatch"
        else
            assert_output "no error ['0', '1', '2']"
        fi
    done
}
