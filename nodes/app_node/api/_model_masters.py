"""Model masters: the platform's catalogue of models, kept in the shared database.

A model master is a name (what a job's ``model`` and an inference request's
``model`` call it), the runtime that serves it and the job fields a job of it
defaults to (:class:`~._models.ModelDefaultsIn`: ``gpus``, ``replicas``,
``image``, ``served_name``, ``location``). It lives in the shared database
(``PutModelMaster`` / ``DeleteModelMaster``), not in app-node's store: every
replica of the database (proxy-inference's, wrk-ork's) reads the same
catalogue, as it reads API keys.

Everyone with a session lists them (choosing a model is part of creating a
job); only platform operators (:func:`~._racks.require_operator`) add,
replace or remove one, as the catalogue is shared by every team.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from contracts.runtime_settings import managed_flag_problem
from crdt import DeleteModelMaster, ModelMaster, PutModelMaster

from .. import codes
from ._common import ApiError, Ctx, ok, validate
from ._models import ModelMasterIn, ModelMasterOut, ModelMastersOut, ModelNameIn
from ._racks import require_operator
from ._spec import RouteSpec


def _out(master: ModelMaster) -> ModelMasterOut:
    return ModelMasterOut(name=master.name, runtime=master.runtime,
                          defaults=dict(master.defaults))


async def list_models(ctx: Ctx, request: Request) -> Response:
    await ctx.session(request)
    masters = await ctx.services.database.model_masters()
    return ok(ModelMastersOut(models=[_out(m) for m in masters]))


async def put_model(ctx: Ctx, request: Request) -> Response:
    """Create (201) or replace (200) the model master of that name."""
    await require_operator(ctx, await ctx.session(request))
    body = await ctx.body(request, ModelMasterIn)
    settings = body.defaults.model_settings
    problem = settings and managed_flag_problem(body.runtime, settings.args)
    if problem:
        raise ApiError(codes.INVALID, f"defaults.model_settings.args: {problem}",
                       "defaults.model_settings.args")
    db = ctx.services.database
    existed = await db.model_master(body.name) is not None
    defaults = body.defaults.model_dump(exclude_none=True)
    await db.append([PutModelMaster(body.name, body.runtime.value, defaults)])
    return ok(ModelMasterOut(name=body.name, runtime=body.runtime.value, defaults=defaults),
              200 if existed else 201)


async def delete_model(ctx: Ctx, request: Request) -> Response:
    await require_operator(ctx, await ctx.session(request))
    name = validate(ModelNameIn, {"name": request.path_params["name"]}).name
    db = ctx.services.database
    if await db.model_master(name) is None:
        raise ApiError(codes.NOT_FOUND, f"no model {name}; see GET /api/models", "name")
    await db.append([DeleteModelMaster(name)])
    return ok()


ROUTES = [
    RouteSpec("GET", "/models", list_models, "The model masters (any session)",
              answer=ModelMastersOut),
    RouteSpec("POST", "/models", put_model,
              "Add or replace a model master (operators; 201 new, 200 replaced)",
              ModelMasterIn, ModelMasterOut, 201),
    RouteSpec("DELETE", "/models/{name:path}", delete_model, "Remove a model master "
              "(operators)", status=204),
]

__all__ = ["ROUTES"]
