"""deploy/'s kustomizations: which files each lists, that every one is
reachable from a root, and what kustomize renders of each."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from checklib import YAML_LOADER, Tally, load_yaml_docs, obj_key, show


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


def check_kustomize_tree(kube: Path, ks: dict[Path, Kustomization], roots: tuple[str, ...], t: Tally) -> None:
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
    stack = [kube.parent / r for r in roots]
    for r in stack:
        t.check(r in ks, f"{r.relative_to(kube.parent)}", "root has no kustomization.yaml")
    while stack:
        d = stack.pop()
        if d in reachable or d not in ks:
            continue
        reachable.add(d)
        stack.extend((d / r).resolve() for r in ks[d].resources if (d / r).is_dir())
    for d in ks:
        t.check(d in reachable, f"{d.relative_to(kube.parent)}", f"not reachable from any root {roots}")
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


def render(kubectl: str, d: Path) -> list[dict] | str:
    """What kustomize renders of `d`, or why it could not."""
    try:
        out = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        return str(e)
    if out.returncode != 0:
        return out.stderr.strip() or f"exit {out.returncode}"
    return [doc for doc in yaml.load_all(out.stdout, Loader=YAML_LOADER) if doc is not None]


def check_render(kube: Path, ks: dict[Path, Kustomization], kubectl: str | None, t: Tally) -> dict[Path, list[dict]]:
    """Renders every kustomization; returns what rendered."""
    rendered_by_dir: dict[Path, list[dict]] = {}
    renders = {}
    if kubectl is not None:
        # Each render is a process of its own: run a few at once.
        with ThreadPoolExecutor(max_workers=4) as pool:
            renders = dict(zip(ks, pool.map(lambda d: render(kubectl, d), ks), strict=True))
    for d in ks:
        rel = d.relative_to(kube.parent)
        plain = plain_objects(d, ks)
        keys = [obj_key(o) for o in plain]
        dups = sorted({show(k) for k in keys if keys.count(k) > 1})
        t.check(not dups, f"{rel}", f"objects defined twice: {dups}")
        if kubectl is None:
            continue
        rendered = renders[d]
        if isinstance(rendered, str):
            t.fail(f"kubectl kustomize {rel}", rendered)
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
