#!/usr/bin/env bash
# scripts/gpu_pack.sh — builds the CUDA binaries here (no GPU needed) and packs what a
# device call needs into .cache/dev/, so one `device run` carries them and
# scripts/gpu_run.sh measures them there. The device machine has the CUDA driver but not
# this machine's Debian libraries, models or venv; every session so far rebuilt this by
# hand, and it went with the machine (.cache is not tracked).
#
#   scripts/gpu_pack.sh NAME      build + pack .cache/dev/NAME.txz:
#                                   bin/orchid, bin/test_cuda_{ops,model,sample},
#                                   bin/bench_batch_decode, bin/bench_stream (and, TRACE=1, tr/bench_batch_decode
#                                   built with -DORCHID_TRACE for tools/trace_report.py)
#   and, once (kept while present): .cache/dev/lib.txz (orchid's non-libc shared libraries),
#   .cache/dev/tok.txz (the tokenizer files: the server's synthetic checkpoint needs them),
#   .cache/dev/tiny.txz (the mlx-lm tiny checkpoint test_cuda_model compares against).
#
# Environment: BUILD (default build-gpu-NAME), NVCC_EXTRA (e.g. -DSOMETHING for an A/B
# build), GENCODE (default sm_90a only: the H200; the generic sm_80 path is CI's build),
# TRACE=1, JOBS. Carry the packs with `carry: [".cache/dev"]` (64 MiB at most in all; the
# three shared packs are ~43 MB, a binary pack ~5 MB: an A/B's two fit).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/gpu_pack.sh NAME}
case $name in *[!A-Za-z0-9_.-]*) echo "gpu_pack: NAME must be letters, digits, '.', '_' or '-'" >&2; exit 2 ;; esac
BUILD=${BUILD:-build-gpu-$name}
GENCODE=${GENCODE:--gencode arch=compute_90a,code=sm_90a}
JOBS=${JOBS:-$(nproc)}
dev=.cache/dev
mkdir -p "$dev"

make -j"$JOBS" BUILD="$BUILD" ARCHFLAGS=-march=x86-64-v3 NVCC_GENCODE="$GENCODE" NVCC_EXTRA="${NVCC_EXTRA:-}" \
    all gpu-tests >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin"
cp "$BUILD/orchid" "$BUILD"/tests/gpu/test_cuda_ops "$BUILD"/tests/gpu/test_cuda_model "$BUILD"/tests/gpu/test_cuda_sample \
   "$BUILD"/tests/gpu/bench_batch_decode "$BUILD"/tests/gpu/bench_stream "$stage/bin/"
if [ "${TRACE:-0}" = 1 ]; then
    make -j"$JOBS" BUILD="$BUILD-trace" ARCHFLAGS=-march=x86-64-v3 NVCC_GENCODE="$GENCODE" \
        NVCC_EXTRA="${NVCC_EXTRA:-} -DORCHID_TRACE" "$BUILD-trace/tests/gpu/bench_batch_decode" >/dev/null
    mkdir -p "$stage/tr"
    cp "$BUILD-trace/tests/gpu/bench_batch_decode" "$stage/tr/"
fi
# the commit, '+' when tracked files differ from it (the build carries uncommitted changes)
echo "$(git rev-parse --short HEAD)$([ -n "$(git status --short --untracked-files=no)" ] && echo +)" >"$stage/commit"
git status --short >>"$stage/commit"
# one stream with a 64 MiB window: the five binaries carry the same kernels (~20 MB each), which
# this stores once (~5 MB for all, against ~19 MB compressed file by file)
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=1,dict=64MiB >"$dev/$name.txz"
echo "packed $dev/$name.txz ($(du -h "$dev/$name.txz" | cut -f1))"

if [ ! -f "$dev/lib.txz" ]; then
    libs=$(mktemp -d)
    # everything orchid links beyond the C and C++ runtimes, which the device has
    ldd "$BUILD/orchid" | awk '/=> \// {print $3}' |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' | xargs -r cp -L -t "$libs"
    tar -C "$libs" -cf - . | xz -1 -T0 >"$dev/lib.txz"
    rm -rf "$libs"
    echo "packed $dev/lib.txz"
fi
if [ ! -f "$dev/tok.txz" ]; then
    [ -f .cache/tokenizer/tokenizer.json ] || .venv/bin/python tools/fetch_tokenizer.py
    tar -C .cache/tokenizer -cf - . | xz -1 -T0 >"$dev/tok.txz"
    echo "packed $dev/tok.txz"
fi
if [ ! -f "$dev/tiny.txz" ]; then
    tiny=.cache/gpu_models/tiny
    [ -f "$tiny/config.json" ] || .venv/bin/python tools/make_test_model.py --config tiny --out "$tiny" >/dev/null
    tar -C "$tiny" -cf - . | xz -1 -T0 >"$dev/tiny.txz"
    echo "packed $dev/tiny.txz"
fi
du -ch "$dev"/*.txz | tail -1
