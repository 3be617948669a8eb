"""Starts the images hack/images.sh built and checks what a user meets first:
each entrypoint answers --version (naming the commit it was built from) and
--help, and refuses an unknown flag; the snap-csi image carries every tool
the node runs (images.node_programs, the list deploy/check.sh holds the
Dockerfile to), the plugin's every tool its code runs; SPDK's answers
--version. An image of another architecture than this machine's (NAME@ARCH)
is checked the same way, started under qemu-user through binfmt_misc: if no
handler is registered for it, its checks fail (they are not skipped). Every
image must be the architecture it is named as, and report it from inside
(`uname -m`); a manifest list (NAME@list) must name exactly the images given
for NAME, one per architecture, and `podman run` of it must run this
machine's. Prints one line per image and exits non-zero on any failure.

Usage: target/deploy-tools/venv/bin/python deploy/tools/check_images.py REPO [--lists DIR] SPEC...
  SPEC is NAME=TAG (this machine's architecture), NAME@ARCH=TAG (another
  architecture, amd64 or arm64) or NAME@list=TAG (a manifest list of NAME's,
  in the store at DIR/storage, DIR/run: hack/images.sh keeps its lists apart).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

from images import node_programs, plugin_programs

# The binary each image's entrypoint is, and what its --version starts with.
BINARIES = {"snap-csi": "snap-csi", "snap-csi-spdk-plugin": "snap-csi-spdk-plugin"}
# Under qemu-user an image's first start is many times slower.
TIMEOUT = 300
# Debian's architecture names, and the kernel's (uname -m, binfmt_misc's
# qemu-NAME handler) for each.
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
NATIVE = {machine: arch for arch, machine in MACHINES.items()}.get(platform.machine(), platform.machine())


def run(
    tag: str, *args: str, entrypoint: str | None = None, arch: str | None = None, store: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", *(store or []), "run", "--rm", "--network", "none", "--pull", "never"]
    if arch:
        # The image's own platform, so podman neither warns nor looks for another.
        cmd += ["--platform", f"linux/{arch}"]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, tag, *args], capture_output=True, text=True, timeout=TIMEOUT)


def emulation_missing(arch: str) -> str | None:
    """Why an image of ARCH cannot start here, or None: another architecture's
    binaries run under qemu-user, through a binfmt_misc handler podman's
    containers can use (flag F: the interpreter opened when registered, so
    it need not be inside the image; qemu-user-static registers it so)."""
    if arch == NATIVE:
        return None
    machine = MACHINES.get(arch)
    if machine is None:
        return f"no known machine for architecture {arch}"
    handler = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{machine}"
    try:
        state = handler.read_text()
    except OSError:
        return (
            f"{handler} is missing: no qemu-user handler for {arch} binaries is registered with binfmt_misc"
            " (apt-get install qemu-user-static, hack/setup.sh does), so the image cannot be started"
        )
    flags = next((line.split(":", 1)[1].strip() for line in state.splitlines() if line.startswith("flags:")), "")
    if not state.startswith("enabled"):
        return f"{handler} is disabled, so {arch} binaries cannot start"
    if "F" not in flags:
        return f"{handler} lacks the F flag (flags: {flags!r}): a container cannot reach its interpreter"
    return None


def check_platform(name: str, tag: str, arch: str, failures: list[str]) -> bool:
    """The image is ARCH's and starts as ARCH's (under qemu-user when not
    this machine's): False if it cannot start at all, the rest then moot."""
    said = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", tag], capture_output=True, text=True
    ).stdout.strip()
    if said != f"linux/{arch}":
        failures.append(f"{name}: {tag} is {said or 'not an image'}, not linux/{arch}")
    missing = emulation_missing(arch)
    if missing:
        failures.append(f"{name}: the {arch} image cannot be checked: {missing}")
        return False
    out = run(tag, "-m", entrypoint="/usr/bin/uname", arch=arch)
    if out.returncode != 0 or out.stdout.strip() != MACHINES.get(arch):
        failures.append(
            f"{name}: `uname -m` in the {arch} image said {out.stdout.strip()!r} (exit {out.returncode},"
            f" {out.stderr.strip()[-200:]!r}), not {MACHINES.get(arch)!r}"
        )
        return False
    return True


def digest(tag: str) -> str:
    return subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Digest}}", tag], capture_output=True, text=True
    ).stdout.strip()


def check_list(name: str, tag: str, images: dict[str, str], store: list[str], failures: list[str]) -> None:
    """The manifest list (in the store STORE names) names exactly IMAGES
    (architecture: tag), each under its own platform and digest, and a
    plain `podman run` of it runs this machine's."""
    out = subprocess.run(["podman", *store, "manifest", "inspect", tag], capture_output=True, text=True)
    if out.returncode != 0:
        failures.append(f"{name}: {tag} is not a manifest list: {out.stderr.strip()}")
        return
    listed = sorted(
        (f"{m.get('platform', {}).get('os')}/{m.get('platform', {}).get('architecture')}", m.get("digest"))
        for m in json.loads(out.stdout).get("manifests", [])
    )
    want = sorted((f"linux/{arch}", digest(image)) for arch, image in images.items())
    if listed != want:
        failures.append(f"{name}: the manifest list {tag} names {listed}, not {want} (the images given)")
    if NATIVE in images:
        ran = run(tag, "-m", entrypoint="/usr/bin/uname", store=store)
        if ran.returncode != 0 or ran.stdout.strip() != MACHINES[NATIVE]:
            failures.append(f"{name}: `podman run` of {tag} ran {ran.stdout.strip()!r} (exit {ran.returncode}), not {NATIVE}'s image")


def check_binary(name: str, tag: str, commit: str, failures: list[str], arch: str | None = None) -> None:
    version = run(tag, "--version", arch=arch)
    want = f"(commit {commit})"
    binary = BINARIES[name.partition("@")[0]]
    if version.returncode != 0 or not version.stdout.startswith(f"{binary} ") or want not in version.stdout:
        failures.append(f"{name}: --version must name {want}, said {version.stdout.strip()!r} (exit {version.returncode})")
    helped = run(tag, "--help", arch=arch)
    if helped.returncode != 0 or "Usage:" not in helped.stdout:
        failures.append(f"{name}: --help exited {helped.returncode}")
    refused = run(tag, "--no-such-flag", arch=arch)
    if refused.returncode != 2 or "--no-such-flag" not in refused.stderr:
        failures.append(f"{name}: an unknown flag must be refused with exit 2, got {refused.returncode}")


def check_tools(name: str, programs: list[str], tag: str, failures: list[str], arch: str | None = None) -> None:
    script = 'for p in "$@"; do command -v "$p" >/dev/null || echo "$p"; done'
    out = run(tag, "-c", script, "sh", *programs, entrypoint="/bin/sh", arch=arch)
    missing = out.stdout.split()
    if out.returncode != 0 or missing:
        failures.append(f"{name}: the binary runs {missing} (exit {out.returncode}), which the image lacks")


def built_from(repo: Path) -> str:
    """The commit a binary built here names (crates/build-info): HEAD, or
    `unknown` where git cannot say (no git, or not a checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    except FileNotFoundError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def main() -> int:
    repo = Path(sys.argv[1]).resolve()
    args = sys.argv[2:]
    store: list[str] = []
    if args[:1] == ["--lists"]:
        lists = Path(args[1])
        store = ["--root", str(lists / "storage"), "--runroot", str(lists / "run"), "--storage-driver", "overlay"]
        args = args[2:]
    specs = dict(arg.split("=", 1) for arg in args)
    commit = built_from(repo)
    failures: list[str] = []
    # NAME: {architecture: tag}, and NAME: manifest list.
    images: dict[str, dict[str, str]] = {}
    lists: dict[str, str] = {}
    for spec, tag in specs.items():
        name, _, arch = spec.partition("@")
        if arch == "list":
            lists[name] = tag
        else:
            images.setdefault(name, {})[arch or NATIVE] = tag
    for name, by_arch in sorted(images.items()):
        for arch, tag in sorted(by_arch.items(), key=lambda item: item[0] != NATIVE):
            label = name if arch == NATIVE else f"{name}@{arch}"
            before = len(failures)
            if check_platform(label, tag, arch, failures):
                if name in BINARIES:
                    check_binary(label, tag, commit, failures, arch)
                if name == "snap-csi":
                    check_tools(label, sorted(node_programs(repo)), tag, failures, arch)
                if name == "snap-csi-spdk-plugin":
                    check_tools(label, sorted(plugin_programs(repo)), tag, failures, arch)
                if name == "snap-csi-spdk":
                    out = run(tag, "--version", arch=arch)
                    if out.returncode != 0 or not out.stdout.startswith("SPDK v24.09"):
                        failures.append(f"{label}: --version said {out.stdout.strip()!r} (exit {out.returncode})")
            user = subprocess.run(
                ["podman", "image", "inspect", "--format", "{{.Config.User}}", tag], capture_output=True, text=True
            ).stdout.strip()
            emulated = "" if arch == NATIVE else ", under qemu-user"
            print(
                f"images: {label} {'ok' if len(failures) == before else 'FAILED'} (linux/{arch}{emulated}, runs as {user or 'root'})",
                file=sys.stderr,
            )
    for name, tag in sorted(lists.items()):
        before = len(failures)
        check_list(f"{name}@list", tag, images.get(name, {}), store, failures)
        print(
            f"images: {name}@list {'ok' if len(failures) == before else 'FAILED'} ({', '.join(sorted(images.get(name, {})))})",
            file=sys.stderr,
        )
    for failure in failures:
        print(f"images: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
