#!/usr/bin/env bash
# mypy --strict over the import packages. The folders are mapped to packages by pyproject's
# package-dir (host/ -> codemode, capabilities/ -> codemode.capabilities), which mypy cannot follow
# through the editable install's import hook, so lay out a link tree with the real package names.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck
rm -rf "$tree"
mkdir -p "$tree/codemode"
for entry in host/*; do
    ln -s "../../$entry" "$tree/codemode/$(basename "$entry")"
done
ln -s ../../capabilities "$tree/codemode/capabilities"
ln -s ../worker_image/codemode_worker "$tree/codemode_worker"
MYPYPATH="$tree" exec "${MYPY:-.venv/bin/mypy}" -p codemode -p codemode_worker "$@"
