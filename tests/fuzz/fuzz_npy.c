/* libFuzzer harness: the .npy parser (lrmoe_npy_parse on growing prefixes,
 * lrmoe_npy_fload on the whole input). Oracles: a prefix shorter than the
 * header asks for more (never succeeds early); the header NumPy would write
 * for the parsed dtype and shape parses back to them; a loaded array saved
 * with lrmoe_npy_fsave loads back to the same tensor. */
#include "npy.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lrmoe_npy_info_t info, again;
    int rc = lrmoe_npy_parse(data, size, &info);
    if (rc == 0) {
        FUZZ_CHECK(info.data_offset <= size, "header ends at %zu, beyond the %zu bytes", info.data_offset, size);
        for (size_t k = 0; k < info.data_offset; k += 1 + info.data_offset / 8)
            FUZZ_CHECK(lrmoe_npy_parse(data, k, &again) != 0, "a %zu-byte prefix of a %zu-byte header parsed",
                       k, info.data_offset);
        char hdr[LRMOE_NPY_HEADER_CAP];
        size_t hl;
        if (lrmoe_npy_header(info.dtype, info.ndim, info.shape, hdr, &hl) == 0) {
            FUZZ_CHECK(lrmoe_npy_parse((const uint8_t *)hdr, hl, &again) == 0, "our own header: %s", lrmoe_errmsg());
            FUZZ_CHECK(again.dtype == info.dtype && again.ndim == info.ndim && again.nbytes == info.nbytes,
                       "our own header parses to another array");
            for (int d = 0; d < info.ndim; d++)
                FUZZ_CHECK(again.shape[d] == info.shape[d], "our own header: dimension %d differs", d);
        }
    }
    FILE *fp = size ? fmemopen((void *)data, size, "rb") : NULL;
    if (!fp) return 0;
    lrmoe_frame_t f, g;
    lrmoe_frame_init(&f);
    lrmoe_frame_init(&g);
    if (lrmoe_npy_fload(fp, &f, "x") == 0) {
        FUZZ_CHECK(rc == 0, "fload accepted what parse refused");
        char *buf = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&buf, &len);
        FUZZ_CHECK(out && lrmoe_npy_fsave(out, f.tensors[0], 0) == 0, "fsave: %s", lrmoe_errmsg());
        fclose(out);
        FILE *in = fmemopen(buf, len, "rb");
        FUZZ_CHECK(in && lrmoe_npy_fload(in, &g, "x") == 0, "reload of our own .npy: %s", lrmoe_errmsg());
        fclose(in);
        fuzz_frame_same(&f, &g, "npy save/load");
        free(buf);
    }
    fclose(fp);
    lrmoe_frame_clear(&f);
    lrmoe_frame_clear(&g);
    return 0;
}
