"""What every part of deploy/'s offline check shares: the tally of checks,
object keys, containers and where their paths really are."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class Tally:
    """Counts passed checks and keeps failures, each once: a pod or object
    that several roots share is checked in each deployment it is part of."""

    def __init__(self) -> None:
        self.passed = 0
        self.failures: list[str] = []

    def check(self, ok: bool, what: str, why: str = "") -> bool:
        if ok:
            self.passed += 1
        else:
            # One line each: a tool's multi-line error stays one failure.
            failure = (f"{what}: {why}" if why else what).replace("\n", " | ")
            if failure not in self.failures:
                self.failures.append(failure)
        return ok

    def fail(self, what: str, why: str = "") -> None:
        self.check(False, what, why)


# libyaml's safe loader where PyYAML has it (the venv's does): the same
# documents, parsed several times faster.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=YAML_LOADER) if d is not None]


Key = tuple[str, str, str, str]


def obj_key(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def show(key: Key) -> str:
    _, kind, ns, name = key
    return f"{kind} {ns + '/' if ns else ''}{name}"


# Where the Kubernetes CSI sidecars come from.
SIG_STORAGE = "registry.k8s.io/sig-storage/"


def image_parts(image: str) -> tuple[str, str, str]:
    """registry/path/name:tag -> (registry/path/name, name, tag)."""
    repo, _, tag = image.rpartition(":")
    if "/" in tag or not repo:
        repo, tag = image, ""
    return repo, repo.rsplit("/", 1)[-1], tag


def pod_spec_of(obj: dict) -> dict | None:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec")


@dataclass
class Container:
    pod: str  # "Kind ns/name"
    spec: dict
    pod_spec: dict
    image_name: str = ""
    tag: str = ""
    args: dict[str, str | None] = field(default_factory=dict)  # flag -> value (None: bare flag)
    positional: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def where(self) -> str:
        return f"{self.pod} container {self.name}"


@dataclass
class Location:
    """Where a container path really is: a host path, or a path inside one
    pod volume."""

    volume: str  # "host" or "<pod>/<volume>"
    path: str

    def __str__(self) -> str:
        return f"{self.path} on the host" if self.volume == "host" else f"{self.path} in volume {self.volume}"


def locate(c: Container, path: str) -> tuple[Location, dict] | None:
    """Where `path` in container `c` really is, and the mount it lies in."""
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


def volume_of(c: Container, mount: dict) -> dict:
    return next((v for v in c.pod_spec.get("volumes") or [] if v["name"] == mount["name"]), {})
