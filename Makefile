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

# ---- MPI: lrmoe-exec runs one rank per process under mpirun whenever
# OpenMPI is found (mpicc --showme, else pkg-config ompi-c); MPI=0 builds
# without it (then running under mpirun says MPI support is not built).
# The detection is written to $(BUILD)/mpi.mk after tests/deps.sh has run
# (which installs OpenMPI when root), so a fresh clone builds with it.
MPICC ?= mpicc
ifneq ($(MPI),0)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
-include $(BUILD)/mpi.mk
endif
endif
$(BUILD)/mpi.mk: tests/deps.sh
	@sh tests/deps.sh build
	@mkdir -p $(@D)
	@{ echo "MPI_CFLAGS := $$($(MPICC) --showme:compile 2>/dev/null || pkg-config --cflags ompi-c 2>/dev/null)"; \
	   echo "MPI_LIBS := $$($(MPICC) --showme:link 2>/dev/null || pkg-config --libs ompi-c 2>/dev/null)"; } > $@
ifneq ($(strip $(MPI_LIBS)),)
HAVE_MPI  := 1
CPPFLAGS  += -DLRMOE_HAVE_MPI $(MPI_CFLAGS)
LDLIBS    += $(MPI_LIBS)
endif

all: deps-build $(TOOLS)
	@test "$(HAVE_CUDA)" = 1 || echo "lrmoe: nvcc not found (set CUDA_HOME): building CPU-only"
	@test "$(HAVE_MPI)" = 1 || echo "lrmoe: OpenMPI not found (libopenmpi-dev): lrmoe-exec without MPI"

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
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

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

clean:
	rm -rf $(BUILD) bin

.PHONY: all check check-gpu bench demo install clean deps-build deps-test
.PHONY: check-resources print-nvccflags
.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(TOOL_SRC:src/%.c=$(BUILD)/src/%.d)
