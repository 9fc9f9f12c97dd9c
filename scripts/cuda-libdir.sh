#!/bin/sh
# Prints the CUDA toolkit's library folder (the one holding libcudart.so), or nothing when none is
# found; exits 0 either way. The candidates, in order: $CUDA_PATH, $CUDA_HOME, the folder above
# NVCC's folder (NVCC: the nvcc path given, default the nvcc on PATH), the folder above its real
# path's (a wrapper script in /usr/local/bin is not beside the toolkit), /usr/local/cuda; in each,
# lib64 then lib. A folder is printed as spelt (a /usr/local/cuda link stays a link, so that a
# CUDA update does not strand a run path). meson.build and scripts/setup.sh both ask it, so that
# the project's and StarPU's run paths name the same folder.
#   scripts/cuda-libdir.sh [NVCC]
nvcc=${1:-$(command -v nvcc 2>/dev/null)}
beside="" real=""
if [ -n "$nvcc" ]; then
  beside=$(dirname "$(dirname "$nvcc")")
  real=$(realpath "$nvcc" 2>/dev/null) && real=$(dirname "$(dirname "$real")")
fi
for root in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "$beside" "$real" /usr/local/cuda; do
  [ -n "$root" ] || continue
  for sub in lib64 lib; do
    if [ -e "$root/$sub/libcudart.so" ]; then
      printf '%s\n' "$root/$sub"
      exit 0
    fi
  done
done
exit 0
