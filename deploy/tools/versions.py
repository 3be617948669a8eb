"""The Kubernetes schemas every rendered object is validated against (strict:
unknown fields are errors), and the CRDs' own for the kinds Kubernetes lacks."""

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

# The newest Kubernetes whose schemas kubernetes-validate bundles; the
# manifests must be valid there (strict: unknown fields are errors).
K8S_VERSION = "1.37"

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
