#!/usr/bin/env python3
"""Offline checks of deploy/: the kustomizations, the Kubernetes schemas, and
whether the manifests and the Dockerfiles agree with the binaries.

Run by deploy/check.sh (inside the venv hack/setup.sh makes). What it proves
and what it does not is listed in deploy/README.md. Each check is one line in
the tally; every failure is printed with what was expected.
"""

from __future__ import annotations

import argparse
import copy
import json
import posixpath
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

# The newest Kubernetes whose schemas kubernetes-validate bundles; the
# manifests must be valid there (strict: unknown fields are errors).
K8S_VERSION = "1.37"

# Roots of deploy/kubernetes: the host side and the DPU side (applied to
# different clusters under NVIDIA DPF). Every other kustomization must be
# reachable from one of them.
ROOTS = ("kubernetes", "kubernetes/dpu")

# CRD kinds kubernetes-validate has no schema for, and our copy of theirs.
CRD_SCHEMAS = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): "volumesnapshotclass-snapshot-v1.json",
}

SIG_STORAGE = "registry.k8s.io/sig-storage/"
SIDECARS = {
    "csi-provisioner",
    "csi-resizer",
    "csi-snapshotter",
    "csi-attacher",
    "csi-node-driver-registrar",
    "livenessprobe",
}
# Sidecars that act on the API and so must not act twice.
LEADER_ELECTED = {"csi-provisioner", "csi-resizer", "csi-snapshotter", "csi-attacher"}

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

# Which of our binaries' settings are CSI sockets they serve, and whose
# defaults `--help` does not print (the node layers defaults < file < env <
# flags, so clap knows none of them): those must be set in the manifest.
CSI_SOCKETS = {
    ("snap-csi", "node"): ("endpoint",),
    ("snap-csi", "controller"): ("endpoint",),
    ("snap-csi-spdk-plugin", None): ("csi-socket",),
}
HIDDEN_DEFAULTS = {("snap-csi", "node")}
SUBCOMMANDS = {"snap-csi": ("node", "controller")}

# NVIDIA DPF socket conventions (shared/reference/snap4-rpc.md).
DPF_PLUGIN_SOCKET = re.compile(r"^/var/lib/nvidia/storage/snap/plugins/[^/]+/dpu\.sock$")
DPF_SNAP_SOCKET = re.compile(r"^/var/lib/nvidia/storage/snap/providers/[^/]+/snap\.sock$")
DEFAULT_PROVIDER = "nvidia"


class Tally:
    def __init__(self) -> None:
        self.passed = 0
        self.failures: list[str] = []

    def check(self, ok: bool, what: str, why: str = "") -> bool:
        if ok:
            self.passed += 1
        else:
            self.failures.append(f"{what}: {why}" if why else what)
        return ok

    def fail(self, what: str, why: str = "") -> None:
        self.check(False, what, why)


# ---------------------------------------------------------------- loading


def load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def obj_key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def show(key: tuple[str, str, str, str]) -> str:
    _, kind, ns, name = key
    return f"{kind} {ns + '/' if ns else ''}{name}"


@dataclass
class Kustomization:
    dir: Path
    resources: list[str]


def read_kustomizations(kube: Path, t: Tally) -> dict[Path, Kustomization]:
    out: dict[Path, Kustomization] = {}
    for path in sorted(kube.rglob("kustomization.yaml")):
        rel = path.relative_to(kube.parent)
        docs = load_yaml_docs(path)
        if not t.check(len(docs) == 1, f"{rel}", "must hold exactly one document"):
            continue
        k = docs[0]
        t.check(
            k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1" and k.get("kind") == "Kustomization",
            f"{rel}",
            "apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization",
        )
        # Transformers would make the applied objects differ from the files
        # every other check reads; keep the files the truth.
        extra = set(k) - {"apiVersion", "kind", "resources"}
        t.check(not extra, f"{rel}", f"only resources are used here, found {sorted(extra)}")
        resources = k.get("resources") or []
        t.check(bool(resources), f"{rel}", "lists no resources")
        out[path.parent] = Kustomization(path.parent, list(resources))
    return out


def check_kustomize_tree(kube: Path, ks: dict[Path, Kustomization], t: Tally) -> None:
    for d, k in ks.items():
        rel = d.relative_to(kube.parent)
        listed_files = set()
        for r in k.resources:
            target = (d / r).resolve()
            if target.is_dir():
                t.check(target in ks, f"{rel}/kustomization.yaml", f"resource {r} is a directory without a kustomization.yaml")
            elif target.is_file():
                t.check(r.endswith(".yaml"), f"{rel}/kustomization.yaml", f"resource {r} is not a .yaml file")
                t.check(target.parent == d.resolve(), f"{rel}/kustomization.yaml", f"resource {r} lies outside its directory")
                listed_files.add(target.name)
            else:
                t.fail(f"{rel}/kustomization.yaml", f"resource {r} does not exist")
        present = {p.name for p in d.glob("*.yaml")} - {"kustomization.yaml"}
        orphans = sorted(present - listed_files)
        t.check(not orphans, f"{rel}/kustomization.yaml", f"files present but not listed in resources: {orphans}")
    # Every kustomization dir is reachable from a root, and every manifest
    # lies in a kustomization dir.
    reachable: set[Path] = set()
    stack = [kube.parent / r for r in ROOTS]
    for r in stack:
        t.check(r in ks, f"{r.relative_to(kube.parent)}", "root has no kustomization.yaml")
    while stack:
        d = stack.pop()
        if d in reachable or d not in ks:
            continue
        reachable.add(d)
        stack.extend((d / r).resolve() for r in ks[d].resources if (d / r).is_dir())
    for d in ks:
        t.check(d in reachable, f"{d.relative_to(kube.parent)}", f"not reachable from any root {ROOTS}")
    for p in sorted(kube.rglob("*.yaml")):
        t.check(p.parent in ks, f"{p.relative_to(kube.parent)}", "lies in a directory without a kustomization.yaml")


def plain_objects(d: Path, ks: dict[Path, Kustomization]) -> list[dict]:
    objs: list[dict] = []
    for r in ks[d].resources:
        target = (d / r).resolve()
        if target.is_dir() and target in ks:
            objs.extend(plain_objects(target, ks))
        elif target.is_file():
            objs.extend(load_yaml_docs(target))
    return objs


def render(kubectl: str, d: Path) -> list[dict]:
    out = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or f"exit {out.returncode}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc is not None]


def check_render(kube: Path, ks: dict[Path, Kustomization], kubectl: str | None, t: Tally) -> dict[Path, list[dict]]:
    """Renders every kustomization; returns what rendered."""
    rendered_by_dir: dict[Path, list[dict]] = {}
    for d in ks:
        rel = d.relative_to(kube.parent)
        plain = plain_objects(d, ks)
        keys = [obj_key(o) for o in plain]
        dups = sorted({show(k) for k in keys if keys.count(k) > 1})
        t.check(not dups, f"{rel}", f"objects defined twice: {dups}")
        if kubectl is None:
            continue
        try:
            rendered = render(kubectl, d)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            t.fail(f"kubectl kustomize {rel}", str(e))
            continue
        rendered_by_dir[d] = rendered
        by_key = {obj_key(o): o for o in rendered}
        t.check(
            set(by_key) == set(keys),
            f"kubectl kustomize {rel}",
            f"renders {sorted(map(show, by_key))}, the files hold {sorted(map(show, keys))}",
        )
        changed = [show(obj_key(o)) for o in plain if by_key.get(obj_key(o)) not in (None, o)]
        t.check(not changed, f"kubectl kustomize {rel}", f"renders these differently from their files: {changed}")
    return rendered_by_dir


# ---------------------------------------------------------------- schemas


def definitions_resource() -> referencing.Resource:
    version = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= K8S_VERSION][-1]
    defs = kv_utils.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", K8S_VERSION)
    return referencing.Resource.from_contents(defs)


def strict_crd_schema(schema: dict, defs_id: str) -> dict:
    """Unknown fields rejected (as strict field validation would), metadata
    checked as ObjectMeta."""
    s = copy.deepcopy(schema)
    s.pop("$comment", None)

    def close(node: dict) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for v in node.values():
                if isinstance(v, dict):
                    close(v)
                elif isinstance(v, list):
                    for i in v:
                        close(i)

    close(s)
    s["properties"]["metadata"] = {"$ref": f"{defs_id}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    return s


def check_schemas(objs: list[dict], schema_dir: Path, t: Tally) -> None:
    defs = definitions_resource()
    registry = defs @ referencing.Registry()
    for o in objs:
        what = f"schema {show(obj_key(o))}"
        crd = CRD_SCHEMAS.get((o.get("apiVersion"), o.get("kind")))
        if crd:
            schema = strict_crd_schema(json.loads((schema_dir / crd).read_text()), defs.contents["$id"])
            errors = sorted(jsonschema.Draft202012Validator(schema, registry=registry).iter_errors(o), key=str)
            t.check(
                not errors,
                what,
                "; ".join(f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors[:5]),
            )
            continue
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
            t.check(True, what)
        except kubernetes_validate.ValidationError as e:
            t.fail(what, f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message} (Kubernetes {e.version}, strict)")
        except kubernetes_validate.SchemaNotFoundError as e:
            t.fail(what, f"{e.message}; add the CRD's schema to CRD_SCHEMAS")


# ---------------------------------------------------------------- binaries


@dataclass
class Flag:
    name: str
    takes_value: bool
    env: str | None = None
    default: str | None = None
    choices: tuple[str, ...] = ()
    help: str = ""

    @property
    def controller_only(self) -> bool:
        """The sample plugin marks the settings of its CSI controller, which
        only matter with --csi-socket, by starting their help so."""
        return self.help.startswith("CSI controller:")


def parse_help(text: str) -> dict[str, Flag]:
    """Flags from clap's --help, short (`--x <X>  text [env: ..]`) or long
    (description on the lines below) form."""
    flags: dict[str, Flag] = {}
    current: tuple[str, bool] | None = None
    body: list[str] = []

    def finish() -> None:
        if current is None:
            return
        name, takes = current
        desc = " ".join(body)
        env = re.search(r"\[env: ([A-Z0-9_]+)=", desc)
        default = re.search(r"\[default: (.*?)\]", desc)
        choices = re.search(r"\[possible values: (.*?)\]", desc)
        dflt = default.group(1) if default else None
        if dflt is not None and len(dflt) >= 2 and dflt[0] == dflt[-1] == '"':
            dflt = dflt[1:-1]
        flags[name] = Flag(
            name,
            takes,
            env.group(1) if env else None,
            dflt,
            tuple(c.strip() for c in choices.group(1).split(",")) if choices else (),
            desc.strip(),
        )

    for line in text.splitlines():
        m = re.match(r"^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)(?: <[^>]+>)?(.*)$", line)
        if m:
            finish()
            current = (m.group(1), "<" in line.split("--" + m.group(1), 1)[1][:3])
            body = [m.group(2)]
        elif current is not None and line.startswith(" "):
            body.append(line.strip())
        elif current is not None and not line.strip():
            continue
        else:
            finish()
            current = None
            body = []
    finish()
    return flags


def run_help(binary: str, sub: str | None) -> dict[str, Flag]:
    cmd = [binary] + ([sub] if sub else []) + ["--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return parse_help(out.stdout)


@dataclass
class Dockerfile:
    path: Path
    stages: list[tuple[str, str | None]]  # (image, alias)
    title: str | None
    built: list[tuple[str, str]]  # (package, bin)
    copied: list[str]  # binaries copied into the final stage, by name
    entrypoint: list[str]
    runtime_packages: set[str]
    text: str


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
    stages: list[tuple[str, str | None]] = []
    title = None
    built: list[tuple[str, str]] = []
    copied: list[str] = []
    entrypoint: list[str] = []
    runtime_packages: set[str] = set()
    for line in logical:
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--")]
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append((parts[0], alias))
            copied = []
            runtime_packages = set()
        elif instr == "RUN":
            for m in re.finditer(r"cargo build ([^&;]*)", rest):
                args = shlex.split(m.group(1))
                pkg = args[args.index("-p") + 1] if "-p" in args else None
                binary = args[args.index("--bin") + 1] if "--bin" in args else None
                if pkg and binary:
                    built.append((pkg, binary))
            for m in re.finditer(r"apt-get install ([^&;]*)", rest):
                runtime_packages |= {a for a in shlex.split(m.group(1)) if not a.startswith("-")}
        elif instr == "COPY" and "--from=" in rest:
            dest = shlex.split(rest)[-1]
            copied.append(posixpath.basename(dest))
        elif instr == "LABEL":
            m = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', rest)
            if m:
                title = m.group(1)
        elif instr == "ENTRYPOINT":
            entrypoint = json.loads(rest)
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


def node_programs(repo: Path) -> set[str]:
    """Every program src/node runs through its command helper (test modules
    cut off: they run tools the image need not carry)."""
    progs = set(NODE_PROGRAMS_FLOOR)
    for src in sorted((repo / "src" / "node").glob("*.rs")):
        text = src.read_text()
        cut = text.find("#[cfg(test)]")
        if cut >= 0:
            text = text[:cut]
        progs |= set(re.findall(r'command::run(?:_unchecked)?\(\s*"([^"]+)"', text))
    return progs


def node_fs_types(repo: Path) -> set[str]:
    text = (repo / "src" / "node" / "format.rs").read_text()
    return set(re.findall(r'"([a-z0-9]+)" => Ok\(FsType::', text))


def debian_package_of(program: str) -> str | None:
    out = subprocess.run(["dpkg", "-S", f"*bin/{program}"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    pkgs = {line.split(":", 1)[0].strip() for line in out.stdout.splitlines() if line.strip().endswith("/" + program)}
    return sorted(pkgs)[0] if len(pkgs) == 1 else None


def check_dockerfiles(repo: Path, images: Path, t: Tally) -> dict[str, Dockerfile]:
    """Returns the Dockerfiles by image title (= the binary they ship)."""
    channel = tomllib.loads((repo / "rust-toolchain.toml").read_text())["toolchain"]["channel"]
    rust_minor = ".".join(channel.split(".")[:2])
    bins = cargo_bins(repo)
    by_title: dict[str, Dockerfile] = {}
    for path in sorted(images.glob("*.Dockerfile")):
        rel = path.relative_to(images.parent.parent)
        df = parse_dockerfile(path)
        t.check(len(df.stages) >= 2, f"{rel}", f"must be multi-stage, has {len(df.stages)} stage(s)")
        if not df.stages:
            continue
        builder_image, builder_alias = df.stages[0]
        t.check(
            builder_image == f"rust:{rust_minor}-bookworm",
            f"{rel}",
            f"builder must be rust:{rust_minor}-bookworm (rust-toolchain.toml pins {channel}), is {builder_image}",
        )
        t.check(builder_alias is not None, f"{rel}", "builder stage needs a name for COPY --from")
        runtime_image = df.stages[-1][0]
        t.check(
            runtime_image == "debian:bookworm-slim",
            f"{rel}",
            f"runtime must be debian:bookworm-slim (the builder's Debian, so glibc matches), is {runtime_image}",
        )
        for image, _ in df.stages:
            t.check(":" in image and not image.endswith(":latest"), f"{rel}", f"image {image} is not pinned by tag")
        t.check(len(df.built) == 1, f"{rel}", f"must build exactly one binary with cargo build -p PKG --bin BIN, builds {df.built}")
        if not df.built:
            continue
        pkg, binary = df.built[0]
        t.check((pkg, binary) in bins, f"{rel}", f"cargo has no binary {binary} in package {pkg}")
        t.check(
            re.search(r"cargo build [^&;]*--locked", df.text) is not None and "--release" in df.text,
            f"{rel}",
            "cargo build must be --release --locked (what Cargo.lock pins, what CI tested)",
        )
        t.check(binary in df.copied, f"{rel}", f"the final stage copies {df.copied}, not the built {binary}")
        t.check(
            df.entrypoint == [f"/usr/local/bin/{binary}"],
            f"{rel}",
            f"ENTRYPOINT must be the built binary /usr/local/bin/{binary}, is {df.entrypoint}",
        )
        t.check(df.title == binary, f"{rel}", f"LABEL org.opencontainers.image.title must be {binary}, is {df.title}")
        ignore = path.with_name(path.name + ".dockerignore")
        t.check(
            ignore.is_file() and "target" in ignore.read_text().split(),
            f"{rel}",
            f"{ignore.name} must exist beside it and exclude target (the build context is the repository)",
        )
        by_title[binary] = df
    t.check("snap-csi" in by_title, "deploy/images", "no Dockerfile ships snap-csi")
    node_df = by_title.get("snap-csi")
    if node_df:
        for prog in sorted(node_programs(repo)):
            pkg = debian_package_of(prog)
            if not t.check(
                pkg is not None,
                f"{node_df.path.relative_to(images.parent.parent)}",
                f"cannot tell which Debian package ships {prog} (dpkg -S); hack/setup.sh installs the node's tools",
            ):
                continue
            t.check(
                pkg in node_df.runtime_packages,
                f"{node_df.path.relative_to(images.parent.parent)}",
                f"the node runs {prog}, shipped by Debian package {pkg}, which the runtime stage does not install "
                f"(it installs {sorted(node_df.runtime_packages)})",
            )
    return by_title


def check_spdk_containerfile(path: Path, t: Tally) -> None:
    """hack/spdk/Containerfile (real SPDK for users' tests; no engine here to
    build it): one pinned Debian 12 stage, every file it copies present in its
    context (its directory), the SPDK tag its patch is for, and spdk_tgt run
    without hugepages or PCI on a socket."""
    where = str(path)
    df = parse_dockerfile(path)
    t.check([image for image, _ in df.stages] == ["debian:bookworm"], where, f"must be one debian:bookworm stage (the Debian whose DPDK the patch is for), has {df.stages}")
    for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", df.text, re.MULTILINE):
        for source in shlex.split(m.group(1))[:-1]:
            t.check((path.parent / source).is_file(), where, f"COPY source {source} is not in the build context {path.parent}")
    patches = sorted(path.parent.glob("spdk-*.patch"))
    tag = patches[0].name.split("-")[1] if patches else None
    t.check(tag is not None and f"--branch {tag} " in df.text, where, f"must clone SPDK at the tag its patch is for ({tag})")
    t.check("build.sh --source" in df.text, where, "must build with build.sh --source (the recipe the test command runs)")
    for flag in ("--no-huge", "-s", "--no-pci", "-r"):
        t.check(flag in df.entrypoint[1:], where, f"ENTRYPOINT must run spdk_tgt with {flag}, is {df.entrypoint}")


# ---------------------------------------------------------------- pods


@dataclass
class Container:
    pod: str  # "Kind ns/name"
    spec: dict
    pod_spec: dict
    root: str  # which root it renders from
    image_name: str = ""
    tag: str = ""
    args: dict[str, str | None] = field(default_factory=dict)  # flag -> value (None: bare flag)
    positional: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def where(self) -> str:
        return f"{self.pod} container {self.name}"


def pods_of(objs: list[dict], root: str) -> list[tuple[str, dict, dict]]:
    out = []
    for o in objs:
        spec = ((o.get("spec") or {}).get("template") or {}).get("spec")
        if spec:
            out.append((show(obj_key(o)), o, spec))
    return out


def expand_vars(value: str, env: dict[str, str], where: str, t: Tally) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in env:
            t.fail(where, f"$({name}) is not defined in the container's env")
            return m.group(0)
        return env[name]

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value)


def container_env(spec: dict) -> dict[str, str]:
    env = {}
    for e in spec.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "valueFrom" in e:
            ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath") or "ref"
            env[e["name"]] = f"<{ref}>"
    return env


def split_args(args: list[str], flags: dict[str, Flag] | None) -> tuple[dict[str, str | None], list[str], list[str]]:
    """--a=b, --a b (when the binary says --a takes a value), --a. Returns the
    flags, the positionals, and the flags given twice."""
    out: dict[str, str | None] = {}
    positional: list[str] = []
    twice: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and len(a) > 1:
            name, eq, value = a.lstrip("-").partition("=")
            if not eq:
                takes = flags is not None and name in flags and flags[name].takes_value
                if takes and i + 1 < len(args):
                    value = args[i + 1]
                    i += 1
                else:
                    value = None
            if name in out:
                twice.append(name)
            out[name] = value
        else:
            positional.append(a)
        i += 1
    return out, positional, twice


def image_parts(image: str) -> tuple[str, str, str]:
    repo, _, tag = image.rpartition(":")
    if "/" in tag or not repo:
        repo, tag = image, ""
    return repo, repo.rsplit("/", 1)[-1], tag


@dataclass
class Location:
    """Where a container path really is: a host path, or a path inside one
    pod volume."""

    volume: str  # "host" or "<pod>/<volume>"
    path: str

    def __str__(self) -> str:
        return f"{self.path} on the host" if self.volume == "host" else f"{self.path} in volume {self.volume}"


def locate(c: Container, path: str) -> tuple[Location, dict] | None:
    mounts = sorted(c.spec.get("volumeMounts") or [], key=lambda m: len(m["mountPath"]), reverse=True)
    vols = {v["name"]: v for v in c.pod_spec.get("volumes") or []}
    for m in mounts:
        mp = m["mountPath"].rstrip("/") or "/"
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            rel = path[len(mp) :].lstrip("/")
            inner = posixpath.join(m.get("subPath", ""), rel)
            vol = vols.get(m["name"], {})
            if "hostPath" in vol:
                return Location("host", posixpath.normpath(posixpath.join(vol["hostPath"]["path"], inner))), m
            return Location(f"{c.pod}/{m['name']}", posixpath.normpath(posixpath.join("/", inner))), m
    return None


def path_kind(flag: str) -> str | None:
    if flag in ("endpoint",) or flag.endswith("-socket"):
        return "socket"
    if flag.endswith("-template"):
        return "template"
    if flag.endswith("-dir") or flag.endswith("-root"):
        return "dir"
    if flag == "vendor-endpoint":
        return "url"
    if flag == "config":
        return "file"
    return None


@dataclass
class Ours:
    c: Container
    binary: str
    sub: str | None
    flags: dict[str, Flag]
    settings: dict[str, str | None]  # effective values of every flag
    explicit: set[str]


def cmd_name(binary: str, sub: str | None) -> str:
    return f"{binary} {sub}" if sub else binary


def analyse_ours(
    c: Container, df: Dockerfile, helps: dict[tuple[str, str | None], dict[str, Flag]], t: Tally
) -> Ours | None:
    binary = df.entrypoint[0].rsplit("/", 1)[-1] if df.entrypoint else df.title or ""
    t.check(not c.spec.get("command"), c.where(), "must not override the image's ENTRYPOINT (the Dockerfile's binary)")
    raw_args = [str(a) for a in c.spec.get("args") or []]
    env = container_env(c.spec)
    where = c.where()
    sub = None
    if binary in SUBCOMMANDS:
        if not t.check(
            bool(raw_args) and raw_args[0] in SUBCOMMANDS[binary],
            where,
            f"first arg must be a {binary} subcommand {SUBCOMMANDS[binary]}",
        ):
            return None
        sub = raw_args[0]
        raw_args = raw_args[1:]
    flags = helps.get((binary, sub))
    if flags is None:
        t.fail(where, f"no --help for {cmd_name(binary, sub)}: the Dockerfile ships a binary the check does not know")
        return None
    args, positional, twice = split_args([expand_vars(a, env, where, t) for a in raw_args], flags)
    t.check(not positional, where, f"{cmd_name(binary, sub)} takes no positional args, got {positional}")
    t.check(not twice, where, f"flags given twice: {twice}")
    settings: dict[str, str | None] = {}
    explicit: set[str] = set()
    for name, value in args.items():
        f = flags.get(name)
        if not t.check(f is not None, where, f"{cmd_name(binary, sub)} has no flag --{name} (see its --help)"):
            continue
        if f.takes_value:
            t.check(value is not None, where, f"--{name} needs a value")
        else:
            t.check(value is None, where, f"--{name} takes no value")
        if f.choices and value is not None:
            t.check(value in f.choices, where, f"--{name}={value} is not one of {list(f.choices)}")
        settings[name] = value
        explicit.add(name)
    # Environment variables are settings too; an unknown one with our
    # prefixes is a typo the binary would ignore.
    by_env = {f.env: f for f in flags.values() if f.env}
    prefixes = {f.env.split("_", 2)[0] + "_" + f.env.split("_", 2)[1] + "_" for f in flags.values() if f.env and f.env.count("_") >= 2}
    for e in c.spec.get("env") or []:
        name = e["name"]
        if name in by_env:
            f = by_env[name]
            t.check(f.name not in explicit, where, f"{name} and --{f.name} both set")
            settings[f.name] = env.get(name)
            explicit.add(f.name)
        elif any(name.startswith(p) for p in prefixes):
            t.fail(where, f"env {name} is not a setting of {cmd_name(binary, sub)}")
    for name, f in flags.items():
        if name not in settings:
            settings[name] = f.default
    if "csi-socket" in flags and settings.get("csi-socket") is None:
        idle = sorted(n for n in explicit if flags[n].controller_only)
        t.check(not idle, where, f"{idle} only matter with --csi-socket, which is not set")
    return Ours(c, binary, sub, flags, settings, explicit)


def check_paths(o: Ours, t: Tally) -> dict[str, Location]:
    """Every path setting resolves into a mount of the container; returns
    where each one really is."""
    where = o.c.where()
    found: dict[str, Location] = {}
    for name, f in o.flags.items():
        kind = path_kind(name)
        if kind is None or name == "help":
            continue
        value = o.settings.get(name)
        if kind == "file" and value is None:
            continue
        if f.controller_only and o.settings.get("csi-socket") is None:
            continue  # the CSI controller is off in this container
        if (o.binary, o.sub) in HIDDEN_DEFAULTS and name not in o.explicit and kind != "file":
            t.fail(where, f"--{name} must be set: `{cmd_name(o.binary, o.sub)} --help` prints no default to check the mounts against")
            continue
        if value is None:
            continue  # optional and off (no default, not set)
        path = value
        if kind == "url":
            if not value.startswith("unix://"):
                continue
            path = value[len("unix://") :]
        if kind == "template":
            path = value.replace("{provider}", DEFAULT_PROVIDER)
        if not t.check(path.startswith("/"), where, f"--{name}={value} is not an absolute path"):
            continue
        probe = path if kind == "dir" else posixpath.dirname(path)
        loc = locate(o.c, probe)
        if not t.check(
            loc is not None,
            where,
            f"--{name}={value}: {probe} is not inside any volumeMount of the container, so it would not outlive "
            "the container or be seen by the other side",
        ):
            continue
        location, _ = loc
        found[name] = Location(location.volume, location.path if kind == "dir" else posixpath.join(location.path, posixpath.basename(path)))
    return found


def check_pods(
    roots: dict[str, list[dict]],
    dockerfiles: dict[str, Dockerfile],
    helps: dict[tuple[str, str | None], dict[str, Flag]],
    version: str,
    repo: Path,
    t: Tally,
) -> None:
    ours: list[tuple[Ours, dict[str, Location]]] = []
    sidecars: list[Container] = []
    all_containers: list[Container] = []
    for root, objs in roots.items():
        for podname, obj, spec in pods_of(objs, root):
            pod_ours = []
            for cs in (spec.get("initContainers") or []) + spec["containers"]:
                c = Container(podname, cs, spec, root)
                all_containers.append(c)
                repo_, c.image_name, c.tag = image_parts(cs.get("image", ""))
                where = c.where()
                t.check(bool(c.tag) and c.tag != "latest", where, f"image {cs.get('image')} must be pinned by a tag")
                req = (cs.get("resources") or {}).get("requests") or {}
                t.check("cpu" in req and "memory" in req, where, "resources.requests must set cpu and memory")
                for e in cs.get("env") or []:
                    if re.search(r"(PASSWORD|SECRET|TOKEN|KEY)$", e["name"]) and "value" in e:
                        t.fail(where, f"env {e['name']} carries a literal value: no secrets in manifests")
                if c.image_name in dockerfiles:
                    t.check(
                        c.tag == version,
                        where,
                        f"our image must be tagged with the workspace version {version}, is {c.tag}",
                    )
                    o = analyse_ours(c, dockerfiles[c.image_name], helps, t)
                    if o:
                        locs = check_paths(o, t)
                        ours.append((o, locs))
                        pod_ours.append(o)
                elif c.image_name in SIDECARS:
                    t.check(repo_ + "/" == SIG_STORAGE + c.image_name + "/", where, f"sidecars come from {SIG_STORAGE}")
                    c.args, c.positional, _ = split_args([str(a) for a in cs.get("args") or []], None)
                    env = container_env(cs)
                    c.args = {k: (expand_vars(v, env, where, t) if v else v) for k, v in c.args.items()}
                    sidecars.append(c)
                else:
                    t.fail(where, f"image {cs.get('image')} is neither ours (deploy/images) nor a sig-storage sidecar")
    check_ports(all_containers, t)
    check_sockets(ours, sidecars, t)
    check_node(ours, sidecars, t)
    check_cross(ours, roots, repo, t)


def arg_listeners(c: Container) -> list[int]:
    """TCP ports a container's args make it listen on: sidecars'
    --http-endpoint/--health-port, our --metrics-address."""
    ports = []
    for a in c.spec.get("args") or []:
        m = re.match(r"^--(http-endpoint|metrics-address|health-port)=(?:.*:)?(\d+)$", str(a))
        if m:
            ports.append(int(m.group(2)))
    return ports


def check_ports(containers: list[Container], t: Tally) -> None:
    """Containers of a pod share one network namespace: two listeners on
    one port means one of them fails to start. (A declared containerPort
    may name a sidecar's listener on the container its probe restarts, as
    the healthz ports here do, so declarations are only checked among
    themselves.)"""
    listening: dict[str, dict[int, str]] = {}
    declared: dict[str, dict[int, str]] = {}
    for c in containers:
        taken = listening.setdefault(c.pod, {})
        for port in arg_listeners(c):
            t.check(port not in taken, c.where(), f"listens on port {port}, as {taken.get(port)} does")
            taken.setdefault(port, c.name)
        named = declared.setdefault(c.pod, {})
        for p in c.spec.get("ports") or []:
            port = p.get("containerPort")
            t.check(port not in named, c.where(), f"declares port {port}, as {named.get(port)} does")
            named.setdefault(port, c.name)


def served_csi_sockets(ours: list[tuple[Ours, dict[str, Location]]]) -> dict[tuple[str, str], Ours]:
    served = {}
    for o, locs in ours:
        for name in CSI_SOCKETS.get((o.binary, o.sub), ()):
            if name in locs:
                served[(locs[name].volume, locs[name].path)] = o
    return served


def named_port(c: dict, port) -> int | None:
    if isinstance(port, int):
        return port
    for p in c.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return None


def check_sockets(ours: list[tuple[Ours, dict[str, Location]]], sidecars: list[Container], t: Tally) -> None:
    served = served_csi_sockets(ours)
    probed: set[tuple[str, str]] = set()
    for c in sidecars:
        where = c.where()
        addr = c.args.get("csi-address")
        if not t.check(bool(addr), where, "--csi-address must be set (the sidecars' default is /run/csi/socket)"):
            continue
        addr = addr.removeprefix("unix://")
        loc = locate(c, posixpath.dirname(addr))
        if not t.check(loc is not None, where, f"--csi-address={addr} is not inside any volumeMount"):
            continue
        key = (loc[0].volume, posixpath.join(loc[0].path, posixpath.basename(addr)))
        server = served.get(key)
        t.check(
            server is not None and server.c.pod == c.pod,
            where,
            f"--csi-address={addr} is {Location(*key)}, where no container of this pod serves CSI "
            f"(served: {[str(Location(*k)) for k in served]})",
        )
        if c.image_name in LEADER_ELECTED:
            t.check("leader-election" in c.args and c.args["leader-election"] in (None, "true"), where, "needs --leader-election")
            t.check(bool(c.args.get("leader-election-namespace")), where, "needs --leader-election-namespace")
            t.check(bool(c.args.get("timeout")), where, "set --timeout: the 15 s default is shorter than a vendor's create")
        if c.image_name == "livenessprobe" and server is not None:
            endpoint = c.args.get("http-endpoint") or (":" + c.args["health-port"] if c.args.get("health-port") else ":9808")
            port = int(endpoint.rsplit(":", 1)[1])
            probe = ((server.c.spec.get("livenessProbe") or {}).get("httpGet")) or {}
            t.check(
                named_port(server.c.spec, probe.get("port")) == port and probe.get("path") == "/healthz",
                where,
                f"probes {addr} on port {port}, but container {server.c.name} has no livenessProbe httpGet /healthz on it",
            )
            probed.add(key)
    for key, o in served.items():
        t.check(key in probed, o.c.where(), f"serves CSI at {Location(*key)} with no livenessprobe sidecar on it")


def check_node(ours: list[tuple[Ours, dict[str, Location]]], sidecars: list[Container], t: Tally) -> None:
    nodes = [(o, locs) for o, locs in ours if (o.binary, o.sub) == ("snap-csi", "node")]
    t.check(len(nodes) == 1, "node plugin", f"expected one snap-csi node container, found {len(nodes)}")
    for o, locs in nodes:
        where = o.c.where()
        kubelet = o.settings.get("kubelet-dir") or ""
        driver = o.settings.get("driver-name") or ""
        loc = locate(o.c, kubelet)
        if t.check(loc is not None, where, f"--kubelet-dir={kubelet} is not mounted"):
            location, mount = loc
            t.check(
                mount["mountPath"].rstrip("/") == kubelet.rstrip("/") and location.volume == "host" and location.path == kubelet.rstrip("/"),
                where,
                f"kubelet passes host paths: --kubelet-dir={kubelet} must be the host's {kubelet} mounted at the same path, is {location}",
            )
            t.check(
                mount.get("mountPropagation") == "Bidirectional",
                where,
                f"{mount['mountPath']} needs mountPropagation: Bidirectional, so stage/publish mounts reach the host",
            )
        t.check(o.c.spec.get("securityContext", {}).get("privileged") is True, where, "the node must be privileged (mount, mkfs, sysfs)")
        sysfs = locs.get("sysfs-root")
        t.check(sysfs is not None and sysfs == Location("host", "/sys"), where, f"--sysfs-root must be the host's /sys, is {sysfs}")
        dev = locate(o.c, "/dev")
        t.check(
            dev is not None and dev[0] == Location("host", "/dev") and dev[1]["mountPath"] == "/dev",
            where,
            "the host's /dev must be mounted at /dev (device nodes of staged volumes)",
        )
        state = locs.get("state-dir")
        t.check(state is not None and state.volume == "host", where, f"--state-dir must be on the host so records outlive the pod, is {state}")
        endpoint = locs.get("endpoint")
        expected = posixpath.join(kubelet, "plugins", driver, posixpath.basename(o.settings.get("endpoint") or ""))
        t.check(
            endpoint is not None and endpoint == Location("host", expected),
            where,
            f"kubelet expects the socket of {driver} at {expected} on the host; --endpoint is {endpoint}",
        )
        regs = [c for c in sidecars if c.pod == o.c.pod and c.image_name == "csi-node-driver-registrar"]
        if t.check(len(regs) == 1, o.c.pod, "needs one node-driver-registrar"):
            r = regs[0]
            t.check(
                r.args.get("kubelet-registration-path") == expected,
                r.where(),
                f"--kubelet-registration-path must be {expected} (the node socket as kubelet sees it), "
                f"is {r.args.get('kubelet-registration-path')}",
            )
            reg = locate(r, "/registration")
            t.check(
                reg is not None and reg[0] == Location("host", posixpath.join(kubelet, "plugins_registry")),
                r.where(),
                f"/registration must be the host's {kubelet}/plugins_registry, is {reg[0] if reg else None}",
            )
            reg_port = (r.args.get("http-endpoint") or "").rsplit(":", 1)[-1]
            probe = ((r.spec.get("livenessProbe") or {}).get("httpGet")) or {}
            t.check(
                reg_port.isdigit() and named_port(r.spec, probe.get("port")) == int(reg_port),
                r.where(),
                "needs --http-endpoint and a livenessProbe on it, so a lost registration restarts it",
            )


def check_cross(ours: list[tuple[Ours, dict[str, Location]]], roots: dict[str, list[dict]], repo: Path, t: Tally) -> None:
    objs = [o for objs in roots.values() for o in objs]
    nodes = [(o, l) for o, l in ours if (o.binary, o.sub) == ("snap-csi", "node")]
    controllers = [(o, l) for o, l in ours if (o.binary, o.sub) == ("snap-csi", "controller")]
    plugins = [(o, l) for o, l in ours if o.binary == "snap-csi-spdk-plugin"]

    # One driver name everywhere.
    drivers = [o for o in objs if o.get("kind") == "CSIDriver"]
    if t.check(len(drivers) == 1, "CSIDriver", f"expected one, found {len(drivers)}"):
        name = drivers[0]["metadata"]["name"]
        spec = drivers[0]["spec"]
        t.check(spec.get("attachRequired") is False, "CSIDriver", "attachRequired must be false: no ControllerPublishVolume, no attacher")
        for o, _ in nodes + controllers:
            t.check(
                o.settings.get("driver-name") == name,
                o.c.where(),
                f"--driver-name must be the CSIDriver's {name}, is {o.settings.get('driver-name')} "
                "(unset means the vendor's or the host's choice)",
            )
        for o in objs:
            if o.get("kind") == "StorageClass":
                t.check(o.get("provisioner") == name, show(obj_key(o)), f"provisioner must be {name}")
            if o.get("kind") == "VolumeSnapshotClass":
                t.check(o.get("driver") == name, show(obj_key(o)), f"driver must be {name}")
    attachers = [c for c in objs if "csi-attacher" in json.dumps(c)]
    t.check(not attachers, "controller", "no csi-attacher: attachRequired is false")

    # The controller proxy reaches the vendor's socket.
    for o, locs in controllers:
        vendor = locs.get("vendor-endpoint")
        servers = [
            (p, pl)
            for p, pl in plugins
            if p.c.pod == o.c.pod and "csi-socket" in pl and vendor is not None and pl["csi-socket"] == vendor
        ]
        t.check(
            bool(servers),
            o.c.where(),
            f"--vendor-endpoint={o.settings.get('vendor-endpoint')} is {vendor}, where no vendor container of the pod "
            "serves its CSI controller",
        )

    # The node and the DPU plugin meet at the same sockets (co-located mode).
    dpu_plugins = [(p, pl) for p, pl in plugins if p.c.pod.startswith("DaemonSet ")]
    t.check(len(dpu_plugins) == 1, "dpu plugin", f"expected one plugin DaemonSet, found {len(dpu_plugins)}")
    for (n, nl), (p, pl) in [(a, b) for a in nodes for b in dpu_plugins]:
        t.check(
            nl.get("plugin-socket") is not None and nl.get("plugin-socket") == pl.get("plugin-socket"),
            n.c.where(),
            f"--plugin-socket is {nl.get('plugin-socket')}, the DPU plugin serves {pl.get('plugin-socket')}",
        )
        plugin_host = pl.get("plugin-socket")
        t.check(
            plugin_host is not None and plugin_host.volume == "host" and DPF_PLUGIN_SOCKET.match(plugin_host.path) is not None,
            p.c.where(),
            f"the plugin socket must follow DPF's plugins/<plugin-name>/dpu.sock, is {plugin_host}",
        )
        provider = p.settings.get("snap-provider") or DEFAULT_PROVIDER
        template = n.settings.get("snap-socket-template") or ""
        node_snap = template.replace("{provider}", provider)
        loc = locate(n.c, posixpath.dirname(node_snap))
        node_snap_loc = Location(loc[0].volume, posixpath.join(loc[0].path, posixpath.basename(node_snap))) if loc else None
        t.check(
            node_snap_loc is not None and node_snap_loc == pl.get("spdk-socket"),
            n.c.where(),
            f"for the plugin's provider {provider!r} the node reaches SNAP at {node_snap_loc}, "
            f"the plugin at {pl.get('spdk-socket')}: they must be one SNAP",
        )
        spdk = pl.get("spdk-socket")
        t.check(
            spdk is not None and spdk.volume == "host" and DPF_SNAP_SOCKET.match(spdk.path) is not None,
            p.c.where(),
            f"SNAP's socket must follow DPF's providers/<provider>/snap.sock (see the comment in dpu/daemonset.yaml), is {spdk}",
        )

    # StorageClasses: one per backend and emulation, values the binaries take.
    emulations = set(nodes[0][0].flags["emulation"].choices) if nodes and "emulation" in nodes[0][0].flags else set()
    backend_flag = next((p.flags.get("default-backend") for p, _ in plugins if "default-backend" in p.flags), None)
    backends = set(backend_flag.choices) if backend_flag else set()
    t.check(bool(emulations), "node --help", "--emulation lists no possible values")
    t.check(bool(backends), "snap-csi-spdk-plugin --help", "--default-backend lists no possible values")
    fs_types = node_fs_types(repo)
    seen = set()
    for o in objs:
        if o.get("kind") != "StorageClass":
            continue
        where = show(obj_key(o))
        params = o.get("parameters") or {}
        b, e = params.get("backend"), params.get("snap-csi.io/emulation")
        t.check(b in backends, where, f"backend {b} is not one the plugin knows {sorted(backends)}")
        t.check(e in emulations, where, f"snap-csi.io/emulation {e} is not one the node takes {sorted(emulations)}")
        fs = params.get("csi.storage.k8s.io/fstype")
        t.check(fs is None or fs in fs_types, where, f"fstype {fs} is not one the node formats {sorted(fs_types)}")
        t.check(o.get("allowVolumeExpansion") is True, where, "allowVolumeExpansion must be true (the node grows ext4 and xfs)")
        t.check(o.get("volumeBindingMode") == "WaitForFirstConsumer", where, "volumeBindingMode must be WaitForFirstConsumer")
        seen.add((b, e))
    missing = sorted({(b, e) for b in backends for e in emulations} - seen)
    t.check(not missing, "StorageClasses", f"no class for (backend, emulation) {missing}")
    t.check(
        any(o.get("kind") == "VolumeSnapshotClass" for o in objs),
        "VolumeSnapshotClass",
        "none defined",
    )
    t.check(not [o for o in objs if o.get("kind") == "Secret"], "manifests", "no Secret objects: no secrets in manifests")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--deploy", type=Path, help="the deploy/ directory to check (default: REPO/deploy)")
    ap.add_argument("--kubectl", help="kubectl for `kubectl kustomize`")
    ap.add_argument("--snap-csi", required=True, help="the snap-csi binary whose --help the manifests must agree with")
    ap.add_argument("--spdk-plugin", required=True, help="the snap-csi-spdk-plugin binary")
    ap.add_argument("--containerfile", type=Path, help="the SPDK Containerfile (default: REPO/hack/spdk/Containerfile)")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the tally")
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    deploy = (a.deploy or repo / "deploy").resolve()
    kube = deploy / "kubernetes"
    t = Tally()

    ks = read_kustomizations(kube, t)
    check_kustomize_tree(kube, ks, t)
    rendered = check_render(kube, ks, a.kubectl, t)
    roots: dict[str, list[dict]] = {}
    for r in ROOTS:
        d = (deploy / r).resolve()
        if d in ks:
            # What kustomize renders is what gets applied; where it could not
            # render (already a failure) check what the files hold.
            roots[r] = rendered[d] if d in rendered else plain_objects(d, ks)
    seen = set()
    unique = []
    for objs in roots.values():
        for o in objs:
            if obj_key(o) not in seen:
                seen.add(obj_key(o))
                unique.append(o)
    check_schemas(unique, deploy / "tools" / "schemas", t)

    helps = {
        ("snap-csi", "node"): run_help(a.snap_csi, "node"),
        ("snap-csi", "controller"): run_help(a.snap_csi, "controller"),
        ("snap-csi-spdk-plugin", None): run_help(a.spdk_plugin, None),
    }
    dockerfiles = check_dockerfiles(repo, deploy / "images", t)
    for binary, path in (("snap-csi", a.snap_csi), ("snap-csi-spdk-plugin", a.spdk_plugin)):
        t.check(
            binary in dockerfiles and Path(path).name == binary,
            f"{path}",
            f"the --help checked must come from the binary a Dockerfile ships ({binary})",
        )
    version = tomllib.loads((repo / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    check_pods(roots, dockerfiles, helps, version, repo, t)
    check_spdk_containerfile((a.containerfile or repo / "hack" / "spdk" / "Containerfile").resolve(), t)

    for f in t.failures:
        print(f"FAIL {f}")
    if not a.quiet:
        print(f"checked {len(unique)} objects in {len(ks)} kustomizations against Kubernetes {K8S_VERSION} and the binaries")
    print(f"deploy: {t.passed} passed, {len(t.failures)} failed")
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())
