"""Pure-Python reader/writer of lrmoe streams (an independent implementation
of lrmoe-stream(5) for tests). Raw streams natively; zstd streams through the
`zstd` command. Frames are (tensors: dict name -> numpy array, attrs: dict).

    from lrmoe_stream import read_stream, write_stream
    frames = read_stream("in.lrm")            # [(tensors, attrs), ...]
    write_stream("out.lrm", frames)           # raw, with trailer

bf16 tensors are returned as uint16 arrays with .dtype annotation recorded in
the dict `dtypes` of read_stream(..., with_dtypes=True); pass
dtypes={"name": "BF16"} to write_stream to store a uint16 array as BF16.
"""
import json
import struct
import subprocess
import sys

import numpy as np

TRAILER = b"LRMOEEND"
DIGEST = b"LRMOECRC"        # the records lrmoe's writers write: CRC-64/NVME
DIGEST_XXH = b"LRMOEXXH"    # the records of earlier writers: XXH64
DIGEST_CRT = b"LRMOECRT"    # CRC-64s by part: the writers' for frames of 64 MiB or more
DIGESTS = (DIGEST, DIGEST_XXH)  # the 16-byte records
NP = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16,
    "I16": np.int16, "U32": np.uint32, "I32": np.int32, "U64": np.uint64,
    "I64": np.int64, "F16": np.float16, "BF16": np.uint16, "F32": np.float32,
    "F64": np.float64,
}
DT = {np.dtype(v).str: k for k, v in NP.items() if k != "BF16"}


def bf16_to_f32(a):
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(a):
    """Round-to-nearest-even, NaN kept quiet (matches liblrmoe)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def _raw_bytes(path):
    data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    if data[:4] == b"\x28\xb5\x2f\xfd":
        data = subprocess.run(["zstd", "-dc"], input=data, check=True,
                              stdout=subprocess.PIPE).stdout
    return data


M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, v):
    return (_rotl((acc + v * P2) & M64, 31) * P1) & M64


def xxh64(data):
    """XXH64, seed 0, written from the xxHash specification (an independent
    check of liblrmoe's; slow: for test-sized frames)."""
    n, p = len(data), 0
    if n >= 32:
        v = [(P1 + P2) & M64, P2, 0, (-P1) & M64]
        while p + 32 <= n:
            for i in range(4):
                v[i] = _round(v[i], struct.unpack_from("<Q", data, p + 8 * i)[0])
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ _round(0, x)) * P1 + P4) & M64
    else:
        h = P5
    h = (h + n) & M64
    while p + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, p)[0]), 27) * P1 + P4) & M64
        p += 8
    if p + 4 <= n:
        h = (_rotl(h ^ (struct.unpack_from("<I", data, p)[0] * P1 & M64), 23) * P2 + P3) & M64
        p += 4
    while p < n:
        h = (_rotl(h ^ (data[p] * P5 & M64), 11) * P1) & M64
        p += 1
    h ^= h >> 33
    h = h * P2 & M64
    h ^= h >> 29
    h = h * P3 & M64
    return h ^ (h >> 32)


def _crc64_table():
    t = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x9A6C9329AC4BC9B5 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_T = _crc64_table()


def crc64(data, crc=0):
    """CRC-64/NVME (reflected 0xAD93D23594C93659, init and xorout all ones;
    check("123456789") = 0xAE8B14860A799888), bytewise from its definition:
    an independent check of liblrmoe's folding (slow: test-sized frames)."""
    r, t = crc ^ M64, _CRC_T
    for b in data:
        r = t[(r ^ b) & 0xFF] ^ (r >> 8)
    return r ^ M64


def digest_of(kind, frame):
    """The record's value for a frame's bytes: kind DIGEST or DIGEST_XXH."""
    return crc64(frame) if kind == DIGEST else xxh64(frame)


def record_len(buf, pos):
    """The length of the digest record at buf[pos:] (lrmoe-stream(5),
    Integrity: "LRMOECRC" + the frame's CRC-64, or "LRMOEXXH" + its XXH64:
    16; "LRMOECRT" + the tensor count n + the CRC-64 of the header and of
    each tensor: 24 + 8 n), 0 when there is none."""
    if buf[pos:pos + 8] in DIGESTS:
        return 16
    if buf[pos:pos + 8] == DIGEST_CRT:
        return 24 + 8 * struct.unpack_from("<Q", buf, pos + 8)[0]
    return 0


def skip_digest(buf, pos):
    """The position after the digest record at buf[pos:], or pos when there
    is none."""
    return pos + record_len(buf, pos)


def part_crcs(frame):
    """The CRC-64s of an "LRMOECRT" record for a frame's bytes: its header
    (length and JSON), then each tensor's data in data order."""
    (hlen,) = struct.unpack_from("<Q", frame, 0)
    hdr = json.loads(frame[8:8 + hlen])
    base = 8 + hlen
    spans = sorted(v["data_offsets"] for k, v in hdr.items() if k != "__metadata__")
    return [crc64(frame[:base])] + [crc64(frame[base + b:base + e]) for b, e in spans]


def record_ok(buf, pos):
    """Whether the record at buf[pos:] matches the frame after it, by its
    own definition (pure Python: test-sized frames)."""
    n = record_len(buf, pos)
    end = decode_frame(buf, pos)[3]
    frame = buf[pos + n:end]
    if buf[pos:pos + 8] == DIGEST_CRT:
        k = (n - 24) // 8
        return list(struct.unpack_from("<%dQ" % (k + 1), buf, pos + 16)) == part_crcs(frame)
    return struct.unpack_from("<Q", buf, pos + 8)[0] == digest_of(buf[pos:pos + 8], frame)


def decode_frame(buf, pos=0):
    """Decode one safetensors blob at buf[pos:] (after its digest record, if
    any); returns (tensors, attrs, dtypes, end)."""
    pos = skip_digest(buf, pos)
    (hlen,) = struct.unpack_from("<Q", buf, pos)
    hdr = json.loads(buf[pos + 8:pos + 8 + hlen].decode("utf-8"))
    base = pos + 8 + hlen
    attrs = hdr.pop("__metadata__", {}) or {}
    tensors, dtypes, end = {}, {}, base
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, en = e["data_offsets"]
        a = np.frombuffer(buf[base + b:base + en], dtype=NP[e["dtype"]])
        tensors[name] = a.reshape(e["shape"])
        dtypes[name] = e["dtype"]
        end = max(end, base + en)
    return tensors, attrs, dtypes, end


def read_stream(path, with_dtypes=False):
    buf = _raw_bytes(path)
    pos, frames = 0, []
    while True:
        if buf[pos:pos + 8] == TRAILER:
            (count,) = struct.unpack_from("<Q", buf, pos + 8)
            assert count == len(frames), "trailer count mismatch"
            break
        if pos >= len(buf):
            raise ValueError("truncated: no trailer")
        t, a, d, pos = decode_frame(buf, pos)
        frames.append((t, a, d) if with_dtypes else (t, a))
    return frames


def encode_frame(tensors, attrs=None, dtypes=None, at=0, align=64):
    """One frame, its header padded as lrmoe's writer pads it: the data starts
    on an align-byte boundary of the stream for a frame that starts at byte at
    (align=8 writes what writers wrote before the 64-byte rule)."""
    dtypes = dtypes or {}
    hdr, blobs, off = {}, [], 0
    if attrs:
        hdr["__metadata__"] = {str(k): str(v) for k, v in attrs.items()}
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")
        dt = dtypes.get(name) or DT[arr.dtype.str if arr.dtype != np.bool_ else "|b1"]
        raw = arr.tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((align - (at + 8 + len(h)) % align) % align)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_stream(path, frames, trailer=True, compress=False, align=64, digests=False):
    """frames: iterable of (tensors, attrs) or (tensors, attrs, dtypes).
    digests=True (or "crc") writes each frame's digest record before it, as
    lrmoe's writers do for frames under 64 MiB (CRC-64); "xxh" the XXH64
    records of earlier writers; "tensors" the records by part (CRC-64 of the
    header and of each tensor); the default writes the format before the
    records existed."""
    kind = DIGEST_XXH if digests == "xxh" else DIGEST
    out, n, at = [], 0, 0
    for fr in frames:
        rl = 0
        if digests == "tensors":
            rl = 24 + 8 * len(fr[0])
        elif digests:
            rl = 16
        at += rl
        out.append(encode_frame(*fr, at=at, align=align))
        if digests == "tensors":
            c = part_crcs(out[-1])
            out.insert(len(out) - 1, DIGEST_CRT + struct.pack("<%dQ" % (len(c) + 1), len(c) - 1, *c))
        elif digests:
            out.insert(len(out) - 1, kind + struct.pack("<Q", digest_of(kind, out[-1])))
        at += len(out[-1])
        n += 1
    if trailer:
        out.append(TRAILER + struct.pack("<Q", n))
    data = b"".join(out)
    if compress:
        data = subprocess.run(["zstd", "-q", "-c"], input=data, check=True,
                              stdout=subprocess.PIPE).stdout
    if path == "-":
        sys.stdout.buffer.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
