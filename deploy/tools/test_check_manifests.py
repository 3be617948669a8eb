#!/usr/bin/env python3
"""The checker must catch what it claims to: each test breaks one thing in a
copy of deploy/ and expects a failure that the unbroken copy does not have.

Usage: test_check_manifests.py --snap-csi BIN --spdk-plugin BIN [unittest args]
(deploy/check.sh passes the binaries it built).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_manifests as cm  # noqa: E402
import images  # noqa: E402
import kustomize  # noqa: E402
from checklib import load_yaml_docs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VENV_KUBECTL = REPO / "target" / "deploy-tools" / "venv" / "bin" / "kubectl"
BINS: dict[str, str] = {}

# The same answers every time: run each slow probe once for the whole suite.
cm.run_help = functools.lru_cache(maxsize=None)(cm.run_help)
images.cargo_bins = functools.lru_cache(maxsize=None)(images.cargo_bins)
images.debian_package_of = functools.lru_cache(maxsize=None)(images.debian_package_of)
images.apt_knows = functools.lru_cache(maxsize=None)(images.apt_knows)
images.run_helper = functools.lru_cache(maxsize=None)(images.run_helper)


def kustomize_inputs(d: Path) -> bytes:
    """Every file kustomize reads to render `d` (our kustomizations list
    resources and components; the overlays' patches are inline), with its
    path below deploy/. A site the check makes in a scratch directory lists
    only resources and components, so what it lists is what it renders."""
    out = b""
    kustomization = d / "kustomization.yaml"
    if kustomization.is_file():
        k = load_yaml_docs(kustomization)[0]
        deploy = deploy_of(d)
        out += str(kustomization.relative_to(deploy)).encode() + kustomization.read_bytes() if deploy else b"site"
        for field in ("resources", "components"):
            for r in k.get(field) or []:
                target = (d / r).resolve()
                out += field.encode()
                if target.is_dir():
                    out += kustomize_inputs(target)
                elif target.is_file():
                    out += str(target.relative_to(deploy_of(target))).encode() + target.read_bytes()
    return out


def deploy_of(d: Path) -> Path | None:
    return next((p for p in [d, *d.parents] if p.name == "deploy"), None)


_render = kustomize.render
_renders: dict[bytes, object] = {}


def cached_render(kubectl: str, d: Path):
    """A broken copy of deploy/ changes one file: render again only the
    kustomizations that read it."""
    key = kustomize_inputs(d)
    if key not in _renders:
        _renders[key] = _render(kubectl, d)
    return copy.deepcopy(_renders[key])


kustomize.render = cached_render
import podman_spec  # noqa: E402  (after the patch: it renders through the cache)


def run_checker(deploy: Path, extra: tuple[str, ...] = ()) -> set[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cm.main(
            [
                *extra,
                "--repo",
                str(REPO),
                "--deploy",
                str(deploy),
                "--kubectl",
                str(VENV_KUBECTL),
                "--snap-csi",
                BINS["snap-csi"],
                "--spdk-plugin",
                BINS["spdk-plugin"],
                "--quiet",
            ]
        )
    return {line[5:] for line in out.getvalue().splitlines() if line.startswith("FAIL ")}


@functools.lru_cache(maxsize=None)
def baseline() -> frozenset[str]:
    with tempfile.TemporaryDirectory() as tmp:
        return frozenset(run_checker(copy_deploy(Path(tmp))))


def copy_deploy(tmp: Path) -> Path:
    dst = tmp / "deploy"
    shutil.copytree(REPO / "deploy", dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


EXAMPLE = "kubernetes/split/example"
NODE_DS = f"{EXAMPLE}/worker-1/host/daemonset.yaml"
NODE_CERT = f"{EXAMPLE}/worker-1/host/certificate.yaml"
AGENT_DS = f"{EXAMPLE}/worker-1/dpu/daemonset.yaml"
AGENT_CERT = f"{EXAMPLE}/worker-1/dpu/certificate.yaml"
README = "README.md"
OVERLAY_128 = "older-kubernetes/1.28-1.31"
CONTROLLER = "kubernetes/controller/deployment.yaml"
OVERLAY_132 = "older-kubernetes/1.32-1.33"


def add_pair(deploy: Path, host: str, *args: str) -> None:
    """A second pair in the example site, made by new-pair.sh as an
    operator would."""
    subprocess.run(
        ["bash", str(deploy / "kubernetes/split/new-pair.sh"), "--host", host, *args, str(deploy / EXAMPLE / host)],
        check=True,
        capture_output=True,
    )
    for side in ("host", "dpu"):
        k = deploy / EXAMPLE / side / "kustomization.yaml"
        k.write_text(k.read_text() + f"  - ../{host}/{side}\n")


def edit(deploy: Path, rel: str, old: str, new: str) -> None:
    path = deploy / rel
    text = path.read_text()
    if old not in text:
        raise AssertionError(f"the test's edit no longer applies to {rel}: {old!r}")
    path.write_text(text.replace(old, new, 1))


class BreakingTheDeployFails(unittest.TestCase):
    def new_failures(
        self,
        edits: list[tuple[str, str, str]],
        extra_files: dict[str, str] | None = None,
        setup: Callable[[Path], None] | None = None,
    ) -> set[str]:
        with tempfile.TemporaryDirectory() as tmp:
            deploy = copy_deploy(Path(tmp))
            if setup:
                setup(deploy)
            for rel, old, new in edits:
                edit(deploy, rel, old, new)
            for rel, text in (extra_files or {}).items():
                (deploy / rel).write_text(text)
            return run_checker(deploy) - baseline()

    def expect(
        self,
        edits: list[tuple[str, str, str]],
        needle: str,
        extra_files: dict[str, str] | None = None,
        setup: Callable[[Path], None] | None = None,
    ) -> None:
        new_failures = self.new_failures(edits, extra_files, setup)
        self.assertTrue(
            any(needle in f for f in new_failures),
            f"expected a new failure containing {needle!r}, got {sorted(new_failures)}",
        )

    def test_socket_dir_not_where_kubelet_looks(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "path: /var/lib/kubelet/plugins/csi.snap-csi.io/", "path: /var/lib/kubelet/plugins/csi.other/")],
            "kubelet expects the socket",
        )

    def test_unknown_node_flag(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "--state-dir=/var/lib/snap-csi", "--state-dri=/var/lib/snap-csi")],
            "has no flag --state-dri",
        )

    def test_node_path_left_to_a_hidden_default(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "            - --sysfs-root=/sys\n", "")],
            "--sysfs-root must be set",
        )

    def test_path_outside_every_mount(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "--state-dir=/var/lib/snap-csi", "--state-dir=/var/lib/elsewhere")],
            "is not inside any volumeMount",
        )

    def test_two_listeners_on_one_port(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "--http-endpoint=:9809", "--http-endpoint=:9808")],
            "listens on port 9808",
        )

    def test_unknown_field_fails_strict_schema(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "mountPropagation: Bidirectional", "mountPropogation: Bidirectional")],
            "schema DaemonSet snap-csi/snap-csi-node",
        )

    def test_kubelet_dir_without_bidirectional_propagation(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "mountPropagation: Bidirectional", "mountPropagation: HostToContainer")],
            "needs mountPropagation: Bidirectional",
        )

    def test_registration_path_differs_from_the_node_socket(self):
        self.expect(
            [
                (
                    "kubernetes/node/daemonset.yaml",
                    "--kubelet-registration-path=/var/lib/kubelet/plugins/csi.snap-csi.io/csi.sock",
                    "--kubelet-registration-path=/var/lib/kubelet/plugins/csi.snap-csi.io/other.sock",
                )
            ],
            "--kubelet-registration-path must be",
        )

    def test_sidecar_on_a_socket_nobody_serves(self):
        self.expect(
            [("kubernetes/controller/deployment.yaml", "- --csi-address=/csi/csi.sock", "- --csi-address=/csi/other.sock")],
            "no container of this pod serves CSI",
        )

    def test_undefined_env_reference(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "--node-id=$(NODE_NAME)", "--node-id=$(NODE_NAM)")],
            "$(NODE_NAM) is not defined",
        )

    def test_driver_name_mismatch(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "--driver-name=csi.snap-csi.io", "--driver-name=csi.other.io")],
            "--driver-name must be the CSIDriver's",
        )

    def test_dpu_plugin_socket_elsewhere_than_the_node_looks(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", "--plugin-socket=/var/lib/nvidia/storage/snap/plugins/spdk/", "--plugin-socket=/var/lib/nvidia/storage/snap/plugins/acme/")],
            "--plugin-socket is",
        )

    def test_node_and_plugin_on_different_snaps(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", "--spdk-socket=/var/lib/nvidia/storage/snap/providers/nvidia/", "--spdk-socket=/var/lib/nvidia/storage/snap/providers/acme/")],
            "they must be one SNAP",
        )

    def test_default_path_outside_every_mount(self):
        # --state-dir is left to the plugin's default, which must be mounted.
        self.expect(
            [("kubernetes/controller/deployment.yaml", "              mountPath: /var/lib/snap-csi-spdk-plugin\n", "              mountPath: /var/lib/elsewhere\n")],
            "--state-dir=/var/lib/snap-csi-spdk-plugin: /var/lib/snap-csi-spdk-plugin is not inside any volumeMount",
        )

    def test_controller_setting_without_the_controller(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", "            - --log-format=json\n", "            - --log-format=json\n            - --aio-pool-dir=/x\n")],
            "only matter with --csi-socket",
        )

    def test_vendor_socket_not_where_the_proxy_calls(self):
        self.expect(
            [("kubernetes/controller/deployment.yaml", "--vendor-endpoint=unix:///vendor/csi.sock", "--vendor-endpoint=unix:///vendor/other.sock")],
            "where no vendor container of the pod serves",
        )

    def test_unlisted_manifest(self):
        self.expect([("kubernetes/rbac/kustomization.yaml", "  - resizer.yaml\n", "")], "not listed in resources")

    def test_missing_resource(self):
        self.expect(
            [("kubernetes/rbac/kustomization.yaml", "  - resizer.yaml\n", "  - resizer.yaml\n  - gone.yaml\n")],
            "resource gone.yaml does not exist",
        )

    def test_storage_class_emulation_the_node_refuses(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "snap-csi.io/emulation: nvme", "snap-csi.io/emulation: nvme-of")],
            "is not one the node takes",
        )

    def test_storage_class_placement_the_node_refuses(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "snap-csi.io/placement: packed", "snap-csi.io/placement: sparse")],
            "snap-csi.io/placement sparse is not one the node takes",
        )

    def test_missing_resource_requests(self):
        self.expect([("kubernetes/node/daemonset.yaml", "              cpu: 50m\n", "")], "resources.requests must set cpu")

    def test_unpinned_sidecar(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "csi-node-driver-registrar:v2.18.0", "csi-node-driver-registrar:latest")],
            "must be pinned by a tag",
        )

    def test_volume_snapshot_class_against_the_crd_schema(self):
        self.expect(
            [("kubernetes/snapshotclass/volumesnapshotclass.yaml", "deletionPolicy: Delete", "deletionPolicy: Remove")],
            "schema VolumeSnapshotClass snap-csi-snapclass",
        )
        self.expect(
            [("kubernetes/snapshotclass/volumesnapshotclass.yaml", "driver: csi.snap-csi.io", "driver: csi.snap-csi.io\ndriverr: x")],
            "schema VolumeSnapshotClass snap-csi-snapclass",
        )

    def test_runtime_image_without_a_tool_the_node_runs(self):
        self.expect([("images/snap-csi.Dockerfile", "        xfsprogs \\\n", "")], "Debian package xfsprogs")

    def test_dockerfile_ships_another_binary(self):
        self.expect(
            [("images/snap-csi.Dockerfile", "/usr/local/bin/snap-csi\nLABEL", "/usr/local/bin/snap-csi-old\nLABEL")],
            "the final stage copies",
        )

    def test_builder_not_the_pinned_toolchain(self):
        self.expect(
            [("images/spdk-plugin.Dockerfile", "FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS builder", "FROM --platform=$BUILDPLATFORM rust:1.94-bookworm AS builder")],
            "builder must be rust:",
        )

    # ---- split mode

    def test_baseline_is_clean(self):
        self.assertEqual(baseline(), frozenset(), "the committed deploy/ must pass")

    def test_a_pair_made_by_the_script_passes(self):
        def second_pair(deploy: Path) -> None:
            add_pair(deploy, "worker-2", "--dpu-node", "bf-7", "--dpu-address", "fd00:1::2", "--dpu-name", "bf3-rack2-07")

        self.assertEqual(self.new_failures([], setup=second_pair), set())

    def test_unknown_agent_flag(self):
        self.expect([(AGENT_DS, "--host-name=worker-1", "--hostname=worker-1")], "dpu-agent has no flag --hostname")

    def test_agent_setting_left_to_a_hidden_default(self):
        self.expect([(AGENT_DS, "            - --tls-ca=/etc/snap-csi/tls/ca.crt\n", "")], "--tls-ca must be set")

    def test_tls_file_not_cert_managers_key(self):
        self.expect([(AGENT_DS, "--tls-ca=/etc/snap-csi/tls/ca.crt", "--tls-ca=/etc/snap-csi/tls/tls.crt")], "must be the file ca.crt")

    def test_split_node_keeps_the_local_sockets(self):
        self.expect(
            [(NODE_DS, "            - --sysfs-root=/sys\n", "            - --sysfs-root=/sys\n            - --plugin-socket=/var/lib/x/dpu.sock\n")],
            "--plugin-socket is unused in split mode",
        )

    def test_plaintext_link(self):
        self.expect(
            [(NODE_DS, "            - --sysfs-root=/sys\n", "            - --sysfs-root=/sys\n            - --dpu-insecure-plaintext\n")],
            "turns off the link's authentication",
        )

    def test_node_certificate_able_to_serve(self):
        self.expect([(NODE_CERT, "    - client auth", "    - server auth")], "usages must include 'client auth'")

    def test_agent_certificate_names_another_dpu(self):
        self.expect([(AGENT_CERT, "  dnsNames:\n    - worker-1", "  dnsNames:\n    - worker-9")], "dnsNames must be ['worker-1']")

    def test_agent_serves_another_host(self):
        self.expect([(AGENT_DS, "--host-name=worker-1", "--host-name=worker-2")], "no DPU agent in kubernetes/split/example/dpu serves host worker-1")

    def test_endpoint_port_not_the_agents(self):
        self.expect([(NODE_DS, "--dpu-endpoint=https://192.168.100.2:9830", "--dpu-endpoint=https://192.168.100.2:9831")], "must reach the port its agent listens on")

    def test_node_id_not_the_node_name(self):
        self.expect([(NODE_DS, "--node-id=$(NODE_NAME)", "--node-id=host-a")], "--node-id must be the node's name")

    def test_agent_without_host_network(self):
        self.expect([(AGENT_DS, "hostNetwork: true", "hostNetwork: false")], "needs hostNetwork")

    def test_key_mounted_on_every_node(self):
        self.expect([(NODE_DS, "operator: In", "operator: NotIn")], "not pinned to one node by name")

    def test_one_key_on_two_hosts(self):
        self.expect(
            [(f"{EXAMPLE}/worker-2/host/daemonset.yaml", "secretName: snap-csi-node-worker-2-tls", "secretName: snap-csi-node-worker-1-tls")],
            "Secret snap-csi-node-worker-1-tls is mounted by",
            setup=lambda deploy: add_pair(deploy, "worker-2", "--dpu-node", "bf-2", "--dpu-address", "192.168.100.2"),
        )

    def test_ca_key_mounted(self):
        self.expect([(NODE_DS, "secretName: snap-csi-node-worker-1-tls", "secretName: snap-csi-link-ca")], "mounts the link CA's Secret")

    def test_secret_files_through_subpaths(self):
        mounts = "".join(
            f"            - name: dpu-tls\n              mountPath: /etc/snap-csi/tls/{f}\n              subPath: {f}\n              readOnly: true\n"
            for f in ("tls.crt", "tls.key", "ca.crt")
        )
        self.expect(
            [(NODE_DS, "            - name: dpu-tls\n              mountPath: /etc/snap-csi/tls\n              readOnly: true\n", mounts)],
            "with a subPath, which a renewed certificate never reaches",
        )

    def test_dpu_cluster_makes_its_own_ca(self):
        self.expect(
            [("kubernetes/split/dpu/kustomization.yaml", "  - serviceaccount.yaml\n", "  - serviceaccount.yaml\n  - selfsigned.yaml\n")],
            "makes a CA of its own",
            extra_files={
                "kubernetes/split/dpu/selfsigned.yaml": "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata:\n"
                "  name: own\n  namespace: snap-csi\nspec:\n  selfSigned: {}\n"
            },
        )

    def test_certificate_from_another_issuer(self):
        self.expect([(NODE_CERT, "    name: snap-csi-link-ca", "    name: letsencrypt")], "must be issued by the link's CA Issuer")

    def test_cert_manager_in_the_colocated_root(self):
        self.expect([("kubernetes/kustomization.yaml", "  - snapshotclass\n", "  - snapshotclass\n  - split/ca-issuer\n")], "co-located mode needs no cert-manager")

    def test_shared_object_differs_between_roots(self):
        self.expect([("kubernetes/dpu/namespace.yaml", "app.kubernetes.io/part-of: snap-csi", "app.kubernetes.io/part-of: other")], "differs between")

    def test_certificate_against_the_crd_schema(self):
        self.expect([(NODE_CERT, "    algorithm: ECDSA", "    algorithm: EC")], "schema Certificate snap-csi/snap-csi-node-worker-1")

    def test_split_node_sidecar_drifts_from_the_colocated_one(self):
        self.expect([(NODE_DS, "            - --probe-timeout=3s", "            - --probe-timeout=5s")], "sidecars ['liveness-probe'] differ")

    def test_generated_pair_edited_by_hand(self):
        self.expect([(NODE_DS, "cpu: 50m", "cpu: 60m")], "differ from what `new-pair.sh")

    def test_template_placeholder_the_script_does_not_fill(self):
        self.expect([("kubernetes/split/templates/host/certificate.yaml.in", "    - @HOST@", "    - @HOSTNAME@")], "has a placeholder this script does not fill")

    # ---- Kubernetes versions

    def test_volume_attributes_classes_in_the_base(self):
        # Kubernetes before 1.34 has no storage.k8s.io/v1 VolumeAttributesClass
        # and refuses the whole apply.
        self.expect([("kubernetes/kustomization.yaml", "  - snapshotclass\n", "  - snapshotclass\n  - volumeattributesclasses\n")], "(Kubernetes 1.28–1.33, strict)")

    def test_field_newer_than_the_oldest_kubernetes(self):
        self.expect(
            [("kubernetes/csidriver/csidriver.yaml", "  storageCapacity: false\n", "  storageCapacity: false\n  nodeAllocatableUpdatePeriodSeconds: 60\n")],
            "(Kubernetes 1.28–1.32, strict)",
        )

    def test_optional_root_older_kubernetes_takes(self):
        def v1beta1(deploy: Path) -> None:
            path = deploy / "kubernetes/volumeattributesclasses/volumeattributesclasses.yaml"
            path.write_text(path.read_text().replace("apiVersion: storage.k8s.io/v1\n", "apiVersion: storage.k8s.io/v1beta1\n"))

        self.expect([], "yet Kubernetes 1.33 takes all of it", setup=v1beta1)

    def test_volume_attributes_class_for_another_driver(self):
        self.expect(
            [("kubernetes/volumeattributesclasses/volumeattributesclasses.yaml", "driverName: csi.snap-csi.io", "driverName: csi.other.io")],
            "driverName must be the CSIDriver's",
        )

    def test_transformer_outside_the_overlays(self):
        self.expect([("kubernetes/storageclasses/kustomization.yaml", "kind: Kustomization\n", "kind: Kustomization\nnamePrefix: x-\n")], "only ['resources'] are used here")

    def test_sidecar_not_the_tables_release(self):
        self.expect(
            [("kubernetes/controller/deployment.yaml", "csi-resizer:v2.3.0", "csi-resizer:v2.2.1")],
            "runs csi-resizer v2.2.1; the table's row 1.34 – 1.37, the manifests' own, says v2.3.0",
        )

    def test_table_gate_the_manifests_lack(self):
        self.expect([(README, "| 1.34 – 1.37 | `v6.4.0` |", "| 1.34 – 1.37 | `v6.4.0` `--feature-gates=Topology=false` |")], "--feature-gates lacks {'Topology': 'false'}")

    def test_table_names_another_release_than_the_overlay(self):
        self.expect(
            [(README, "| `v1.13.2` `--feature-gates=", "| `v1.13.1` `--feature-gates=")],
            "renders Deployment snap-csi/snap-csi-controller other than the table's row 1.28 – 1.31 makes it: container csi-resizer runs",
        )

    def test_table_flag_other_than_feature_gates(self):
        self.expect([(README, "| `v2.3.0` |", "| `v2.3.0` `--handle-volume-inuse-error=false` |")], "a range sets only --feature-gates")

    def test_rows_leave_a_gap(self):
        self.expect([(README, "| 1.32 – 1.33 |", "| 1.32 – 1.32 |")], "rows 1.34 – 1.37 and 1.32 – 1.32 must meet")

    def test_overlay_changes_more_than_the_table(self):
        self.expect(
            [(f"{OVERLAY_132}/sidecars/kustomization.yaml", "        value: --feature-gates=Topology=true,VolumeAttributesClass=false\n", "        value: --feature-gates=Topology=true,VolumeAttributesClass=false\n      - op: replace\n        path: /spec/template/spec/containers/2/args/7\n        value: --timeout=30s\n")],
            "container csi-provisioner runs",
        )

    def test_overlay_without_the_tables_gate(self):
        self.expect(
            [(f"{OVERLAY_128}/sidecars/kustomization.yaml", "      - op: add\n        path: /spec/template/spec/containers/3/args/-\n        value: --feature-gates=RecoverVolumeExpansionFailure=false,VolumeAttributesClass=false\n", "")],
            "container csi-resizer runs",
        )

    def test_overlay_patch_after_the_base_moved(self):
        # The patch's test operations refuse to replace another argument.
        self.expect([("kubernetes/controller/deployment.yaml", "            - --extra-create-metadata\n", "")], "testing value /spec/template/spec/containers/2/args/5 failed")

    def test_overlay_changes_more_on_a_split_site(self):
        patch = (
            "  - target:\n      kind: DaemonSet\n      name: snap-csi-node-worker-1\n    patch: |-\n"
            "      - op: replace\n        path: /spec/template/spec/containers/1/args/0\n        value: --v=5\n"
        )
        self.expect([(f"{OVERLAY_132}/sidecars/kustomization.yaml", "patches:\n", "patches:\n" + patch)], "kubernetes/split/example/host with the Component of deploy/older-kubernetes/1.32-1.33")

    def test_overlay_without_a_row(self):
        def extra(deploy: Path) -> None:
            shutil.copytree(deploy / OVERLAY_132, deploy / "older-kubernetes/1.26-1.27")

        self.expect([], "deploy/older-kubernetes/1.26-1.27: overlays deploy/kubernetes, yet no row", setup=extra)

    # ---- images

    # The sample vendor's offer (deploy/README.md, "Filesystem volumes",
    # "Multipath NVMe-oF") and who runs as root.
    def test_no_filesystem_class(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "  backend: fs\n", "  backend: nvmf\n")],
            "no class with backend: fs",
        )

    def test_storage_class_parameter_the_plugin_refuses(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "  backend: fs\n", "  backend: fs\n  fs-quota: \"1\"\n")],
            "['fs-quota'] are not ones the sample plugin takes",
        )

    def test_qos_on_a_filesystem_class(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "  backend: fs\n", "  backend: fs\n  snap-csi.io/qos-rw-iops: \"1000\"\n")],
            "block-device options the plugin refuses for backend fs",
        )

    def test_controller_without_a_share(self):
        self.expect(
            [(CONTROLLER, "            - --fs-share=/var/lib/snap-csi-fs-share\n", "")],
            "no controller with --fs-share",
        )

    def test_share_without_bidirectional_propagation(self):
        self.expect(
            [(CONTROLLER, "              mountPath: /var/lib/snap-csi-fs-share\n              mountPropagation: Bidirectional\n",
              "              mountPath: /var/lib/snap-csi-fs-share\n              mountPropagation: HostToContainer\n")],
            "needs mountPropagation: Bidirectional, so the volumes' loop mounts reach SNAP",
        )

    def test_share_elsewhere_than_snap_sees_it(self):
        self.expect(
            [(CONTROLLER, "              mountPath: /var/lib/snap-csi-fs-share\n", "              mountPath: /share\n"),
             (CONTROLLER, "            - --fs-share=/var/lib/snap-csi-fs-share\n", "            - --fs-share=/share\n")],
            "must be the host's /share mounted at that path",
        )

    def test_share_controller_not_privileged(self):
        self.expect(
            [(CONTROLLER, "            privileged: true\n", "            privileged: false\n")],
            "makes filesystem volumes (--fs-share: losetup, mount, chattr, fsfreeze): must be privileged",
        )

    def test_share_controller_without_the_hosts_dev(self):
        self.expect(
            [(CONTROLLER, "            - name: dev\n              mountPath: /dev\n", "")],
            "the loop devices of fs volumes",
        )

    def test_dpu_plugin_share_not_the_controllers(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", "--fs-share=/var/lib/snap-csi-fs-share", "--fs-share=/srv/share")],
            "the DPU plugin makes the filesystem devices of the controller's volumes",
        )

    def test_one_nvmf_listener(self):
        self.expect(
            [(CONTROLLER, "--nvmf-listen=$(HOST_IP):4420,$(HOST_IP):4421", "--nvmf-listen=$(HOST_IP):4420")],
            "a multipath volume needs the target's two listeners",
        )

    def test_no_multipath_class(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", '  nvmf-multipath: "true"\n', "")],
            'no class with nvmf-multipath: "true"',
        )

    def test_multipath_on_another_backend(self):
        self.expect(
            [("kubernetes/storageclasses/storageclasses.yaml", "  backend: aio\n", '  backend: aio\n  nvmf-multipath: "true"\n')],
            "nvmf-multipath is for backend nvmf only",
        )

    def test_root_without_a_reason(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", "        # root: SNAP's socket", "        # SNAP's socket")],
            "container spdk-plugin: runs as root (runAsUser: 0)",
        )

    def test_image_default_user_without_a_reason(self):
        self.expect(
            [(AGENT_DS, "        # root: the agent", "        # the agent"), (AGENT_DS, "        runAsUser: 0\n        runAsGroup: 0\n", "")],
            "runs as root (the image default user)",
        )

    def test_privileged_without_a_reason(self):
        self.expect(
            [("kubernetes/node/daemonset.yaml", "            # root: mount(2)", "            # mount(2)")],
            "container snap-csi-node: is privileged: say why",
        )

    def test_unprivileged_container_keeps_a_capability(self):
        self.expect(
            [("kubernetes/dpu/daemonset.yaml", 'drop: ["ALL"]', 'drop: ["ALL"]\n              add: ["NET_RAW"]')],
            'container spdk-plugin: capabilities must drop ["ALL"]',
        )

    def test_non_root_needs_no_reason(self):
        new = self.new_failures(
            [("kubernetes/dpu/daemonset.yaml", "        # root: SNAP's socket", "        # SNAP's socket"),
             ("kubernetes/dpu/daemonset.yaml", "        runAsUser: 0\n", "        runAsUser: 1000\n        runAsNonRoot: true\n")]
        )
        self.assertFalse([f for f in new if "root" in f], new)

    def test_run_table_names_another_release_than_the_pin(self):
        self.expect(
            [(README, "| 1.34 – 1.37 | none | `csi-provisioner v6.4.0`", "| 1.34 – 1.37 | none | `csi-provisioner v6.3.0`")],
            "says nothing of `csi-provisioner v6.4.0`",
        )

    def test_run_table_claims_a_release_twice(self):
        self.expect(
            [(README, "| 1.34 – 1.37 | none |", "| 1.34 – 1.37 | `livenessprobe v2.20.0` |")],
            "both run and not run",
        )

    def test_run_table_without_a_range(self):
        self.expect(
            [(README, "| 1.32 – 1.33 | none | `csi-provisioner v5.3.0`", "| 1.32 – 1.34 | none | `csi-provisioner v5.3.0`")],
            "must be the sidecar table's",
        )

    def test_builder_emulated_instead_of_cross_compiling(self):
        self.expect([("images/snap-csi.Dockerfile", "FROM --platform=$BUILDPLATFORM rust:", "FROM rust:")], "FROM --platform=$BUILDPLATFORM")

    def test_helper_without_arm64(self):
        self.expect([("images/rust-target.sh", "  arm64) triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu debian=arm64 ;;\n", "")], "triple must be aarch64-unknown-linux-gnu")

    def test_cross_build_without_the_targets_libc(self):
        self.expect([("images/rust-target.sh", " libc6-dev-$debian-cross", "")], "C compiler and its libc")

    def test_builder_without_the_protobuf_includes(self):
        self.expect([("images/spdk-plugin.Dockerfile", "protobuf-compiler libprotobuf-dev ", "protobuf-compiler ")], "Debian package libprotobuf-dev")

    def test_cargo_build_for_the_build_platform(self):
        self.expect([("images/snap-csi.Dockerfile", '--target "$RUST_TARGET" ', "")], 'build --target "$RUST_TARGET"')

    def test_no_prebuilt_stage(self):
        self.expect([("images/spdk-plugin.Dockerfile", "FROM scratch AS prebuilt", "FROM scratch AS copied")], "`prebuilt` stage")

    def test_binaries_not_from_the_builder_by_default(self):
        self.expect([("images/snap-csi.Dockerfile", "ARG BINARIES=builder", "ARG BINARIES=prebuilt")], "FROM ${BINARIES} AS binaries")


class PodmanSpec(unittest.TestCase):
    """deploy/tools/podman_spec.py: hack/local-up.sh --containers runs each
    process with the flags it reads from the manifests, so a change there
    must change them."""

    MAPS = {
        "node": [
            "--map", "/var/lib/kubelet=/run/x/kubelet",
            "--map", "/var/lib/kubelet/plugins/csi.snap-csi.io=/run/x",
            "--map", "/var/lib/snap-csi=/run/x/node-state",
            "--map", "/var/lib/nvidia/storage/snap=/run/x",
            "--map", "dpu-tls=/run/x/tls",
        ],
        "controller": ["--map", "socket-dir=/run/x", "--map", "vendor-socket-dir=/run/x"],
        "plugin": ["--map", "/var/lib/nvidia/storage/snap=/run/x"],
        "agent": ["--map", "/var/lib/nvidia/storage/snap=/run/x", "--map", "tls=/run/x/tls"],
    }

    def spec(self, deploy: Path, component: str, *args: str) -> tuple[int, list[str], str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = podman_spec.main([component, "--deploy", str(deploy), "--kubectl", str(VENV_KUBECTL), *args])
        return rc, out.getvalue().splitlines(), err.getvalue()

    def flags(self, deploy: Path, component: str, *args: str) -> list[str]:
        rc, lines, err = self.spec(deploy, component, *self.MAPS[component], *args)
        self.assertEqual(rc, 0, err)
        return lines

    def edited(self, edits: list[tuple[str, str, str]], component: str, *args: str) -> list[str]:
        with tempfile.TemporaryDirectory() as tmp:
            deploy = copy_deploy(Path(tmp))
            for rel, old, new in edits:
                edit(deploy, rel, old, new)
            return self.flags(deploy, component, *args)

    def test_each_component_as_its_manifest(self):
        deploy = REPO / "deploy"
        for mode in ("colocated", "split"):
            node = self.flags(deploy, "node", "--mode", mode)
            self.assertIn("--privileged", node)
            self.assertNotIn("--network", node)
            self.assertIn("type=bind,src=/run/x/kubelet,dst=/run/x/kubelet,bind-propagation=rshared", node)
            self.assertIn("type=bind,src=/dev,dst=/dev,bind-propagation=rprivate", node)
            self.assertIn("type=bind,src=/sys,dst=/sys,bind-propagation=rprivate", node)
            # The socket and snap directories map to one directory: one mount.
            self.assertEqual(node.count("type=bind,src=/run/x,dst=/run/x,bind-propagation=rprivate"), 1)
        self.assertIn("type=bind,src=/run/x/tls,dst=/run/x/tls,ro,bind-propagation=rprivate", node)
        for component in ("controller", "plugin", "agent"):
            flags = self.flags(deploy, component)
            self.assertNotIn("--privileged", flags)
            for pair in (["--cap-drop", "ALL"], ["--user", "0:0"], ["--security-opt", "no-new-privileges"]):
                self.assertTrue(any(flags[i : i + 2] == pair for i in range(len(flags))), (component, pair, flags))
            self.assertIn("--read-only", flags)
        self.assertEqual(self.flags(deploy, "agent", "--host-network", "ns:/run/netns/n")[-6:-4], ["--network", "ns:/run/netns/n"])
        self.assertNotIn("--network", self.flags(deploy, "plugin"))
        self.assertIn("host", self.flags(deploy, "plugin", "--pod-network", "host"))

    def test_node_propagation_follows_the_manifest(self):
        flags = self.edited([("kubernetes/node/daemonset.yaml", "mountPropagation: Bidirectional", "mountPropagation: HostToContainer")], "node")
        self.assertIn("type=bind,src=/run/x/kubelet,dst=/run/x/kubelet,bind-propagation=rslave", flags)
        flags = self.edited([(NODE_DS, "              mountPropagation: Bidirectional\n", "")], "node", "--mode", "split")
        self.assertIn("type=bind,src=/run/x/kubelet,dst=/run/x/kubelet,bind-propagation=rprivate", flags)

    def test_privileges_follow_the_manifest(self):
        flags = self.edited([("kubernetes/node/daemonset.yaml", "privileged: true", "privileged: false")], "node")
        self.assertNotIn("--privileged", flags)
        flags = self.edited([("kubernetes/dpu/daemonset.yaml", 'drop: ["ALL"]', 'drop: ["ALL"]\n              add: ["SYS_ADMIN"]')], "plugin")
        self.assertIn("SYS_ADMIN", flags)
        self.assertEqual(flags[flags.index("SYS_ADMIN") - 1], "--cap-add")
        flags = self.edited([("kubernetes/controller/deployment.yaml", "runAsUser: 0", "runAsUser: 1000")], "controller")
        self.assertEqual(flags[flags.index("--user") + 1], "1000:0")

    def test_host_mounts_and_network_follow_the_manifest(self):
        # /dev gone from the node: not bound.
        flags = self.edited(
            [("kubernetes/node/daemonset.yaml", "            - name: dev\n              mountPath: /dev\n", "")], "node"
        )
        self.assertFalse(any("dst=/dev," in f for f in flags), flags)
        flags = self.edited([(AGENT_DS, "hostNetwork: true", "hostNetwork: false")], "agent")
        self.assertNotIn("--network", flags)
        flags = self.edited([(AGENT_DS, "              readOnly: true\n", "")], "agent")
        self.assertIn("type=bind,src=/run/x/tls,dst=/run/x/tls,bind-propagation=rprivate", flags)

    def test_volumes_without_a_host_path_are_listed_and_must_be_mapped(self):
        deploy = REPO / "deploy"
        rc, lines, _ = self.spec(deploy, "controller", "--volumes")
        self.assertEqual((rc, lines), (0, ["socket-dir emptyDir /csi rw", "vendor-socket-dir emptyDir /vendor rw"]))
        rc, lines, _ = self.spec(deploy, "agent", "--volumes")
        self.assertEqual((rc, lines), (0, ["tls secret /etc/snap-csi/tls ro"]))
        rc, _, err = self.spec(deploy, "controller", "--map", "socket-dir=/run/x")
        self.assertEqual(rc, 1)
        self.assertIn("--map vendor-socket-dir=LOCALDIR", err)

    def test_unmapped_host_paths_refused_when_asked(self):
        deploy = REPO / "deploy"
        rc, _, err = self.spec(deploy, "node", "--require-mapped", "--pass", "/dev", "--pass", "/sys")
        self.assertEqual(rc, 1)
        self.assertIn("--map /var/lib/kubelet", err)
        flags = self.flags(deploy, "node", "--require-mapped", "--pass", "/dev", "--pass", "/sys")
        self.assertIn("--privileged", flags)
        rc, _, err = self.spec(deploy, "node", *self.MAPS["node"], "--require-mapped", "--pass", "/sys")
        self.assertEqual(rc, 1)
        self.assertIn("host path /dev", err)

    def test_non_root_and_groups_follow_the_manifest(self):
        flags = self.edited(
            [("kubernetes/controller/deployment.yaml", "        runAsUser: 0\n", "        runAsUser: 1000\n        runAsNonRoot: true\n        fsGroup: 2000\n        supplementalGroups: [3000]\n")],
            "controller",
        )
        self.assertEqual(flags[flags.index("--user") + 1], "1000:0")
        adds = [flags[i + 1] for i, f in enumerate(flags) if f == "--group-add"]
        self.assertEqual(adds, ["2000", "3000"])
        with tempfile.TemporaryDirectory() as tmp:
            deploy = copy_deploy(Path(tmp))
            edit(deploy, "kubernetes/dpu/daemonset.yaml", "        runAsUser: 0\n", "        runAsUser: 0\n        runAsNonRoot: true\n")
            rc, _, err = self.spec(deploy, "plugin", *self.MAPS["plugin"])
        self.assertEqual(rc, 1)
        self.assertIn("kubelet would refuse to start the container", err)

    def test_vendor_controller_as_its_manifest(self):
        deploy = REPO / "deploy"
        rc, lines, err = self.spec(deploy, "vendor", "--volumes")
        self.assertEqual((rc, lines), (0, ["vendor-socket-dir emptyDir /vendor rw"]), err)
        maps = ["--map", "vendor-socket-dir=/run/x", "--map", "/var/lib/snap-csi-fs-share=/run/x/fs-share"]
        rc, flags, err = self.spec(deploy, "vendor", *maps)
        self.assertEqual(rc, 0, err)
        self.assertIn("--privileged", flags)
        self.assertIn("type=bind,src=/run/x/fs-share,dst=/run/x/fs-share,bind-propagation=rshared", flags)
        self.assertIn("type=bind,src=/dev,dst=/dev,bind-propagation=rprivate", flags)
        rc, flags, err = self.spec(
            deploy, "vendor", *maps, "--require-mapped", "--pass", "/dev", "--pass", "/var/lib/snap-csi-spdk-plugin",
            "--pass", "/var/lib/snap-csi-aio-pool", "--pass", "/run/spdk-target",
        )
        self.assertEqual(rc, 0, err)

    def test_one_directory_two_ways_is_refused(self):
        rc, _, err = self.spec(REPO / "deploy", "agent", "--map", "/var/lib/nvidia/storage/snap=/run/x", "--map", "tls=/run/x")
        self.assertEqual(rc, 1)
        self.assertIn("two volumes mount at /run/x differently", err)


class HelpParsing(unittest.TestCase):
    def test_spdk_containerfile_copies_what_its_context_lacks(self):
        with tempfile.TemporaryDirectory() as tmp:
            hack = Path(tmp) / "hack"
            shutil.copytree(REPO / "hack", hack, ignore=shutil.ignore_patterns("target"))
            path = hack / "spdk" / "Containerfile"
            text = path.read_text()
            self.assertIn(" hack/spdk/build.sh ", text)
            path.write_text(text.replace(" hack/spdk/build.sh ", " hack/spdk/build-spdk.sh ", 1))
            with tempfile.TemporaryDirectory() as tmp2:
                failures = run_checker(copy_deploy(Path(tmp2)), ("--containerfile", str(path))) - baseline()
        self.assertTrue(any("COPY source hack/spdk/build-spdk.sh" in f for f in failures), sorted(failures))

    def test_long_and_short_clap_layouts(self):
        long = (
            "Usage: x node [OPTIONS]\n\nOptions:\n"
            "      --endpoint <ENDPOINT>\n          CSI socket path [env: X_ENDPOINT=]\n"
            "      --emulation <EMULATION>\n          Default [env: X_EMU=] [possible values: nvme, virtio-blk]\n"
            "  -h, --help\n          Print help\n"
        )
        flags = cm.parse_help(long)
        self.assertEqual(flags["endpoint"].env, "X_ENDPOINT")
        self.assertIsNone(flags["endpoint"].default)
        self.assertEqual(flags["emulation"].choices, ("nvme", "virtio-blk"))
        self.assertFalse(flags["help"].takes_value)
        short = (
            "Options:\n"
            '      --snap-provider <SNAP_PROVIDER>  The provider [env: P=] [default: ""]\n'
            "      --call-timeout <CALL_TIMEOUT>    Seconds [env: T=] [default: 30]\n"
        )
        flags = cm.parse_help(short)
        self.assertEqual(flags["snap-provider"].default, "")
        self.assertEqual(flags["call-timeout"].default, "30")
        self.assertTrue(flags["call-timeout"].takes_value)


if __name__ == "__main__":
    args = sys.argv[1:]
    for flag, key in (("--snap-csi", "snap-csi"), ("--spdk-plugin", "spdk-plugin")):
        i = args.index(flag)
        BINS[key] = str(Path(args[i + 1]).resolve())
        del args[i : i + 2]
    unittest.main(argv=[sys.argv[0]] + args)
