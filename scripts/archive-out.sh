#!/usr/bin/env bash
# Packs a GPU script's output folder into one archive, OUT/all.tgz (the GPU machine returns a limited
# number of files from a call: an archive and a summary come back whole). With ARCHIVE_ONLY=1, only
# all.tgz and the files named after OUT are left in OUT.
#   scripts/archive-out.sh OUT [KEEP...]
# Exits 1 with a message when OUT is not a folder or the archive cannot be written (OUT is then
# left as it was).
set -u
out=${1:?usage: scripts/archive-out.sh OUT [KEEP...]}
shift
[ -d "$out" ] || { echo "archive-out.sh: $out is not a folder" >&2; exit 1; }
tmp=$(mktemp "${TMPDIR:-/tmp}/archive-out-XXXXXX.tgz") || exit 1
if ! (cd "$out" && tar czf "$tmp" --exclude=./all.tgz .) || ! mv "$tmp" "$out/all.tgz"; then
  rm -f "$tmp"; echo "archive-out.sh: could not archive $out" >&2; exit 1
fi
if [ "${ARCHIVE_ONLY:-0}" = 1 ]; then
  keep=(! -name all.tgz)
  for k in "$@"; do keep+=(! -name "$k"); done
  find "$out" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf {} +
fi
