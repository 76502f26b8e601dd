#!/usr/bin/env bash
# Test-only pyxis stand-in, one task's side (see srun here):
#   enter.sh MOUNTS WORKDIR -- command...
# MOUNTS is pyxis' SRC:DST[:FLAGS],... list. In a private mount namespace (root only, as slurmd
# runs the test cluster's jobs) each SRC is bound at DST, read-only with `ro`; a DST that does not
# exist on the host is created as an empty directory (never written into: the bind covers it).
set -euo pipefail
if [ -z "${RECSYS_PYXIS_STANDIN_NS:-}" ]; then
    RECSYS_PYXIS_STANDIN_NS=1 exec unshare --mount --propagation private -- bash "${BASH_SOURCE[0]}" "$@"
fi
unset RECSYS_PYXIS_STANDIN_NS
mounts=$1 workdir=$2
shift 2
[ "${1:-}" = -- ] && shift
IFS=, read -ra entries <<< "$mounts"
for entry in "${entries[@]}"; do
    IFS=: read -r src dst flags <<< "$entry"
    [ -n "$src" ] && [ -n "$dst" ] || { echo "pyxis stand-in: bad mount entry '$entry'" >&2; exit 2; }
    ro=no
    case "+${flags:-}+" in *+ro+*) ro=yes ;; esac
    if [ "$src" != "$dst" ]; then
        if [ ! -e "$dst" ]; then
            mkdir -p -- "$dst"
        elif [ ! -d "$dst" ]; then
            echo "pyxis stand-in: mount point $dst exists and is not a directory" >&2; exit 2
        fi
        mount --bind "$src" "$dst"
    elif [ "$ro" = yes ]; then
        mount --bind "$src" "$dst"
    fi
    if [ "$ro" = yes ]; then
        mount -o remount,bind,ro "$dst"
    fi
done
if [ -n "$workdir" ]; then
    cd -- "$workdir"
fi
exec "$@"
