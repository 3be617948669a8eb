#!/usr/bin/env python3
"""The checker must catch what it claims to: each test breaks one thing in a
copy of deploy/ and expects a failure that the unbroken copy does not have.

Usage: test_check_manifests.py --snap-csi BIN --spdk-plugin BIN [unittest args]
(deploy/check.sh passes the binaries it built).
"""

from __future__ import annotations

import contextlib
import functools
import io
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_manifests as cm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VENV_KUBECTL = REPO / "target" / "deploy-tools" / "venv" / "bin" / "kubectl"
BINS: dict[str, str] = {}

# The same answers every time: run each slow probe once for the whole suite.
cm.run_help = functools.lru_cache(maxsize=None)(cm.run_help)
cm.cargo_bins = functools.lru_cache(maxsize=None)(cm.cargo_bins)
cm.debian_package_of = functools.lru_cache(maxsize=None)(cm.debian_package_of)


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


class BreakingTheDeployFails(unittest.TestCase):
    def expect(self, edits: list[tuple[str, str, str]], needle: str, extra_files: dict[str, str] | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            deploy = copy_deploy(Path(tmp))
            for rel, old, new in edits:
                path = deploy / rel
                text = path.read_text()
                self.assertIn(old, text, f"the test's edit no longer applies to {rel}")
                path.write_text(text.replace(old, new, 1))
            for rel, text in (extra_files or {}).items():
                (deploy / rel).write_text(text)
            new_failures = run_checker(deploy) - baseline()
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
        self.expect([("images/spdk-plugin.Dockerfile", "FROM rust:1.95-bookworm AS builder", "FROM rust:1.94-bookworm AS builder")], "builder must be rust:")


class HelpParsing(unittest.TestCase):
    def test_spdk_containerfile_copies_what_its_context_lacks(self):
        with tempfile.TemporaryDirectory() as tmp:
            spdk = Path(tmp) / "spdk"
            shutil.copytree(REPO / "hack" / "spdk", spdk)
            path = spdk / "Containerfile"
            text = path.read_text()
            self.assertIn("COPY build.sh ", text)
            path.write_text(text.replace("COPY build.sh ", "COPY build-spdk.sh ", 1))
            with tempfile.TemporaryDirectory() as tmp2:
                failures = run_checker(copy_deploy(Path(tmp2)), ("--containerfile", str(path))) - baseline()
        self.assertTrue(any("COPY source build-spdk.sh" in f for f in failures), sorted(failures))

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
