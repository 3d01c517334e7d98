/* Conversion checks driven by tests/stream.bats: prints the library's
 * conversions so Python/NumPy can compare them with an independent reference.
 *   dtype_test f16all          every f16 bit pattern -> f32 bits (hex)
 *   dtype_test tof16 FILE      f32 bits (hex, one per line) -> f16 bits
 *   dtype_test tobf16 FILE     f32 bits -> bf16 bits
 *   dtype_test empty           every conversion of 0 elements from and to NULL
 *                              (empty tensors have no data; built with UBSan) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "f16all")) {
        for (unsigned h = 0; h < 65536; h++) {
            float f = lrmoe_f16_to_f32((uint16_t)h);
            unsigned u;
            memcpy(&u, &f, 4);
            printf("%08x\n", u);
        }
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "empty")) {
        for (int d = 0; d < LRMOE_NDTYPES; d++) {
            lrmoe_convert_to_f32((lrmoe_dtype_t)d, NULL, NULL, 0);
            lrmoe_convert_to_f64((lrmoe_dtype_t)d, NULL, NULL, 0);
            lrmoe_convert_to_i64((lrmoe_dtype_t)d, NULL, NULL, 0);
            lrmoe_convert_from_f32((lrmoe_dtype_t)d, NULL, NULL, 0);
        }
        printf("ok\n");
        return 0;
    }
    if (argc >= 3) {
        FILE *fp = fopen(argv[2], "r");
        if (!fp) return 1;
        unsigned u;
        while (fscanf(fp, "%x", &u) == 1) {
            float f;
            memcpy(&f, &u, 4);
            printf("%04x\n", !strcmp(argv[1], "tof16") ? lrmoe_f32_to_f16(f) : lrmoe_f32_to_bf16(f));
        }
        fclose(fp);
        return 0;
    }
    return 2;
}
