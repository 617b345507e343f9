"""``cosmicac jobs create -f FILE`` and ``--dry-run`` (run in this process).

Against an in-process app-node and wrk-ork (``served_ork``): a job from a YAML file,
a JSON file and stdin; a ``jobs get -o yaml`` document taken back (the second job
equal to the first but for what the server sets); options over the file's fields; a
dry run that prints the would-be job and where it would run or why it would wait,
creating nothing, and whose ``-o yaml`` ``create -f`` takes back too.

Without a server (the errors come before any request): each error form, one line
``error: FILE[:LINE]: field: what``, exit 2; and ``jobs create`` without ``-f``
does not import YAML. The file reader is fuzzed: any text is a body or a
``JobFileError``, nothing else."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli._jobfile import (
    BODY_FIELDS,
    DOCUMENT_FIELDS,
    MAX_FILE_BYTES,
    SPEC_FIELDS,
    JobFileError,
    body_of,
    load,
    parse,
)
from contracts.model import JobSpec
from nodes.app_node.api._models import JobIn, JobOut, JobPreviewOut

from .support import ServedOrk, cli_env, invoke, one_error_line

pytestmark = pytest.mark.slow  # about 15 s: app-node and wrk-ork served per test

IMAGE = "docker://registry.local/jobs/app:1"

BOX_YAML = f"""\
# a GPU container
name: box
type: container
image: {IMAGE}
gpus: 2
"""

#: What the server sets on a job: not expected equal between a job and its copy.
SERVER_SET = {"id", "status", "reason", "created_by", "created_at", "deleted_at", "rack",
              "replicas", "model_health", "agents_heard_at"}


def test_the_file_s_fields_are_the_api_s() -> None:
    assert set(BODY_FIELDS) == set(JobIn.model_fields)
    assert set(DOCUMENT_FIELDS) == set(JobOut.model_fields)
    assert set(SPEC_FIELDS) == set(JobSpec.model_fields)
    assert set(JobPreviewOut.model_fields) <= set(DOCUMENT_FIELDS)  # -f takes it back


# -- with a server ------------------------------------------------------------------


async def _document(served: ServedOrk, job: str, output: str = "json") -> dict:
    got = await served.cli("jobs", "get", job, "-o", output)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


async def test_yaml_json_and_stdin_files_create_the_job_they_describe(
        served_ork: ServedOrk, tmp_path: Path) -> None:
    served = served_ork
    await served.login()
    (tmp_path / "box.yaml").write_text(BOX_YAML)
    (tmp_path / "llm.json").write_text(json.dumps({
        "name": "llm", "type": "inference", "runtime": "local", "model": "demo",
        "image": IMAGE, "replicas": 2, "served_name": "chat",
        "runtime_settings": {"args": ["--ctx", "512"], "env": {"A": "1"}}}))
    created = {}
    for name, args, stdin in (("box", ["-f", str(tmp_path / "box.yaml")], b""),
                              ("llm", ["-f", str(tmp_path / "llm.json")], b""),
                              ("stdin", ["-f", "-", "--name", "stdin"], BOX_YAML.encode())):
        result = await served.cli("jobs", "create", *args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        created[name] = await _document(served, result.stdout.decode().strip())
    assert (created["box"]["name"], created["box"]["spec"]["gpus"]) == ("box", 2)
    llm = created["llm"]["spec"]
    assert (llm["replicas"], llm["served_name"], llm["runtime_settings"]) == (
        2, "chat", {"args": ["--ctx", "512"], "env": {"A": "1"}})
    assert created["stdin"]["name"] == "stdin" and created["stdin"]["spec"]["gpus"] == 2


async def test_a_job_document_from_get_is_taken_back_as_a_copy(
        served_ork: ServedOrk, tmp_path: Path) -> None:
    served = served_ork
    await served.login()
    first = await served.cli("jobs", "create", "--name", "box", "--type", "container",
                             "--image", IMAGE, "--gpus", "3")
    assert first.returncode == 0, first.stderr
    job = first.stdout.decode().strip()
    got = await served.cli("jobs", "get", job, "-o", "yaml")
    assert got.returncode == 0, got.stderr
    (tmp_path / "job.yaml").write_bytes(got.stdout)

    copy = await served.cli("jobs", "create", "-f", str(tmp_path / "job.yaml"))
    assert copy.returncode == 0, copy.stderr
    original, duplicate = await _document(served, job), \
        await _document(served, copy.stdout.decode().strip())
    assert duplicate["id"] != original["id"]
    assert {k: v for k, v in duplicate.items() if k not in SERVER_SET} == \
        {k: v for k, v in original.items() if k not in SERVER_SET}

    # Through a pipe, with options over the document's fields.
    renamed = await served.cli("jobs", "create", "-f", "-", "--name", "copy", "--gpus", "1",
                               "-o", "json", stdin=got.stdout)
    assert renamed.returncode == 0, renamed.stderr
    document = json.loads(renamed.stdout)
    assert (document["name"], document["spec"]["name"], document["spec"]["gpus"]) == (
        "copy", "copy", 1)
    assert document["spec"]["image"] == IMAGE


async def test_the_api_s_422_still_names_its_field(served_ork: ServedOrk,
                                                   tmp_path: Path) -> None:
    served = served_ork
    await served.login()
    (tmp_path / "bad.yaml").write_text(BOX_YAML + "model: demo\n")  # a container with a model
    result = await served.cli("jobs", "create", "-f", str(tmp_path / "bad.yaml"))
    assert result.returncode == 2
    assert "field model" in one_error_line(result)
    # What neither the file nor an option gives is asked for by its option.
    (tmp_path / "nameless.yaml").write_text("type: container\n")
    nameless = await served.cli("jobs", "create", "-f", str(tmp_path / "nameless.yaml"))
    assert nameless.returncode == 2
    assert one_error_line(nameless) == ("error: --name is required: what to call the job "
                                        "(or name: in the file)")
    assert served.job_ids() == set()


async def test_a_dry_run_shows_where_the_job_would_run_and_creates_nothing(
        served_ork: ServedOrk, tmp_path: Path) -> None:
    served = served_ork
    await served.login()
    (tmp_path / "box.yaml").write_text(BOX_YAML)
    known = served.job_ids()

    table = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"), "--dry-run")
    assert table.returncode == 0, table.stderr
    text = table.stdout.decode()
    assert "dry run, nothing created: it would start now on rack" in text
    assert "n0 (2 GPUs)" in text or "n1 (2 GPUs)" in text
    assert served.job_ids() == known

    as_json = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"),
                               "--dry-run", "--gpus", "8", "-o", "json")
    preview = json.loads(as_json.stdout)
    assert (preview["status"], preview["spec"]["gpus"]) == ("starting", 8)
    assert preview["replicas"][0]["gpus"] == [8] and "id" not in preview

    # Fill both nodes, then ask again: it would wait, and says why.
    for _ in range(2):
        full = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"),
                                "--gpus", "8")
        assert full.returncode == 0, full.stderr
    known = served.job_ids()
    waiting = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"),
                               "--dry-run")
    assert waiting.returncode == 0, waiting.stderr
    assert "it would wait (Pending): no room now in location default" in \
        waiting.stdout.decode()
    as_yaml = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"),
                               "--dry-run", "--name", "later", "-o", "yaml")
    assert as_yaml.returncode == 0 and b"status: pending" in as_yaml.stdout
    assert served.job_ids() == known  # no dry run created anything

    # The dry run's document is a job file too.
    real = await served.cli("jobs", "create", "-f", "-", stdin=as_yaml.stdout)
    assert real.returncode == 0, real.stderr
    made = await _document(served, real.stdout.decode().strip())
    assert (made["name"], made["status"], made["spec"]["gpus"]) == ("later", "pending", 2)


async def test_a_dry_run_for_a_team_the_caller_is_not_in_is_refused_as_create_is(
        served_ork: ServedOrk, tmp_path: Path) -> None:
    served = served_ork
    await served.login()
    (tmp_path / "box.yaml").write_text(BOX_YAML + "team_id: t-not-mine\n")
    dry = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"), "--dry-run")
    real = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"))
    assert dry.returncode == real.returncode == 1
    assert one_error_line(dry) == one_error_line(real)
    assert served.job_ids() == set()


# -- without a server ---------------------------------------------------------------


@pytest.fixture
def offline(tmp_path: Path) -> dict[str, str]:
    """A CLI environment whose server does not exist: every case below fails first."""
    return cli_env(tmp_path / "config", "http://127.0.0.1:9")


ERRORS = {
    "unknown field": ("name: x\ntype: container\ncolour: red\n",
                      "job.yaml:3: colour: not a field of a job file"),
    "gpus zero": (BOX_YAML.replace("gpus: 2", "gpus: 0"),
                  "job.yaml:5: gpus: must be an integer ≥ 1 and ≤ 64, not 0"),
    "gpus text": (BOX_YAML.replace("gpus: 2", "gpus: '2'"),
                  'job.yaml:5: gpus: must be an integer ≥ 1 and ≤ 64, not "2"'),
    "bad type": ("name: x\ntype: vm\n", "job.yaml:2: type: must be 'container' or "
                                        "'inference', not \"vm\""),
    "bad image": ("name: x\ntype: container\nimage: ubuntu\n",
                  "job.yaml:3: image: must be a registry image"),
    "twice": ("name: x\ntype: container\nname: y\n", "job.yaml:3: name: given twice"),
    "alias": ("name: &n x\ntype: container\nmodel: *n\n",
              "job.yaml:3: model: aliases (*name) are not accepted"),
    "a list": ("- name: x\n", "job.yaml: a job file holds one mapping"),
    "empty": ("", "job.yaml: a job file holds one mapping (name: ..., type: ...), this one "
                  "is empty"),
    "not yaml": ("name: [x\n", "job.yaml:2: not valid YAML"),
    "two documents": ("name: x\n---\nname: y\n", "job.yaml:2: not valid YAML"),
    "python tag": ("name: !!python/object/apply:os.system [id]\n",
                   "job.yaml:1: not valid YAML: could not determine a constructor"),
    "spec not a mapping": ("name: x\nspec: 3\n", "job.yaml:2: spec: must be a mapping"),
    "spec unknown": ("name: x\nspec:\n  name: x\n  colour: red\n",
                     "job.yaml:4: spec.colour: not a field of a job file"),
    "top and spec differ": ("name: x\nspec:\n  name: y\n  type: container\n",
                            "job.yaml:3: spec.name: says 'y' and the document's name says "
                            "'x'; keep one"),
    "body field in a document": ("name: x\ngpus: 1\nspec:\n  type: container\n",
                                 "job.yaml:2: gpus: not a field of a job file (a create "
                                 "body's field: in a job document it goes under spec)"),
    "nested settings": ("name: x\ntype: inference\nruntime_settings:\n  args: [1]\n",
                        "job.yaml:4: runtime_settings.args.0: must be text"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_each_error_names_the_file_line_and_field_and_exits_2(
        case: str, tmp_path: Path, offline: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    text, expected = ERRORS[case]
    (tmp_path / "job.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)  # the file is named as the user typed it
    result = invoke(["jobs", "create", "-f", "job.yaml"], env=offline)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"error: {expected}"), line


def test_a_file_too_large_missing_or_not_utf8_is_refused(tmp_path: Path,
                                                         offline: dict[str, str]) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"name: x\n" + b"#" * MAX_FILE_BYTES)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    for args, expected in (
            (["-f", str(big)], f"error: {big}: larger than 1 MiB"),
            (["-f", str(tmp_path / "none.yaml")],
             f"error: {tmp_path / 'none.yaml'}: No such file or directory"),
            (["-f", str(latin)], f"error: {latin}: not UTF-8 text (byte 9)"),
            (["-f", str(tmp_path)], f"error: {tmp_path}: Is a directory")):
        result = invoke(["jobs", "create", *args], env=offline)
        assert result.returncode == 2, (args, result.stderr)
        assert one_error_line(result).startswith(expected), result.stderr
    big_stdin = invoke(["jobs", "create", "-f", "-"], env=offline,
                       stdin=b"#" * (MAX_FILE_BYTES + 1))
    assert one_error_line(big_stdin).startswith("error: stdin: larger than 1 MiB")


def test_json_errors_name_the_field() -> None:
    for text, expected in (
            ('{"name": "x", "name": "y"}', "job.json: name: given twice"),
            ('{"name": "x", "gpus": true}', "job.json: gpus: must be an integer ≥ 1 and ≤ 64, "
                                            "not true"),
            ('{"name": "x",}', "job.json: not valid JSON")):
        with pytest.raises(JobFileError) as error:
            document, lines = parse(text, "job.json")
            body_of(document, "job.json", lines)
        assert error.value.message.startswith(expected), error.value.message


def test_create_without_a_file_imports_no_yaml(tmp_path: Path) -> None:
    """The ``-f`` path's imports stay there: a plain create loads neither YAML nor the
    job file module (in a fresh interpreter: this one has imported them). The command
    runs as ``python -m cli.main`` does (nothing of the tests imported beside it);
    at exit, the process says which of the two it loaded."""
    script = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('loaded', 'yaml' in sys.modules,"
        " 'cli._jobfile' in sys.modules))\n"
        "runpy.run_module('cli.main', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run(
        [sys.executable, "-c", script, "jobs", "create", "--name", "x", "--type", "container"],
        capture_output=True, text=True, timeout=120, check=False,
        env=cli_env(tmp_path / "config", "http://127.0.0.1:9"))
    assert done.returncode == 3, done.stderr  # 3: not logged in
    assert done.stdout.split()[-3:] == ["loaded", "False", "False"], done.stderr


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.builds(
    lambda key, value: f"{key}: {value}\n", st.sampled_from([*BODY_FIELDS, "spec", "x"]),
    st.text(max_size=40)))
def test_fuzz_any_text_is_a_body_or_a_job_file_error(text: str) -> None:
    try:
        body = load("fuzz.yaml", io.BytesIO(text.encode()))
    except JobFileError as error:
        assert error.message.startswith("fuzz.yaml")
        return
    assert isinstance(body, dict) and set(body) <= set(BODY_FIELDS)


async def test_a_dry_run_against_an_app_node_older_than_it_leaves_no_job(
        served_ork: ServedOrk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older app-node ignores ``dry_run`` and creates the job: the CLI deletes it
    again and fails, rather than leaving a job the user never meant to run."""
    from nodes.app_node.api import _jobs

    served = served_ork
    await served.login()
    monkeypatch.setattr(_jobs, "_dry_run", lambda request: False)  # the older route
    (tmp_path / "box.yaml").write_text(BOX_YAML)
    result = await served.cli("jobs", "create", "-f", str(tmp_path / "box.yaml"), "--dry-run")
    assert result.returncode == 1 and result.stdout == b""
    line = one_error_line(result)
    assert "older than --dry-run and created job j-" in line and "deleted again" in line
    [job] = served.job_ids()
    assert served.world is not None and served.world.status(job).value == "deleting"
