"""Drive a pipeline of lrmoe stages live, one frame at a time (tests/stream-live.bats).

    python3 live_pipe.py [options] INPUT 'CMD | CMD ...'

INPUT is an lrmoe stream (raw or zstd). Its frames are written to the
pipeline's standard input one at a time. After writing a group of frames
(--batch, default 1) the producer stops and waits until the pipeline's
standard output -- a raw stream, so the last stage needs --no-compress --
has yielded every frame written so far, and every TSV named by --rows
FILE:PER holds PER data rows per frame written so far. Only then does it
write the next group: a stage that sits on a frame until the next one
pushes it makes the producer time out. At the end it writes the trailer
(unless --no-trailer: safetensors blobs for lrmoe-import -), closes the
pipe, checks that the output is the input frame for frame with a trailer,
and that the pipeline exited 0.

Prints one line per group: "frames 0-0 out after 0.012 s". Exit 1 on any
failure with the reason on stderr.
"""
import argparse
import json
import os
import select
import struct
import subprocess
import sys
import time

import lrmoe_stream as s


def split_frames(buf):
    """Raw stream bytes -> list of frame blobs (without the trailer)."""
    pos, out = 0, []
    while buf[pos:pos + 8] != s.TRAILER:
        pos = s.skip_digest(buf, pos)   # the blobs alone (lrmoe-import - reads them)
        _, _, _, end = s.decode_frame(buf, pos)
        out.append(buf[pos:end])
        pos = end
    return out


def count_frames(buf):
    """Complete frames at the start of buf (a raw stream being written)."""
    pos, n = 0, 0
    while len(buf) - pos >= 8 and buf[pos:pos + 8] != s.TRAILER:
        if buf[pos:pos + 8] in s.DIGESTS + (s.DIGEST_CRT,):
            if len(buf) - pos < 24 or len(buf) - pos < s.record_len(buf, pos) + 8:
                break
            pos += s.record_len(buf, pos)
        (hlen,) = struct.unpack_from("<Q", buf, pos)
        if len(buf) - pos < 8 + hlen:
            break
        hdr = json.loads(buf[pos + 8:pos + 8 + hlen])
        hdr.pop("__metadata__", None)
        end = pos + 8 + hlen + max([e["data_offsets"][1] for e in hdr.values()] or [0])
        if len(buf) < end:
            break
        pos, n = end, n + 1
    return n


def data_rows(path):
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return 0
    # complete lines after the header; the last element is "" or a partial row
    return max(len(lines) - 2, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("cmd")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rows", action="append", default=[], help="FILE:ROWS_PER_FRAME")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--no-trailer", action="store_true")
    a = ap.parse_args()
    frames = split_frames(s._raw_bytes(a.input))
    p = subprocess.Popen(a.cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = b""
    fd = p.stdout.fileno()

    def fail(msg):
        p.kill()
        p.wait()
        sys.exit("live_pipe: " + msg)

    for g in range(0, len(frames), a.batch):
        upto = min(g + a.batch, len(frames))
        for fr in frames[g:upto]:
            p.stdin.write(fr)
        p.stdin.flush()
        t0 = time.monotonic()
        while True:
            rows_ok = all(data_rows(spec.rsplit(":", 1)[0]) >= upto * int(spec.rsplit(":", 1)[1])
                          for spec in a.rows)
            if count_frames(out) >= upto and rows_ok:
                break
            left = a.timeout - (time.monotonic() - t0)
            if left <= 0:
                have = {spec: data_rows(spec.rsplit(":", 1)[0]) for spec in a.rows}
                fail("frames %d-%d written, but after %.0f s only %d frames came out "
                     "(TSV data rows: %s): a stage holds them back"
                     % (g, upto - 1, a.timeout, count_frames(out), have))
            r, _, _ = select.select([fd], [], [], min(left, 0.05))
            if r:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    fail("the pipeline ended after %d frames (exit %s)" % (count_frames(out), p.wait()))
                out += chunk
        print("frames %d-%d out after %.3f s" % (g, upto - 1, time.monotonic() - t0))
    if not a.no_trailer:
        p.stdin.write(s.TRAILER + struct.pack("<Q", len(frames)))
    p.stdin.close()
    out += p.stdout.read()
    rc = p.wait()
    if rc != 0:
        sys.exit("live_pipe: the pipeline exited %d" % rc)
    if out[-16:-8] != s.TRAILER or struct.unpack("<Q", out[-8:])[0] != len(frames):
        sys.exit("live_pipe: the output does not end in a trailer counting %d frames" % len(frames))
    print("%d frames, exit 0" % len(frames))


if __name__ == "__main__":
    main()
