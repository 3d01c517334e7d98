#!/usr/bin/env bats
# lrmoe-import / lrmoe-export against the real libraries: NumPy (np.save,
# np.load) and the PyPI `safetensors` package (its own writer and parser),
# plus the independent stream reader tests/helpers/lrmoe_stream.py.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    export PYTHONPATH="$H"
    T="$BATS_TEST_TMPDIR"
    REF="python3 $H/interop_ref.py"
}

need_safetensors() {
    python3 -c 'import safetensors' 2>/dev/null ||
        skip "Python package safetensors missing (pip install safetensors)"
}

# One line "lrmoe-<tool>: what: why" on stderr, exit 1.
assert_one_error() {
    local tool=$1
    assert_failure 1
    assert_equal "${#lines[@]}" 1
    assert_line --regexp "^$tool: .+: .+"
}

@test "help and version for import and export" {
    for t in import export; do
        run "$BIN/lrmoe-$t" --help
        assert_success
        assert_output --partial "Usage: lrmoe-$t"
        run "$BIN/lrmoe-$t" --version
        assert_success
        assert_output --regexp "^lrmoe-$t \(lrmoe\) [0-9]"
        run "$BIN/lrmoe-$t" --bogus
        assert_failure 2
    done
}

@test "npy: every dtype imports and np.load reads it back byte-identical" {
    $REF npy-make "$T/n"
    run "$BIN/lrmoe-import" -o "$T/s.lrm" "$T/n"
    assert_success
    run "$BIN/lrmoe-export" -d "$T/o" "$T/s.lrm"
    assert_success
    run $REF npy-check "$T/n" "$T/o"
    assert_success
    assert_output "npy-check: 16 arrays byte-identical"
    # the stream itself, read by the independent Python reader, holds the arrays
    python3 - "$T/s.lrm" "$T/n" <<'PY'
import sys, os, numpy as np, lrmoe_stream as s
(fr,) = s.read_stream(sys.argv[1], with_dtypes=True)
t, attrs, dt = fr
assert attrs == {}
for name, a in t.items():
    ref = np.load(os.path.join(sys.argv[2], name + ".npy"))
    if dt[name] == "BOOL":
        a = a.view(np.bool_)
    assert a.dtype == ref.dtype and a.shape == ref.shape and a.tobytes() == ref.tobytes(), name
assert len(t) == 16
PY
}

@test "npy: exported files are the files np.save writes (same header bytes)" {
    python3 -c 'import numpy, sys; sys.exit(tuple(map(int, numpy.__version__.split(".")[:2])) < (1, 24))' ||
        skip "numpy < 1.24 pads .npy headers differently"
    $REF npy-make "$T/n"
    "$BIN/lrmoe-import" "$T/n" | "$BIN/lrmoe-export" -d "$T/o"
    for f in "$T"/n/*.npy; do
        run cmp "$f" "$T/o/f000.$(basename "$f")"
        assert_success
    done
}

@test "npy: big-endian, format 2.0 and 3.0 headers, Python 2 longs" {
    python3 - "$T" <<'PY'
import sys, struct, numpy as np
d = sys.argv[1]
def w(name, hdr, ver, data):
    h = hdr.encode()
    pre = b"\x93NUMPY" + bytes([ver, 0]) + (struct.pack("<H", len(h)) if ver == 1 else struct.pack("<I", len(h)))
    open(f"{d}/{name}.npy", "wb").write(pre + h + data)
w("be", "{'descr': '>f8', 'fortran_order': False, 'shape': (2, 2), }\n", 1,
  np.array([[1.5, -2.0], [np.inf, 3e-300]], ">f8").tobytes())
w("v2", "{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }\n", 2,
  np.array([1, -2, 3], "<i2").tobytes())
w("v3", "{\"descr\": \"|u1\", \"shape\": (2L,), \"fortran_order\": False}  \n", 3, bytes([7, 9]))
PY
    run "$BIN/lrmoe-import" -o "$T/s.lrm" "$T/be.npy" "$T/v2.npy" "$T/v3.npy"
    assert_success
    "$BIN/lrmoe-export" -d "$T/o" "$T/s.lrm"
    python3 - "$T/o" <<'PY'
import sys, numpy as np
d = sys.argv[1]
be = np.load(f"{d}/f000.be.npy")
assert be.dtype == np.dtype("<f8")  # swapped to little-endian
assert np.array_equal(be, np.array([[1.5, -2.0], [np.inf, 3e-300]]))
assert np.load(f"{d}/f000.v2.npy").tolist() == [1, -2, 3]
assert np.load(f"{d}/f000.v3.npy").tolist() == [7, 9]
PY
}

@test "npy: file names group into frames (fN.NAME, NAME.N, NAME)" {
    python3 - "$T/d" <<'PY'
import sys, os, numpy as np
d = sys.argv[1]; os.makedirs(d)
np.save(f"{d}/f002.hidden.npy", np.full(3, 2, np.float32))
np.save(f"{d}/hidden.1.npy", np.full(3, 1, np.float32))
np.save(f"{d}/logits.1.npy", np.full(2, 1, np.float32))
np.save(f"{d}/bias.npy", np.zeros(4, np.float32))
np.save(f"{d}/f10.model.layers.0.w.npy", np.ones(1, np.float32))
PY
    "$BIN/lrmoe-import" --no-compress -o "$T/s.lrm" "$T/d"
    python3 - "$T/s.lrm" <<'PY'
import sys, lrmoe_stream as s
fr = s.read_stream(sys.argv[1])
got = [sorted((k, float(v.ravel()[0])) for k, v in t.items()) for t, a in fr]
assert got == [[("bias", 0.0)], [("hidden", 1.0), ("logits", 1.0)], [("hidden", 2.0)],
               [("model.layers.0.w", 1.0)]], got
PY
    # --one-frame: every file in one frame, names kept whole
    "$BIN/lrmoe-import" --no-compress -1 -o "$T/one.lrm" "$T/d"
    python3 - "$T/one.lrm" <<'PY'
import sys, lrmoe_stream as s
(t, a), = s.read_stream(sys.argv[1])
assert sorted(t) == ["bias", "f002.hidden", "f10.model.layers.0.w", "hidden.1", "logits.1"], sorted(t)
PY
}

@test "npy: frames in numeric order however the names sort, argument order kept inside a frame" {
    python3 - "$T/d" <<'PY'
import sys, os, numpy as np
d = sys.argv[1]; os.makedirs(d)
for f in range(300):   # the directory's name order puts f10 before f2
    for k, n in enumerate(("z", "a", "m")):
        np.save(f"{d}/f{f}.{n}.npy", np.full(1, 10 * f + k, np.float32))
PY
    "$BIN/lrmoe-import" --no-compress -o "$T/s.lrm" "$T/d"
    # named files in an order of their own: frame 7 first in the arguments
    "$BIN/lrmoe-import" --no-compress -o "$T/a.lrm" "$T/d/f7.m.npy" "$T/d/f3.z.npy" \
        "$T/d/f7.z.npy" "$T/d/f3.a.npy" "$T/d/f7.a.npy"
    python3 - "$T/s.lrm" "$T/a.lrm" <<'PY'
import sys, lrmoe_stream as s
fr = s.read_stream(sys.argv[1])
assert len(fr) == 300, len(fr)
for f, (t, a) in enumerate(fr):   # the directory: names sorted inside a frame
    got = [(k, float(v.ravel()[0])) for k, v in t.items()]
    assert got == [("a", 10 * f + 1), ("m", 10 * f + 2), ("z", 10 * f)], (f, got)
fr = s.read_stream(sys.argv[2])
got = [[k for k in t] for t, a in fr]
assert got == [["z", "a"], ["m", "z", "a"]], got
PY
}

@test "npy: --dtype bf16 reinterprets uint16; export as u16 (bit-exact) or --bf16-as f32" {
    python3 - "$T" <<'PY'
import sys, numpy as np, lrmoe_stream as s
rng = np.random.default_rng(3)
x = rng.standard_normal((6, 5)).astype(np.float32)
x[0, 0], x[0, 1], x[0, 2] = np.nan, np.inf, -np.inf
np.save(f"{sys.argv[1]}/hidden.npy", s.f32_to_bf16(x))
np.save(f"{sys.argv[1]}/ids.npy", np.arange(4, dtype=np.uint16))
PY
    "$BIN/lrmoe-import" --no-compress -t hidden=bf16 -o "$T/s.lrm" "$T/hidden.npy" "$T/ids.npy"
    run "$BIN/lrmoe-view" --no-stats "$T/s.lrm"
    assert_line --regexp '^  hidden +BF16 +\[6,5\]'
    assert_line --regexp '^  ids +U16 +\[4\]'
    "$BIN/lrmoe-export" -d "$T/u" "$T/s.lrm"
    "$BIN/lrmoe-export" -d "$T/f" --bf16-as f32 "$T/s.lrm"
    run cmp "$T/hidden.npy" "$T/u/f000.hidden.npy"
    assert_success
    python3 - "$T" <<'PY'
import sys, numpy as np, lrmoe_stream as s
d = sys.argv[1]
bits = np.load(f"{d}/hidden.npy")
f = np.load(f"{d}/f/f000.hidden.npy")
assert f.dtype == np.float32
ref = s.bf16_to_f32(bits)
assert f.tobytes() == ref.tobytes()  # exact, NaN/Inf included
assert np.load(f"{d}/f/f000.ids.npy").dtype == np.uint16  # not BF16: untouched
PY
    # the global form converts every 16-bit integer array
    "$BIN/lrmoe-import" --no-compress -t bf16 -o "$T/g.lrm" "$T/hidden.npy" "$T/ids.npy"
    run "$BIN/lrmoe-view" --no-stats "$T/g.lrm"
    assert_line --regexp '^  ids +BF16 +\[4\]'
}

@test "safetensors: a file written by the safetensors package imports and exports identical" {
    need_safetensors
    $REF st-make "$T/ref.safetensors"
    run "$BIN/lrmoe-import" -o "$T/s.lrm" "$T/ref.safetensors"
    assert_success
    run "$BIN/lrmoe-view" "$T/s.lrm"
    assert_line --partial 'layer=3'
    assert_line --regexp '^  hidden +BF16 +\[4,8\]'
    run "$BIN/lrmoe-export" -O safetensors -d "$T/o" "$T/s.lrm"
    assert_success
    run $REF st-check "$T/ref.safetensors" "$T/o/f000.safetensors"
    assert_success
    assert_output "st-check: 8 tensors and 3 metadata keys identical"
}

@test "stdin: safetensors blobs written back to back by the safetensors package, one frame each" {
    need_safetensors
    python3 - "$T/blobs" <<'EOF'
import sys, numpy as np
from safetensors.numpy import save
with open(sys.argv[1], "wb") as f:
    for step in range(3):
        x = np.arange(12, dtype=np.float32).reshape(3, 4) + step
        f.write(save({"router_logits": x, "ids": np.array([step], np.int64)},
                     metadata={"step": str(step)}))
EOF
    "$BIN/lrmoe-import" --no-compress -o "$T/s.lrm" - < "$T/blobs"
    python3 - "$T/s.lrm" <<'EOF'
import sys, numpy as np
from lrmoe_stream import read_stream
fr = read_stream(sys.argv[1])
assert len(fr) == 3, len(fr)
for step, (t, a) in enumerate(fr):
    assert a["step"] == str(step), a
    assert np.array_equal(t["router_logits"], np.arange(12, dtype=np.float32).reshape(3, 4) + step)
    assert t["ids"].tolist() == [step]
EOF
    # through a pipe, with a file after it, renamed
    run sh -c "cat '$T/blobs' | '$BIN/lrmoe-import' --name ids=step_ids - '$T/blobs' | '$BIN/lrmoe-view'"
    assert_failure   # the second argument is three blobs: a file holds one
    cat "$T/blobs" | "$BIN/lrmoe-import" --name ids=step_ids -o "$T/p.lrm" -
    run "$BIN/lrmoe-view" "$T/p.lrm"
    assert_success
    assert_equal "$(grep -c 'step_ids' <<< "$output")" 3
}

@test "stdin: truncated blobs, streams, zstd and npy on standard input fail naming the frame" {
    need_safetensors
    python3 - "$T/blobs" <<'EOF'
import sys, numpy as np
from safetensors.numpy import save
with open(sys.argv[1], "wb") as f:
    for step in range(2):
        f.write(save({"x": np.ones((64,), np.float32)}))
EOF
    n=$(stat -c %s "$T/blobs")
    for cut in 3 20 $((n - 1)); do
        head -c "$cut" "$T/blobs" > "$T/cut"
        run "$BIN/lrmoe-import" -o "$T/o.lrm" - < "$T/cut"
        assert_one_error lrmoe-import
        assert_output --partial "stdin: frame"
        assert_output --partial "truncated"
    done
    "$BIN/lrmoe-import" -o "$T/z.lrm" - < "$T/blobs"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" - < "$T/z.lrm"
    assert_one_error lrmoe-import
    assert_output --partial "zstd"
    "$BIN/lrmoe-import" --no-compress -o "$T/r.lrm" - < "$T/blobs"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" - < "$T/r.lrm"
    assert_one_error lrmoe-import
    assert_output --partial "lrmoe stream"
    python3 -c "import numpy as np, sys; np.save(sys.stdout.buffer, np.ones(3))" > "$T/a.npy"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" - < "$T/a.npy"
    assert_one_error lrmoe-import
    assert_output --partial ".npy"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" - < /dev/null
    assert_one_error lrmoe-import
    assert_output --partial "no safetensors data"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" - -
    assert_failure 1
    assert_output --partial "standard input named twice"
}

@test "safetensors: --name, --attr and --tensor/--frame selection" {
    need_safetensors
    $REF st-make "$T/a.safetensors"
    cp "$T/a.safetensors" "$T/b.safetensors"
    "$BIN/lrmoe-import" --no-compress --name hidden=x --name load=expert_load --attr step=99 --attr run=r1 \
        -o "$T/s.lrm" "$T/a.safetensors" "$T/b.safetensors"
    "$BIN/lrmoe-export" -O both -F 1 -T x -T expert_load -d "$T/o" "$T/s.lrm"
    run ls "$T/o"
    assert_output "$(printf 'f001.expert_load.npy\nf001.frame.json\nf001.safetensors\nf001.x.npy')"
    python3 - "$T" <<'PY'
import sys, numpy as np, safetensors
from interop_ref import st_load, st_tensors
d = sys.argv[1]
t, meta = st_load(f"{d}/o/f001.safetensors")
ref = st_tensors()
assert sorted(t) == ["expert_load", "x"], sorted(t)
assert t["x"] == ("BF16", (4, 8), ref["hidden"][2])
assert t["expert_load"][2] == ref["load"][2]
assert meta == {"layer": "3", "step": "99", "note": "from safetensors", "run": "r1"}, meta
assert np.load(f"{d}/o/f001.expert_load.npy").tolist() == [5, 0, 3]
PY
    run "$BIN/lrmoe-export" -T nosuch -d "$T/o2" "$T/s.lrm"
    assert_one_error lrmoe-export
    assert_output --partial "nosuch"
    run "$BIN/lrmoe-export" --frame 5 -d "$T/o3" "$T/s.lrm"
    assert_one_error lrmoe-export
    run "$BIN/lrmoe-import" --name nosuch=y -o "$T/x.lrm" "$T/a.safetensors"
    assert_one_error lrmoe-import
    run "$BIN/lrmoe-import" --name hidden=load -o "$T/x.lrm" "$T/a.safetensors"
    assert_one_error lrmoe-import
    assert_output --partial "already exists"
}

@test "lrmoe-gen frame: exported npy and safetensors load in NumPy/safetensors and import back identical" {
    need_safetensors
    [ -x "$BIN/lrmoe-gen" ] || skip "lrmoe-gen not built"
    run "$BIN/lrmoe-gen" --help
    assert_output --partial "--preset"
    "$BIN/lrmoe-gen" --preset qwen3-30b-a3b --tokens 64 --layers 2 --no-compress -o "$T/g.lrm" ||
        skip "lrmoe-gen does not take these options yet"
    "$BIN/lrmoe-export" -O both -d "$T/o" "$T/g.lrm"
    # safetensors frames re-import to the very same stream bytes
    "$BIN/lrmoe-import" --no-compress -o "$T/back.lrm" "$T"/o/f*.safetensors
    run cmp "$T/g.lrm" "$T/back.lrm"
    assert_success
    # npy files + the fNNN.frame.json sidecars re-import to the same bytes too
    "$BIN/lrmoe-import" --no-compress -o "$T/npy.lrm" "$T"/o/*.npy "$T"/o/*.frame.json
    run cmp "$T/g.lrm" "$T/npy.lrm"
    assert_success
    # a directory holding both kinds is refused rather than doubled
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/o"
    assert_one_error lrmoe-import
    assert_output --partial "both .npy and .safetensors"
    # NumPy and the safetensors package read the files; without sidecars
    # (plain .npy, BF16 as uint16 bits) --dtype restores the same tensors
    python3 - "$T" > "$T/bf16-names" <<'PY'
import sys, glob, os, numpy as np, safetensors, lrmoe_stream as s
d = sys.argv[1]
frames = s.read_stream(f"{d}/g.lrm", with_dtypes=True)
bf = set()
for i, (t, a, dt) in enumerate(frames):
    for name, arr in t.items():
        n = np.load(f"{d}/o/f{i:03d}.{name}.npy")
        assert n.shape == arr.shape and n.tobytes() == arr.tobytes(), name
        if dt[name] == "BF16":
            assert n.dtype == np.uint16
            bf.add(name)
    with open(f"{d}/o/f{i:03d}.safetensors", "rb") as f:
        st = dict(safetensors.deserialize(f.read()))
    assert sorted(st) == sorted(t)
    for name, arr in t.items():
        assert st[name]["dtype"] == dt[name] and bytes(st[name]["data"]) == arr.tobytes()
    with safetensors.safe_open(f"{d}/o/f{i:03d}.safetensors", "np") as f:
        assert f.metadata() == a
print(" ".join("-t %s=bf16" % b for b in sorted(bf)))
PY
    "$BIN/lrmoe-import" --no-compress $(cat "$T/bf16-names") -o "$T/plain.lrm" "$T"/o/*.npy
    python3 - "$T" <<'PY'
import sys, lrmoe_stream as s
d = sys.argv[1]
a = s.read_stream(f"{d}/g.lrm", with_dtypes=True)
b = s.read_stream(f"{d}/plain.lrm", with_dtypes=True)
assert len(a) == len(b)
for (ta, _, da), (tb, ab, db) in zip(a, b):
    assert sorted(ta) == sorted(tb) and ab == {}
    for k in ta:
        assert da[k] == db[k] and ta[k].shape == tb[k].shape and ta[k].tobytes() == tb[k].tobytes(), k
PY
    # --bf16-as f32 .npy files come back exactly through their sidecars
    "$BIN/lrmoe-export" --bf16-as f32 -d "$T/f" "$T/g.lrm"
    "$BIN/lrmoe-import" --no-compress -o "$T/f32.lrm" "$T/f"
    run cmp "$T/g.lrm" "$T/f32.lrm"
    assert_success
}

@test "sidecar: bad JSON or a dtype that does not fit fails" {
    python3 - "$T" <<'PY'
import sys, numpy as np
d = sys.argv[1]
np.save(f"{d}/f000.x.npy", np.zeros(3, np.float64))
open(f"{d}/f000.frame.json", "w").write('{"attrs": {"a": 1}}')
open(f"{d}/f001.frame.json", "w").write('{"attrs": ')
open(f"{d}/f002.frame.json", "w").write('{"tensors": [{"name": "y", "dtype": "BF16"}]}')
np.save(f"{d}/f002.y.npy", np.zeros(3, np.float64))
open(f"{d}/f003.frame.json", "w").write('{"attrs": {"layer": "3"}, "tensors": [{"name": "b", "dtype": "I16"}, {"name": "a", "dtype": "BF16"}]}')
np.save(f"{d}/f003.a.npy", np.arange(3, dtype=np.uint16))
np.save(f"{d}/f003.b.npy", np.arange(2, dtype=np.uint16))
PY
    run "$BIN/lrmoe-import" -o "$T/o.lrm" "$T/f000.x.npy" "$T/f000.frame.json"
    assert_one_error lrmoe-import
    assert_output --partial "attribute a is not a string"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" "$T/f001.frame.json"
    assert_one_error lrmoe-import
    assert_output --partial "malformed JSON"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" "$T/f002.y.npy" "$T/f002.frame.json"
    assert_one_error lrmoe-import
    assert_output --partial "the sidecar says BF16"
    # order and dtypes restored from the sidecar
    "$BIN/lrmoe-import" --no-compress -o "$T/o.lrm" "$T/f003.a.npy" "$T/f003.b.npy" "$T/f003.frame.json"
    run "$BIN/lrmoe-view" --no-stats "$T/o.lrm"
    assert_line "  layer=3"
    for i in "${!lines[@]}"; do [[ "${lines[$i]}" == "  tensor "* ]] && h=$i; done
    assert_line --index $((h + 1)) --regexp '^  b +I16 '
    assert_line --index $((h + 2)) --regexp '^  a +BF16 '
}

@test "bad input: garbage, bad headers, size mismatch, unknown dtypes" {
    python3 - "$T" <<'PY'
import sys, struct, numpy as np
d = sys.argv[1]
def hdr(s, ver=1):
    h = s.encode()
    return b"\x93NUMPY" + bytes([ver, 0]) + (struct.pack("<H", len(h)) if ver == 1 else struct.pack("<I", len(h))) + h
ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }\n"
files = {
    "garbage.npy": b"this is not a numpy file\n" * 4,
    "empty.npy": b"",
    "badhdr.npy": hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4 }\n") + bytes(48),
    "notdict.npy": hdr("['<f4', False, (3, 4)]\n") + bytes(48),
    "nokey.npy": hdr("{'descr': '<f4', 'shape': (3, 4), }\n") + bytes(48),
    "hugehdr.npy": b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30) + b"{",
    "trunchdr.npy": hdr(ok)[:30],
    "short.npy": hdr(ok) + bytes(40),
    "long.npy": hdr(ok) + bytes(52),
    "version.npy": b"\x93NUMPY\x07\x00" + bytes(30),
    "dims.npy": hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n") + bytes(4),
    "garbage.safetensors": b"\xff" * 64,
    "trunc.safetensors": b"",
}
for name, data in files.items():
    open(f"{d}/{name}", "wb").write(data)
np.save(f"{d}/complex.npy", np.zeros(3, np.complex64))
np.save(f"{d}/strings.npy", np.array(["ab", "cd"]))
np.save(f"{d}/struct.npy", np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
np.save(f"{d}/fortran.npy", np.asfortranarray(np.zeros((3, 4), np.float32)))
np.save(f"{d}/u8.npy", np.zeros(3, np.uint8))
# safetensors with an unknown dtype and with bad offsets
def st(hd, data):
    h = hd.encode(); return struct.pack("<Q", len(h)) + h + data
open(f"{d}/dtype.safetensors", "wb").write(st('{"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', bytes(2)))
open(f"{d}/offsets.safetensors", "wb").write(st('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', bytes(4)))
open(f"{d}/json.safetensors", "wb").write(st('{"x":{"dtype":"F32",', bytes(4)))
PY
    declare -A why=(
        [garbage.npy]="bad magic" [empty.npy]="empty file" [badhdr.npy]="bad .npy header"
        [notdict.npy]="not a dict" [nokey.npy]="missing 'fortran_order'"
        [hugehdr.npy]="exceeds the limit" [trunchdr.npy]="truncated"
        [short.npy]="data size mismatch" [long.npy]="trailing bytes"
        [version.npy]="unsupported .npy format version 7.0"
        [dims.npy]="more than 8 dimensions" [complex.npy]="unsupported dtype '<c8'"
        [strings.npy]="unsupported dtype" [struct.npy]="structured arrays"
        [fortran.npy]="Fortran-order arrays are not supported"
        [garbage.safetensors]="not a valid safetensors file" [trunc.safetensors]="empty file"
        [dtype.safetensors]="F8_E4M3" [offsets.safetensors]="data_offsets"
        [json.safetensors]="malformed JSON"
    )
    for f in "${!why[@]}"; do
        run "$BIN/lrmoe-import" -o "$T/out.lrm" "$T/$f"
        assert_one_error lrmoe-import
        assert_output --partial "$T/$f: "
        assert_output --partial "${why[$f]}"
        # a failed import leaves a stream without trailer: readers reject it
        run "$BIN/lrmoe-view" "$T/out.lrm"
        assert_failure 1
    done
    run "$BIN/lrmoe-import" -t u8=bf16 -o "$T/out.lrm" "$T/u8.npy"
    assert_one_error lrmoe-import
    assert_output --partial "element sizes differ"
    run "$BIN/lrmoe-import" -o "$T/out.lrm" "$T/nonexistent.npy"
    assert_one_error lrmoe-import
    run "$BIN/lrmoe-import" -t nosuchtype -o "$T/out.lrm" "$T/u8.npy"
    assert_failure 2
    run "$BIN/lrmoe-import" -o "$T/out.lrm"
    assert_failure 2
    # the same tensor twice in one frame
    cp "$T/u8.npy" "$T/f0.u8.npy"
    run "$BIN/lrmoe-import" -o "$T/out.lrm" "$T/u8.npy" "$T/f0.u8.npy"
    assert_one_error lrmoe-import
    assert_output --partial "duplicate tensor u8"
}

@test "export: truncated or garbage streams fail with one error line" {
    $REF npy-make "$T/n"
    "$BIN/lrmoe-import" "$T/n" | "$BIN/lrmoe-export" -O safetensors -d "$T/st"
    "$BIN/lrmoe-import" --no-compress -o "$T/s.lrm" "$T/st/f000.safetensors" "$T/st/f000.safetensors"
    size=$(stat -c %s "$T/s.lrm")
    head -c $((size - 16)) "$T/s.lrm" > "$T/notrailer.lrm"
    head -c $((size / 2)) "$T/s.lrm" > "$T/half.lrm"
    printf 'garbage garbage garbage' > "$T/garbage.lrm"
    for f in notrailer half garbage; do
        run "$BIN/lrmoe-export" -d "$T/o-$f" "$T/$f.lrm"
        assert_one_error lrmoe-export
    done
    run "$BIN/lrmoe-export" -d /dev/null/x "$T/s.lrm"
    assert_one_error lrmoe-export
    run "$BIN/lrmoe-export" --format zip "$T/s.lrm"
    assert_failure 2
    # a full disk: export into files that are /dev/full, import onto /dev/full
    mkdir "$T/full"
    ln -s /dev/full "$T/full/f000.big.npy"
    run "$BIN/lrmoe-export" -d "$T/full" "$T/s.lrm"
    assert_one_error lrmoe-export
    assert_output --partial "No space left on device"
    ln -s /dev/full "$T/full/f000.safetensors"
    run "$BIN/lrmoe-export" -O safetensors -d "$T/full" "$T/s.lrm"
    assert_one_error lrmoe-export
    assert_output --partial "No space left on device"
    # a small frame that stdio would only write at the final flush: the
    # writer's per-frame flush reports it (lrmoe-stream(5), Live streams)
    "$BIN/lrmoe-import" -o "$T/small.lrm" "$T/n/u8.npy"
    run "$BIN/lrmoe-export" -O safetensors -d "$T/full" "$T/small.lrm"
    assert_one_error lrmoe-export
    assert_output --partial "No space left on device"
    run "$BIN/lrmoe-import" -o /dev/full "$T/n"
    assert_one_error lrmoe-import
    # a tensor name that cannot be a file name
    python3 - "$T/slash.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"a/b": np.zeros(2, np.float32)}, {})])
PY
    run "$BIN/lrmoe-export" -d "$T/o-slash" "$T/slash.lrm"
    assert_one_error lrmoe-export
    assert_output --partial "a/b"
    run "$BIN/lrmoe-export" -O safetensors -d "$T/o-slash2" "$T/slash.lrm"
    assert_success
}

@test "import: no leaks on success or on any error path, with --name/--dtype/--attr; an empty directory is an error" {
    command -v valgrind >/dev/null 2>&1 || skip "valgrind not installed (tests/deps.sh installs it)"
    python3 -c "import numpy as np; np.save('$T/f0.hidden.npy', np.zeros((4,3),np.float32)); np.save('$T/f0.ids.npy', np.zeros((4,2),np.uint16))"
    mkdir -p "$T/empty"
    VG="valgrind -q --leak-check=full --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=9"
    # the ASan build (make check SANITIZE=1) cannot run under valgrind; its
    # LeakSanitizer fails the run with a non-zero exit instead
    [ -z "${SANITIZE:-}" ] || VG=""
    while IFS='|' read -r want args; do
        run sh -c "$VG '$BIN/lrmoe-import' $args -o '$T/o.lrm' < /dev/null"
        [ "$status" -eq "$want" ] || { echo "rc=$status want $want: $args"; echo "$output"; return 1; }
    done <<LIST
0|--name hidden=h --dtype ids=bf16 --attr a=b -a c=d '$T/f0.hidden.npy' '$T/f0.ids.npy'
1|--name nope=x --attr a=b '$T/f0.hidden.npy'
1|--dtype f32=bf16 '$T/f0.hidden.npy'
2|--attr bad '$T/f0.hidden.npy'
2|--name hidden= '$T/f0.hidden.npy'
2|--dtype =bf16 '$T/f0.hidden.npy'
1|'$T/empty'
1|--dtype bf16 --name a=b '$T/nonexistent.npy'
1|- -
LIST
    run "$BIN/lrmoe-import" "$T/empty"
    assert_failure
    assert_output --partial "directory holds no .npy or .safetensors files"
}

@test "import: a torch.save() file (zip or legacy pickle) is recognised and the error says what to do" {
    python3 -c 'import torch' 2>/dev/null || skip "torch not installed (tests/deps.sh installs it)"
    python3 -c "
import torch
torch.save({'hidden': torch.zeros(2, 3)}, '$T/t.pt')
torch.save({'hidden': torch.zeros(2, 3)}, '$T/old.pt', _use_new_zipfile_serialization=False)"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" "$T/t.pt"
    assert_failure 1
    assert_output --partial "a zip archive, as torch.save() writes, not safetensors"
    assert_output --partial "safetensors.torch.save_file"
    run "$BIN/lrmoe-import" -o "$T/o.lrm" "$T/old.pt"
    assert_failure 1
    assert_output --partial "a Python pickle (legacy torch.save())"
}
