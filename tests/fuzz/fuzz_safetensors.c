/* libFuzzer harness: the safetensors decoder, both ways in: the in-memory
 * lrmoe_frame_decode (what lrmoe-import runs on a .safetensors file) and the
 * FILE reader lrmoe_frame_fread (lrmoe-import -, blobs back to back).
 * The decoder reads a copy that ends at an inaccessible page (a read past
 * the end faults even inside jansson). Oracles: a decoded frame encodes and decodes to itself; when the whole
 * input is one valid blob, fread reads that same frame and then a clean end. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lrmoe_frame_t f, g;
    lrmoe_frame_init(&f);
    lrmoe_frame_init(&g);
    size_t maplen;
    const uint8_t *g8 = fuzz_guarded(data, size, &maplen);
    int whole = lrmoe_frame_decode(g8, size, &f) == 0;
    fuzz_unguard(g8, size, maplen);
    if (whole) fuzz_roundtrip(&f);

    FILE *fp = size ? fmemopen((void *)data, size, "rb") : NULL;
    if (fp) {
        int n = 0, r;
        while ((r = lrmoe_frame_fread(fp, &g)) == 1) {
            if (whole) {
                FUZZ_CHECK(n == 0, "fread found a second blob in one valid blob");
                fuzz_frame_same(&f, &g, "decode vs fread");
            } else {
                fuzz_roundtrip(&g);
            }
            n++;
        }
        if (whole) FUZZ_CHECK(r == 0 && n == 1, "fread of a valid blob: %d frames, rc %d (%s)", n, r,
                              r < 0 ? lrmoe_errmsg() : "");
        fclose(fp);
    }
    lrmoe_frame_clear(&f);
    lrmoe_frame_clear(&g);
    return 0;
}
