"""Which Kubernetes versions the manifests are for: every rendered object is
validated against the schemas of each version it is meant for (strict:
unknown fields are errors), and against the CRDs' own for the kinds
Kubernetes lacks; and deploy/README.md's table of sidecar releases per
Kubernetes range is what the manifests and the overlays for older
Kubernetes run."""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
from kubernetes_validate import utils as kv_utils

from checklib import SIG_STORAGE, Tally, image_parts, obj_key, pod_spec_of, show
from kustomize import OVERLAYS, Kustomization, render_site

# The Kubernetes versions snap-csi supports: from the oldest a user runs it on
# (issue 20) to the newest whose schemas kubernetes-validate bundles, which the
# pinned sidecars are built against.
OLDEST = "1.28"
NEWEST = "1.37"

# CRD kinds kubernetes-validate has no schema for, and our copy of theirs.
CRD_SCHEMAS = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): "volumesnapshotclass-snapshot-v1.json",
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json",
}

# kubernetes-validate reads and parses its schema files (the definitions are
# megabytes) for every object it validates; they never change, so read each
# once. Nothing here or in jsonschema modifies a schema.
kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)


def minor(version: str) -> int:
    major, _, m = version.partition(".")
    if major != "1" or not m.isdigit():
        raise ValueError(f"not a Kubernetes 1.x version: {version!r}")
    return int(m)


def minors(low: str, high: str) -> list[str]:
    """Every Kubernetes minor version from `low` to `high`."""
    return [f"1.{m}" for m in range(minor(low), minor(high) + 1)]


def spans(versions: list[str]) -> str:
    """1.28, 1.29, 1.30, 1.33 -> "1.28–1.30, 1.33"."""
    runs: list[list[int]] = []
    for m in sorted(map(minor, versions)):
        if runs and m == runs[-1][1] + 1:
            runs[-1][1] = m
        else:
            runs.append([m, m])
    return ", ".join(f"1.{a}" if a == b else f"1.{a}–1.{b}" for a, b in runs)


def definitions_resource() -> referencing.Resource:
    version = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= NEWEST][-1]
    defs = kv_utils.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", NEWEST)
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


# Why each (object, version) was refused, and whether for want of a schema
# for its kind; None if taken. The self-tests check many copies of deploy/
# that differ in one file, so most objects come again.
_refusals: dict[tuple[str, str], tuple[str, bool] | None] = {}


def _refusal(o: dict, version: str) -> tuple[str, bool] | None:
    key = (json.dumps(o, sort_keys=True), version)
    if key not in _refusals:
        try:
            kubernetes_validate.validate(o, version, strict=True)
            _refusals[key] = None
        except kubernetes_validate.ValidationError as e:
            _refusals[key] = (f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}", False)
        except kubernetes_validate.SchemaNotFoundError as e:
            _refusals[key] = (e.message, True)
    return _refusals[key]


def refusal(o: dict, version: str) -> str | None:
    """Why Kubernetes `version` would refuse `o` with strict field
    validation, or None."""
    r = _refusal(o, version)
    return r[0] if r else None


def check_schemas(objs: list[dict], versions: list[str], schema_dir: Path, t: Tally) -> None:
    """Every object against each of `versions` (the CRD kinds once, against
    their CRD's schema)."""
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
        refused = [v for v in versions if refusal(o, v)]
        newest = _refusal(o, NEWEST)
        hint = "; add the CRD's schema to CRD_SCHEMAS" if newest and newest[1] else ""
        t.check(not refused, what, f"{refusal(o, refused[0]) if refused else ''} (Kubernetes {spans(refused)}, strict){hint}")


def check_floor(root: str, objs: list[dict], low: str, t: Tally) -> None:
    """A root for Kubernetes `low` and newer must need `low`: valid one
    version before, its objects would belong in every deployment."""
    before = f"1.{minor(low) - 1}"
    t.check(
        any(refusal(o, before) for o in objs),
        root,
        f"is meant for Kubernetes {low} and newer, yet Kubernetes {before} takes all of it: "
        "put its objects in the deployments' roots, or correct its minimum",
    )


# ---------------------------------------------------------------- the table

# deploy/README.md's table of sidecar releases by Kubernetes range follows
# this line; its columns, and each sidecar column's image.
TABLE_MARK = "<!-- sidecars by Kubernetes version: deploy/check.sh holds the manifests to this table (tools/versions.py) -->"
SIDECAR_COLUMNS = {
    "external-provisioner": "csi-provisioner",
    "external-resizer": "csi-resizer",
    "external-snapshotter": "csi-snapshotter",
    "node-driver-registrar": "csi-node-driver-registrar",
    "livenessprobe": "livenessprobe",
}
COLUMNS = ("Kubernetes", *SIDECAR_COLUMNS, "co-located root")
TABLE = "deploy/README.md's table of sidecars by Kubernetes version"


@dataclass
class Release:
    tag: str
    gates: dict[str, str]  # the feature gates the range sets, in the table's order


@dataclass
class Row:
    low: str
    high: str
    releases: dict[str, Release]  # by image name
    root: str  # below deploy/

    @property
    def name(self) -> str:
        return f"{self.low} – {self.high}"


def parse_gates(value: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in value.split(",") if item)


def feature_gates(args: list[str]) -> tuple[int | None, dict[str, str]]:
    """Where a sidecar's --feature-gates is in its args, and its gates."""
    for i, a in enumerate(args):
        if a.startswith("--feature-gates="):
            return i, parse_gates(a.removeprefix("--feature-gates="))
    return None, {}


def parse_row(cells: list[str], t: Tally) -> Row | None:
    where = f"{TABLE}, row {cells[0]!r}"
    m = re.fullmatch(r"(1\.\d+) [–-] (1\.\d+)", cells[0])
    if not t.check(m is not None and minor(m[1]) <= minor(m[2]), where, "the Kubernetes range must read like 1.28 – 1.31"):
        return None
    releases = {}
    for column, cell in zip(SIDECAR_COLUMNS, cells[1:-1], strict=True):
        code = re.findall(r"`([^`]+)`", cell)
        if not t.check(bool(code) and re.fullmatch(r"v\d+\.\d+\.\d+", code[0]) is not None, where, f"{column}: the release must come first, as `vX.Y.Z`; is {cell!r}"):
            return None
        gates: dict[str, str] = {}
        for flag in code[1:]:
            # The overlays are checked to change nothing but releases and
            # feature gates, so nothing else can be said per range.
            g = re.fullmatch(r"--feature-gates=(\w+=(?:true|false)(?:,\w+=(?:true|false))*)", flag)
            if not t.check(g is not None, where, f"{column}: {flag}: a range sets only --feature-gates=Name=true|false,..."):
                return None
            gates.update(parse_gates(g[1]))
        releases[SIDECAR_COLUMNS[column]] = Release(code[0], gates)
    root = re.findall(r"`deploy/([^`]+)`", cells[-1])
    if not t.check(len(root) == 1, where, f"the co-located root must be one `deploy/...` path; is {cells[-1]!r}"):
        return None
    return Row(m[1], m[2], releases, root[0].rstrip("/"))


def read_table(readme: Path, t: Tally) -> list[Row]:
    """The table's rows, newest Kubernetes first."""
    lines = readme.read_text().splitlines()
    if not t.check(TABLE_MARK in lines, TABLE, f"is missing: {readme} has no line {TABLE_MARK!r} before it"):
        return []
    start = lines.index(TABLE_MARK) + 1
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    if not t.check(len(table) > 2 and tuple(table[0]) == COLUMNS, TABLE, f"columns must be {COLUMNS}"):
        return []
    rows = [parse_row(cells, t) for cells in table[2:] if t.check(len(cells) == len(COLUMNS), TABLE, f"row {cells} has {len(cells)} cells")]
    return [r for r in rows if r is not None]



# deploy/README.md's table of what this project did with each row's
# releases follows this line: per range, the pinned releases run on a
# cluster and those not, each as `image vX.Y.Z`.
RUN_MARK = "<!-- sidecars run on a cluster: deploy/check.sh holds this table to the one above (tools/versions.py) -->"
RUN_COLUMNS = ("Kubernetes", "run on a cluster by this project", "not run on a cluster by this project")
RUN_TABLE = "deploy/README.md's table of sidecars run on a cluster"


def check_run_table(readme: Path, rows: list[Row], t: Tally) -> None:
    """Every range of the sidecar table has a row here, in its order, whose
    two columns name each release that range pins exactly once: as run on
    a cluster, or as not. A release changed in one table and not the other
    fails, so what is claimed as run cannot go stale."""
    lines = readme.read_text().splitlines()
    if not t.check(RUN_MARK in lines, RUN_TABLE, f"is missing: {readme} has no line {RUN_MARK!r} before it"):
        return
    table = []
    for line in lines[lines.index(RUN_MARK) + 1 :]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    if not t.check(len(table) > 2 and tuple(table[0]) == RUN_COLUMNS, RUN_TABLE, f"columns must be {RUN_COLUMNS}"):
        return
    body = table[2:]
    t.check([c[0] for c in body] == [r.name for r in rows], RUN_TABLE,
            f"its ranges {[c[0] for c in body]} must be the sidecar table's {[r.name for r in rows]}, in its order")
    for cells, row in zip(body, rows):
        where = f"{RUN_TABLE}, row {row.name!r}"
        if not t.check(len(cells) == len(RUN_COLUMNS), where, f"has {len(cells)} cells"):
            continue
        pinned = {(name, r.tag) for name, r in row.releases.items()}
        ran = set(re.findall(r"`([a-z-]+) (v\d+\.\d+\.\d+)`", cells[1]))
        not_ran = set(re.findall(r"`([a-z-]+) (v\d+\.\d+\.\d+)`", cells[2]))
        t.check(not ran & not_ran, where, f"{sorted(ran & not_ran)} both run and not run")
        for name, tag in sorted(pinned - ran - not_ran):
            t.fail(where, f"says nothing of `{name} {tag}`, which the range pins: name it as run on a cluster or as not")
        for name, tag in sorted((ran | not_ran) - pinned):
            t.fail(where, f"names `{name} {tag}`, which the range does not pin (a release run but not pinned goes in prose, unquoted)")


def check_rows(rows: list[Row], t: Tally) -> Row | None:
    """The rows cover the supported versions, each once; returns the newest,
    whose releases the manifests pin."""
    if not t.check(bool(rows), TABLE, "has no rows"):
        return None
    t.check(rows[0].high == NEWEST, TABLE, f"its first row must reach the newest supported Kubernetes, {NEWEST}; reaches {rows[0].high}")
    t.check(rows[-1].low == OLDEST, TABLE, f"its last row must start at the oldest supported Kubernetes, {OLDEST}; starts at {rows[-1].low}")
    for newer, older in zip(rows, rows[1:]):
        t.check(minor(older.high) + 1 == minor(newer.low), TABLE, f"rows {newer.name} and {older.name} must meet: newest first, no gap, no overlap")
    base = rows[0]
    t.check(base.root == "kubernetes", TABLE, f"the newest row is the manifests' own: its root must be deploy/kubernetes, is deploy/{base.root}")
    for r in rows[1:]:
        root = f"{OVERLAYS}/{r.low}-{r.high}"
        t.check(r.root == root, TABLE, f"row {r.name}: its root must be deploy/{root}, is deploy/{r.root}")
    return base


def sidecars(objs: list[dict]):
    """(object, container) for every sidecar container."""
    for o in objs:
        spec = pod_spec_of(o) or {}
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if c.get("image", "").startswith(SIG_STORAGE):
                yield o, c


def check_base(base: Row, objs: list[dict], t: Tally) -> None:
    """The deployments run the newest row's releases, with its gates."""
    run = set()
    for o, c in sidecars(objs):
        where = f"{show(obj_key(o))} container {c['name']}"
        _, name, tag = image_parts(c["image"])
        release = base.releases.get(name)
        if not t.check(release is not None, where, f"{name} has no column in {TABLE}"):
            continue
        run.add(name)
        t.check(tag == release.tag, where, f"runs {name} {tag}; the table's row {base.name}, the manifests' own, says {release.tag}")
        gates = feature_gates(c.get("args") or [])[1]
        unset = {g: v for g, v in release.gates.items() if gates.get(g) != v}
        t.check(not unset, where, f"--feature-gates lacks {unset}, which the table's row {base.name} sets")
    for name in sorted(base.releases.keys() - run):
        t.fail(TABLE, f"has a column for {name}, which no manifest runs")


def with_row(objs: list[dict], row: Row) -> list[dict]:
    """The objects with the row's sidecar releases, and its feature gates set
    on top of each sidecar's own: what the row's overlay must render."""
    out = copy.deepcopy(objs)
    for _, c in sidecars(out):
        repo, name, _ = image_parts(c["image"])
        release = row.releases.get(name)
        if release is None:
            continue
        c["image"] = f"{repo}:{release.tag}"
        if release.gates:
            args = c.setdefault("args", [])
            i, gates = feature_gates(args)
            flag = "--feature-gates=" + ",".join(f"{g}={v}" for g, v in (gates | release.gates).items())
            if i is None:
                args.append(flag)
            else:
                args[i] = flag
    return out


def differences(want: dict, got: dict) -> str:
    """How a rendered object differs from the table's, container by
    container."""
    want_spec, got_spec = pod_spec_of(want), pod_spec_of(got)
    if not (want_spec and got_spec):
        return "fields the table does not set differ"
    wanted = {c["name"]: c for c in want_spec.get("containers") or []}
    gotten = {c["name"]: c for c in got_spec.get("containers") or []}
    out = []
    for n in sorted(wanted.keys() | gotten.keys()):
        w, g = wanted.get(n), gotten.get(n)
        if w == g:
            continue
        if w is None or g is None:
            out.append(f"container {n} is in only one of them")
        elif (w.get("image"), w.get("args")) != (g.get("image"), g.get("args")):
            out.append(f"container {n} runs {g.get('image')} {g.get('args')}; the table makes it {w.get('image')} {w.get('args')}")
        else:
            out.append(f"container {n} differs in fields the table does not set")
    return "; ".join(out) or "the pod differs outside its containers"


def check_as_row(where: str, got: list[dict], base_objs: list[dict], row: Row, t: Tally) -> None:
    """A render is `base_objs` with the row's releases and gates, nothing
    else."""
    want = {obj_key(o): o for o in with_row(base_objs, row)}
    by_key = {obj_key(o): o for o in got}
    t.check(
        by_key.keys() == want.keys(),
        where,
        f"renders {sorted(map(show, by_key))}, what it overlays holds {sorted(map(show, want))}",
    )
    for k in sorted(by_key.keys() & want.keys()):
        t.check(
            by_key[k] == want[k],
            where,
            f"renders {show(k)} other than the table's row {row.name} makes it: {differences(want[k], by_key[k])}",
        )


# The split-mode site whose host side is rendered with each overlay's
# Component, as a site on older Kubernetes lists it.
SPLIT_SITE = "kubernetes/split/example/host"


def check_overlays(
    deploy: Path,
    rows: list[Row],
    ks: dict[Path, Kustomization],
    rendered: dict[Path, list[dict]],
    roots: dict[str, list[dict]],
    kubectl: str | None,
    schema_dir: Path,
    t: Tally,
) -> None:
    """Each older row's overlay renders deploy/kubernetes with the row's
    releases and gates and nothing else, and so does a split-mode site
    listing the overlay's Component; both are valid on every Kubernetes of
    the row."""
    unnamed = {d.relative_to(deploy).as_posix() for d, k in ks.items() if k.components}
    for row in rows[1:]:
        where = f"deploy/{row.root}"
        d = deploy / row.root
        unnamed.discard(row.root)
        if not t.check(d in rendered, where, f"the overlay for the table's row {row.name} is missing or did not render"):
            continue
        check_as_row(where, rendered[d], roots.get("kubernetes", []), row, t)
        check_schemas(rendered[d], minors(row.low, row.high), schema_dir, t)
        if kubectl is None:
            continue
        site = render_site(kubectl, [deploy / SPLIT_SITE], [(d / c).resolve() for c in ks[d].components])
        where = f"deploy/{SPLIT_SITE} with the Component of {where}"
        if not t.check(not isinstance(site, str), f"kubectl kustomize {where}", str(site)):
            continue
        check_as_row(where, site, roots.get(SPLIT_SITE, []), row, t)
        check_schemas(site, minors(row.low, row.high), schema_dir, t)
    for o in sorted(unnamed):
        t.fail(f"deploy/{o}", f"overlays deploy/kubernetes, yet no row of {TABLE} names it")
