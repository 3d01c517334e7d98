# lrmoe: make | make check | make bench | make demo | make install PREFIX=... DESTDIR=...
# make check-gpu runs the CUDA kernel tests where a GPU is present.

CC       ?= cc
CFLAGS   ?= -O2
CFLAGS   += -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -MMD -MP
CPPFLAGS += -Ilib
LDLIBS   += -lzstd -ljansson -lglpk -lopenblas -lm -lpthread
PREFIX   ?= /usr/local
BUILD    ?= build

LIB_SRC  := $(wildcard lib/*.c)
LIB_OBJ  := $(LIB_SRC:lib/%.c=$(BUILD)/lib/%.o)
TOOL_SRC := $(wildcard src/lrmoe-*.c)
TOOLS    := $(TOOL_SRC:src/%.c=bin/%)
MANS     := $(wildcard man/man*/*.[1-9])
LIBDIR   ?= $(PREFIX)/lib
VERSION  := $(shell sed -n 's/^\#define LRMOE_VERSION "\(.*\)"/\1/p' lib/lrmoe.h)

# ---- liblrmoe.so.0 (lrmoe(3)): the same -fPIC objects as liblrmoe.a, only the
# functions declared in the public headers exported (build/liblrmoe.map is
# generated from them), headers installed under $(PREFIX)/include/lrmoe/.
PUB_HDR  := lib/lrmoe.h lib/cost.h lib/route.h lib/plan.h lib/score.h lib/pack.h \
            lib/exec.h $(wildcard lib/exec_frame.h) lib/api.h
SONAME   := liblrmoe.so.0
PICFLAGS := -fPIC

# ---- CUDA backend: built whenever nvcc is found (CUDA_HOME overridable).
# kernels/*.cu go into liblrmoe.a; tests/gpu/*.cu (kernel tests, GPU bench)
# are built by `make` too, so a compile error anywhere in CUDA code fails it.
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null))
CUDA_ARCH ?= sm_90
NVCC      := $(CUDA_HOME)/bin/nvcc
CU_SRC    := $(wildcard kernels/*.cu)
GPU_SRC   := $(wildcard tests/gpu/*.cu)
ifneq ($(CUDA_HOME),)
ifneq ($(wildcard $(NVCC)),)
HAVE_CUDA := 1
endif
endif
ifeq ($(HAVE_CUDA),1)
CU_OBJ    := $(CU_SRC:kernels/%.cu=$(BUILD)/kernels/%.o)
GPU_BIN   := $(GPU_SRC:tests/gpu/%.cu=$(BUILD)/tests/gpu/%)
CPPFLAGS  += -DLRMOE_HAVE_CUDA
NVCCFLAGS ?= -O2
NVCCFLAGS += -std=c++17 -arch=$(CUDA_ARCH) -DLRMOE_HAVE_CUDA -Ilib -Ikernels \
             -Xcompiler -Wall,-Wextra -MMD -MP
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
LDLIBS    += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -lcublas -lnccl -lstdc++
all: deps-build $(GPU_BIN)
-include $(CU_OBJ:.o=.d) $(GPU_BIN:=.d)
else
CU_OBJ    :=
GPU_BIN   :=
endif

all: deps-build $(TOOLS) $(BUILD)/$(SONAME) $(BUILD)/lrmoe.pc
	@test "$(HAVE_CUDA)" = 1 || echo "lrmoe: nvcc not found (set CUDA_HOME): building CPU-only"

# Build dependencies: installed with apt-get when missing and root, else named.
deps-build:
	@sh tests/deps.sh build
deps-test: deps-build
	@sh tests/deps.sh test

$(BUILD)/liblrmoe.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PICFLAGS) -c -o $@ $<

$(BUILD)/liblrmoe.map: $(PUB_HDR) Makefile
	@mkdir -p $(@D)
	{ echo 'LRMOE_0 {'; echo '  global:'; \
	  perl -0777 -ne 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g; print "    $$1;\n" while /\b(lrmoe_[a-z0-9_]+)\s*\(/g' $(PUB_HDR) | sort -u; \
	  echo '  local: *;'; echo '};'; } > $@

$(BUILD)/$(SONAME): $(LIB_OBJ) $(CU_OBJ) $(BUILD)/liblrmoe.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined \
	  -Wl,--version-script=$(BUILD)/liblrmoe.map -o $@ $(LIB_OBJ) $(CU_OBJ) $(LDLIBS)
	ln -sf $(SONAME) $(BUILD)/liblrmoe.so

$(BUILD)/lrmoe.pc: lrmoe.pc.in Makefile
	sed -e 's,@PREFIX@,$(PREFIX),' -e 's,@LIBDIR@,$(LIBDIR),' -e 's,@VERSION@,$(VERSION),' \
	  lrmoe.pc.in > $@

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -Xcompiler $(PICFLAGS) -c -o $@ $<

$(BUILD)/tests/gpu/%.o: tests/gpu/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(BUILD)/liblrmoe.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

bin/%: $(BUILD)/src/%.o $(BUILD)/liblrmoe.a
	@mkdir -p bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

check: all deps-test
	@sh tests/run.sh

check-gpu: all
	@BUILD="$(BUILD)" HAVE_CUDA="$(HAVE_CUDA)" sh tests/gpu/check-gpu.sh

# Kernel registers/shared/local memory against kernels/kcu_launch.h (no GPU).
check-resources:
	@NVCC="$(NVCC)" NVCCFLAGS="$(NVCCFLAGS)" sh tests/gpu/check-resources.sh
print-nvccflags:
	@echo $(NVCCFLAGS)

bench: all deps-test
	@sh tests/bench/run.sh

demo: all
	@sh tests/demo.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin
	for m in $(MANS); do d=$(DESTDIR)$(PREFIX)/share/man/$$(basename $$(dirname $$m)); \
	  install -d $$d && install -m 644 $$m $$d || exit 1; done
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include/lrmoe
	install -m 755 $(BUILD)/$(SONAME) $(DESTDIR)$(LIBDIR)/liblrmoe.so.$(VERSION)
	ln -sf liblrmoe.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/liblrmoe.so
	install -m 644 $(BUILD)/liblrmoe.a $(DESTDIR)$(LIBDIR)
	install -m 644 $(PUB_HDR) $(DESTDIR)$(PREFIX)/include/lrmoe
	sed -e 's,@PREFIX@,$(PREFIX),' -e 's,@LIBDIR@,$(LIBDIR),' -e 's,@VERSION@,$(VERSION),' \
	  lrmoe.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/lrmoe.pc

clean:
	rm -rf $(BUILD) bin

.PHONY: all check check-gpu bench demo install clean deps-build deps-test
.PHONY: check-resources print-nvccflags
.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(TOOL_SRC:src/%.c=$(BUILD)/src/%.d)
