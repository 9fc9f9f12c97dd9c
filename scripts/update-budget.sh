#!/usr/bin/env bash
# Prints the GPU update budget of the 20B quarter's runs (scripts/gpu-targets.sh, gpu-compare.sh):
# $UPDATE_BUDGET when set; else 40GB (sized on the H200's 141 GB), or 30GB on a GPU of less than
# 100 GB (an 80 GB H100, where 40GB ran out of GPU memory at the second iteration beside the
# emulated compute's activations, and 30GB ran). With the argument `resident` (the runs that keep
# 31.5 GB of state resident as well): 3GB on a GPU of less than 100 GB, where 30GB (310acb2),
# 20GB (020a617) and 5GB (d03f100, a run from its rates cache, at its second iteration; a
# calibrating run's two iterations fitted) beside 31.5 GB resident ran out of GPU memory. 3GB is
# what dos-train's memory warning names there (31.5 + 3 GB of optimizer state, 30.6 GB of
# activations at --tokens 4096, 17.3 GB of parameters and gradients on about 84.5 GB free, 2 GB
# kept spare); it ran at 4d45f10 (PART=20b's resident step). On an H100 at 5a6860c, calibrating
# 20B processes with the update overlapped (gpu-calibration.sh's 20b case, -n 3) ran out of GPU memory
# at their first iteration under 30GB and under 20GB, where PART=20b's ran under 30GB at 013eb8b:
# docs/status.md, "Next on a GPU, in order". GPU memory
# from nvidia-smi (40GB where it cannot be read). A second line on standard error says which and why.
set -u
if [ -n "${UPDATE_BUDGET:-}" ]; then
  echo "$UPDATE_BUDGET"; echo "20B update budget: $UPDATE_BUDGET (UPDATE_BUDGET)" >&2; exit 0
fi
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
budget=40GB
small=30GB
[ "${1:-}" = resident ] && small=3GB
[ -n "$mib" ] && [ "$mib" -lt 100000 ] && budget=$small
echo "$budget"
echo "20B update budget${1:+ ($1)}: $budget (GPU memory: ${mib:-unknown} MiB)" >&2
