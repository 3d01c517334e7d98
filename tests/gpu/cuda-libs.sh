# Sourced (sh): find CUDA's libraries for the build and the run.
#
#   . tests/gpu/cuda-libs.sh; cuda_libs CUDA_HOME LINKDIR
#
# cudart, cuBLAS and NCCL each from the toolkit's library directory
# (lib64, targets/x86_64-linux/lib, lib), else from the nvidia-* wheels of
# python3 (the image ships nvidia-cublas, nvidia-nccl-cu13: their
# lib/ beside include/ under site-packages/nvidia/*, e.g. nvidia/cu13/lib,
# nvidia/nccl/lib; LRMOE_NVIDIA_DIRS, one directory a line, replaces what
# python3's `nvidia.__path__` says). A wheel's directory goes into
# LIBRARY_PATH and LD_LIBRARY_PATH (exported), its include/ into CPATH; a
# wheel ships only the versioned name (libnccl.so.2), so LINKDIR gets the
# unversioned link the linker asks for.
# Sets CUDA_LIBDIR (where libcudart.so is, for make's CUDA_LIBDIR),
# CUDA_LIBS_FOUND ("name:path(how)" words) and CUDA_LIBS_MISSING (names);
# prints what it looked at.
_cl_pre() { # VAR DIR: DIR in front of the path list VAR, once
    eval "_v=\${$1:-}"
    case ":$_v:" in *":$2:"*) ;; *) eval "$1=\"$2\${_v:+:\$_v}\"" ;; esac
}
cuda_libs() {
    _ch=$1; _links=$2
    CUDA_LIBDIR=; CUDA_LIBS_FOUND=; CUDA_LIBS_MISSING=
    _nv=${LRMOE_NVIDIA_DIRS-$(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)}
    echo "== cuda-libs: toolkit $_ch; nvidia wheel dirs: $(echo $_nv)"
    for _spec in cudart:cuda_runtime.h cublas:cublas_v2.h cublasLt:cublasLt.h nccl:nccl.h; do
        _n=${_spec%%:*}; _h=${_spec#*:}; _at=; _how=
        for _d in "$_ch/lib64" "$_ch/targets/x86_64-linux/lib" "$_ch/lib"; do
            if ls "$_d/lib$_n.so"* >/dev/null 2>&1; then _at=$_d; _how=toolkit; break; fi
        done
        if [ -z "$_at" ]; then
            for _p in $_nv; do
                for _d in "$_p"/*/lib; do
                    if ls "$_d/lib$_n.so."* >/dev/null 2>&1; then _at=$_d; _how=wheel; break 2; fi
                done
            done
        fi
        if [ -z "$_at" ]; then
            CUDA_LIBS_MISSING="$CUDA_LIBS_MISSING $_n"
            echo "lib$_n: not found"
            continue
        fi
        _so=$(ls "$_at/lib$_n.so"* | head -1)
        CUDA_LIBS_FOUND="$CUDA_LIBS_FOUND $_n:$_so($_how)"
        echo "lib$_n: $_so ($_how)"
        if [ ! -e "$_at/lib$_n.so" ]; then
            mkdir -p "$_links" && ln -sf "$_so" "$_links/lib$_n.so"
            _cl_pre LIBRARY_PATH "$_links"
        fi
        if [ "$_how" = wheel ]; then
            _cl_pre LIBRARY_PATH "$_at"
            _cl_pre LD_LIBRARY_PATH "$_at"
            [ -e "$_at/../include/$_h" ] && _cl_pre CPATH "$(cd "$_at/../include" && pwd)"
        fi
        if [ "$_n" = cudart ]; then
            if [ -e "$_at/libcudart.so" ]; then CUDA_LIBDIR=$_at; else CUDA_LIBDIR=$_links; fi
        fi
    done
    export LIBRARY_PATH LD_LIBRARY_PATH CPATH
}
