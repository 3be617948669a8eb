#!/usr/bin/env bash
# The official CSI conformance suite, csi-sanity (kubernetes-csi/csi-test
# v5.4.0), against the whole stack (hack/local-up.sh) once per backend: the
# controller proxy in front of the sample controller, and the node service,
# with csi-sanity's default configuration except for small volumes and, unless
# --no-mutable-parameters, a VolumeAttributesClass's mutable parameters.
#
# csi-sanity is built once, offline, from csi-test's source with its vendored
# Go modules (hack/fetch-third-party.sh csi-test: upstream, or an offline
# mirror directory named by SNAP_CSI_THIRD_PARTY_MIRROR; Go 1.23 from
# hack/setup.sh) into ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/csi-sanity-<sha256
# of the source's pinned tree id (or the --tarball's sum) and of
# hack/csi-sanity-connect-race.patch, the suite's one fix (a connection race)>/.
# With a network, `go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.4.0`
# gives the same binary: pass it with --csi-sanity.
#
# Prints csi-sanity's summary per backend and a line of counts; fails on any
# failed spec and on any skipped spec, except those csi-sanity skips because
# we do not offer a capability (each such reason is listed in
# NOT_OFFERED below and counted on one line), and the one spec
# csi-test itself marks pending. The GroupController specs must all run and
# pass (group snapshots are offered on both backends), and so must the
# ModifyVolume specs (MODIFY_VOLUME: QoS limits, from a VolumeAttributesClass
# given as --csi.testvolumemutableparameters).
#
# --no-mutable-parameters runs csi-sanity without
# --csi.testvolumemutableparameters, as its defaults are: then it sends empty
# mutable parameters (CreateVolume without a VolumeAttributesClass, and a
# ControllerModifyVolume that asks for nothing, which must succeed), and the
# same accounting holds: no spec of csi-test v5.4.0 skips for want of
# mutable parameters, so every ModifyVolume spec must still run and pass.
#
# The fs backend (filesystem volumes, staged as virtio-fs) always runs
# without mutable parameters, and says so: QoS limits are for block volumes,
# so its CreateVolume refuses them. Its plugin makes filesystem devices only
# (local-up --fs-only), as a file-storage vendor's plugin would, and as
# SNAP's NFS fsdevs, as DPF's plugin does.
#
# nvmf-multipath is the nvmf backend with the StorageClass parameter
# nvmf-multipath: "true": every volume attached on the DPU through both of
# the target's listeners, as one device.
#
# --parameter KEY=VALUE adds a StorageClass parameter to every backend's
# volumes, e.g. snap-csi.io/emulation=virtio-blk (block volumes are NVMe
# otherwise): the node's other paths held to the same suite. (Not
# encryption: its key is a stage secret, which this script does not give.)
#
# Usage (as root): hack/csi-sanity.sh [--profile release|debug] [--no-build]
#   [--backend aio|nvmf|nvmf-multipath|fs]... [--no-mutable-parameters]
#   [--parameter KEY=VALUE]... [--csi-sanity BINARY] [--tarball CSI-TEST.tar.gz]
#   [-- LOCAL-UP-ARGS...]
# Default: debug, every backend, with mutable parameters. Arguments after --
# go to hack/local-up.sh (e.g. `-- --containers`: the plugin, controller
# proxy, node and agent run from their images, with their manifests'
# privileges and mounts; `-- --mode split`; `-- --dpus 2`: a host with two
# DPUs, the node given both, in either mode; `-- --host vm`: the node in a
# QEMU guest, a real Linux kernel as the host, where csi-sanity's staging
# and target paths are then made, checked and removed, through
# snap-csi-guest exec). With --dpus 2 the default
# backends are all but fs, which local-up refuses there (its second DPU makes
# no filesystem devices).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
repo=$PWD
# absolute PATH: PATH as the caller meant it, from the directory they ran us in.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }

profile=debug
build=1
backends=()
binary=
tarball=
local_up_args=()
mutable=1
parameters=()
while (($#)); do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --backend) backends+=("$2"); shift 2 ;;
    --no-mutable-parameters) mutable=0; shift ;;
    --parameter)
      [[ $2 == ?*=* ]] || { echo "csi-sanity: --parameter takes KEY=VALUE, not $2" >&2; exit 2; }
      parameters+=("$2"); shift 2 ;;
    --csi-sanity) binary=$(absolute "$2"); shift 2 ;;
    --tarball) tarball=$(absolute "$2"); shift 2 ;;
    --) shift; local_up_args=("$@"); break ;;
    -h | --help) sed -n '/^set -euo/q; 2,$p' "$0"; exit 0 ;;
    *) echo "csi-sanity: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! ((${#backends[@]})); then
  backends=(aio nvmf nvmf-multipath fs)
  for ((i = 0; i + 1 < ${#local_up_args[@]}; i++)); do
    if [ "${local_up_args[i]}" = --dpus ] && [ "${local_up_args[i + 1]}" != 1 ]; then
      backends=(aio nvmf nvmf-multipath)
      echo "csi-sanity: every backend but fs: local-up --dpus ${local_up_args[i + 1]} makes no filesystem devices"
    fi
  done
fi
for backend in "${backends[@]}"; do
  case $backend in aio | nvmf | nvmf-multipath | fs) ;; *) echo "csi-sanity: unknown backend $backend" >&2; exit 2 ;; esac
done
case $profile in release | debug) ;; *) echo "csi-sanity: --profile must be release or debug" >&2; exit 2 ;; esac

# Skip messages of csi-sanity's for capabilities we do not offer, and why.
declare -A NOT_OFFERED=(
  ["ControllerPublishVolume not supported"]="no PUBLISH_UNPUBLISH_VOLUME: the DPU attach is NodeStageVolume's"
  ["ControllerUnpublishVolume not supported"]="no PUBLISH_UNPUBLISH_VOLUME: the DPU attach is NodeStageVolume's"
  ["Controller Publish, UnpublishVolume not supported"]="no PUBLISH_UNPUBLISH_VOLUME: the DPU attach is NodeStageVolume's"
)

./hack/setup.sh
if ((build)); then
  flag=()
  [ "$profile" = release ] && flag=(--release)
  cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin
fi

# The csi-sanity binary: given, or built from csi-test's source once per the
# source's identity (known without fetching it: a cache hit needs no network).
if [ -z "$binary" ]; then
  if [ -z "$tarball" ]; then
    source_id=$(hack/fetch-third-party.sh --id csi-test)
  elif [ -f "$tarball" ]; then
    source_id=$(sha256sum <"$tarball" | cut -d' ' -f1)
  else
    echo "csi-sanity: no csi-test source at $tarball" >&2
    exit 1
  fi
  cache_root=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}
  # The suite's one fix (its connection race, see the patch) is part of the key.
  patch_file=$repo/hack/csi-sanity-connect-race.patch
  cache=$cache_root/csi-sanity-$({ echo "$source_id"; cat "$patch_file"; } | sha256sum | cut -d' ' -f1)
  binary=$cache/csi-sanity
  if [ ! -x "$binary" ]; then
    go=/usr/lib/go-1.23/bin/go
    [ -x "$go" ] || { echo "csi-sanity: $go is missing (hack/setup.sh installs it)" >&2; exit 1; }
    [ -n "$tarball" ] || tarball=$(hack/fetch-third-party.sh csi-test | tail -n1)
    mkdir -p "$cache_root"
    scratch=$(mktemp -d "$cache_root/.csi-sanity-build.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT
    started=$SECONDS
    tar -xzf "$tarball" -C "$scratch"
    src=$(dirname "$(find "$scratch" -maxdepth 2 -name go.mod | head -n 1)")
    patch -s -p1 -d "$src" <"$patch_file"
    mkdir "$scratch/out"
    (cd "$src" && env GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off GOENV=off CGO_ENABLED=0 \
      GOCACHE="$scratch/cache" GOPATH="$scratch/gopath" \
      "$go" build -trimpath -o "$scratch/out/csi-sanity" ./cmd/csi-sanity)
    # Atomic: a concurrent build that got there first wins, and either is whole.
    mv -T "$scratch/out" "$cache" 2>/dev/null || [ -x "$binary" ]
    rm -rf "$scratch"
    trap - EXIT
    echo "csi-sanity: built $binary in $((SECONDS - started)) s"
  fi
fi

# shellcheck source=hack/lib/local-up-client.sh
. hack/lib/local-up-client.sh
local_up_images "$profile" "${local_up_args[@]}"
guest=0
[[ " ${local_up_args[*]} " == *" --host vm "* ]] && guest=1
if ((guest)); then
  ((build)) && cargo build "${flag[@]}" --locked --quiet -p snap-csi-harness --bin snap-csi-guest
  # Where the guest sees it (hack/lib/local-up-vm.sh: vm_visible).
  work=$(mktemp -d "$repo/target/snap-csi-sanity.XXXXXX")
else
  work=$(mktemp -d /tmp/snap-csi-sanity.XXXXXX)
fi
trap 'local_up_stop; rm -rf "$work"' EXIT

# guest_path_commands RUN: csi-sanity's commands that make, check and remove
# its staging and target paths in the guest host, where the node mounts
# (csi-sanity runs each with the path as its one argument); sets
# path_commands to its flags for them.
path_commands=()
guest_path_commands() {
  local run=$1 name script esc
  for name in create check remove; do
    case $name in
      create) script='mkdir -p "$1" && echo "$1"' ;;
      check) script='if [ -f "$1" ]; then echo file; elif [ -d "$1" ]; then echo directory;
        elif [ -e "$1" ]; then echo other; else echo not_found; fi' ;;
      remove) script='rm -rf "$1"' ;;
    esac
    # The path is the guest shell's $1 (single-quoted: csi-sanity's paths
    # are below the kubelet directory, without quotes); the script's own
    # quotes and $ are escaped for the double quotes around it.
    esc=${script//\\/\\\\}
    esc=${esc//\"/\\\"}
    esc=${esc//\$/\\\$}
    printf '#!/bin/sh\nexec %q exec --socket %q "set -- '"'"'$1'"'"'; %s"\n' \
      "$repo/target/$profile/snap-csi-guest" "$GUEST_EXEC" "$esc" >"$run/guest-$name"
    chmod +x "$run/guest-$name"
  done
  path_commands=(
    --csi.createstagingpathcmd "$run/guest-create" --csi.createmountpathcmd "$run/guest-create"
    --csi.checkpathcmd "$run/guest-check"
    --csi.removestagingpathcmd "$run/guest-remove" --csi.removemountpathcmd "$run/guest-remove"
    --csi.createpathcmdtimeout 60s --csi.checkpathcmdtimeout 60s --csi.removepathcmdtimeout 60s
  )
}

# verdict REPORT.json NAME: prints the counts; fails on a failed spec or a
# skip that NOT_OFFERED does not explain.
verdict() {
  local reasons
  reasons=$(for r in "${!NOT_OFFERED[@]}"; do printf '%s\t%s\n' "$r" "${NOT_OFFERED[$r]}"; done)
  REASONS=$reasons python3 - "$1" "$2" <<'PY'
import collections, json, os, sys

report, name = sys.argv[1], sys.argv[2]
allowed = dict(line.split("\t", 1) for line in os.environ["REASONS"].splitlines() if line)
counts = collections.Counter()
why_skipped = collections.Counter()
group = collections.Counter()
modify = collections.Counter()
unexplained = []
for suite in json.load(open(report)):
    for spec in suite.get("SpecReports") or []:
        if spec.get("LeafNodeType") != "It":
            continue
        state = spec["State"]
        counts[state] += 1
        if any("GroupController" in t for t in spec.get("ContainerHierarchyTexts") or []):
            group[state] += 1
        if any("ModifyVolume" in t for t in spec.get("ContainerHierarchyTexts") or []):
            modify[state] += 1
        if state == "skipped":
            message = (spec.get("Failure") or {}).get("Message", "")
            if message in allowed:
                why_skipped[allowed[message]] += 1
            else:
                title = " ".join(spec.get("ContainerHierarchyTexts") or []) + " " + spec["LeafNodeText"]
                unexplained.append(f"{title}: {message or 'no reason given'}")
failed = sum(n for state, n in counts.items() if state not in ("passed", "skipped", "pending"))
print(f"{name}: {counts['passed']} passed, {failed} failed, {counts['skipped']} skipped, "
      f"{counts['pending']} pending (marked pending in csi-test itself)")
print(f"{name}: skipped because a capability is not offered: "
      + ("; ".join(f"{n} for {why}" for why, n in sorted(why_skipped.items())) or "none"))
for line in unexplained:
    print(f"{name}: SKIPPED WITHOUT A REASON WE ACCEPT: {line}")
group_ok = group["passed"] > 0 and group["passed"] == sum(group.values())
print(f"{name}: GroupController specs: {group['passed']} passed of {sum(group.values())}"
      + ("" if group_ok else " (ALL MUST RUN AND PASS)"))
modify_ok = modify["passed"] > 0 and modify["passed"] == sum(modify.values())
print(f"{name}: ModifyVolume specs: {modify['passed']} passed of {sum(modify.values())}"
      + ("" if modify_ok else " (ALL MUST RUN AND PASS)"))
sys.exit(1 if failed or unexplained or not counts["passed"] or not group_ok or not modify_ok else 0)
PY
}

status=0
for backend in "${backends[@]}"; do
  run=$work/$backend
  mkdir -p "$run"
  started=$SECONDS
  # The fs backend's plugin makes filesystem devices only, as a file-storage
  # vendor's would: the node serves them from a plugin without block devices.
  fs_only=()
  [ "$backend" = fs ] && fs_only=(--fs-only)
  local_up_start "$run" --profile "$profile" --backend "${backend%-multipath}" --dir "$run/stack" \
    "${fs_only[@]}" "${local_up_args[@]}"
  ((guest)) && guest_path_commands "$run"
  # The volumes go to the backend under test whatever local-up's default.
  echo "backend: ${backend%-multipath}" >"$run/parameters.yaml"
  [ "$backend" = nvmf-multipath ] && echo 'nvmf-multipath: "true"' >>"$run/parameters.yaml"
  for parameter in "${parameters[@]}"; do
    printf '%s: "%s"\n' "${parameter%%=*}" "${parameter#*=}" >>"$run/parameters.yaml"
  done
  name="csi-sanity $backend${parameters[*]:+ (${parameters[*]})}"
  saved=/tmp/csi-sanity-$backend.log
  mutable_flag=()
  if ((mutable)) && [ "$backend" = fs ]; then
    echo "csi-sanity fs: without mutable parameters: QoS limits are for block volumes"
  fi
  if ((mutable)) && [ "$backend" != fs ]; then
    # A VolumeAttributesClass's QoS limits: CreateVolume's mutable parameters
    # and every ControllerModifyVolume's (the ModifyVolume specs run: the
    # controller offers MODIFY_VOLUME). Values SPDK takes as they are.
    cat >"$run/mutable-parameters.yaml" <<'YAML'
snap-csi.io/qos-rw-iops: "4000"
snap-csi.io/qos-rw-mbytes-per-sec: "0"
snap-csi.io/qos-r-mbytes-per-sec: "200"
snap-csi.io/qos-w-mbytes-per-sec: "100"
YAML
    mutable_flag=(--csi.testvolumemutableparameters "$run/mutable-parameters.yaml")
  else
    name="$name (no mutable parameters)"
    saved=/tmp/csi-sanity-$backend-no-mutable-parameters.log
  fi
  echo
  echo "== $name (log: csi-sanity.log in the run's directory)"
  # Staging and target directories under the kubelet directory: the node
  # refuses paths outside it. Sizes: small, and not csi-sanity's defaults.
  sanity_status=0
  # A guest's node is at http://ADDRESS:PORT, which gRPC-Go (csi-sanity)
  # takes as ADDRESS:PORT.
  "$binary" \
    --csi.endpoint "${CSI_NODE_ENDPOINT#http://}" \
    --csi.controllerendpoint "$CSI_CONTROLLER_ENDPOINT" \
    --csi.stagingdir "$KUBELET_DIR/csi-sanity-staging" \
    --csi.mountdir "$KUBELET_DIR/csi-sanity-mount" \
    --csi.testvolumesize $((64 << 20)) \
    --csi.testvolumeexpandsize $((96 << 20)) \
    --csi.testvolumeparameters "$run/parameters.yaml" \
    "${mutable_flag[@]}" \
    "${path_commands[@]}" \
    --ginkgo.no-color \
    --ginkgo.json-report "$run/report.json" \
    >"$run/csi-sanity.log" 2>&1 || sanity_status=$?
  # csi-sanity's own summary: the failures it lists, and its counts.
  sed -n '/^Summarizing\|^Ran [0-9]* of [0-9]* Specs/,$p' "$run/csi-sanity.log"
  if [ ! -s "$run/report.json" ]; then
    echo "$name wrote no report (exit $sanity_status):" >&2
    tail -n 40 "$run/csi-sanity.log" >&2
    status=1
  elif ! verdict "$run/report.json" "$name"; then
    status=1
    cp "$run/csi-sanity.log" "$saved"
    echo "$name: full log in $saved; the stack's logs follow" >&2
    tail -n 30 "$run"/stack/logs/*.log >&2 || true
  fi
  local_up_stop
  local_up_assert_clean "$run/stack"
  echo "$name: $((SECONDS - started)) s, stack up to stopped and clean"
done
exit "$status"
