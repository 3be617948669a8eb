"""deploy/'s kustomizations: which files each lists, that every one is
reachable from a root, and what kustomize renders of each."""

from __future__ import annotations

import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from checklib import YAML_LOADER, Tally, load_yaml_docs, obj_key, show

# The overlays that run the deployments on older Kubernetes: the one place a
# kustomization may make the applied objects differ from the files (deploy/
# README.md, "Kubernetes versions"). How they may differ is fixed by the
# README's table, against which versions.py checks their renders; everywhere
# else the files are the truth every other check reads.
OVERLAYS = "older-kubernetes"
TREES = ("kubernetes", OVERLAYS)
API_VERSIONS = {"Kustomization": "kustomize.config.k8s.io/v1beta1", "Component": "kustomize.config.k8s.io/v1alpha1"}
# The fields each kind of kustomization may use, by tree: an overlay is a
# root listing deploy/kubernetes and its Component (sidecar images and
# patches), which a split-mode site can list too.
FIELDS = {
    ("kubernetes", "Kustomization"): {"resources"},
    (OVERLAYS, "Kustomization"): {"resources", "components"},
    (OVERLAYS, "Component"): {"images", "patches"},
}


@dataclass
class Kustomization:
    dir: Path
    kind: str
    resources: list[str]
    components: list[str]


def read_kustomizations(deploy: Path, t: Tally) -> dict[Path, Kustomization]:
    out: dict[Path, Kustomization] = {}
    for tree in TREES:
        for path in sorted((deploy / tree).rglob("kustomization.yaml")):
            rel = path.relative_to(deploy)
            docs = load_yaml_docs(path)
            if not t.check(len(docs) == 1, f"{rel}", "must hold exactly one document"):
                continue
            k = docs[0]
            kind = k.get("kind", "")
            fields = FIELDS.get((tree, kind))
            kinds = [f"{API_VERSIONS[kd]} {kd}" for tr, kd in FIELDS if tr == tree]
            t.check(
                fields is not None and k.get("apiVersion") == API_VERSIONS[kind],
                f"{rel}",
                f"apiVersion/kind must be {' or '.join(kinds)}",
            )
            extra = set(k) - {"apiVersion", "kind"} - (fields or set())
            t.check(not extra, f"{rel}", f"only {sorted(fields or ())} are used here, found {sorted(extra)}")
            resources = k.get("resources") or []
            t.check(bool(resources) or kind == "Component", f"{rel}", "lists no resources")
            out[path.parent] = Kustomization(path.parent, kind, list(resources), list(k.get("components") or []))
    return out


def check_kustomize_tree(deploy: Path, ks: dict[Path, Kustomization], roots: tuple[str, ...], t: Tally) -> None:
    for d, k in ks.items():
        rel = d.relative_to(deploy)
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
        for c in k.components:
            target = (d / c).resolve()
            t.check(
                target in ks and ks[target].kind == "Component",
                f"{rel}/kustomization.yaml",
                f"component {c} is not a directory with a Component kustomization",
            )
        present = {p.name for p in d.glob("*.yaml")} - {"kustomization.yaml"}
        orphans = sorted(present - listed_files)
        t.check(not orphans, f"{rel}/kustomization.yaml", f"files present but not listed in resources: {orphans}")
    # Every kustomization dir is reachable from a root, and every manifest
    # lies in a kustomization dir.
    reachable: set[Path] = set()
    stack = [deploy / r for r in roots]
    for r in stack:
        t.check(r in ks, f"{r.relative_to(deploy)}", "root has no kustomization.yaml")
    while stack:
        d = stack.pop()
        if d in reachable or d not in ks:
            continue
        reachable.add(d)
        stack.extend((d / r).resolve() for r in ks[d].resources + ks[d].components if (d / r).is_dir())
    for d in ks:
        t.check(d in reachable, f"{d.relative_to(deploy)}", f"not reachable from any root {roots}")
    for tree in TREES:
        for p in sorted((deploy / tree).rglob("*.yaml")):
            t.check(p.parent in ks, f"{p.relative_to(deploy)}", "lies in a directory without a kustomization.yaml")


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


def render_site(kubectl: str, resources: list[Path], components: list[Path]) -> list[dict] | str:
    """What kustomize renders of a kustomization of one's own listing these,
    as a split-mode site keeps (made in a scratch directory: kustomize
    takes only relative paths)."""
    with tempfile.TemporaryDirectory() as tmp:
        site = {
            "apiVersion": API_VERSIONS["Kustomization"],
            "kind": "Kustomization",
            "resources": [os.path.relpath(p, tmp) for p in resources],
            "components": [os.path.relpath(p, tmp) for p in components],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(site))
        return render(kubectl, Path(tmp))


def check_render(deploy: Path, ks: dict[Path, Kustomization], kubectl: str | None, t: Tally) -> dict[Path, list[dict]]:
    """Renders every kustomization but the Components (rendered as part of
    the roots listing them); returns what rendered."""
    rendered_by_dir: dict[Path, list[dict]] = {}
    renders = {}
    dirs = [d for d, k in ks.items() if k.kind != "Component"]
    if kubectl is not None:
        # Each render is a process of its own: run a few at once.
        with ThreadPoolExecutor(max_workers=4) as pool:
            renders = dict(zip(dirs, pool.map(lambda d: render(kubectl, d), dirs), strict=True))
    for d in dirs:
        rel = d.relative_to(deploy)
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
        if ks[d].components:
            continue  # an overlay: its changes are the table's (versions.check_overlays)
        changed = [show(obj_key(o)) for o in plain if by_key.get(obj_key(o)) not in (None, o)]
        t.check(not changed, f"kubectl kustomize {rel}", f"renders these differently from their files: {changed}")
    return rendered_by_dir
