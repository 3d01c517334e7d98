# lrmoe: make | make check | make bench | make demo | make install PREFIX=... DESTDIR=...
# make check SANITIZE=1 (ASan+UBSan suite) | make fuzz FUZZ_SECONDS=N
# make check-gpu runs the CUDA kernel tests where a GPU is present; where none
# is (or no CUDA in the build) tests/gpu/check-gpu.sh exits 77 and make fails.
# NODEPS=1 skips the dependency step (tests/deps.sh, which may apt-get as
# root): for a machine without a package registry whose dependencies are
# already in place, e.g. headers through CPATH and libraries through
# LIBRARY_PATH (tests/gpu/device-check.sh builds this way).

CC       ?= cc
CFLAGS   ?= -O2
CFLAGS   += -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -MMD -MP
CPPFLAGS += -Ilib
LDLIBS   += -lzstd -ljansson -lglpk -lm -lpthread
PREFIX   ?= /usr/local
BUILD    ?= build
# make check SANITIZE=1: ASan + UBSan (leaks on, UB fatal) in their own build
# dir; the tools in bin/ are relinked whenever the variant changes. UBSan
# with float-cast-overflow, which GCC's "undefined" leaves out (a float
# converted to an integer type it does not fit).
PLAIN_BUILD := $(BUILD)
ifneq ($(SANITIZE),)
BUILD    := $(BUILD)/san
CFLAGS   += -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow \
            -fno-sanitize-recover=undefined,float-cast-overflow
LDFLAGS  += -fsanitize=address,undefined,float-cast-overflow
VARIANT  := san
else
VARIANT  := plain
endif
FUZZ_SECONDS ?= 60
# the dependency step (deps-build, deps-test, and before $(BUILD)/mpi.mk)
ifeq ($(NODEPS),1)
DEPS_SH  := : NODEPS=1 skips tests/deps.sh
else
DEPS_SH  := sh tests/deps.sh
endif
# `make` is `make all` whichever rule comes first (CPU-only, the first one is mpi.mk)
.DEFAULT_GOAL := all

LIB_SRC  := $(wildcard lib/*.c)
LIB_OBJ  := $(LIB_SRC:lib/%.c=$(BUILD)/lib/%.o)
TOOL_SRC := $(wildcard src/lrmoe-*.c)
TOOLS    := $(TOOL_SRC:src/%.c=bin/%)
MANS     := $(wildcard man/man*/*.[1-9])
LIBDIR   ?= $(PREFIX)/lib
VERSION  := $(shell sed -n 's/^\#define LRMOE_VERSION "\(.*\)"/\1/p' lib/lrmoe.h)

# ---- liblrmoe.so.2 (lrmoe(3)): the same -fPIC objects as liblrmoe.a, only the
# functions declared in the public headers exported (build/liblrmoe.map is
# generated from them), headers installed under $(PREFIX)/include/lrmoe/.
PUB_HDR  := lib/lrmoe.h lib/cost.h lib/route.h lib/plan.h lib/score.h lib/pack.h \
            lib/minpeak.h lib/exec.h lib/api.h \
            lib/capacity.h lib/budget.h
SONAME   := liblrmoe.so.2
PICFLAGS := -fPIC
OBJCOPY  ?= objcopy
# the library's objects: only what the installed headers declare (their
# `#pragma GCC visibility push(default)`) is visible outside them
LIBVIS   := -fvisibility=hidden

# ---- oneDNN: the CPU backend's BF16 expert GEMMs (lrmoe-exec --compute bf16).
# Detected once, when the first object is compiled (after deps-build, which
# installs libdnnl-dev as root), by compiling and linking against it;
# HAVE_DNNL=0 builds without. Without it the build is F32-only and
# --compute bf16 says so.
HAVE_DNNL ?= $(eval HAVE_DNNL := $(shell echo 'int main(void){return dnnl_version() == 0;}' | \
    $(CC) -include oneapi/dnnl/dnnl.h -x c - -o /dev/null -ldnnl >/dev/null 2>&1 && echo 1))$(HAVE_DNNL)
CPPFLAGS += $(if $(filter 1,$(HAVE_DNNL)),-DLRMOE_HAVE_DNNL)
LDLIBS   += $(if $(filter 1,$(HAVE_DNNL)),-ldnnl -lgomp)

# ---- CUDA backend: built whenever nvcc is found (CUDA_HOME overridable).
# kernels/*.cu go into liblrmoe.a (the tools, tests/gpu) and into the module
# liblrmoe-cuda.so.1 (with kernels/module.c), the only object linked against
# cudart/cublas/nccl: liblrmoe.so.2 dlopens it on first use of the CUDA
# backend (lib/cuda_module.c, lib/cuda_module.h), so a Python user's
# `import lrmoe` loads no CUDA library. tests/gpu/*.cu (kernel tests, GPU
# bench) are built by `make` too, so a compile error anywhere in CUDA code fails it.
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
# The Hopper grouped GEMM (--gemm cutlass, kernels/ggemm.cu) adds one object
# per variant of kernels/cutlass/ggemm_sm90.cu (ta tb c_bf16; ~1 min of
# nvcc each here): compiled when the CUTLASS headers are found
# (tests/gpu/cutlass-inc.sh, after tests/deps.sh installed them; written to
# $(BUILD)/cutlass.mk; CUTLASS=0 builds without), or taken prebuilt from
# CUTLASS_PREBUILT (a directory of gg_VARIANT.o, what device-check.sh
# carries to a machine without the headers).
GG_VARIANTS := 000 001 010 011 100 101
gg_digits = $(subst 0,0 ,$(subst 1,1 ,$(1)))
gg_defs = -DGG_TA=$(word 1,$(call gg_digits,$(1))) -DGG_TB=$(word 2,$(call gg_digits,$(1))) \
    -DGG_CBF16=$(word 3,$(call gg_digits,$(1)))
CUTLASS_NVCCFLAGS = -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -DNDEBUG -DLRMOE_HAVE_CUDA -Ilib -Ikernels -I$(CUTLASS_INC) -Xcompiler -fPIC \
    -Xcompiler -fvisibility=hidden -Xcompiler -fno-gnu-unique -Xptxas -v
ifeq ($(HAVE_CUDA),1)
ifneq ($(CUTLASS),0)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
-include $(BUILD)/cutlass.mk
endif
endif
# The sanitized build takes the plain build's CUTLASS objects when they are
# all there (device code and CUTLASS's host adapter, which nvcc compiles
# without sanitizers in either build): CI's second pass saves their minutes.
ifneq ($(SANITIZE),)
ifeq ($(CUTLASS_PREBUILT),)
ifeq ($(words $(wildcard $(GG_VARIANTS:%=$(PLAIN_BUILD)/kernels/cutlass/gg_%.o))),$(words $(GG_VARIANTS)))
CUTLASS_PREBUILT := $(PLAIN_BUILD)/kernels/cutlass
endif
endif
endif
ifneq ($(CUTLASS_PREBUILT),)
GG_OBJ    := $(GG_VARIANTS:%=$(CUTLASS_PREBUILT)/gg_%.o)
else ifneq ($(strip $(CUTLASS_INC)),)
GG_OBJ    := $(GG_VARIANTS:%=$(BUILD)/kernels/cutlass/gg_%.o)
endif
HAVE_CUTLASS := $(if $(GG_OBJ),1)
CU_OBJ    := $(CU_SRC:kernels/%.cu=$(BUILD)/kernels/%.o) $(GG_OBJ)
GPU_BIN   := $(GPU_SRC:tests/gpu/%.cu=$(BUILD)/tests/gpu/%)
CPPFLAGS  += -DLRMOE_HAVE_CUDA
NVCCFLAGS ?= -O2
NVCCFLAGS += -std=c++17 -arch=$(CUDA_ARCH) -DLRMOE_HAVE_CUDA -Ilib -Ikernels \
             -Xcompiler -Wall,-Wextra -MMD -MP
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -lcublas -lnccl -lstdc++
CUDA_MOD  := liblrmoe-cuda.so.1
CUDA_LOADER := $(BUILD)/lib/cuda_module.o
$(CUDA_LOADER): CPPFLAGS += -DLRMOE_CUDA_LOADER
all: deps-build $(GPU_BIN) $(BUILD)/$(CUDA_MOD)
-include $(CU_SRC:kernels/%.cu=$(BUILD)/kernels/%.d) $(GPU_BIN:=.d) $(BUILD)/kernels/module.d
else
CU_OBJ    :=
GPU_BIN   :=
CUDA_LDLIBS :=
CUDA_MOD  :=
CUDA_LOADER :=
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
$(BUILD)/cutlass.mk: tests/deps.sh tests/gpu/cutlass-inc.sh | $(BUILD)/mpi.mk
	@mkdir -p $(@D)
	@echo "CUTLASS_INC := $$(sh tests/gpu/cutlass-inc.sh 2>/dev/null)" > $@
$(BUILD)/mpi.mk: tests/deps.sh
	@$(DEPS_SH) build
	@mkdir -p $(@D)
	@{ echo "MPI_CFLAGS := $$($(MPICC) --showme:compile 2>/dev/null || pkg-config --cflags ompi-c 2>/dev/null)"; \
	   echo "MPI_LIBS := $$($(MPICC) --showme:link 2>/dev/null || pkg-config --libs ompi-c 2>/dev/null)"; } > $@
ifneq ($(strip $(MPI_LIBS)),)
HAVE_MPI  := 1
CPPFLAGS  += -DLRMOE_HAVE_MPI $(MPI_CFLAGS)
LDLIBS    += $(MPI_LIBS)
endif

all: deps-build $(TOOLS) $(BUILD)/$(SONAME) $(BUILD)/lrmoe.pc
	@test "$(HAVE_CUDA)" = 1 || echo "lrmoe: nvcc not found (set CUDA_HOME): building CPU-only"
	@test "$(HAVE_DNNL)" = 1 || echo "lrmoe: oneDNN (libdnnl-dev) not found: building without --compute bf16"
	@test "$(HAVE_MPI)" = 1 || echo "lrmoe: OpenMPI not found (libopenmpi-dev): lrmoe-exec without MPI"
	@test "$(HAVE_CUDA)" != 1 || test "$(HAVE_CUTLASS)" = 1 || \
	  echo "lrmoe: CUTLASS headers not found (nvidia-cutlass): CUDA backend without --gemm cutlass"

# Build dependencies: installed with apt-get when missing and root, else named;
# NODEPS=1: not looked at (nothing installed, nothing checked).
deps-build:
	@$(DEPS_SH) build
deps-test: deps-build
	@$(DEPS_SH) test

# liblrmoe.a: the C objects (each exports only lrmoe_* names), and the CUDA
# objects partially linked into one, cuda.o, whose C++, CUB and NVTX
# symbols are made local once its files have resolved each other: a
# static link sees only lrmoe_* from liblrmoe.a (tests/lib.bats).
CUDA_A_OBJ := $(if $(CU_OBJ),$(BUILD)/kernels/cuda.o)
$(BUILD)/kernels/cuda.o: $(CU_OBJ)
	$(LD) -r --force-group-allocation -o $@ $^
	$(OBJCOPY) --wildcard --keep-global-symbol='lrmoe_*' $@
$(BUILD)/liblrmoe.a: $(filter-out $(CUDA_LOADER),$(LIB_OBJ)) $(CUDA_A_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $^

$(LIB_OBJ) $(TOOL_SRC:src/%.c=$(BUILD)/src/%.o): | deps-build

$(BUILD)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PICFLAGS) $(LIBVIS) -c -o $@ $<

$(BUILD)/liblrmoe.map: $(PUB_HDR) Makefile
	@mkdir -p $(@D)
	{ echo 'LRMOE_2 {'; echo '  global:'; \
	  perl -0777 -ne 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g; print "    $$1;\n" while /\b(lrmoe_[a-z0-9_]+)\s*\(/g' $(PUB_HDR) | sort -u; \
	  echo '  local: *;'; echo '};'; } > $@

$(BUILD)/$(SONAME): $(LIB_OBJ) $(BUILD)/liblrmoe.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined \
	  -Wl,--version-script=$(BUILD)/liblrmoe.map -o $@ $(LIB_OBJ) $(LDLIBS) -ldl
	ln -sf $(SONAME) $(BUILD)/liblrmoe.so

# the CUDA module: exports lrmoe_cuda_module_init only
$(BUILD)/$(CUDA_MOD): $(CU_OBJ) $(BUILD)/kernels/module.o kernels/cuda_module.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(CUDA_MOD) -Wl,--no-undefined \
	  -Wl,--version-script=kernels/cuda_module.map -o $@ $(CU_OBJ) $(BUILD)/kernels/module.o \
	  $(CUDA_LDLIBS)

$(BUILD)/kernels/module.o: kernels/module.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PICFLAGS) -Ikernels -c -o $@ $<

# lrmoe.pc's Libs.private: what a static link against liblrmoe.a needs
# (the libraries this build links, CUDA's and MPI's included when built)
PC_PRIVATE = $(strip $(LDLIBS) $(CUDA_LDLIBS) -ldl)
PC_SED = sed -e 's,@PREFIX@,$(PREFIX),' -e 's,@LIBDIR@,$(LIBDIR),' -e 's,@VERSION@,$(VERSION),' \
	  -e 's|@LIBS_PRIVATE@|$(PC_PRIVATE)|'
$(BUILD)/lrmoe.pc: lrmoe.pc.in Makefile $(wildcard $(BUILD)/mpi.mk)
	$(PC_SED) lrmoe.pc.in > $@

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -Xcompiler $(PICFLAGS) -Xcompiler $(LIBVIS) -Xcompiler -fno-gnu-unique -c -o $@ $<

# ggemm.cu calls the CUTLASS objects only when there are some
$(BUILD)/kernels/ggemm.o: NVCCFLAGS += $(if $(HAVE_CUTLASS),-DLRMOE_HAVE_CUTLASS)
$(BUILD)/kernels/ggemm.o: $(wildcard $(BUILD)/cutlass.mk)
# one CUTLASS variant (ta tb c_bf16 = the three digits); ptxas's report kept
# beside it for tests/cuda-resources.bats
$(BUILD)/kernels/cutlass/gg_%.o: kernels/cutlass/ggemm_sm90.cu kernels/ggemm_sm90.h kernels/ggemm_variant.h
	@mkdir -p $(@D)
	$(NVCC) $(CUTLASS_NVCCFLAGS) $(call gg_defs,$*) -c -o $@ $< 2> $(@:.o=.ptxas) || \
	  { cat $(@:.o=.ptxas) >&2; exit 1; }

$(BUILD)/tests/gpu/%.o: tests/gpu/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(BUILD)/liblrmoe.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# bin/.variant holds "plain" or "san"; rewritten (so newer than the tools,
# which relink) only when the variant changes.
bin/.variant: FORCE
	@mkdir -p bin && { [ "$$(cat $@ 2>/dev/null)" = $(VARIANT) ] || echo $(VARIANT) > $@; }
$(TOOLS): bin/.variant $(BUILD)/liblrmoe-tools.a
FORCE:

# The tools link the .so's objects (the CUDA loader, no kernels, no CUDA
# library: lrmoe-exec starts without CUDA's start-up and loads
# liblrmoe-cuda.so.1 on --backend cuda only), which their run path finds:
# PREFIX/lib when installed (make install puts it there), $(BUILD) in-tree.
TOOL_RPATH := -Wl,-rpath,'$$ORIGIN/../lib' -Wl,-rpath,$(abspath $(BUILD))
$(BUILD)/liblrmoe-tools.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $^
# installed, and linked by tests/gpu, no longer by the tools
all: $(BUILD)/liblrmoe.a

# (Makefile: an edit of the link line, LDLIBS, relinks them)
bin/%: $(BUILD)/src/%.o $(BUILD)/liblrmoe-tools.a Makefile
	@mkdir -p bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) -ldl $(TOOL_RPATH)

# what make install installs: the same tools relinked with PREFIX/lib alone
# in their run path (no build directory of this machine in an installed tool)
INST_TOOLS := $(TOOLS:bin/%=$(BUILD)/inst/%)
$(BUILD)/inst/%: $(BUILD)/src/%.o $(BUILD)/liblrmoe-tools.a Makefile
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) -ldl -Wl,-rpath,'$$ORIGIN/../lib'

# ---- unit tests (tests/unit/NAME_test.c): each linked from the objects of
# the modules it tests and what they need, no more (the lists below: a new
# dependency of a module shows here first). The bats files build theirs with
# `make build/unit/NAME_test` (tests/helpers/unit.bash); `make unit` builds
# and runs them all on quick arguments (tests/unit/run.sh).
UNIT_NAMES    := $(patsubst tests/unit/%_test.c,%,$(wildcard tests/unit/*_test.c))
UNIT_BIN      := $(UNIT_NAMES:%=$(BUILD)/unit/%_test)
UNIT_alloc    := frame dtype producers error
UNIT_blas     := blas error
UNIT_capacity := capacity error
UNIT_crc64    := crc64 crc64_par par error
UNIT_dtype    := dtype error
UNIT_gemm     := gemm_cpu gemm_amx gemm_avx2 gemm_dpbf16 dtype error blas
UNIT_gemm_amx := $(UNIT_gemm)
UNIT_plan     := plan plan_eplb plan_llep plan_lrmoe plan_core minpeak capacity cost error frame \
                 producers dtype clock stream crc64
UNIT_stream_verify := stream crc64 frame producers dtype clock error
UNIT_route    := route route_scalar route_avx2 route_avx512 error dtype blas
UNIT_swiglu   := swiglu dtype error
UNIT_weights_map := weights_map weights frame crc64 crc64_par par producers dtype stream clock error
# score_test is linked against liblrmoe.so.2 (it calls the public API only)
$(BUILD)/unit/score_test: tests/unit/score_test.c $(BUILD)/$(SONAME)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< -L$(BUILD) -l:$(SONAME) \
	  -Wl,-rpath,$(abspath $(BUILD)) -lm
.SECONDEXPANSION:
$(BUILD)/unit/%_test: tests/unit/%_test.c $$(addprefix $(BUILD)/lib/,$$(addsuffix .o,$$(UNIT_$$*)))
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS) -ldl
-include $(UNIT_BIN:=.d)
unit-build: $(UNIT_BIN)
unit: $(UNIT_BIN)
	@sh tests/unit/run.sh $(BUILD)/unit

# The layer rule (lib/LAYERS, lrmoe(7) THE LIBRARY) on the objects' real
# call edges; tests/layers.bats runs it in make check.
check-layers: all
	@python3 tests/helpers/layers.py check $(BUILD)/lib $(BUILD)/kernels

# Everyday edits (< 1 min): the unit tests, the library's C API, the stream
# codec and one whole pipeline (tests/README, Tiers).
check-fast: all $(UNIT_BIN)
	@LRMOE_BUILD="$(BUILD)" sh tests/fast.sh

# The unit programs the bats files run (tests/helpers/unit.bash: the plain
# build's, score_test also the pass's) are built first, so that files running
# at once (tests/run.sh, TEST_JOBS) never build them at the same time.
check: all deps-test
	@$(MAKE) -s --no-print-directory NODEPS=1 SANITIZE= BUILD=$(PLAIN_BUILD) unit-build
	@$(if $(SANITIZE),$(MAKE) -s --no-print-directory NODEPS=1 $(BUILD)/unit/score_test)
	@SANITIZE="$(SANITIZE)" LRMOE_BUILD="$(BUILD)" sh tests/run.sh

# libFuzzer harnesses (tests/fuzz), FUZZ_SECONDS each with random seeds; make check
# runs them on seed 1 and fixed counts (tests/fuzz.bats).
fuzz: all
	@BUILD="$(BUILD)" sh tests/fuzz/run.sh $(FUZZ_SECONDS)

check-gpu: all
	@BUILD="$(BUILD)" HAVE_CUDA="$(HAVE_CUDA)" sh tests/gpu/check-gpu.sh

# Kernel registers/shared/local memory against kernels/kcu_launch.h (no GPU).
check-resources:
	@NVCC="$(NVCC)" NVCCFLAGS="$(NVCCFLAGS)" sh tests/gpu/check-resources.sh
print-nvccflags:
	@echo $(NVCCFLAGS)
print-cutlass:
	@echo "HAVE_CUTLASS=$(HAVE_CUTLASS) CUTLASS_INC=$(CUTLASS_INC) GG_OBJ=$(GG_OBJ)"
# the CUTLASS objects alone (device-check.sh --prepare carries them)
cutlass-objs: $(GG_OBJ)

bench: all deps-test
	@sh tests/bench/run.sh

demo: all
	@sh tests/demo.sh

install: all $(INST_TOOLS)
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(INST_TOOLS) $(DESTDIR)$(PREFIX)/bin
	for m in $(MANS); do d=$(DESTDIR)$(PREFIX)/share/man/$$(basename $$(dirname $$m)); \
	  install -d $$d && install -m 644 $$m $$d || exit 1; done
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include/lrmoe
	install -m 755 $(BUILD)/$(SONAME) $(DESTDIR)$(LIBDIR)/liblrmoe.so.$(VERSION)
	ln -sf liblrmoe.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/liblrmoe.so
	$(if $(CUDA_MOD),install -m 755 $(BUILD)/$(CUDA_MOD) $(DESTDIR)$(LIBDIR))
	install -m 644 $(BUILD)/liblrmoe.a $(DESTDIR)$(LIBDIR)
	install -m 644 $(PUB_HDR) $(DESTDIR)$(PREFIX)/include/lrmoe
	$(PC_SED) lrmoe.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/lrmoe.pc

clean:
	rm -rf $(BUILD) bin

.PHONY: all check check-fast check-layers unit unit-build check-gpu bench demo install clean deps-build deps-test fuzz FORCE
.PHONY: check-resources print-nvccflags print-cutlass cutlass-objs
.SECONDARY:
-include $(LIB_OBJ:.o=.d) $(TOOL_SRC:src/%.c=$(BUILD)/src/%.d)
