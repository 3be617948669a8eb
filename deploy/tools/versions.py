"""Which Kubernetes versions the manifests are for: every rendered object is
validated against the schemas of each version it is meant for (strict:
unknown fields are errors), and against the CRDs' own for the kinds
Kubernetes lacks."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
from kubernetes_validate import utils as kv_utils

from checklib import Tally, obj_key, show

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
