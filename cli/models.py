"""``cosmicac models``: the platform's model masters (the catalogue jobs choose from).

Everyone logged in lists them; adding, replacing and removing one is for
platform operators (owners and admins of the first admin's team), as the
catalogue is shared by every team. ``add`` on an existing name replaces it.
"""

from __future__ import annotations

from urllib.parse import quote

import typer

from ._args import count_option
from ._completion import choices, model_names
from ._console import err, fail
from ._output import Column, Output, no_headers_option, query_option
from ._server_settings import server_settings, server_settings_options
from .session import (
    EXIT_CODES_HELP,
    USAGE,
    api_for,
    check_output,
    emit,
    output_option,
    server_option,
)

__all__ = ["app"]

app = typer.Typer(help=f"Model masters: list, add (or replace), remove. {EXIT_CODES_HELP}",
                  no_args_is_help=True)

_RUNTIMES = ("vllm", "parakeet", "local")
_COLUMNS = (Column("name"), Column("runtime"), Column("gpus", drop=3),
            Column("replicas", drop=4), Column("image", cut=True, drop=1),
            Column("served name", cut=True), Column("location", drop=2))


def _row(model: dict) -> tuple:
    defaults = model["defaults"]
    return (model["name"], model["runtime"], defaults.get("gpus"), defaults.get("replicas"),
            defaults.get("image"), defaults.get("served_name"), defaults.get("location"))


@app.command("list")
def list_models(server: str | None = server_option(), output: str = output_option(),
                no_headers: bool = no_headers_option(),
                query: str | None = query_option()) -> None:
    """The model masters with the defaults a job of each gets.

    Example: cosmicac models list -o json
    """
    shown = Output.of(output, no_headers, query)
    models = api_for(server).get("/models")["models"]
    emit(shown, models, _COLUMNS, [_row(m) for m in models])


_SERVER_OPTIONS = server_settings_options()


@app.command("add")
def add(
    name: str = typer.Argument(..., help="The model's name, as jobs and requests call it "
                                         "(e.g. meta-llama/Llama-3.1-8B)."),
    runtime: str = typer.Option(..., "--runtime", "-r", help="vllm, parakeet or local.",
                                autocompletion=choices(*_RUNTIMES)),
    gpus: int | None = count_option(None, "--gpus", maximum=64,
                                    help="GPUs per replica a job gets by default."),
    replicas: int | None = count_option(None, "--replicas", maximum=64,
                                        help="Replicas a job gets by default."),
    image: str | None = typer.Option(None, "--image",
                                     help="Default image, docker://host/repo:tag."),
    served_name: str | None = typer.Option(None, "--served-name",
                                           help="Default name requests use for it."),
    location: str | None = typer.Option(None, "--location", help="Default location."),
    server_args: str | None = _SERVER_OPTIONS[0],
    server_env: list[str] | None = _SERVER_OPTIONS[1],
    hub_token_secret: str | None = typer.Option(
        None, "--hub-token-secret", help="The Kubernetes Secret (key 'token') with the "
        "model hub's token for gated models; on the local and qemu backends the worker's "
        "secrets/NAME/token file."),
    server: str | None = server_option(), output: str = output_option(),
) -> None:
    """Add a model master, or replace the one of that name (operators).

    Example: cosmicac models add meta-llama/Llama-3.1-8B --runtime vllm --gpus 2 \\
      --image docker://registry.example/vllm:0.6

    Example: cosmicac models add meta-llama/Llama-3.1-70B --runtime vllm --gpus 8 \\
      --server-args '--max-model-len 8192 --dtype bfloat16' --hub-token-secret hf-token
    """
    if runtime not in _RUNTIMES:
        fail(f"--runtime takes vllm, parakeet or local, not {runtime!r}", code=USAGE)
    check_output(output)
    settings = server_settings(server_args, server_env)
    if hub_token_secret:
        settings["hub_token_secret"] = hub_token_secret
    given = {"gpus": gpus, "replicas": replicas, "image": image, "served_name": served_name,
             "location": location, "model_settings": settings or None}
    model = api_for(server).post("/models", {
        "name": name, "runtime": runtime,
        "defaults": {k: v for k, v in given.items() if v is not None}})
    emit(output, model, _COLUMNS, [_row(model)])


@app.command("remove")
def remove(name: str = typer.Argument(..., help="The model's name.", autocompletion=model_names),
           server: str | None = server_option()) -> None:
    """Remove a model master (operators); running jobs of it are not touched.

    Example: cosmicac models remove meta-llama/Llama-3.1-8B
    """
    api_for(server).request("DELETE", f"/models/{quote(name, safe='/')}")
    err.print(f"removed {name}")
