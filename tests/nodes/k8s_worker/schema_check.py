"""Strict validation of rendered manifests against the upstream OpenAPI schemas.

- VirtualMachineInstance: ``v1.VirtualMachineInstance`` of KubeVirt's
  swagger.json; DataVolume: ``v1beta1.DataVolume`` of CDI's (both in
  ``schemas/`` beside this module, see its README).
- Secret and Service (core/v1) are in neither file: they are checked against
  the ``kubernetes`` client's generated ``V1Secret`` and ``V1Service`` models
  (``openapi_types`` and ``attribute_map``, generated from Kubernetes' own
  OpenAPI document).

*Strict* means what the API server's strict field validation does: a field
the schema does not declare is an error. Swagger definitions leave
``additionalProperties`` open, so every object schema that lists
``properties`` gets ``additionalProperties: false`` here, and so does every
marker type that declares no field at all (``masquerade: {}``, ``pod: {}``);
maps such as ``labels`` or ``resources.requests`` declare
``additionalProperties`` with a value schema and are left alone, and the
free-form types (``FieldsV1``, ``Patch``, ``RawExtension``) stay open.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema

__all__ = ["schemas_dir", "validate"]

_FILES = {"VirtualMachineInstance": ("kubevirt-swagger.json", "v1.VirtualMachineInstance"),
          "DataVolume": ("cdi-swagger.json", "v1beta1.DataVolume")}


def schemas_dir() -> Path:
    """The upstream OpenAPI files: ``$COSMICAC_SCHEMAS``, else the copy kept beside
    this module (``schemas/``, copied from the team's ``shared/schemas`` with
    their provenance), so CI on a bare checkout validates too: never skipped."""
    if os.environ.get("COSMICAC_SCHEMAS"):
        return Path(os.environ["COSMICAC_SCHEMAS"])
    return Path(__file__).resolve().parent / "schemas"


def _close(node: Any) -> Any:
    """Every object schema with ``properties`` refuses undeclared fields."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)
    return node


@functools.cache
def _validator(kind: str) -> jsonschema.Draft4Validator:
    filename, definition = _FILES[kind]
    document = json.loads((schemas_dir() / filename).read_text())
    definitions = _close(copy.deepcopy(document["definitions"]))
    for name, body in definitions.items():
        # Marker types (``masquerade: {}``, ``pod: {}``) declare no fields at
        # all: any field in them is undeclared. Only the free-form ones stay open.
        if body.get("type") == "object" and "properties" not in body \
                and "additionalProperties" not in body and not name.endswith(_FREE_FORM):
            body["additionalProperties"] = False
    schema = {"$ref": f"#/definitions/{definition}", "definitions": definitions}
    return jsonschema.Draft4Validator(schema)


#: core/v1 kinds the backend renders, checked against the client's models.
_CORE_V1 = ("Secret", "Service")

#: Definitions that really are free-form JSON (managedFields, patches, raw objects).
_FREE_FORM = ("FieldsV1", ".Patch", "RawExtension")

_LIST = re.compile(r"^(?:list|List)\[(.+)\]$")
_DICT = re.compile(r"^(?:dict\((\w+), (.+)\)|Dict\[(\w+), (.+)\])$")
_PRIMITIVES = {"str": str, "bool": bool, "int": int, "float": (int, float), "object": object}


def _check_model(value: Any, type_name: str, where: str) -> None:
    """``value`` (JSON) against a generated client model type, strictly."""
    from kubernetes import client

    if (m := _LIST.match(type_name)) is not None:
        assert isinstance(value, list), f"{where}: expected a list"
        for i, item in enumerate(value):
            _check_model(item, m[1], f"{where}[{i}]")
        return
    if (m := _DICT.match(type_name)) is not None:
        assert isinstance(value, dict), f"{where}: expected a map"
        for key, item in value.items():
            assert isinstance(key, str), f"{where}: non-string key"
            _check_model(item, m[2] or m[4], f"{where}.{key}")
        return
    if type_name in _PRIMITIVES:
        assert isinstance(value, _PRIMITIVES[type_name]), f"{where}: expected {type_name}"
        assert not (type_name in ("int", "float") and isinstance(value, bool)), where
        return
    if type_name == "bytes":  # OpenAPI "format: byte": base64 in JSON
        assert isinstance(value, str), f"{where}: expected base64 text"
        base64.b64decode(value, validate=True)
        return
    if type_name == "datetime":
        assert isinstance(value, str), f"{where}: expected a timestamp"
        return
    model = getattr(client, type_name)
    assert isinstance(value, dict), f"{where}: expected an object ({type_name})"
    json_to_attr = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        assert key in json_to_attr, f"{where}: field {key!r} is not declared by {type_name}"
        _check_model(item, model.openapi_types[json_to_attr[key]], f"{where}.{key}")


def validate(manifest: dict[str, Any]) -> None:
    """Raise (``jsonschema.ValidationError`` or ``AssertionError``) unless ``manifest``
    is valid, strictly, for its kind."""
    kind = manifest.get("kind")
    if kind in _CORE_V1:
        assert manifest.get("apiVersion") == "v1"
        _check_model(manifest, f"V1{kind}", kind)
        return
    assert kind in _FILES, f"no schema for kind {kind!r}"
    _validator(kind).validate(manifest)
