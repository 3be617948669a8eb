#!/usr/bin/env python3
"""The `podman run` flags that give one of our containers what its manifest
gives it on a cluster: privileges, capabilities, user, root filesystem,
network and host mounts with their propagation. hack/local-up.sh --containers
runs each process from its image with these flags, so that the stack on one
machine and the manifests cannot drift apart: a privilege, a /dev or /sys
mount, a propagation or the host network exists there because the manifest
says so, never because local-up says so again.

Usage: podman_spec.py COMPONENT [--mode colocated|split] [--deploy DIR]
         [--kubectl KUBECTL] [--map KEY=LOCALDIR]... [--host-network NET]
         [--pod-network NET] [--require-mapped] [--pass PATH]... [--volumes]

COMPONENT, and the container it is (kustomize renders the root first):

  node        co-located: DaemonSet snap-csi-node, container snap-csi-node
              (root kubernetes); --mode split: the example site's node
              DaemonSet snap-csi-node-*, container snap-csi-node (root
              kubernetes/split/example/host)
  controller  Deployment snap-csi-controller, container snap-csi-controller
              (root kubernetes)
  plugin      DaemonSet snap-csi-spdk-plugin, container spdk-plugin (root
              kubernetes/dpu)
  vendor      Deployment snap-csi-controller, container
              spdk-plugin-controller (root kubernetes): the sample plugin as
              the CSI controller, privileged, its filesystem share mounted
              Bidirectional
  agent       the example site's DaemonSet snap-csi-dpu-agent-*, container
              dpu-agent (root kubernetes/split/example/dpu)

Prints one flag per line (bash: mapfile -t):

  --privileged                      securityContext.privileged
  --cap-drop ALL / --cap-add CAP    securityContext.capabilities
  --security-opt no-new-privileges  allowPrivilegeEscalation: false
  --read-only --read-only-tmpfs=false
                                    readOnlyRootFilesystem (no tmpfs over
                                    /tmp or /run: a kubelet adds none)
  --user UID[:GID]                  runAsUser/runAsGroup (the container's,
                                    else the pod's); runAsNonRoot with a
                                    runAsUser of 0 or none is refused, as
                                    kubelet refuses to start it (our images
                                    name no user: theirs is root)
  --group-add GID                   the pod's fsGroup and supplementalGroups
                                    (kubelet adds both to every container's
                                    groups; a Kubernetes volume's fsGroup
                                    ownership has no podman counterpart: a
                                    mapped directory keeps its owner)
  --network NET                     hostNetwork: the host's network (NET is
                                    --host-network, default host); without
                                    it the pod network (--pod-network; none
                                    given: no flag, podman's default)
  --mount type=bind,...             each hostPath volume the container
                                    mounts: src the host path, dst its
                                    mountPath, ro for readOnly,
                                    bind-propagation rshared for
                                    Bidirectional, rslave for
                                    HostToContainer, rprivate otherwise
                                    (as the CRI runtimes mount them: a
                                    plain "private" would let a shared
                                    mount inside, such as the kubelet
                                    directory, propagate back out)

--map KEY=LOCALDIR puts LOCALDIR in place of a volume: KEY a hostPath's path
(as the manifest writes it) or the name of a volume without a host path
(emptyDir, Secret, projected, ...). A mapped volume is bound at LOCALDIR's
own path, not at its mountPath, so the process keeps the paths local-up
gives it (a run directory under /tmp), with the manifest's propagation and
readOnly. Volumes mapped to one directory with the same options are one
mount; with different options the tool refuses. A volume without a host
path that is not mapped is an error (the process would lack it).
--require-mapped makes an unmapped hostPath an error too, unless a --pass
PATH names it: a stack on one machine binds the host's own /dev and /sys,
never its real /var/lib/kubelet.

--volumes prints, instead of flags, the volumes the container mounts that
have no host path, one a line: NAME KIND MOUNTPATH ro|rw (KIND emptyDir,
secret, projected, configMap, ...), for local-up to map to its own
directories.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kustomize import render  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    root: str  # the kustomization, below deploy/
    kind: str
    name: str  # fnmatch pattern: a split site has one workload per pair
    container: str


TARGETS = {
    ("node", "colocated"): Target("kubernetes", "DaemonSet", "snap-csi-node", "snap-csi-node"),
    ("node", "split"): Target("kubernetes/split/example/host", "DaemonSet", "snap-csi-node-*", "snap-csi-node"),
    ("controller", None): Target("kubernetes", "Deployment", "snap-csi-controller", "snap-csi-controller"),
    ("plugin", None): Target("kubernetes/dpu", "DaemonSet", "snap-csi-spdk-plugin", "spdk-plugin"),
    ("vendor", None): Target("kubernetes", "Deployment", "snap-csi-controller", "spdk-plugin-controller"),
    ("agent", None): Target("kubernetes/split/example/dpu", "DaemonSet", "snap-csi-dpu-agent-*", "dpu-agent"),
}
COMPONENTS = sorted({c for c, _ in TARGETS})

PROPAGATION = {None: "rprivate", "None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}


class SpecError(Exception):
    pass


def target_of(component: str, mode: str) -> Target:
    t = TARGETS.get((component, mode)) or TARGETS.get((component, None))
    if t is None:
        raise SpecError(f"no component {component!r} (one of {', '.join(COMPONENTS)})")
    return t


def find_container(objs: list[dict], t: Target) -> tuple[dict, dict]:
    """The pod spec and the container `t` names, from what the root renders.
    A split site has one workload per pair, all made by new-pair.sh from one
    template: the first by name stands for them."""
    found = []
    for o in objs:
        name = (o.get("metadata") or {}).get("name", "")
        if o.get("kind") != t.kind or not fnmatch.fnmatchcase(name, t.name):
            continue
        pod = ((o.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in pod.get("containers") or []:
            if c.get("name") == t.container:
                found.append((name, pod, c))
    if not found:
        raise SpecError(f"{t.root} renders no {t.kind} {t.name} with a container {t.container}")
    _, pod, c = sorted(found, key=lambda f: f[0])[0]
    return pod, c


def volume_kind(v: dict) -> str:
    kinds = [k for k in v if k != "name"]
    return kinds[0] if kinds else "emptyDir"


def norm(path: str) -> str:
    """A host path as a key: kubelet ignores a trailing slash."""
    return path.rstrip("/") or "/"


@dataclass
class Mount:
    src: str
    dst: str
    ro: bool
    propagation: str

    def flag(self) -> str:
        opts = [f"type=bind,src={self.src},dst={self.dst}"]
        if self.ro:
            opts.append("ro")
        opts.append(f"bind-propagation={self.propagation}")
        return ",".join(opts)


def flags_for(
    pod: dict,
    c: dict,
    maps: dict[str, str],
    host_network: str = "host",
    pod_network: str | None = None,
    passed: set[str] | None = None,
) -> list[str]:
    """`passed`: unless None, the only host paths that may be bound
    unmapped."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    sc = c.get("securityContext") or {}
    if sc.get("privileged"):
        out.append("--privileged")
    caps = sc.get("capabilities") or {}
    for cap in caps.get("drop") or []:
        out += ["--cap-drop", cap]
    for cap in caps.get("add") or []:
        out += ["--cap-add", cap]
    if sc.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        out += ["--read-only", "--read-only-tmpfs=false"]
    user = sc.get("runAsUser", psc.get("runAsUser"))
    group = sc.get("runAsGroup", psc.get("runAsGroup"))
    if user is not None:
        out += ["--user", f"{user}:{group}" if group is not None else str(user)]
    elif group is not None:
        raise SpecError("runAsGroup without runAsUser: podman's --user needs a user")
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) and user in (None, 0):
        raise SpecError(
            "runAsNonRoot with " + ("runAsUser: 0" if user == 0 else "no runAsUser (our images' user is root)")
            + ": kubelet would refuse to start the container"
        )
    groups = ([psc["fsGroup"]] if psc.get("fsGroup") is not None else []) + list(psc.get("supplementalGroups") or [])
    for gid in dict.fromkeys(groups):
        out += ["--group-add", str(gid)]
    if pod.get("hostNetwork"):
        out += ["--network", host_network]
    elif pod_network:
        out += ["--network", pod_network]
    if pod.get("hostPID"):
        out += ["--pid", "host"]
    if pod.get("hostIPC"):
        out += ["--ipc", "host"]

    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    mounts: dict[str, Mount] = {}
    for vm in c.get("volumeMounts") or []:
        v = volumes.get(vm["name"])
        if v is None:
            raise SpecError(f"volumeMount {vm['name']} names no volume of the pod")
        if vm.get("subPath") or vm.get("subPathExpr"):
            raise SpecError(f"volumeMount {vm['name']} has a subPath, which this tool does not map")
        ro = bool(vm.get("readOnly"))
        propagation = PROPAGATION.get(vm.get("mountPropagation"))
        if propagation is None:
            raise SpecError(f"volumeMount {vm['name']}: unknown mountPropagation {vm.get('mountPropagation')!r}")
        if "hostPath" in v:
            host = norm(v["hostPath"]["path"])
            local = maps.get(host)
            if local is None and passed is not None and host not in passed:
                raise SpecError(
                    f"volume {v['name']} is host path {host} (at {vm['mountPath']}): "
                    f"give it a directory with --map {host}=LOCALDIR, or --pass {host}"
                )
            m = Mount(local, local, ro, propagation) if local else Mount(host, vm["mountPath"], ro, propagation)
        else:
            local = maps.get(v["name"])
            if local is None:
                raise SpecError(
                    f"volume {v['name']} ({volume_kind(v)}, at {vm['mountPath']}) has no host path: "
                    f"give it a directory with --map {v['name']}=LOCALDIR"
                )
            m = Mount(local, local, ro, propagation)
        seen = mounts.get(m.dst)
        if seen is not None and seen != m:
            raise SpecError(f"two volumes mount at {m.dst} differently: {seen.flag()} and {m.flag()}")
        mounts[m.dst] = m
    # Parents before what is mounted inside them.
    for m in sorted(mounts.values(), key=lambda m: (m.dst.rstrip("/").count("/"), m.dst)):
        out += ["--mount", m.flag()]
    return out


def unhosted_volumes(pod: dict, c: dict) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    lines = []
    for vm in c.get("volumeMounts") or []:
        v = volumes.get(vm["name"]) or {}
        if "hostPath" not in v:
            lines.append(f"{vm['name']} {volume_kind(v)} {vm['mountPath']} {'ro' if vm.get('readOnly') else 'rw'}")
    return lines


def parse_maps(items: list[str]) -> dict[str, str]:
    maps = {}
    for item in items:
        key, sep, local = item.partition("=")
        if not sep or not key or not local.startswith("/"):
            raise SpecError(f"--map {item}: must be HOSTPATH=LOCALDIR or VOLUME=LOCALDIR, LOCALDIR absolute")
        maps[norm(key) if key.startswith("/") else key] = norm(local)
    return maps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("component", choices=COMPONENTS)
    ap.add_argument("--mode", choices=("colocated", "split"), default="colocated")
    ap.add_argument("--deploy", type=Path, default=REPO / "deploy")
    ap.add_argument("--kubectl", default=str(REPO / "target/deploy-tools/venv/bin/kubectl"))
    ap.add_argument("--map", action="append", default=[], metavar="KEY=LOCALDIR")
    ap.add_argument("--host-network", default="host", metavar="NET")
    ap.add_argument("--pod-network", metavar="NET")
    ap.add_argument("--require-mapped", action="store_true")
    ap.add_argument("--pass", dest="passed", action="append", default=[], metavar="PATH")
    ap.add_argument("--volumes", action="store_true")
    args = ap.parse_args(argv)
    try:
        t = target_of(args.component, args.mode)
        objs = render(args.kubectl, args.deploy / t.root)
        if isinstance(objs, str):
            raise SpecError(f"kubectl kustomize {t.root}: {objs}")
        pod, c = find_container(objs, t)
        if args.volumes:
            lines = unhosted_volumes(pod, c)
        else:
            passed = {norm(p) for p in args.passed} if args.require_mapped else None
            lines = flags_for(pod, c, parse_maps(args.map), args.host_network, args.pod_network, passed)
    except SpecError as e:
        print(f"podman_spec: {args.component}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
