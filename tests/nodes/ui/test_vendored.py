"""The vendored htmx files are exactly the npm package's, as recorded beside them."""

import hashlib
import json
from pathlib import Path

import nodes.ui

VENDOR = Path(nodes.ui.__file__).parent / "static" / "vendor"


def test_each_vendored_file_matches_its_recorded_hash_and_the_pages_load_them():
    record = json.loads((VENDOR / "vendored.json").read_text())
    assert record["package"] == "htmx.org" and record["version"].startswith("4.")
    assert record["files"], "nothing recorded"
    for name, entry in record["files"].items():
        digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"{name} differs from htmx.org {record['version']}"
    base = (VENDOR.parents[1] / "templates" / "base.html").read_text()
    for name in record["files"]:
        assert f'src="/static/vendor/{name}"' in base, name
    # Nothing else is vendored unrecorded (a licence file aside).
    present = {path.name for path in VENDOR.iterdir()}
    assert present == {*record["files"], "vendored.json", "htmx-LICENSE"}
