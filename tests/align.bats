#!/usr/bin/env bats
# Tensor data alignment in streams (lrmoe-stream(5), "bytes 8..8+N-1"): the
# writer pads each frame's JSON header so the frame's data starts on a 64-byte
# boundary of the uncompressed stream; older 8-aligned files still read, are
# mapped as weights and give the same bits; the safetensors package reads
# what lrmoe writes.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    HELP="$BATS_TEST_DIRNAME/helpers"
    REF="$HELP/exec_ref.py"
    D="$BATS_TEST_TMPDIR"
}

pyedit() {
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *; import numpy as np; $1"
}

# For the stream $1 (raw or zstd): "frames F data_off A tensors T off B":
# F frames, A of them whose data does not start on a 64-byte boundary of
# the stream (S + 8 + N), T tensors whose size and earlier tensors' sizes
# in their frame are multiples of 64, B of them not 64-aligned in the stream.
layout() {
    pyedit "
import json, lrmoe_stream
b = lrmoe_stream._raw_bytes('$1'); pos = nf = a = nt = bad = 0
while b[pos:pos + 8] != TRAILER:
    pos = lrmoe_stream.skip_digest(b, pos)
    (n,) = struct.unpack_from('<Q', b, pos); h = json.loads(b[pos + 8:pos + 8 + n])
    h.pop('__metadata__', None); d0 = pos + 8 + n; nf += 1; a += d0 % 64 != 0
    for name, e in sorted(h.items(), key=lambda kv: kv[1]['data_offsets'][0]):
        s, t = e['data_offsets']
        if s % 64 or (t - s) % 64: break
        nt += 1; bad += (d0 + s) % 64 != 0
    pos = d0 + max([e['data_offsets'][1] for e in h.values()] or [0])
print('frames', nf, 'data_off', a, 'tensors', nt, 'off', bad)
"
}

# frames whose data sizes are not multiples of 64 (a 3-byte U8, 5 F32, ...)
# and headers of every length mod 64 (attribute values of 1..9 bytes), as
# the old writer (align=8) padded them
odd_frames() {
    pyedit "
fr = []
for i in range(9):
    t = {'odd': np.arange(3 + 5 * i, dtype=np.uint8), 'w': np.ones((4, 16), np.float32) * i}
    fr.append(({'w': t['w'], 'odd': t['odd']} if i % 2 else t, {'layer': i, 'tag': 'x' * (1 + i)}))
write_stream('$1', fr, align=8)"
}

@test "align: every frame's data starts on a 64-byte boundary of the raw and the zstd stream, whatever the sizes before it" {
    odd_frames "$D/old.lrm"
    # the old layout really is off 64 for most frames (else this test proves nothing)
    run layout "$D/old.lrm"
    assert_success
    [ "$(echo "$output" | cut -d' ' -f4)" -ge 5 ]
    "$BIN/lrmoe-cat" --no-compress --output "$D/raw.lrm" "$D/old.lrm"
    "$BIN/lrmoe-cat" --level 3 --output "$D/z.lrm" "$D/old.lrm"
    "$BIN/lrmoe-cat" "$D/old.lrm" | cat > "$D/pipe.lrm"
    for f in raw z pipe; do
        run layout "$D/$f.lrm"
        assert_success
        assert_output --regexp '^frames 9 data_off 0 tensors 4 off 0$'
    done
    # same frames, same tensors and attributes
    run pyedit "
a = read_stream('$D/old.lrm', True); b = read_stream('$D/raw.lrm', True); c = read_stream('$D/z.lrm', True)
assert len(a) == len(b) == len(c) == 9
for x, y, z in zip(a, b, c):
    assert list(x[0]) == list(y[0]) == list(z[0]) and x[1] == y[1] == z[1] and x[2] == y[2] == z[2]
    for n in x[0]: assert x[0][n].tobytes() == y[0][n].tobytes() == z[0][n].tobytes(), n
print('same')"
    assert_output same
    # the test helper pads as the writer does: byte for byte the same file
    pyedit "write_stream('$D/py.lrm', [f for f in read_stream('$D/old.lrm', True)], digests=True)"
    cmp "$D/py.lrm" "$D/raw.lrm"
}

@test "align: lrmoe-gen's raw weights file holds every weight tensor 64-byte aligned" {
    "$BIN/lrmoe-gen" --tokens 16 --experts 4 --topk 2 --hidden 32 --ffn 16 --layers 3 \
        --weights "$D/w.lrm" --no-compress > /dev/null
    run layout "$D/w.lrm"
    assert_success
    assert_output --regexp '^frames 3 data_off 0 tensors ([3-9]|[1-9][0-9]+) off 0$'
}

@test "align: an old 8-aligned weights file is still mapped and gives the forward and backward the same bits as its re-aligned copy" {
    # 384 tokens x top-2 of 4 experts: ~192 rows per expert, past the AMX
    # forward's few-rows case, D and F multiples of 32 (the AMX kernels' shapes)
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 384 --E 4 --K 2 --D 64 --F 32 --dtype bf16
    # as the old writer wrote it, with an attribute that puts the data off 64
    pyedit "
import lrmoe_stream
t, a, d = read_stream('$D/w.lrm', True)[0]
k = next(k for k in range(1, 64) if len(lrmoe_stream.encode_frame(t, {**a, 'note': 'x' * k}, d, align=8)) % 64 != sum(v.nbytes for v in t.values()) % 64)
write_stream('$D/w8.lrm', [(t, {**a, 'note': 'x' * k}, d)], align=8)"
    run layout "$D/w8.lrm"
    assert_success
    assert_output --regexp '^frames 1 data_off 1 tensors [3-9] off [3-9]$'
    "$BIN/lrmoe-cat" --no-compress --output "$D/w64.lrm" "$D/w8.lrm"
    run layout "$D/w64.lrm"
    assert_output --regexp '^frames 1 data_off 0 tensors [3-9] off 0$'
    for c in f32 bf16; do
        for w in w64 w8; do
            "$BIN/lrmoe-exec" --phase forward --compute $c --weights "$D/$w.lrm" --no-compress \
                --output "$D/f$w.lrm" "$D/in.lrm"
            "$BIN/lrmoe-exec" --phase backward --compute $c --weights "$D/$w.lrm" --no-compress \
                --output "$D/b$w.lrm" "$D/fw64.lrm"
        done
        run pyedit "
for p in 'f', 'b':
    x, a = read_stream('$D/%sw8.lrm' % p)[0]; y, b = read_stream('$D/%sw64.lrm' % p)[0]
    assert a['exec.weights'] == b['exec.weights'] == 'mapped', (a['exec.weights'], b['exec.weights'])
    assert list(x) == list(y)
    for n in x: assert x[n].tobytes() == y[n].tobytes(), (p, n)
print('same')"
        assert_success
        assert_output same
    done
}

@test "align: safetensors.torch.load_file reads what lrmoe writes: an exported frame and a later frame of a raw stream cut out" {
    python3 -c 'import safetensors.torch' 2>/dev/null ||
        skip "Python package safetensors (with torch) missing: tests/deps.sh installs it"
    "$BIN/lrmoe-gen" --tokens 16 --experts 4 --topk 2 --hidden 32 --ffn 16 --layers 2 \
        --dtype f32 --weights "$D/w.lrm" --no-compress > /dev/null
    odd_frames "$D/old.lrm"
    "$BIN/lrmoe-cat" --no-compress --output "$D/odd.lrm" "$D/old.lrm"
    "$BIN/lrmoe-export" --format safetensors --dir "$D/x" "$D/w.lrm"
    run pyedit "
import safetensors.torch as st
def same(path, want):
    got = st.load_file(path)
    assert sorted(got) == sorted(want[0]), (sorted(got), sorted(want[0]))
    for n, v in want[0].items(): assert np.array_equal(got[n].numpy(), v), (path, n)
w = read_stream('$D/w.lrm')
for i in range(2): same('$D/x/f%03d.safetensors' % i, w[i])
# frame 5 of the raw stream, cut out as it is: padded for its place in the stream
b = open('$D/odd.lrm', 'rb').read(); pos = 0
for i in range(6):
    start = skip_digest(b, pos); pos = decode_frame(b, pos)[3]
open('$D/f5.safetensors', 'wb').write(b[start:pos])
same('$D/f5.safetensors', read_stream('$D/odd.lrm')[5])
print('loaded')"
    assert_success
    assert_output loaded
}
