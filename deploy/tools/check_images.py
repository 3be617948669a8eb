"""Starts the images hack/images.sh built and checks what a user meets first:
each entrypoint answers --version (naming the commit it was built from) and
--help, and refuses an unknown flag; the snap-csi image carries every tool
the node runs (images.node_programs, the list deploy/check.sh holds the
Dockerfile to), the plugin's every tool its code runs; SPDK's answers --version. Prints one line per image and exits
non-zero on any failure.

Usage: target/deploy-tools/venv/bin/python deploy/tools/check_images.py REPO NAME=TAG...
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from images import node_programs, plugin_programs

# The binary each image's entrypoint is, and what its --version starts with.
BINARIES = {"snap-csi": "snap-csi", "snap-csi-spdk-plugin": "snap-csi-spdk-plugin"}
TIMEOUT = 120


def run(tag: str, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "run", "--rm", "--network", "none"]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, tag, *args], capture_output=True, text=True, timeout=TIMEOUT)


def check_binary(name: str, tag: str, commit: str, failures: list[str]) -> None:
    version = run(tag, "--version")
    want = f"(commit {commit})"
    if version.returncode != 0 or not version.stdout.startswith(f"{BINARIES[name]} ") or want not in version.stdout:
        failures.append(f"{name}: --version must name {want}, said {version.stdout.strip()!r} (exit {version.returncode})")
    helped = run(tag, "--help")
    if helped.returncode != 0 or "Usage:" not in helped.stdout:
        failures.append(f"{name}: --help exited {helped.returncode}")
    refused = run(tag, "--no-such-flag")
    if refused.returncode != 2 or "--no-such-flag" not in refused.stderr:
        failures.append(f"{name}: an unknown flag must be refused with exit 2, got {refused.returncode}")


def check_tools(name: str, programs: list[str], tag: str, failures: list[str]) -> None:
    script = 'for p in "$@"; do command -v "$p" >/dev/null || echo "$p"; done'
    out = run(tag, "-c", script, "sh", *programs, entrypoint="/bin/sh")
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
    images = dict(arg.split("=", 1) for arg in sys.argv[2:])
    commit = built_from(repo)
    failures: list[str] = []
    for name, tag in sorted(images.items()):
        before = len(failures)
        if name in BINARIES:
            check_binary(name, tag, commit, failures)
        if name == "snap-csi":
            check_tools(name, sorted(node_programs(repo)), tag, failures)
        if name == "snap-csi-spdk-plugin":
            check_tools(name, sorted(plugin_programs(repo)), tag, failures)
        if name == "snap-csi-spdk":
            out = run(tag, "--version")
            if out.returncode != 0 or not out.stdout.startswith("SPDK v24.09"):
                failures.append(f"snap-csi-spdk: --version said {out.stdout.strip()!r} (exit {out.returncode})")
        user = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Config.User}}", tag], capture_output=True, text=True
        ).stdout.strip()
        print(f"images: {name} {'ok' if len(failures) == before else 'FAILED'} (runs as {user or 'root'})", file=sys.stderr)
    for failure in failures:
        print(f"images: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
