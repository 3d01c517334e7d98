#!/usr/bin/env python3
"""Which parts of a raw lrmoe stream are in the page cache (mincore(2)).

  resident.py evict FILE    write FILE's dirty pages back and drop its
                            pages from the page cache (fsync,
                            posix_fadvise DONTNEED), then print the
                            fraction of its pages still resident (a
                            filesystem that keeps them, tmpfs, prints 1)
  resident.py frames FILE   for each frame of the raw stream FILE, the
                            fraction of its bytes' pages (digest record,
                            header and data) that are resident, one per
                            line: "frame I FRACTION"
  resident.py tensors FILE  the same for each tensor's data: "frame I NAME
                            FRACTION", in data order

The tests use it to see which frames of a weights stream a process read:
evict, run the process, look (tests/exec.bats).
"""
import ctypes
import json
import mmap
import os
import sys

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_pages(path):
    """one flag per page of PATH: 1 when in the page cache"""
    fd = os.open(path, os.O_RDONLY)
    try:
        n = os.fstat(fd).st_size
        if n == 0:
            return []
        addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        pages = (n + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(ctypes.c_void_p(addr), n, vec)
        libc.munmap(ctypes.c_void_p(addr), n)
        if rc:
            raise OSError(ctypes.get_errno(), "mincore")
        return [v & 1 for v in vec]
    finally:
        os.close(fd)


def frames(path, tensors=False):
    """(begin, end) byte ranges of the raw stream's frames, each with its
    digest record; tensors=True: [(name, begin, end), ...] of each frame's
    tensors' data instead. Reads the records and headers only, through a
    mapping without read-around (MADV_RANDOM): reading the file would bring
    all of it into the page cache, and a later look would see that."""
    with open(path, "rb") as f:
        b = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    b.madvise(mmap.MADV_RANDOM)
    out, pos = [], 0
    while b[pos:pos + 8] != b"LRMOEEND":
        start = pos
        if b[pos:pos + 8] in (b"LRMOECRC", b"LRMOEXXH"):
            pos += 16
        elif b[pos:pos + 8] == b"LRMOECRT":    # count, header CRC, a CRC a tensor
            pos += 24 + 8 * int.from_bytes(b[pos + 8:pos + 16], "little")
        hl = int.from_bytes(b[pos:pos + 8], "little")
        hdr = json.loads(b[pos + 8:pos + 8 + hl])
        d0 = pos + 8 + hl
        ts = sorted((v["data_offsets"][0], v["data_offsets"][1], k)
                    for k, v in hdr.items() if k != "__metadata__")
        pos = d0 + max([e for _, e, _ in ts] or [0])
        out.append([(k, d0 + a, d0 + e) for a, e, k in ts] if tensors else (start, pos))
    b.close()
    return out


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("evict", "frames", "tensors"):
        sys.exit("usage: resident.py evict|frames|tensors FILE")
    path = sys.argv[2]
    if sys.argv[1] == "evict":
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)    # dirty pages (a file just written) are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        r = resident_pages(path)
        print(f"{sum(r) / max(len(r), 1):.3f}")
        return
    r = resident_pages(path)
    if sys.argv[1] == "tensors":
        for i, ts in enumerate(frames(path, tensors=True)):
            for k, a, e in ts:
                p0, p1 = a // PAGE, (e + PAGE - 1) // PAGE
                print(f"frame {i} {k} {sum(r[p0:p1]) / max(p1 - p0, 1):.3f}")
        return
    for i, (a, e) in enumerate(frames(path)):
        p0, p1 = a // PAGE, (e + PAGE - 1) // PAGE
        print(f"frame {i} {sum(r[p0:p1]) / max(p1 - p0, 1):.3f}")


if __name__ == "__main__":
    main()
