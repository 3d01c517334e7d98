/* Conversion checks driven by tests/stream.bats: prints the library's
 * conversions so Python/NumPy can compare them with an independent reference.
 *   dtype_test f16all          every f16 bit pattern -> f32 bits (hex)
 *   dtype_test tof16 FILE      f32 bits (hex, one per line) -> f16 bits
 *   dtype_test tobf16 FILE     f32 bits -> bf16 bits
 *   dtype_test empty           every conversion of 0 elements from and to NULL
 *                              (empty tensors have no data; built with UBSan)
 *   dtype_test toint FILE      f32 bits -> every integer dtype (from_f32) and
 *                              f32, f64, bf16 -> i64 (to_i64): one line per
 *                              value, "I8 U8 I16 U16 I32 U32 I64 U64 f32 f64
 *                              bf16" in decimal (built with float-cast UBSan) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

/* one value of the file modes: f32 -> f16 bits, -> bf16 bits, -> every
 * integer view */
static void print_f16(float f) { printf("%04x\n", lrmoe_f32_to_f16(f)); }
static void print_bf16(float f) { printf("%04x\n", lrmoe_f32_to_bf16(f)); }
static void print_toint(float f)
{
    int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32; uint32_t u32;
    int64_t i64, a, b, c;
    uint64_t u64;
    lrmoe_convert_from_f32(LRMOE_I8, &f, &i8, 1);
    lrmoe_convert_from_f32(LRMOE_U8, &f, &u8, 1);
    lrmoe_convert_from_f32(LRMOE_I16, &f, &i16, 1);
    lrmoe_convert_from_f32(LRMOE_U16, &f, &u16, 1);
    lrmoe_convert_from_f32(LRMOE_I32, &f, &i32, 1);
    lrmoe_convert_from_f32(LRMOE_U32, &f, &u32, 1);
    lrmoe_convert_from_f32(LRMOE_I64, &f, &i64, 1);
    lrmoe_convert_from_f32(LRMOE_U64, &f, &u64, 1);
    double d = f;
    uint16_t h = lrmoe_f32_to_bf16(f);
    lrmoe_convert_to_i64(LRMOE_F32, &f, &a, 1);
    lrmoe_convert_to_i64(LRMOE_F64, &d, &b, 1);
    lrmoe_convert_to_i64(LRMOE_BF16, &h, &c, 1);
    printf("%d %u %d %u %ld %lu %lld %llu %lld %lld %lld\n", i8, u8, i16, u16, (long)i32,
           (unsigned long)u32, (long long)i64, (unsigned long long)u64, (long long)a,
           (long long)b, (long long)c);
}

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
        void (*fn)(float) = !strcmp(argv[1], "toint") ? print_toint
                          : !strcmp(argv[1], "tof16") ? print_f16 : print_bf16;
        FILE *fp = fopen(argv[2], "r");
        if (!fp) return 1;
        unsigned u;
        while (fscanf(fp, "%x", &u) == 1) {
            float f;
            memcpy(&f, &u, 4);
            fn(f);
        }
        fclose(fp);
        return 0;
    }
    return 2;
}
