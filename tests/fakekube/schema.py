"""What kube-apiserver does to a custom resource on create and update, from its structural schema:
validate (422 Invalid with causes), apply `default:` values, prune unknown fields."""
import copy
import functools
import re
from pathlib import Path

import jsonschema
import yaml

CRD_PATH = Path(__file__).resolve().parents[2] / "runners" / "schemas" / "mpijob-crd-v2beta1.yaml"
TRAINJOB_CRD_PATH = CRD_PATH.with_name("trainjob-crd-v1alpha1.yaml")
# Kueue's CRDs: copies of those shared by the projects beside this repository (../shared/schemas),
# kept here so that a clone alone runs the tests (tests/test_fakekube_kueue.py checks the copies).
KUEUE_CRD_DIR = Path(__file__).resolve().parent / "crds"
SHARED_CRD_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"
KUEUE_VERSION = "v1beta1"
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
# Standard ObjectMeta fields a client may set; the apiserver keeps these on any object.
OBJECT_META_FIELDS = {
    "name", "generateName", "namespace", "labels", "annotations", "ownerReferences", "finalizers",
    "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "managedFields", "selfLink"}


def _strip_extensions(node):
    if isinstance(node, dict):
        return {k: _strip_extensions(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if isinstance(node, list):
        return [_strip_extensions(v) for v in node]
    return node


@functools.lru_cache(maxsize=None)
def load_crd_schema(path=CRD_PATH, version=None):
    """The openAPIV3Schema of the CRD at `path`: of `version`, or of its storage version."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(Path(path).read_text(), Loader=loader)
    found = next(v for v in crd["spec"]["versions"] if (v["name"] == version if version else v.get("storage")))
    return found["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def kueue_schema(plural):
    """Kueue's v1beta1 schema of `plural` (workloads, localqueues, clusterqueues)."""
    return CRDSchema(load_crd_schema(KUEUE_CRD_DIR / f"kueue-{plural}-crd.yaml", KUEUE_VERSION))


class CRDSchema:
    def __init__(self, schema):
        self.raw = schema
        self.validator = jsonschema.Draft4Validator(_strip_extensions(schema))

    def default_and_prune(self, obj):
        """Return (new object, [pruned field paths]) like the apiserver's structural defaulting and
        pruning. Top-level metadata keeps standard ObjectMeta fields only."""
        obj = copy.deepcopy(obj)
        pruned = []
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for key in [k for k in meta if k not in OBJECT_META_FIELDS]:
                pruned.append(f"metadata.{key}")
                del meta[key]
        props = self.raw.get("properties", {})
        for key in [k for k in obj if k not in props]:
            pruned.append(key)
            del obj[key]
        for key, sub in props.items():
            if key != "metadata" and key in obj:
                obj[key] = _walk(obj[key], sub, key, pruned)
        return obj, pruned

    def errors(self, obj):
        """Causes as the apiserver reports them: [{"reason", "message", "field"}]."""
        causes = []
        for err in sorted(self.validator.iter_errors(obj), key=lambda e: list(e.path)):
            field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.path)
            field = field.replace(".[", "[")
            if err.validator == "required":
                missing = re.search(r"'([^']+)' is a required property", err.message)
                name = missing.group(1) if missing else "?"
                field = f"{field}.{name}" if field else name
                causes.append({"reason": "FieldValueRequired", "message": "Required value", "field": field})
            elif err.validator == "enum":
                values = ", ".join(f'"{v}"' for v in err.validator_value)
                causes.append({"reason": "FieldValueNotSupported", "field": field,
                               "message": f'Unsupported value: "{err.instance}": supported values: {values}'})
            elif err.validator == "type":
                causes.append({"reason": "FieldValueTypeInvalid", "field": field,
                               "message": f'Invalid value: "{type(err.instance).__name__}": {field} in body '
                                          f'must be of type {err.validator_value}: "{err.instance}"'})
            else:
                causes.append({"reason": "FieldValueInvalid", "field": field,
                               "message": f"Invalid value: {err.instance!r}: {err.message}"})
        return causes


def _walk(value, schema, path, pruned):
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        if "properties" in schema:
            props = schema["properties"]
            for key in [k for k in value if k not in props]:
                pruned.append(f"{path}.{key}")
                del value[key]
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    value[key] = _walk(value[key], sub, f"{path}.{key}", pruned)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key in value:
                value[key] = _walk(value[key], schema["additionalProperties"], f"{path}[{key}]", pruned)
        elif "properties" not in schema and "additionalProperties" not in schema:
            # `type: object` with no fields: everything inside is pruned (unless preserved).
            for key in list(value):
                pruned.append(f"{path}.{key}")
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_walk(v, schema["items"], f"{path}[{i}]", pruned) for i, v in enumerate(value)]
    return value
