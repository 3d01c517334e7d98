# Sourced by tests/build.bats and tests/cuda.bats (bash): a simulation of
# the lent device machine on this one, in directory $1:
#   $1/bin       PATH: a failing apt-get (no network; its calls logged in
#                $1/apt-get.log) first, then every command of PATH except
#                OpenMPI's (mpicc, mpirun, ...): no MPI there
#   SIM_CC       cc that sees no system header of a build dependency (zstd,
#                jansson, glpk, OpenBLAS): -nostdinc with the compiler's own
#                directories and a copy of /usr/include without them, so
#                those headers come only through CPATH
#   PKG_CONFIG_LIBDIR empty (pkg-config finds no ompi-c either)
#   CPATH, LIBRARY_PATH, LD_LIBRARY_PATH unset
# sim_device DIR; then run commands with sim_env CMD... (SIM_PATH_PRE: a
# directory before all of PATH, e.g. a toolkit's bin/)
DEP_HEADERS="zstd.h zdict.h zstd_errors.h jansson.h jansson_config.h glpk.h cblas.h \
cblas-openblas.h openblas_config.h cblas_mangling.h f77blas.h"
sim_device() {
    SIM=$1
    mkdir -p "$SIM/bin" "$SIM/farm" "$SIM/inc/multi" "$SIM/pc" || return 1
    printf '#!/bin/sh\necho "$*" >> "%s/apt-get.log"\necho "E: simulated: no network" >&2\nexit 100\n' \
        "$SIM" > "$SIM/bin/apt-get"
    chmod +x "$SIM/bin/apt-get"
    : > "$SIM/apt-get.log"
    local d f n
    for d in $(echo "$PATH" | tr : ' '); do
        [ -d "$d" ] || continue
        for f in "$d"/*; do
            n=${f##*/}
            case $n in mpi*|orte*|ompi*|opal*|oshcc|oshrun|apt-get) continue ;; esac
            [ -e "$SIM/farm/$n" ] || [ ! -x "$f" ] || ln -s "$f" "$SIM/farm/$n"
        done
    done
    # the system headers less the dependencies' ones
    for f in /usr/include/*; do
        n=${f##*/}
        case " $DEP_HEADERS x86_64-linux-gnu " in *" $n "*) continue ;; esac
        ln -s "$f" "$SIM/inc/$n"
    done
    for f in /usr/include/x86_64-linux-gnu/*; do
        n=${f##*/}
        case " $DEP_HEADERS " in *" $n "*) continue ;; esac
        ln -s "$f" "$SIM/inc/multi/$n"
    done
    # the compiler's own include directories stay; /usr/include is replaced
    local gccinc="" i
    for i in $(echo | cc -xc -E -v - 2>&1 | sed -n '/^#include <...> search starts here:/,/^End of search list/p' |
               grep '^ /' | sed 's/^ //'); do
        case $i in /usr/include|/usr/include/x86_64-linux-gnu|/usr/local/include) ;;
                   *) gccinc="$gccinc -isystem $i" ;; esac
    done
    SIM_CC="cc -nostdinc$gccinc -isystem $SIM/inc/multi -isystem $SIM/inc"
}
sim_env() {
    env -u CPATH -u LIBRARY_PATH -u LD_LIBRARY_PATH -u C_INCLUDE_PATH \
        PATH="${SIM_PATH_PRE:+$SIM_PATH_PRE:}$SIM/bin:$SIM/farm" \
        PKG_CONFIG_LIBDIR="$SIM/pc" PKG_CONFIG_PATH= CC="$SIM_CC" "$@"
}
