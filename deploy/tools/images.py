"""The Dockerfiles of deploy/images, checked without Docker: what they build
and ship, the runtime packages the node's tools need, and the multi-arch
setup (a builder on the build platform cross-compiling for amd64 and arm64
through rust-target.sh, which is run here for every pair of architectures).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from checklib import Tally

# The tools the node runs, as the brief for the image names them; the check
# adds whatever src/node execs besides (see node_programs()).
NODE_PROGRAMS_FLOOR = (
    "mkfs.ext4",
    "mkfs.xfs",
    "e2fsck",
    "resize2fs",
    "xfs_growfs",
    "blkid",
    "blockdev",
    "dumpe2fs",
)

# The platforms every image is built for (BuildKit's TARGETARCH), with the
# Rust and GNU triples a cross build for each must use.
ARCHES = {
    "amd64": ("x86_64-unknown-linux-gnu", "x86_64-linux-gnu"),
    "arm64": ("aarch64-unknown-linux-gnu", "aarch64-linux-gnu"),
}
HELPER = "rust-target.sh"
HELPER_IN_IMAGE = "/usr/local/bin/rust-target"


@dataclass
class Stage:
    image: str
    alias: str | None
    platform: str | None  # FROM --platform=...
    lines: list[str]  # its instructions, continuation lines joined


@dataclass
class Dockerfile:
    path: Path
    stages: list[Stage]
    title: str | None
    built: list[tuple[str, str]]  # (package, bin)
    copied: list[str]  # binaries copied into the final stage, by name
    entrypoint: list[str]
    runtime_packages: set[str]
    text: str


def apt_installs(line: str) -> list[set[str]]:
    """The packages of each `apt-get install` in a RUN line; a command
    substitution counts as the literal token `$(...)`."""
    out = []
    for m in re.finditer(r"apt-get install ((?:\$\([^)]*\)|[^&;$])*)", line):
        words = re.findall(r"\$\([^)]*\)|\S+", m.group(1))
        out.append({w for w in words if not w.startswith("-")})
    return out


def parse_dockerfile(path: Path) -> Dockerfile:
    text = path.read_text()
    # Join continuation lines, drop comments.
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[Stage] = []
    title = None
    built: list[tuple[str, str]] = []
    copied: list[str] = []
    entrypoint: list[str] = []
    runtime_packages: set[str] = set()
    # ARGs before the first FROM, with their defaults: a FROM naming one is
    # read as the default (what a build without --build-arg makes).
    global_args: dict[str, str] = {}
    for line in logical:
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name.strip()] = default.strip()
            continue
        if instr == "FROM":
            words = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), rest).split()
            platform = next((w.split("=", 1)[1] for w in words if w.startswith("--platform=")), None)
            parts = [w for w in words if not w.startswith("--")]
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], alias, platform, []))
            copied = []
            runtime_packages = set()
            continue
        if stages:
            stages[-1].lines.append(line)
        if instr == "RUN":
            for m in re.finditer(r"cargo build ([^&;]*)", rest):
                args = shlex.split(m.group(1))
                pkg = args[args.index("-p") + 1] if "-p" in args else None
                binary = args[args.index("--bin") + 1] if "--bin" in args else None
                if pkg and binary:
                    built.append((pkg, binary))
            for packages in apt_installs(rest):
                runtime_packages |= packages
        elif instr == "COPY" and "--from=" in rest:
            dest = shlex.split(rest)[-1]
            copied.append(posixpath.basename(dest))
        elif instr == "LABEL":
            m = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', rest)
            if m:
                title = m.group(1)
        elif instr == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instr == "CMD":
            entrypoint = entrypoint + json.loads(rest)
    return Dockerfile(path, stages, title, built, copied, entrypoint, runtime_packages, text)


def cargo_bins(repo: Path) -> set[tuple[str, str]]:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"cargo metadata failed: {out.stderr.strip()}")
    meta = json.loads(out.stdout)
    return {(p["name"], t["name"]) for p in meta["packages"] for t in p["targets"] if "bin" in t["kind"]}


def programs_run(sources: list[Path]) -> set[str]:
    """Every program these Rust files run through the command helper (test
    modules cut off: they run tools an image need not carry)."""
    progs: set[str] = set()
    for src in sources:
        text = src.read_text()
        cut = text.find("#[cfg(test)]")
        progs |= set(re.findall(r'command::run(?:_unchecked)?\(\s*"([^"]+)"', text[: cut if cut >= 0 else None]))
    return progs


def node_programs(repo: Path) -> set[str]:
    """Every program src/node runs, and the brief's list."""
    return set(NODE_PROGRAMS_FLOOR) | programs_run(sorted((repo / "src" / "node").glob("*.rs")))


def plugin_programs(repo: Path) -> set[str]:
    """Every program the sample plugin runs."""
    return programs_run(sorted((repo / "vendor-plugins" / "spdk" / "src").rglob("*.rs")))


def build_files(repo: Path) -> dict[str, str]:
    """The files the build needs from Debian, by what they are for: protoc,
    and every google/protobuf/*.proto our protos import."""
    files = {"protoc": "*bin/protoc"}
    for proto in sorted((repo / "proto").rglob("*.proto")):
        for name in re.findall(r'^import "(google/protobuf/[^"]+)";', proto.read_text(), re.M):
            files[name] = f"*/include/{name}"
    return files


def debian_package_of(pattern: str) -> str | None:
    """The one installed Debian package holding a file matching `pattern`
    (a dpkg -S glob; a bare name means a program in some bin/)."""
    if "/" not in pattern:
        pattern = f"*bin/{pattern}"
    out = subprocess.run(["dpkg", "-S", pattern], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    base = "/" + posixpath.basename(pattern)
    pkgs = {line.split(":", 1)[0].strip() for line in out.stdout.splitlines() if line.strip().endswith(base)}
    return sorted(pkgs)[0] if len(pkgs) == 1 else None


def run_helper(helper: Path, target: str, build: str, what: str) -> tuple[int, str]:
    env = {**os.environ, "TARGETARCH": target, "BUILDARCH": build}
    out = subprocess.run([str(helper), what], capture_output=True, text=True, env=env, timeout=30)
    return out.returncode, out.stdout.strip()


def apt_knows(package: str) -> bool | None:
    """Whether apt has `package` for this machine; None without apt lists."""
    if not any(Path("/var/lib/apt/lists").glob("*_Packages*")):
        return None
    return subprocess.run(["apt-cache", "show", package], capture_output=True).returncode == 0


def check_helper(images: Path, t: Tally) -> None:
    """rust-target.sh, for every target and build architecture: the triples
    of ARCHES, the cross compiler's packages only when the two differ, a
    linker, C compiler and archiver for cargo and ring, and an unknown
    architecture refused rather than built as something else."""
    helper = images / HELPER
    where = f"deploy/images/{HELPER}"
    if not t.check(helper.is_file() and os.access(helper, os.X_OK), where, "missing or not executable"):
        return
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    unknown_apt = []
    for target, (triple, gnu) in ARCHES.items():
        upper, lower = triple.upper().replace("-", "_"), triple.replace("-", "_")
        for build in ARCHES:
            case = f"{where} (TARGETARCH={target}, build machine {build})"
            rc, out = run_helper(helper, target, build, "triple")
            t.check(rc == 0 and out == triple, case, f"triple must be {triple}, is {out!r} (exit {rc})")
            rc, out = run_helper(helper, target, build, "env")
            want = {
                "RUST_TARGET": triple,
                f"CARGO_TARGET_{upper}_LINKER": f"{gnu}-gcc",
                f"CC_{lower}": f"{gnu}-gcc",
                f"AR_{lower}": f"{gnu}-ar",
            }
            got = dict(re.findall(r"^export (\w+)=(\S+)$", out, re.M))
            t.check(rc == 0 and got == want, case, f"env must export {want}, exports {got} (exit {rc})")
            # Another architecture's binaries run here under qemu-user: the
            # runner of local-up --dpu-arch and of cargo test.
            runner = "" if target == build else f"qemu-{triple.split('-')[0]}-static -L /usr/{gnu}"
            exported = re.findall(rf"^export CARGO_TARGET_{upper}_RUNNER='([^']*)'$", out, re.M)
            t.check(exported == ([runner] if runner else []), case, f"env's runner must be {runner!r}, is {exported}")
            rc, out = run_helper(helper, target, build, "runner")
            t.check(rc == 0 and out == runner, case, f"runner must be {runner!r}, is {out!r} (exit {rc})")
            rc, out = run_helper(helper, target, build, "packages")
            packages = out.split()
            if target == build:
                t.check(rc == 0 and not packages, case, f"a native build needs no cross packages, names {packages}")
                continue
            t.check(
                rc == 0 and f"gcc-{gnu.replace('_', '-')}" in packages and any(p.startswith("libc6-dev-") for p in packages),
                case,
                f"a cross build needs the {gnu} C compiler and its libc (a Recommends only), names {packages}",
            )
            if build == native:
                for p in packages:
                    known = apt_knows(p)
                    if known is None:
                        unknown_apt.append(p)
                    else:
                        t.check(known, case, f"Debian has no package {p} for {native} (apt-cache show)")
    rc, _ = run_helper(helper, "riscv64", "amd64", "triple")
    t.check(rc != 0, where, "an architecture it has no settings for must fail the build, not build another")
    if unknown_apt:
        print(f"note: not checked that Debian has {unknown_apt}: this machine has no apt lists (apt-get update)")


def check_multiarch(df: Dockerfile, rel: str, binary: str, build_packages: dict[str, str | None], t: Tally) -> None:
    """The builder runs on the build platform and cross-compiles through the
    helper; the runtime stage is the target platform's image."""
    builder, runtime = df.stages[0], df.stages[-1]
    t.check(
        builder.platform == "$BUILDPLATFORM",
        rel,
        "the builder must be FROM --platform=$BUILDPLATFORM and cross-compile: otherwise the arm64 image "
        f"is compiled under emulation, if at all (is --platform={builder.platform})",
    )
    t.check(runtime.platform is None, rel, f"the runtime stage must be the target platform's, not --platform={runtime.platform}")
    lines = builder.lines
    t.check("ARG TARGETARCH" in lines, rel, "the builder stage must declare ARG TARGETARCH (BuildKit sets it per platform)")
    t.check(
        f"COPY deploy/images/{HELPER} {HELPER_IN_IMAGE}" in lines,
        rel,
        f"the builder must COPY deploy/images/{HELPER} {HELPER_IN_IMAGE}",
    )
    installed = set().union(*(p for line in lines if line.startswith("RUN") for p in apt_installs(line)))
    t.check(
        "$(rust-target packages)" in installed,
        rel,
        "the builder's apt-get install must include $(rust-target packages) (the cross compiler)",
    )
    for what, pkg in sorted(build_packages.items()):
        if t.check(pkg is not None, rel, f"cannot tell which Debian package ships {what} (dpkg -S); hack/setup.sh installs it"):
            t.check(pkg in installed, rel, f"the build needs {what}, from Debian package {pkg}, which the builder does not install")
    runs = " ".join(line for line in lines if line.startswith("RUN"))
    t.check(
        'rustup target add "$(rust-target triple)"' in runs,
        rel,
        'the builder must rustup target add "$(rust-target triple)" (the target\'s standard library)',
    )
    build = re.search(r'eval "\$\(rust-target env\)"\s+&&\s+cargo build ([^&;]*)', runs)
    t.check(
        build is not None and '--target "$RUST_TARGET"' in build.group(1),
        rel,
        'cargo build must follow eval "$(rust-target env)" and build --target "$RUST_TARGET"',
    )
    t.check(
        f'"target/$RUST_TARGET/release/{binary}"' in runs,
        rel,
        f"the binary is target/$RUST_TARGET/release/{binary}, which the builder must install",
    )


def check_pinned(df: Dockerfile, rel: str, t: Tally) -> None:
    """Every image a stage starts from is pinned by tag, but scratch and
    earlier stages."""
    aliases = {stage.alias for stage in df.stages}
    for stage in df.stages:
        if stage.image != "scratch" and stage.image not in aliases:
            t.check(":" in stage.image and not stage.image.endswith(":latest"), rel, f"image {stage.image} is not pinned by tag")


def check_prebuilt(df: Dockerfile, rel: str, t: Tally) -> None:
    """The binaries come from the stage BINARIES names: the builder by
    default, or `prebuilt` (hack/images.sh: a binary this machine built and
    tested), and the runtime stage copies from that choice."""
    aliases = [stage.alias for stage in df.stages]
    t.check("prebuilt" in aliases, rel, "needs a `prebuilt` stage (FROM scratch, COPY ${PREBUILT}/...): hack/images.sh builds with it")
    chosen = [stage for stage in df.stages if stage.alias == "binaries"]
    t.check(
        bool(chosen) and chosen[0].image == df.stages[0].alias,
        rel,
        "needs `FROM ${BINARIES} AS binaries` with ARG BINARIES defaulting to the builder stage",
    )


def check_dockerfiles(repo: Path, images: Path, t: Tally) -> dict[str, Dockerfile]:
    """Returns the Dockerfiles by image title (= the binary they ship)."""
    channel = tomllib.loads((repo / "rust-toolchain.toml").read_text())["toolchain"]["channel"]
    rust_minor = ".".join(channel.split(".")[:2])
    bins = cargo_bins(repo)
    build_packages = {what: debian_package_of(pattern) for what, pattern in build_files(repo).items()}
    check_helper(images, t)
    by_title: dict[str, Dockerfile] = {}
    for path in sorted(images.glob("*.Dockerfile")):
        rel = f"{path.relative_to(images.parent.parent)}"
        df = parse_dockerfile(path)
        t.check(len(df.stages) >= 2, rel, f"must be multi-stage, has {len(df.stages)} stage(s)")
        if not df.stages:
            continue
        builder = df.stages[0]
        t.check(
            builder.image == f"rust:{rust_minor}-bookworm",
            rel,
            f"builder must be rust:{rust_minor}-bookworm (rust-toolchain.toml pins {channel}), is {builder.image}",
        )
        t.check(builder.alias is not None, rel, "builder stage needs a name for COPY --from")
        runtime_image = df.stages[-1].image
        t.check(
            runtime_image == "debian:bookworm-slim",
            rel,
            f"runtime must be debian:bookworm-slim (the builder's Debian, so glibc matches), is {runtime_image}",
        )
        check_pinned(df, rel, t)
        t.check(len(df.built) == 1, rel, f"must build exactly one binary with cargo build -p PKG --bin BIN, builds {df.built}")
        if not df.built:
            continue
        pkg, binary = df.built[0]
        t.check((pkg, binary) in bins, rel, f"cargo has no binary {binary} in package {pkg}")
        t.check(
            re.search(r"cargo build [^&;]*--locked", df.text) is not None and "--release" in df.text,
            rel,
            "cargo build must be --release --locked (what Cargo.lock pins, what CI tested)",
        )
        check_multiarch(df, rel, binary, build_packages, t)
        check_prebuilt(df, rel, t)
        t.check(binary in df.copied, rel, f"the final stage copies {df.copied}, not the built {binary}")
        t.check(
            df.entrypoint == [f"/usr/local/bin/{binary}"],
            rel,
            f"ENTRYPOINT must be the built binary /usr/local/bin/{binary}, is {df.entrypoint}",
        )
        t.check(df.title == binary, rel, f"LABEL org.opencontainers.image.title must be {binary}, is {df.title}")
        ignore = path.with_name(path.name + ".dockerignore")
        t.check(
            ignore.is_file() and "target" in ignore.read_text().split(),
            rel,
            f"{ignore.name} must exist beside it and exclude target (the build context is the repository)",
        )
        by_title[binary] = df
    t.check("snap-csi" in by_title, "deploy/images", "no Dockerfile ships snap-csi")
    node_df = by_title.get("snap-csi")
    if node_df:
        rel = f"{node_df.path.relative_to(images.parent.parent)}"
        for prog in sorted(node_programs(repo)):
            pkg = debian_package_of(prog)
            if not t.check(
                pkg is not None,
                rel,
                f"cannot tell which Debian package ships {prog} (dpkg -S); hack/setup.sh installs the node's tools",
            ):
                continue
            t.check(
                pkg in node_df.runtime_packages,
                rel,
                f"the node runs {prog}, shipped by Debian package {pkg}, which the runtime stage does not install "
                f"(it installs {sorted(node_df.runtime_packages)})",
            )
    return by_title


def check_spdk_containerfile(path: Path, t: Tally) -> None:
    """hack/spdk/Containerfile (real SPDK, for the test command and users'
    tests; hack/images.sh builds it): pinned Debian 12 stages, every file it
    copies present in its context (the repository: build.sh fetches with the
    script and manifest in hack/), SPDK pinned at the tag its patch is for,
    and spdk_tgt run without hugepages or PCI on a socket by default."""
    where = str(path)
    context = path.parent.parent.parent
    df = parse_dockerfile(path)
    aliases = {stage.alias for stage in df.stages}
    images = {stage.image for stage in df.stages} - aliases - {"scratch"}
    t.check(
        bool(images) and images <= {"debian:bookworm", "debian:bookworm-slim"},
        where,
        f"must start from debian:bookworm(-slim) only (the Debian whose DPDK the patch is for), has {sorted(images)}",
    )
    for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", df.text, re.MULTILINE):
        for source in shlex.split(m.group(1))[:-1]:
            if not source.startswith("$"):
                t.check((context / source).is_file(), where, f"COPY source {source} is not in the build context {context}")
    patches = sorted(path.parent.glob("spdk-*.patch"))
    tag = patches[0].name.split("-")[1] if patches else None
    manifest = context / "hack" / "third-party.txt"
    pinned = [line.split() for line in manifest.read_text().splitlines()] if manifest.is_file() else []
    t.check(
        tag is not None and ["part", "spdk", ".", "https://github.com/spdk/spdk", tag] in [p[:5] for p in pinned],
        str(manifest),
        f"must pin SPDK at the tag its patch is for ({tag})",
    )
    runs = [line for stage in df.stages for line in stage.lines if line.upper().startswith("RUN ")]
    t.check(any("hack/spdk/build.sh" in line for line in runs), where, "must build with hack/spdk/build.sh (the recipe the test command runs)")
    for flag in ("--no-huge", "-s", "--no-pci", "-r"):
        t.check(flag in df.entrypoint[1:], where, f"ENTRYPOINT and CMD must run spdk_tgt with {flag}, is {df.entrypoint}")
