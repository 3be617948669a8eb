#!/usr/bin/env bash
# Offline checks of deploy/, run by hack/test.sh after the cargo steps: every
# kustomization rendered with kustomize, every object validated against the
# Kubernetes schemas (strict), and the manifests and Dockerfiles checked
# against the binaries' own --help, so a path, socket or flag that drifts from
# the code fails here rather than on a node (hack/spdk/Containerfile is checked
# too). No cluster, Docker or network.
# The tools come from hack/setup.sh (target/deploy-tools/venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/deploy-tools/venv
# No __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/kubectl" ]; then
  echo "deploy/check.sh: $venv is missing its tools; run hack/setup.sh first" >&2
  exit 1
fi
# The --help the manifests are checked against must be today's.
cargo build --locked --quiet -p snap-csi -p snap-csi-spdk-plugin --bins
bins=(--snap-csi target/debug/snap-csi --spdk-plugin target/debug/snap-csi-spdk-plugin)
# First prove the checker catches what it claims to (broken copies of deploy/
# must fail), then check the real one.
"$venv/bin/python" deploy/tools/test_check_manifests.py "${bins[@]}"
"$venv/bin/python" deploy/tools/check_manifests.py --kubectl "$venv/bin/kubectl" "${bins[@]}"
