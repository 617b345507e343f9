"""``cosmicac jobs``: create, list, inspect, restart and delete the team's jobs.

Scripts rely on two forms exactly: ``jobs create ...`` prints the job id alone on
stdout (``JOB=$(cosmicac jobs create ...)``), with ``-o json`` the job document;
``jobs get JOB -o json`` prints the API's job document as it is (``status`` is
``running`` for an Active job; ``model_health`` an inference job's model health,
apart from its status, or null when unknown). ``jobs list`` and ``jobs get`` show
it as the ``health`` column beside ``status``, which their tables name as the seeds
and the web UI do (Active, Queued; ``-`` when the health is unknown), and
``heard``: how long ago the job's least recently heard agent last reported to its
worker (``agents_heard_at``; minutes while the job stays Starting or Active mean
its agents cannot reach the worker: seeds/relay.txt). ``--wait``
follows the job's events (polling a server that offers none) until the job runs
(create, restart) or is gone (delete), with progress on stderr (:mod:`cli._wait`).

``jobs logs`` prints a job's log records from wrk-monitor through app-node
(``GET /api/jobs/{job}/logs``): one line each, ``time  source  service  [replica]
text`` with the server's UTC time (RFC 3339: the same on every machine, sorts as
text), or JSON lines with ``-o json``; ``-f`` follows the event stream until
Ctrl-C (exit 130), subscribing again right after the last record printed (its
cursor) when the server says ``lagged``.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import typer

from contracts.labels import age_label, heard_label, status_label
from runtime.sse import SseReader

from ._completion import choices, container_job_ids, job_ids, model_names, team_names
from ._console import err, fail, print_json
from ._help import add_note
from ._output import Column, Output, no_headers_option, query_option
from ._server_settings import server_settings, server_settings_options
from ._wait import DEFAULT_TIMEOUT_S, INTERRUPTED, Goal, wait_for
from .session import (
    EXIT_CODES_HELP,
    UNREACHABLE,
    USAGE,
    Api,
    api_for,
    check_output,
    emit,
    output_option,
    server_option,
)
from .teams import resolve_team

__all__ = ["app"]

_WAIT_HELP = (f"{EXIT_CODES_HELP} With --wait: exit 1 also when the job failed (with its "
              f"reason) or --timeout passed.")
app = typer.Typer(help=f"Jobs: list, get, create, restart, delete; replicas. {_WAIT_HELP}",
                  no_args_is_help=True)
replicas_app = typer.Typer(help=f"One replica of a job: restart or delete it while it is "
                                f"queued, pending or starting. {_WAIT_HELP}",
                           no_args_is_help=True)
app.add_typer(replicas_app, name="replicas")

_TYPES = ("container", "inference")
_RUNTIMES = ("vllm", "parakeet", "local")


def _team_option() -> Any:
    return typer.Option(None, "--team", "-t", help="The team (id or name); default: the "
                                                   "active team.", autocompletion=team_names)


def _wait_option(what: str) -> Any:
    return typer.Option(False, "--wait", "-w", help=f"Wait until the job {what}, showing "
                                                    f"progress on stderr.")


def _timeout_option() -> Any:
    return typer.Option(DEFAULT_TIMEOUT_S, "--timeout", min=0.0,
                        help="How long --wait waits, in seconds.")


def _job_path(job: str) -> str:
    return f"/jobs/{quote(job, safe='')}"


def _when(seconds: float | None) -> str:
    """A time as the web UI's job page shows it: RFC 3339 in UTC, to the second."""
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(
        timespec="seconds")


def _runs(spec: dict) -> str:
    """What a job runs: ``runtime:model`` for inference, else its image."""
    return f"{spec['runtime']}:{spec['model']}" if spec.get("model") else spec.get("image") or ""


def _replicas_column(job: dict) -> str:
    """``2/3 running``: how many replicas run, of how many."""
    replicas = job["replicas"]
    running = sum(r["status"] == "running" for r in replicas)
    return f"{running}/{len(replicas)} running"


def _health(job: dict) -> str:
    """The model health column: ``Healthy``, ``Degraded``, ``Unhealthy``, or ``-`` when
    unknown (a container job, no wrk-monitor, no proxy reporting it; an older server)."""
    return job.get("model_health") or "-"


#: ``jobs list``'s columns, as the web UI's jobs list names them; in a narrow terminal
#: the name is cut first, then the least useful columns go (``drop``: largest first).
_LIST_COLUMNS = (Column("id"), Column("name", cut=True), Column("type", drop=4),
                 Column("status"), Column("health", drop=3), Column("replicas", drop=5),
                 Column("gpus", drop=6), Column("heard", drop=7), Column("age", drop=2),
                 Column("runs", wide=True), Column("created", wide=True))


def _list_row(job: dict, now: float) -> tuple[Any, ...]:
    return (job["id"], job["name"], job["type"], status_label(job["status"]), _health(job),
            _replicas_column(job), job["spec"]["gpus"],
            heard_label(job.get("agents_heard_at"), now),
            age_label(now - job["created_at"]), _runs(job["spec"]), _when(job["created_at"]))


def _watch_option(what: str) -> Any:
    return typer.Option(False, "--watch", "-w", help=f"Keep showing {what} as it changes "
                        f"(from the server's event stream), until Ctrl-C; through a pipe, "
                        f"one line per change.")


@app.command("list")
def list_jobs(team: str | None = _team_option(),
              limit: int = typer.Option(50, "--limit", min=1, max=500,
                                        help="Jobs per page (newest first)."),
              every: bool = typer.Option(False, "--all", "-a",
                                         help="Every job of the team, not one page."),
              watch: bool = _watch_option("the list"),
              server: str | None = server_option(), output: str = output_option(),
              no_headers: bool = no_headers_option(),
              query: str | None = query_option()) -> None:
    """The team's jobs with their live status, newest first.

    Example: cosmicac jobs list --all -o json

    Example: cosmicac jobs list -o name | xargs -n1 cosmicac jobs get

    Example: cosmicac jobs list --query "[?status=='running'].id"

    Example: cosmicac jobs list --watch
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    team_id = resolve_team(api, team)["id"] if team else None

    def listed() -> tuple[list[dict], str | None]:
        jobs: list[dict] = []
        cursor: str | None = None
        for _ in range(10_000):  # pages; the cursor ends it long before
            page = api.get("/jobs", team_id=team_id, limit=str(limit), cursor=cursor)
            jobs.extend(page["jobs"])
            cursor = page.get("next")
            if not every or not cursor:
                break
        return jobs, cursor

    if watch:
        from ._watch import watch_list

        watch_list(api, team_id, lambda: listed()[0], shown, _LIST_COLUMNS, _list_row)
        return
    jobs, cursor = listed()
    if cursor and not every and not shown.is_document:
        err.print(f"more jobs: --all lists every one (or --limit {limit * 2})")
    now = time.time()
    emit(shown, jobs, _LIST_COLUMNS, [_list_row(j, now) for j in jobs],
         names=[j["id"] for j in jobs])


#: ``jobs get``'s columns: the job's, then a table of its replicas.
_GET_COLUMNS = (Column("id"), Column("name", cut=True), Column("type", drop=5),
                Column("status"), Column("health", drop=4), Column("gpus", drop=6),
                Column("runs", cut=True, drop=3), Column("heard", drop=7),
                Column("created", drop=2), Column("reason", cut=True))
_REPLICA_COLUMNS = (Column("replica"), Column("status"), Column("generation", drop=2),
                    Column("nodes", cut=True, drop=1), Column("message", cut=True))


def _show(shown: Output, job: dict, stream: TextIO | None = None) -> None:
    """The job: its document with -o json/yaml/--query, its id with -o name, else a
    job table and a replica table."""
    stream = stream or sys.stdout
    if shown.is_document or shown.mode == "name":
        emit(shown, job, names=[job["id"]], stream=stream)
        return
    now = time.time()
    created = f"{_when(job['created_at'])} ({age_label(now - job['created_at'])} ago)"
    emit(shown, job, _GET_COLUMNS,
         [(job["id"], job["name"], job["type"], status_label(job["status"]), _health(job),
           job["spec"]["gpus"], _runs(job["spec"]),
           heard_label(job.get("agents_heard_at"), now), created, job["reason"])],
         stream=stream)
    stream.write("\n")
    emit(shown, job, _REPLICA_COLUMNS,
         [(r["index"], status_label(r["status"]), r["generation"], ", ".join(r["nodes"]),
           r["message"])
          for r in job["replicas"]], stream=stream)


@app.command("get")
def get(job: str = typer.Argument(..., help="The job's id (see `jobs list`).",
                                  autocompletion=job_ids),
        watch: bool = _watch_option("the job"),
        server: str | None = server_option(), output: str = output_option(),
        no_headers: bool = no_headers_option(),
        query: str | None = query_option()) -> None:
    """A job with its replicas; -o json or -o yaml prints the API's document as it is.

    Example: cosmicac jobs get j-5d1c... -o json

    Example: cosmicac jobs get j-5d1c... -o yaml > job.yaml

    Example: cosmicac jobs get j-5d1c... --query status

    Example: cosmicac jobs get j-5d1c... --watch
    """
    shown = Output.of(output, no_headers, query)
    if watch:
        from ._watch import watch_job

        watch_job(api_for(server), job, shown, lambda j, stream=None: _show(shown, j, stream),
                  _LIST_COLUMNS, _list_row)
        return
    _show(shown, api_for(server).get(_job_path(job)))


def _create_body(api: Api, *, name: str | None, type_: str | None, image: str | None,
                 gpus: int | None, replicas: int | None, runtime: str | None, model: str | None,
                 served_name: str | None, location: str | None,
                 team: str | None, settings: dict[str, Any] | None = None,
                 given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The POST /api/jobs body; one usage line (exit 2) for what is missing or unknown.

    ``given`` is a job file's fields (``-f``, :mod:`._jobfile`, checked there); the
    options given override them, ``--server-args`` the file's arguments and
    ``--server-env`` its variables of the same names.

    The rest (a container job with a model, replicas > 1...) is the API's to refuse:
    its 422 names the field, and the CLI prints it as it is.
    """
    body: dict[str, Any] = dict(given or {})
    options = {"name": name, "type": type_, "image": image, "gpus": gpus,
               "replicas": replicas, "runtime": runtime, "model": model,
               "served_name": served_name, "location": location}
    body.update({key: value for key, value in options.items() if value is not None})
    def in_file(field: str) -> str:
        return f" (or {field}: in the file)" if given is not None else ""

    if not body.get("name"):
        fail(f"--name is required: what to call the job{in_file('name')}", code=USAGE)
    if body.get("type") not in _TYPES:
        fail(f"--type takes container or inference, not {body['type']!r}" if body.get("type")
             else f"--type is required: container or inference{in_file('type')}", code=USAGE)
    if body.get("runtime") is not None and body["runtime"] not in _RUNTIMES:
        fail(f"--runtime takes vllm, parakeet or local, not {body['runtime']!r}", code=USAGE)
    if settings:
        merged = dict(body.get("runtime_settings") or {})
        if "args" in settings:
            merged["args"] = settings["args"]
        if "env" in settings:
            merged["env"] = {**merged.get("env", {}), **settings["env"]}
        body["runtime_settings"] = merged
    if team:
        body["team_id"] = resolve_team(api, team)["id"]
    return body


_SERVER_OPTIONS = server_settings_options()


@app.command("create")
def create(name: str | None = typer.Option(None, "--name", "-n",
                                           help="The job's name (required)."),
           type_: str | None = typer.Option(None, "--type",
                                            help="container or inference (required).",
                                            autocompletion=choices(*_TYPES)),
           image: str | None = typer.Option(
               None, "--image", help="Registry image, docker://host[:port]/repo[:tag]; "
                                     "default: the deployment's default_image, if set."),
           gpus: int | None = typer.Option(
               None, "--gpus", help="GPUs per replica; default: the model master's, else 1."),
           replicas: int | None = typer.Option(
               None, "--replicas", help="Replicas (inference jobs); default: the model "
                                        "master's, else 1."),
           runtime: str | None = typer.Option(None, "--runtime",
                                              help="vllm, parakeet or local (inference).",
                                              autocompletion=choices(*_RUNTIMES)),
           model: str | None = typer.Option(None, "--model",
                                            help="The model to serve (inference).",
                                            autocompletion=model_names),
           served_name: str | None = typer.Option(
               None, "--served-name", help="The name clients ask for (inference; default: "
                                           "the model)."),
           location: str | None = typer.Option(None, "--location",
                                               help="Where to run it; default: default."),
           isolated_network: bool = typer.Option(
               False, "--isolated-network", help="A GPU container on a network of its own, "
               "reached through a WireGuard gateway (see: cosmicac jobs wireguard)."),
           filename: str | None = typer.Option(
               None, "--filename", "-f", metavar="FILE",
               help="The job from a YAML or JSON file (- for stdin): the API's create body, "
                    "or a job document as `jobs get -o yaml` prints it; options given here "
                    "override its fields."),
           dry_run: bool = typer.Option(
               False, "--dry-run", help="Create nothing: show the job as it would be "
               "created and where it would run now, or why it would wait (the server "
               "checks all that a create checks)."),
           server_args: str | None = _SERVER_OPTIONS[0],
           server_env: list[str] | None = _SERVER_OPTIONS[1],
           team: str | None = _team_option(),
           wait: bool = _wait_option("runs"), timeout: float = _timeout_option(),
           server: str | None = server_option(), output: str = output_option()) -> None:
    """Create a job; print its id (with -o json or yaml: the job document, with its id).

    With --wait, the id is printed at once and the command returns when the job
    runs; with --wait -o json, the document is printed then, as it is running.

    Example: JOB=$(cosmicac jobs create --name llm --type inference --runtime local
    --model demo --wait)

    Example: cosmicac jobs create --name box --type container --image
    docker://registry.example/ubuntu-cuda:12.4 --gpus 2 -o json

    Example: cosmicac jobs create --name long --type inference --model
    meta-llama/Llama-3.1-8B --server-args '--max-model-len 32768' --server-env
    VLLM_LOGGING_LEVEL=DEBUG

    Example: cosmicac jobs create -f job.yaml --dry-run

    Example: cosmicac jobs get j-5d1c... -o yaml | cosmicac jobs create -f - --name copy
    """
    check_output(output)
    settings = server_settings(server_args, server_env)
    given = None
    if filename is not None:
        from ._jobfile import JobFileError, load  # here: only -f loads YAML and pydantic

        try:
            given = load(filename, sys.stdin.buffer)
        except JobFileError as exc:
            fail(exc.message, code=USAGE)
    api = api_for(server)
    body = _create_body(api, name=name, type_=type_, image=image, gpus=gpus,
                        replicas=replicas, runtime=runtime, model=model,
                        served_name=served_name, location=location, team=team,
                        settings=settings, given=given)
    if isolated_network:
        body["isolated_network"] = True
    if dry_run:
        from ._jobfile import ask_preview, print_preview

        print_preview(Output.of(output), ask_preview(api, body))
        return
    job = api.post("/jobs", body)
    if output in ("json", "yaml"):
        if wait:
            job = wait_for(api, job["id"], Goal.RUNNING, timeout)
        if output == "json":
            print_json(job)
        else:
            emit(output, job)
        return
    print(job["id"], flush=True)  # before waiting: the caller has it even if we stop
    if wait:
        wait_for(api, job["id"], Goal.RUNNING, timeout)


@app.command("restart")
def restart(job: str = typer.Argument(..., help="The job's id.", autocompletion=job_ids),
            wait: bool = _wait_option("runs again"), timeout: float = _timeout_option(),
            server: str | None = server_option()) -> None:
    """Restart every replica of a job (storage is kept).

    Example: cosmicac jobs restart 5d1c... --wait
    """
    api = api_for(server)
    restarted = api.post(f"{_job_path(job)}/restart")
    err.print(f"restarting job {restarted['id']}: {restarted['status']}")
    if wait:
        wait_for(api, restarted["id"], Goal.RUNNING, timeout)


@app.command("delete")
def delete(job: str = typer.Argument(..., help="The job's id.", autocompletion=job_ids),
           wait: bool = _wait_option("is gone"), timeout: float = _timeout_option(),
           server: str | None = server_option()) -> None:
    """Delete a job; wrk-ork removes its replicas (--wait: until it is gone).

    Example: cosmicac jobs delete 5d1c... --wait
    """
    api = api_for(server)
    answer = api.request("DELETE", _job_path(job))
    if answer["gone"]:
        err.print(f"deleted job {job}")
        return
    err.print(f"deleting job {job}" + ("" if wait else "; --wait waits until it is gone"))
    if wait:
        wait_for(api, job, Goal.GONE, timeout)
        err.print(f"deleted job {job}")


def _replica_path(job: str, replica: int) -> str:
    return f"{_job_path(job)}/replicas/{replica}"


@replicas_app.command("restart")
def restart_replica(job: str = typer.Argument(..., help="The job's id.", autocompletion=job_ids),
                    replica: int = typer.Argument(..., min=0, help="The replica's index."),
                    wait: bool = _wait_option("runs"), timeout: float = _timeout_option(),
                    server: str | None = server_option()) -> None:
    """Restart one replica (while it is queued, pending or starting).

    Example: cosmicac jobs replicas restart 5d1c... 1 --wait
    """
    api = api_for(server)
    restarted = api.post(f"{_replica_path(job, replica)}/restart")
    err.print(f"restarting replica {replica} of job {restarted['id']}")
    if wait:
        wait_for(api, restarted["id"], Goal.RUNNING, timeout)


@replicas_app.command("delete")
def delete_replica(job: str = typer.Argument(..., help="The job's id.", autocompletion=job_ids),
                   replica: int = typer.Argument(..., min=0, help="The replica's index."),
                   server: str | None = server_option()) -> None:
    """Delete one replica (while it is queued, pending or starting); the job keeps
    the others.

    Example: cosmicac jobs replicas delete 5d1c... 1
    """
    api_for(server).request("DELETE", _replica_path(job, replica))
    err.print(f"deleted replica {replica} of job {job}")


#: Longest silence on a followed stream before it counts as broken (keep-alives come
#: every 15 s).
_LOGS_SILENCE_S = 60.0
#: Times ``-f`` subscribes again after ``lagged``.
_LOGS_RESUBSCRIBES = 100


def _log_line(output: str, record: dict[str, Any]) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(record) + "\n")
    else:
        replica = "-" if record.get("replica") is None else record["replica"]
        sys.stdout.write(f"{record['time']}  {record['source']:<11}  {record['service']}  "
                         f"[{replica}]  {record['text']}\n")
    sys.stdout.flush()


def _follow_logs(api: Api, path: str, params: dict[str, str], output: str) -> None:
    """Print the followed records until Ctrl-C; after ``lagged``, follow again right
    after the last record printed (its cursor): nothing missing, nothing twice."""
    import httpx  # here: the other commands start without it

    headers = {"authorization": f"Bearer {api.token}"} if api.token else {}
    timeout = httpx.Timeout(30.0, connect=5.0, read=_LOGS_SILENCE_S)
    cursor: str | None = None
    with httpx.Client(base_url=f"{api.server}/api", timeout=timeout) as client:
        for _ in range(_LOGS_RESUBSCRIBES + 1):
            query = {**params, "follow": "1", **({"after": cursor} if cursor else {})}
            lagged = None
            try:
                with client.stream("GET", path, params=query, headers=headers) as response:
                    if response.status_code != 200:
                        response.read()
                        api._fail(response)
                    reader = SseReader()
                    for line in response.iter_lines():
                        got = reader.line(line)
                        if got is None:
                            continue
                        event, data = got
                        if event == "records":
                            for record in json.loads(data)["records"]:
                                _log_line(output, record)
                            cursor = reader.last_id or cursor
                        elif event == "lagged":
                            lagged = json.loads(data).get("message", "")
                            break
            except httpx.TransportError as exc:
                fail(f"lost the log stream from {api.server}: {exc or type(exc).__name__}",
                     code=UNREACHABLE)
            if lagged is None:
                fail("the server ended the log stream", code=UNREACHABLE)
            err.print(f"following again ({lagged})")
        fail("the log stream kept falling behind; narrow it with --source", code=1)


@app.command("logs")
def logs(job: str = typer.Argument(..., help="The job's id.", autocompletion=job_ids),
         follow: bool = typer.Option(False, "--follow", "-f",
                                     help="Keep printing new records until Ctrl-C."),
         source: str | None = typer.Option(None, "--source", help="system (the platform's "
                                           "steps) or application (the model server)."),
         since: str | None = typer.Option(None, "--since", help="Only records since a "
                                          "duration ago (90, 10m, 2h, 1d) or an RFC 3339 "
                                          "time."),
         limit: int = typer.Option(1000, "--limit", min=1, max=1000,
                                   help="The newest this many records (without -f)."),
         server: str | None = server_option(), output: str = output_option()) -> None:
    """A job's log records (what wrk-monitor still holds: the last ones, then live).

    Example: cosmicac jobs logs 5d1c... -f --source application --since 10m
    """
    check_output(output)
    if source is not None and source not in ("system", "application"):
        fail(f"--source takes system or application, not {source!r}", code=USAGE)
    api = api_for(server)
    path = f"{_job_path(job)}/logs"
    params = {k: v for k, v in (("source", source), ("since", since)) if v}
    try:
        if follow:
            _follow_logs(api, path, params, output)  # ends only by exiting
            return
        body = api.get(path, **params, limit=str(limit))
        for record in body["records"]:
            _log_line(output, record)
        if body.get("more") and output != "json":
            err.print("older records left out: --since or --limit to see others")
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


add_note((list_jobs, get, delete_replica, logs), EXIT_CODES_HELP)
add_note((create, restart, delete, restart_replica), _WAIT_HELP)


@app.command("wireguard")
def wireguard(job: str = typer.Argument(..., help="An isolated job's id.",
                                        autocompletion=container_job_ids),
              output_file: Path | None = typer.Option(
                  None, "--output", "-O", help="Write the config to this file (0600) "
                  "instead of printing it; wg-quick names the interface after it (at most "
                  "15 characters before .conf)."),
              server: str | None = server_option()) -> None:
    """Your WireGuard config for an isolated job's network (wg-quick format).

    Its private key is this CLI's own identity (as an X25519 key), so it never
    leaves this machine; the gateway knows you by the key you logged in with.

    Example: cosmicac jobs wireguard j-5d1c... -O cac0.conf && sudo wg-quick up ./cac0.conf
    """
    from p2p.errors import P2PError
    from p2p.keys import load_or_create_keypair
    from runtime.wireguard import WireGuardError, member_config

    from ._config import config_dir, write_private

    info = api_for(server).get(_job_path(job) + "/wireguard")
    try:
        keypair = load_or_create_keypair(config_dir(None) / "user")
    except P2PError as exc:
        fail(str(exc))
    if keypair.hex != str(info.get("cli_public_key", "")).lower():
        fail("this CLI's key is not the one your account has; run cosmicac login here first")
    try:
        text = member_config(keypair.x25519_private, info["address"],
                             info["gateway_public_key"], info["endpoint"], info["networks"])
    except (WireGuardError, KeyError, TypeError) as exc:
        fail(f"the server's answer cannot make a WireGuard config: {exc}")
    if output_file is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_private(output_file, text)
    err.print(f"wrote {output_file} (0600): wg-quick up {output_file}", markup=False)
