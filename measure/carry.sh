#!/usr/bin/env bash
# The Python packages a device call carries in .whl/ (docs/measure.md), installed into /tmp/site:
#   source measure/carry.sh && carry_install      (on the lent machine, from the repository root)
#   bash measure/carry.sh pack WHEEL...           (here: a wheel's files as .whl/NAME.site.tar.xz)
# A wheel is a zip of its files, deflated; the same files as one xz tar are 37 % smaller (megatron-core
# 0.19.2: 2.37 -> 1.49 MB), and the carried files count toward the 64 MiB the working tree may take on a
# call. Unpacking the tar into --target is what `pip install --no-deps --no-compile --target` does with a
# pure-layout wheel: the package folders and its .dist-info, as they are in the wheel.

carry_install() {
    mkdir -p /tmp/site
    local found=0 t
    for t in .whl/*.site.tar.xz; do
        [ -e "$t" ] || continue
        tar -xJf "$t" -C /tmp/site || return 1
        found=1
    done
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || return 1
        found=1
    fi
    [ "$found" = 1 ] || { echo "carry: nothing in .whl/ to install" >&2; return 1; }
}

carry_pack() {
    local w name tmp
    mkdir -p .whl
    for w in "$@"; do
        name=$(basename "$w" .whl)
        tmp=$(mktemp -d)
        python3 -m zipfile -e "$w" "$tmp" || return 1
        tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9e > ".whl/$name.site.tar.xz"
        rm -rf "$tmp"
        echo "$w -> .whl/$name.site.tar.xz ($(stat -c %s ".whl/$name.site.tar.xz") bytes)"
    done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        pack) shift; carry_pack "$@" ;;
        *) echo "usage: bash measure/carry.sh pack WHEEL..." >&2; exit 2 ;;
    esac
fi
