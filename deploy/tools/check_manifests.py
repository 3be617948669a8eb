#!/usr/bin/env python3
"""Offline checks of deploy/: the kustomizations, the Kubernetes schemas, and
whether the manifests and the Dockerfiles agree with the binaries.

Run by deploy/check.sh (inside the venv hack/setup.sh makes). What it proves
and what it does not is listed in deploy/README.md. Each check is one line in
the tally; every failure is printed with what was expected.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import split
from checklib import SIG_STORAGE, YAML_LOADER, Container, Location, Tally, image_parts, locate, obj_key, pod_spec_of, show
from images import Dockerfile, check_dockerfiles, check_spdk_containerfile
from kustomize import check_kustomize_tree, check_render, plain_objects, read_kustomizations
from versions import NEWEST, OLDEST, check_base, check_floor, check_overlays, check_rows, check_run_table, check_schemas, minors, read_table


@dataclass(frozen=True)
class Deployment:
    """Two roots applied together: the host cluster's and the DPU cluster's
    (the same cluster unless NVIDIA DPF gives the DPUs their own)."""

    host: str
    dpu: str
    mode: str  # "colocated" or "split"


DEPLOYMENTS = (
    Deployment("kubernetes", "kubernetes/dpu", "colocated"),
    # Split mode's shared parts, as a site lists them, without pairs.
    Deployment("kubernetes/split/host", "kubernetes/split/dpu", "split"),
    # The example site: those parts and one pair made by new-pair.sh.
    Deployment("kubernetes/split/example/host", "kubernetes/split/example/dpu", "split"),
)
# Roots of no deployment, applied on their own where the cluster serves
# their API, by the Kubernetes version they need: the VolumeAttributesClasses
# are storage.k8s.io/v1 from 1.34 (deploy/README.md, "Kubernetes versions").
OPTIONAL_ROOTS = {"kubernetes/volumeattributesclasses": "1.34"}
# Every kustomization must be reachable from one of them.
ROOTS = tuple(r for d in DEPLOYMENTS for r in (d.host, d.dpu)) + tuple(OPTIONAL_ROOTS)

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

# Which of our binaries' settings are CSI sockets they serve.
CSI_SOCKETS = {
    ("snap-csi", "node"): ("endpoint",),
    ("snap-csi", "controller"): ("endpoint",),
    ("snap-csi-spdk-plugin", None): ("csi-socket",),
}
SUBCOMMANDS = {"snap-csi": ("node", "dpu-agent", "controller")}

# Settings of the node and the agent, whose defaults `--help` does not print
# (they layer defaults < file < env < flags, so clap knows none): a mode must
# set those it uses, so the mounts can be checked, and must not set those it
# ignores, which would only mislead a reader. The node is in split mode when
# it has a --dpu-endpoint.
NODE_PATHS = ("endpoint", "kubelet-dir", "state-dir", "sysfs-root")
LOCAL_ATTACH = ("plugin-socket", "snap-socket-template")
NODE_LINK = ("dpu-endpoint", "dpu-tls-cert", "dpu-tls-key", "dpu-tls-ca")
AGENT_SETTINGS = ("listen", "host-name", "tls-cert", "tls-key", "tls-ca") + LOCAL_ATTACH
# Plaintext links: for tests on one machine, never in a manifest.
INSECURE = ("insecure-plaintext", "dpu-insecure-plaintext")

# NVIDIA DPF socket conventions (shared/reference/snap4-rpc.md).
DPF_PLUGIN_SOCKET = re.compile(r"^/var/lib/nvidia/storage/snap/plugins/[^/]+/dpu\.sock$")
DPF_SNAP_SOCKET = re.compile(r"^/var/lib/nvidia/storage/snap/providers/[^/]+/snap\.sock$")
DEFAULT_PROVIDER = "nvidia"


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


def node_fs_types(repo: Path) -> set[str]:
    text = (repo / "src" / "node" / "format.rs").read_text()
    return set(re.findall(r'"([a-z0-9]+)" => Ok\(FsType::', text))


# ---------------------------------------------------------------- pods


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


def path_kind(flag: str) -> str | None:
    if flag in ("endpoint",) or flag.endswith("-socket"):
        return "socket"
    if flag.endswith("-template"):
        return "template"
    if flag.endswith("-dir") or flag.endswith("-root"):
        return "dir"
    if flag in ("vendor-endpoint", "dpu-endpoint", "listen"):
        return "url"  # a path only when unix://
    if flag == "config" or re.fullmatch(r"(dpu-)?tls-(cert|key|ca)", flag):
        return "file"
    return None


NODE = ("snap-csi", "node")
AGENT = ("snap-csi", "dpu-agent")


@dataclass
class Ours:
    c: Container
    binary: str
    sub: str | None
    flags: dict[str, Flag]
    settings: dict[str, str | None]  # effective values of every flag
    explicit: set[str]
    locs: dict[str, Location] = field(default_factory=dict)  # where each path setting really is

    @property
    def cmd(self) -> tuple[str, str | None]:
        return (self.binary, self.sub)


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


def mode_settings(o: Ours) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The mode a node or agent runs in, the settings it must set and those
    it must not (see NODE_PATHS)."""
    if o.cmd == NODE:
        if o.settings.get("dpu-endpoint") is not None:
            return "split", NODE_PATHS + NODE_LINK, LOCAL_ATTACH
        return "co-located", NODE_PATHS + LOCAL_ATTACH, NODE_LINK[1:]
    if o.cmd == AGENT:
        return "split", AGENT_SETTINGS, ()
    return "", (), ()


def check_mode_settings(o: Ours, t: Tally) -> None:
    where = o.c.where()
    mode, required, unused = mode_settings(o)
    for name in required:
        t.check(
            name in o.explicit,
            where,
            f"--{name} must be set: `{cmd_name(o.binary, o.sub)} --help` prints no default, so the manifest must say it",
        )
    for name in unused:
        t.check(name not in o.explicit, where, f"--{name} is unused in {mode} mode: remove it")
    for name in INSECURE:
        t.check(name not in o.explicit, where, f"--{name} turns off the link's authentication: never in a manifest")


def check_paths(o: Ours, t: Tally) -> dict[str, Location]:
    """Every path setting resolves into a mount of the container; returns
    where each one really is."""
    where = o.c.where()
    found: dict[str, Location] = {}
    for name, f in o.flags.items():
        kind = path_kind(name)
        value = o.settings.get(name)
        if kind is None or value is None:
            continue  # no path, or optional and off (or unset: check_mode_settings)
        if f.controller_only and o.settings.get("csi-socket") is None:
            continue  # the CSI controller is off in this container
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


def analyse_pods(
    objs: list[dict],
    dockerfiles: dict[str, Dockerfile],
    helps: dict[tuple[str, str | None], dict[str, Flag]],
    version: str,
    t: Tally,
) -> list[Ours]:
    """Checks every pod on its own (each once, whichever roots hold it) and
    returns the containers of ours, analysed."""
    ours: list[Ours] = []
    sidecars: list[Container] = []
    containers: list[Container] = []
    for obj in objs:
        spec = pod_spec_of(obj)
        if not spec:
            continue
        podname = show(obj_key(obj))
        for cs in (spec.get("initContainers") or []) + spec["containers"]:
            c = Container(podname, cs, spec)
            containers.append(c)
            repo_, c.image_name, c.tag = image_parts(cs.get("image", ""))
            where = c.where()
            t.check(bool(c.tag) and c.tag != "latest", where, f"image {cs.get('image')} must be pinned by a tag")
            req = (cs.get("resources") or {}).get("requests") or {}
            t.check("cpu" in req and "memory" in req, where, "resources.requests must set cpu and memory")
            for e in cs.get("env") or []:
                if re.search(r"(PASSWORD|SECRET|TOKEN|KEY)$", e["name"]) and "value" in e:
                    t.fail(where, f"env {e['name']} carries a literal value: no secrets in manifests")
            if c.image_name in dockerfiles:
                t.check(c.tag == version, where, f"our image must be tagged with the workspace version {version}, is {c.tag}")
                o = analyse_ours(c, dockerfiles[c.image_name], helps, t)
                if o:
                    check_mode_settings(o, t)
                    o.locs = check_paths(o, t)
                    check_fs_share_mount(o, t)
                    ours.append(o)
            elif c.image_name in SIDECARS:
                t.check(repo_ + "/" == SIG_STORAGE + c.image_name + "/", where, f"sidecars come from {SIG_STORAGE}")
                c.args, c.positional, _ = split_args([str(a) for a in cs.get("args") or []], None)
                env = container_env(cs)
                c.args = {k: (expand_vars(v, env, where, t) if v else v) for k, v in c.args.items()}
                sidecars.append(c)
            else:
                t.fail(where, f"image {cs.get('image')} is neither ours (deploy/images) nor a sig-storage sidecar")
    check_ports(containers, t)
    check_sockets(ours, sidecars, t)
    for o in ours:
        if o.cmd == NODE:
            check_node(o, sidecars, t)
    return ours


def arg_listeners(c: Container) -> list[int]:
    """TCP ports a container's args make it listen on: sidecars'
    --http-endpoint/--health-port, our --metrics-address and --listen."""
    ports = []
    for a in c.spec.get("args") or []:
        m = re.match(r"^--(http-endpoint|metrics-address|health-port|listen)=(?:.*:)?(\d+)$", str(a))
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


def served_csi_sockets(ours: list[Ours]) -> dict[tuple[str, str, str], Ours]:
    """By pod and location: pods of two modes serve the same host path, each
    on the hosts of its own mode."""
    served = {}
    for o in ours:
        for name in CSI_SOCKETS.get(o.cmd, ()):
            if name in o.locs:
                served[(o.c.pod, o.locs[name].volume, o.locs[name].path)] = o
    return served


def named_port(c: dict, port) -> int | None:
    if isinstance(port, int):
        return port
    for p in c.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return None


def check_sockets(ours: list[Ours], sidecars: list[Container], t: Tally) -> None:
    served = served_csi_sockets(ours)
    probed: set[tuple[str, str, str]] = set()
    for c in sidecars:
        where = c.where()
        addr = c.args.get("csi-address")
        if not t.check(bool(addr), where, "--csi-address must be set (the sidecars' default is /run/csi/socket)"):
            continue
        addr = addr.removeprefix("unix://")
        loc = locate(c, posixpath.dirname(addr))
        if not t.check(loc is not None, where, f"--csi-address={addr} is not inside any volumeMount"):
            continue
        key = (c.pod, loc[0].volume, posixpath.join(loc[0].path, posixpath.basename(addr)))
        server = served.get(key)
        t.check(
            server is not None,
            where,
            f"--csi-address={addr} is {Location(*key[1:])}, where no container of this pod serves CSI "
            f"(served: {[str(Location(*k[1:])) for k in served if k[0] == c.pod]})",
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
        t.check(key in probed, o.c.where(), f"serves CSI at {Location(*key[1:])} with no livenessprobe sidecar on it")


def check_node(o: Ours, sidecars: list[Container], t: Tally) -> None:
    """What kubelet needs of a node plugin, in either mode."""
    where = o.c.where()
    locs = o.locs
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


def check_meets_plugin(u: Ours, p: Ours, t: Tally) -> None:
    """Whatever does the DPU attach (a co-located node, or an agent) and the
    vendor plugin beside SNAP reach the same plugin socket and the same SNAP."""
    ul, pl = u.locs, p.locs
    t.check(
        ul.get("plugin-socket") is not None and ul.get("plugin-socket") == pl.get("plugin-socket"),
        u.c.where(),
        f"--plugin-socket is {ul.get('plugin-socket')}, the DPU plugin serves {pl.get('plugin-socket')}",
    )
    plugin_host = pl.get("plugin-socket")
    t.check(
        plugin_host is not None and plugin_host.volume == "host" and DPF_PLUGIN_SOCKET.match(plugin_host.path) is not None,
        p.c.where(),
        f"the plugin socket must follow DPF's plugins/<plugin-name>/dpu.sock, is {plugin_host}",
    )
    provider = p.settings.get("snap-provider") or DEFAULT_PROVIDER
    template = u.settings.get("snap-socket-template") or ""
    snap = template.replace("{provider}", provider)
    loc = locate(u.c, posixpath.dirname(snap))
    snap_loc = Location(loc[0].volume, posixpath.join(loc[0].path, posixpath.basename(snap))) if loc else None
    t.check(
        snap_loc is not None and snap_loc == pl.get("spdk-socket"),
        u.c.where(),
        f"for the plugin's provider {provider!r} it reaches SNAP at {snap_loc}, "
        f"the plugin at {pl.get('spdk-socket')}: they must be one SNAP",
    )
    spdk = pl.get("spdk-socket")
    t.check(
        spdk is not None and spdk.volume == "host" and DPF_SNAP_SOCKET.match(spdk.path) is not None,
        p.c.where(),
        f"SNAP's socket must follow DPF's providers/<provider>/snap.sock (see the comment in dpu/daemonset.yaml), is {spdk}",
    )


def check_host_cluster(
    root: str, objs: list[dict], ours: list[Ours], helps: dict[tuple[str, str | None], dict[str, Flag]], repo: Path, t: Tally
) -> None:
    """One driver name, the controller proxy on its vendor, and the classes
    in a host cluster's root."""
    controllers = [o for o in ours if o.cmd == ("snap-csi", "controller")]
    drivers = [o for o in objs if o.get("kind") == "CSIDriver"]
    if t.check(len(drivers) == 1, f"{root}: CSIDriver", f"expected one, found {len(drivers)}"):
        name = drivers[0]["metadata"]["name"]
        spec = drivers[0]["spec"]
        t.check(spec.get("attachRequired") is False, "CSIDriver", "attachRequired must be false: no ControllerPublishVolume, no attacher")
        for o in [o for o in ours if o.cmd == NODE] + controllers:
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
    plugins = [o for o in ours if o.binary == "snap-csi-spdk-plugin"]
    for o in controllers:
        vendor = o.locs.get("vendor-endpoint")
        servers = [p for p in plugins if p.c.pod == o.c.pod and "csi-socket" in p.locs and vendor is not None and p.locs["csi-socket"] == vendor]
        t.check(
            bool(servers),
            o.c.where(),
            f"--vendor-endpoint={o.settings.get('vendor-endpoint')} is {vendor}, where no vendor container of the pod "
            "serves its CSI controller",
        )

    # StorageClasses: one per backend and emulation, values the binaries take.
    emulation = helps[NODE].get("emulation")
    placement = helps[NODE].get("placement")
    backend = helps[("snap-csi-spdk-plugin", None)].get("default-backend")
    emulations = set(emulation.choices) if emulation else set()
    placements = set(placement.choices) if placement else set()
    backends = set(backend.choices) if backend else set()
    t.check(bool(emulations), "node --help", "--emulation lists no possible values")
    t.check(bool(backends), "snap-csi-spdk-plugin --help", "--default-backend lists no possible values")
    # The fs backend's volumes need a share the controller is given
    # (--fs-share): a root whose controller has none can name no class for it
    # (and fails check_vendor_offer: the README offers them).
    if not any(p.settings.get("fs-share") and p.settings.get("csi-socket") for p in plugins):
        backends -= {"fs"}
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
        p = params.get("snap-csi.io/placement")
        t.check(p is None or p in placements, where, f"snap-csi.io/placement {p} is not one the node takes {sorted(placements)}")
        t.check(p != "packed" or e == "nvme", where, "snap-csi.io/placement packed needs snap-csi.io/emulation nvme")
        fs = params.get("csi.storage.k8s.io/fstype")
        fs_ok = fs in fs_types or (e == "virtio-fs" and fs == "virtiofs")
        t.check(fs is None or fs_ok, where, f"fstype {fs} is not one the node formats {sorted(fs_types)}")
        t.check(o.get("allowVolumeExpansion") is True, where, "allowVolumeExpansion must be true (the node grows ext4 and xfs)")
        t.check(o.get("volumeBindingMode") == "WaitForFirstConsumer", where, "volumeBindingMode must be WaitForFirstConsumer")
        seen.add((b, e))
    # A filesystem emulation (virtio-fs) takes a filesystem backend's fsdevs,
    # the block emulations the other backends' bdevs.
    fs_emulations, fs_backends = {"virtio-fs"}, {"fs"}
    wanted = {(b, e) for b in backends - fs_backends for e in emulations - fs_emulations}
    wanted |= {(b, e) for b in backends & fs_backends for e in emulations & fs_emulations}
    for b, e in seen:
        t.check((e in fs_emulations) == (b in fs_backends), f"StorageClass ({b}, {e})",
                "a filesystem emulation needs a filesystem backend, a block one a block backend")
    missing = sorted(wanted - seen)
    t.check(not missing, f"{root}: StorageClasses", f"no class for (backend, emulation) {missing}")
    t.check(any(o.get("kind") == "VolumeSnapshotClass" for o in objs), f"{root}: VolumeSnapshotClass", "none defined")
    check_vendor_offer(root, objs, plugins, repo, t)



# ---------------------------------------------------------------- the sample vendor's offer


def rust_const(path: Path, name: str) -> str | None:
    m = re.search(rf'\bconst {name}: &str = "([^"]*)";', path.read_text())
    return m.group(1) if m else None


def plugin_parameters(repo: Path) -> tuple[set[str], set[str], str]:
    """The StorageClass parameters the sample plugin's CreateVolume takes
    (vendor-plugins/spdk/src/csi/params.rs: anything else is
    INVALID_ARGUMENT), read from the constants it names them by: the keys,
    the QoS keys, and the CO's prefix."""
    params = repo / "vendor-plugins/spdk/src/csi/params.rs"
    keys = {
        rust_const(params, "BACKEND_PARAM"),
        rust_const(params, "MULTIPATH_PARAM"),
        rust_const(repo / "src/node/context.rs", "EMULATION_KEY"),
        rust_const(repo / "src/node/context.rs", "PLACEMENT_KEY"),
        rust_const(repo / "src/dpu/crypto.rs", "ENCRYPTION"),
    }
    qos = set(re.findall(r'pub const \w+_KEY: &str = "([^"]+)";', (repo / "vendor-plugins/spdk/src/qos.rs").read_text()))
    return {k for k in keys if k}, qos, rust_const(params, "CO_PREFIX") or "csi.storage.k8s.io/"


def nvmf_listeners(o: Ours) -> list[str]:
    """--nvmf-listen's ADDR:PORTs (the flag's list form, comma-separated)."""
    return [x.strip() for x in (o.settings.get("nvmf-listen") or "").split(",") if x.strip()]


def check_vendor_offer(root: str, objs: list[dict], plugins: list[Ours], repo: Path, t: Tally) -> None:
    """What deploy/README.md offers of the sample vendor, in a host
    cluster's root: filesystem volumes (a controller with a share, and a
    class for them), multipath NVMe-oF (two listeners, and a class), and
    classes whose parameters the plugin takes."""
    controllers = [p for p in plugins if p.settings.get("csi-socket")]
    keys, qos, co_prefix = plugin_parameters(repo)
    t.check(len(keys) == 5 and bool(qos), "vendor-plugins/spdk", f"could not read the plugin's parameter names: {sorted(keys)}, {sorted(qos)}")
    classes = [o for o in objs if o.get("kind") == "StorageClass"]
    for o in classes:
        where = show(obj_key(o))
        params = o.get("parameters") or {}
        unknown = sorted(k for k in params if k not in keys | qos and not k.startswith(co_prefix))
        t.check(not unknown, where, f"parameters {unknown} are not ones the sample plugin takes (vendor-plugins/spdk/src/csi/params.rs)")
        mp = params.get("nvmf-multipath")
        t.check(mp in (None, "true", "false"), where, f'nvmf-multipath is "true" or "false", is {mp!r}')
        t.check(mp != "true" or params.get("backend") == "nvmf", where, "nvmf-multipath is for backend nvmf only")
        if params.get("backend") == "fs":
            t.check(not [k for k in params if k in qos or k in ("snap-csi.io/placement", "snap-csi.io/encryption")], where,
                    "QoS, placement and encryption are block-device options the plugin refuses for backend fs")
    # Filesystem volumes: a controller that makes them, and a class.
    with_share = [p for p in controllers if p.settings.get("fs-share")]
    t.check(bool(with_share), f"{root}: vendor controller",
            "no controller with --fs-share: the filesystem volumes deploy/README.md offers (backend fs) cannot be made")
    fs_classes = [o for o in classes if (o.get("parameters") or {}).get("backend") == "fs"]
    t.check(bool(fs_classes), f"{root}: StorageClasses", "no class with backend: fs (virtio-fs, ReadWriteMany)")
    for o in fs_classes:
        t.check((o.get("parameters") or {}).get("snap-csi.io/emulation") == "virtio-fs", show(obj_key(o)),
                "a backend fs class needs snap-csi.io/emulation: virtio-fs")
    # Multipath NVMe-oF: two listeners, and a class asking for both.
    for p in controllers:
        if p.settings.get("nvmf-target-socket") is None:
            continue
        listeners = nvmf_listeners(p)
        t.check(len(set(listeners)) >= 2, p.c.where(),
                f"--nvmf-listen gives {listeners}: a multipath volume needs the target's two listeners (two ADDR:PORT)")
    if any(p.settings.get("nvmf-target-socket") for p in controllers):
        t.check(any((o.get("parameters") or {}).get("nvmf-multipath") == "true" for o in classes), f"{root}: StorageClasses",
                'no class with nvmf-multipath: "true" for the target\'s two listeners')


def check_fs_share_mount(o: Ours, t: Tally) -> None:
    """A controller making fs volumes loop-mounts their images in its share:
    privileged (losetup, mount, chattr, fsfreeze), the share the host's at
    the same path (the volume context names it as SNAP sees it) with
    Bidirectional propagation (the mounts reach SNAP and the NFS server), and
    the host's /dev (loop devices made after the container started)."""
    share = o.settings.get("fs-share")
    if not share or not o.settings.get("csi-socket"):
        return
    where = o.c.where()
    t.check((o.c.spec.get("securityContext") or {}).get("privileged") is True, where,
            "makes filesystem volumes (--fs-share: losetup, mount, chattr, fsfreeze): must be privileged")
    loc = locate(o.c, share)
    if t.check(loc is not None, where, f"--fs-share={share} is not inside any volumeMount"):
        location, mount = loc
        t.check(location == Location("host", share) and mount["mountPath"].rstrip("/") == share.rstrip("/"), where,
                f"--fs-share={share} must be the host's {share} mounted at that path (SNAP opens it there), is {location}")
        t.check(mount.get("mountPropagation") == "Bidirectional", where,
                f"the share {mount['mountPath']} needs mountPropagation: Bidirectional, so the volumes' loop mounts reach SNAP")
    dev = locate(o.c, "/dev")
    t.check(dev is not None and dev[0] == Location("host", "/dev") and dev[1]["mountPath"] == "/dev", where,
            "the host's /dev must be mounted at /dev (the loop devices of fs volumes)")


# ---------------------------------------------------------------- users

ROOT_REASON = re.compile(r"#\s*root:\s*\S.{9,}")


def source_docs(deploy: Path) -> dict[tuple[str, str, str], str]:
    """The text of every manifest document under kubernetes/, by kind,
    namespace and name: the comments the rendered objects lose."""
    docs: dict[tuple[str, str, str], str] = {}
    for path in sorted((deploy / "kubernetes").rglob("*.yaml")):
        for text in re.split(r"(?m)^---\s*$", path.read_text()):
            try:
                obj = yaml.load(text, Loader=YAML_LOADER)
            except yaml.YAMLError:
                continue
            if isinstance(obj, dict) and obj.get("kind"):
                meta = obj.get("metadata") or {}
                docs[(obj["kind"], meta.get("namespace", ""), meta.get("name", ""))] = text
    return docs


def yaml_block(lines: list[str], start: int) -> list[str]:
    """Line `start` and those below it indented deeper (blank lines too)."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return block


def root_reasons(text: str, container: str) -> tuple[bool, bool]:
    """Whether the container's own block, and the pod's securityContext,
    hold a `# root: <reason>` comment."""
    lines = text.splitlines()
    own = pod = False
    for i, line in enumerate(lines):
        if re.fullmatch(rf"\s*- name: {re.escape(container)}\s*", line):
            own = own or any(ROOT_REASON.search(x) for x in yaml_block(lines, i))
    for i, line in enumerate(lines):
        if line.strip() == "containers:":
            indent = line[: len(line) - len(line.lstrip())]
            for j, other in enumerate(lines):
                if other == f"{indent}securityContext:":
                    pod = pod or any(ROOT_REASON.search(x) for x in yaml_block(lines, j))
    return own, pod


def check_users(deploy: Path, objs: list[dict], t: Tally) -> None:
    """Every container runs as a user other than root, or says why not: a
    `# root: <reason>` comment in its securityContext or the pod's (deploy/
    README.md, "Users"). A privileged container says it in its own. Every
    other container keeps no capability, cannot gain privileges and has a
    read-only root filesystem."""
    docs = source_docs(deploy)
    for obj in objs:
        spec = pod_spec_of(obj)
        if not spec:
            continue
        meta = obj.get("metadata") or {}
        text = docs.get((obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")))
        pod = show(obj_key(obj))
        if not t.check(text is not None, pod, "no manifest under kubernetes/ holds it, so its comments cannot be read"):
            continue
        psc = spec.get("securityContext") or {}
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            where = f"{pod} container {c['name']}"
            sc = c.get("securityContext") or {}
            user = sc.get("runAsUser", psc.get("runAsUser"))
            non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            own, in_pod = root_reasons(text, c["name"])
            if sc.get("privileged"):
                t.check(own, where, "is privileged: say why beside its securityContext (`# root: <reason>`)")
            elif non_root is True and user != 0:
                t.check(user is not None, where, "runAsNonRoot needs a numeric runAsUser: our images name no user")
            else:
                t.check(own or in_pod, where,
                        f"runs as root ({'runAsUser: 0' if user == 0 else 'the image default user'}): set runAsNonRoot "
                        "and a runAsUser, or say why beside its securityContext or the pod's (`# root: <reason>`)")
            if not sc.get("privileged"):
                caps = sc.get("capabilities") or {}
                t.check(caps.get("drop") == ["ALL"] and not caps.get("add"), where, 'capabilities must drop ["ALL"] and add none')
                t.check(sc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation must be false")
                t.check(sc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem must be true")


def check_attribute_classes(root: str, objs: list[dict], deployed: list[dict], t: Tally) -> None:
    """A VolumeAttributesClass is for our driver: the resizer sends
    ControllerModifyVolume only for classes naming it."""
    drivers = {o["metadata"]["name"] for o in deployed if o.get("kind") == "CSIDriver"}
    classes = [o for o in objs if o.get("kind") == "VolumeAttributesClass"]
    t.check(bool(classes), root, "holds no VolumeAttributesClass")
    for o in classes:
        t.check(
            o.get("driverName") in drivers,
            show(obj_key(o)),
            f"driverName must be the CSIDriver's {sorted(drivers)}, is {o.get('driverName')}",
        )


def check_deployment(
    d: Deployment, roots: dict[str, list[dict]], ours: list[Ours], helps: dict[tuple[str, str | None], dict[str, Flag]], repo: Path, t: Tally
) -> int:
    """One deployment as a whole, by its mode; returns its host/DPU pairs."""
    host_objs, dpu_objs = roots.get(d.host, []), roots.get(d.dpu, [])
    host_pods, dpu_pods = split.pods_in(host_objs), split.pods_in(dpu_objs)
    host_ours = [o for o in ours if o.c.pod in host_pods]
    dpu_ours = [o for o in ours if o.c.pod in dpu_pods]
    check_host_cluster(d.host, host_objs, host_ours, helps, repo, t)
    nodes = [o for o in host_ours if o.cmd == NODE]
    agents = [o for o in dpu_ours if o.cmd == AGENT]
    for o in dpu_ours:
        t.check(o.cmd != NODE, o.c.where(), f"the node plugin belongs to the host cluster's root, not {d.dpu}")
    plugins = [o for o in dpu_ours if o.binary == "snap-csi-spdk-plugin" and o.c.pod.startswith("DaemonSet ")]
    t.check(len(plugins) == 1, f"{d.dpu}: dpu plugin", f"expected one plugin DaemonSet, found {len(plugins)}")
    # The DPU plugins serve the controller's fs volumes: their directories,
    # named in the volume context, must lie in the plugin's share.
    shares = {o.settings.get("fs-share") for o in host_ours if o.binary == "snap-csi-spdk-plugin" and o.settings.get("csi-socket")}
    shares.discard(None)
    for p in plugins:
        t.check(
            p.settings.get("fs-share") in shares,
            p.c.where(),
            f"--fs-share is {p.settings.get('fs-share')}, the controller's {sorted(shares)}: the DPU plugin makes the "
            "filesystem devices of the controller's volumes, which lie in that share",
        )
    pairs = 0
    if d.mode == "colocated":
        split.no_cert_manager(d.host, host_objs, t)
        split.no_cert_manager(d.dpu, dpu_objs, t)
        t.check(len(nodes) == 1, f"{d.host}: node plugin", f"expected one snap-csi node container, found {len(nodes)}")
        t.check(not agents, d.dpu, f"co-located mode runs no DPU agent, found {[a.c.pod for a in agents]}")
        for n in nodes:
            t.check(mode_settings(n)[0] == "co-located", n.c.where(), f"is in split mode in the co-located root {d.host}")
        attachers = nodes
    else:
        for n in nodes:
            t.check(mode_settings(n)[0] == "split", n.c.where(), f"is co-located in the split-mode root {d.host}: give it --dpu-endpoint")
        pairs = split.check_split(d.host, host_objs, host_ours, d.dpu, dpu_objs, dpu_ours, t)
        attachers = agents
    for u in attachers:
        for p in plugins:
            check_meets_plugin(u, p, t)
    return pairs


def check_node_twins(ours: list[Ours], t: Tally) -> None:
    """A split-mode node DaemonSet is the co-located one with another DPU
    attach (templates/host/daemonset.yaml.in began as a copy): the sidecars
    and the volumes both have must stay the same."""
    nodes = [o for o in ours if o.cmd == NODE]
    colocated = [o for o in nodes if mode_settings(o)[0] == "co-located"]
    if not colocated:
        return
    ref = colocated[0]
    ref_sidecars = {c["name"]: c for c in ref.c.pod_spec["containers"] if c["name"] != ref.c.name}
    ref_volumes = {v["name"]: v for v in ref.c.pod_spec.get("volumes") or []}
    for o in nodes:
        if mode_settings(o)[0] != "split":
            continue
        sidecars = {c["name"]: c for c in o.c.pod_spec["containers"] if c["name"] != o.c.name}
        differ = sorted(n for n in sidecars.keys() | ref_sidecars.keys() if sidecars.get(n) != ref_sidecars.get(n))
        t.check(not differ, o.c.pod, f"sidecars {differ} differ from the co-located node's ({ref.c.pod}); keep the two in step")
        volumes = {v["name"]: v for v in o.c.pod_spec.get("volumes") or []}
        differ = sorted(n for n in volumes.keys() & ref_volumes.keys() if volumes[n] != ref_volumes[n])
        t.check(not differ, o.c.pod, f"volumes {differ} differ from the co-located node's ({ref.c.pod}); keep the two in step")


def check_shared_objects(roots: dict[str, list[dict]], t: Tally) -> list[dict]:
    """An object in several roots (the namespace, the CA Issuer, what split
    mode reuses) must be the same in each: a cluster that applies two of
    them would flip between versions. Returns each object once."""
    first: dict[tuple[str, str, str, str], tuple[str, dict]] = {}
    for root, objs in roots.items():
        for o in objs:
            seen = first.setdefault(obj_key(o), (root, o))
            t.check(
                seen[1] == o,
                f"{show(obj_key(o))}",
                f"differs between {seen[0]} and {root}: a cluster applying both would flip between them",
            )
    return [o for _, o in first.values()]


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
    t = Tally()

    ks = read_kustomizations(deploy, t)
    # The overlays for older Kubernetes are roots nothing lists.
    overlays = tuple(d.relative_to(deploy).as_posix() for d, k in ks.items() if k.components)
    check_kustomize_tree(deploy, ks, ROOTS + overlays, t)
    rendered = check_render(deploy, ks, a.kubectl, t)
    roots: dict[str, list[dict]] = {}
    for r in ROOTS:
        d = (deploy / r).resolve()
        if d in ks:
            # What kustomize renders is what gets applied; where it could not
            # render (already a failure) check what the files hold.
            roots[r] = rendered[d] if d in rendered else plain_objects(d, ks)
    optional = {r: roots.pop(r, []) for r in OPTIONAL_ROOTS}
    unique = check_shared_objects(roots, t)
    # The deployments are for every supported version; the older ones run
    # them through an overlay that changes only sidecar releases and flags.
    schema_dir = deploy / "tools" / "schemas"
    check_schemas(unique, minors(OLDEST, NEWEST), schema_dir, t)
    for r, low in OPTIONAL_ROOTS.items():
        check_schemas(optional[r], minors(low, NEWEST), schema_dir, t)
        check_floor(r, optional[r], low, t)
        check_attribute_classes(r, optional[r], unique, t)
    rows = read_table(deploy / "README.md", t)
    base = check_rows(rows, t)
    check_run_table(deploy / "README.md", rows, t)
    if base:
        check_base(base, unique, t)
        check_overlays(deploy, rows, ks, rendered, roots, a.kubectl, schema_dir, t)

    helps = {
        NODE: run_help(a.snap_csi, "node"),
        AGENT: run_help(a.snap_csi, "dpu-agent"),
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
    ours = analyse_pods(unique, dockerfiles, helps, version, t)
    check_node_twins(ours, t)
    check_users(deploy, unique, t)
    pairs = sum(check_deployment(d, roots, ours, helps, repo, t) for d in DEPLOYMENTS)
    t.check(pairs >= 1, "split mode", "no deployment holds a host/DPU pair, so the pair checks checked nothing")
    generated = split.check_generated(deploy, t)
    t.check(generated >= 1, "split mode", "no pair made by new-pair.sh is committed, so its templates go unchecked")
    t.check(not [o for o in unique if o.get("kind") == "Secret"], "manifests", "no Secret objects: no secrets in manifests")
    check_spdk_containerfile((a.containerfile or repo / "hack" / "spdk" / "Containerfile").resolve(), t)

    for f in t.failures:
        print(f"FAIL {f}")
    if not a.quiet:
        print(
            f"checked {len(unique)} objects in {len(ks)} kustomizations ({len(DEPLOYMENTS)} deployments, {pairs} host/DPU "
            f"pairs) against Kubernetes {OLDEST} to {NEWEST} and the binaries"
        )
    print(f"deploy: {t.passed} passed, {len(t.failures)} failed")
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())
