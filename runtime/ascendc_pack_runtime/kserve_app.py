"""The application ``ascendc-pack serve`` runs: KServe 0.21's REST server with a fresh FastAPI app.

KServe's ``RESTServer`` registers its routes on the module-global app of
``kserve.model_server``; :class:`AscpackRESTServer` builds its own app instead (nothing global is
changed, and two servers in one process do not share routes) and its own ``uvicorn.Config``
with the limits of :mod:`ascendc_pack_runtime.http_edge`. On that app:

* ``POST /v2/models/<m>/infer`` is this module's route, registered before KServe's: it reads the
  raw body and has the model decode it strictly (:mod:`ascendc_pack_runtime.v2_request`), so
  FastAPI's JSON parsing and pydantic's coercions (``"256"`` -> 256, ``true`` -> 1) never see
  a request. KServe's DataPlane still runs the model (``preprocess``/``predict``/``postprocess``).
* ``GET /v2/models/<m>/stats`` answers inference and execution counts in the form of Triton's
  statistics extension (``get_inference_statistics``).
* ``GET /v2/models/<m>/config`` answers the model's configuration in Triton's JSON form
  (:func:`ascendc_pack_runtime.triton_config.model_config`: what tritonclient's
  ``get_model_config`` reads).
* The other V2 routes (health, server and model metadata, model ready) and V1 are KServe's,
  behind :class:`AscpackDataPlane` (model names checked, version ``1``). ``GET /v2`` lists the
  extensions this server serves: ``binary_tensor_data``, ``model_configuration`` and ``statistics``, not KServe's
  ``model_repository_extension`` (the repository API is refused with 403, :mod:`.http_edge`).
* Client errors are ``{"error": ...}`` logged in one line without a traceback; server errors
  keep KServe's handlers.

Importing this module imports KServe (see :mod:`ascendc_pack_runtime.kserve_model`).
"""

from __future__ import annotations

from typing import Sequence

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from kserve.errors import InvalidInput, ModelNotFound, ModelNotReady, ServerNotReady
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.rest.server import RESTServer
from starlette.exceptions import HTTPException as StarletteHTTPException

from .http_edge import EdgeLimits, V2Middleware, log_refusal, protocol_factory
from .v2 import short
from .v2_request import IHCL


SERVED_EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
"""The V2 / Triton protocol extensions this server answers (``GET /v2``)."""


class _NotServed(ModelNotFound):
    def __init__(self, name: str, served: Sequence[str]):
        self.reason = f"model {short(name)} is not served here; this server serves {sorted(served)}"


class AscpackDataPlane(DataPlane):
    """KServe's DataPlane with the checks and names this server adds."""

    def _check_served(self, name: str) -> None:
        if self._model_registry.get_model(name) is None:
            raise _NotServed(name, list(self._model_registry.get_models()))

    def get_model_from_registry(self, name: str):
        self._check_served(name)
        return super().get_model_from_registry(name)

    async def get_model(self, name: str):
        self._check_served(name)
        return await super().get_model(name)

    async def model_ready(self, model_name: str, disable_predictor_health_check: bool = False) -> bool:
        self._check_served(model_name)
        return await super().model_ready(model_name, disable_predictor_health_check)

    def metadata(self) -> dict:
        d = super().metadata()
        d["extensions"] = list(SERVED_EXTENSIONS)   # not model_repository_extension: that API is 403 here
        return d

    async def ready(self) -> bool:
        models = self._model_registry.get_models()
        return bool(models) and all([await m.healthy() for m in models.values()])

    async def model_metadata(self, model_name: str) -> dict:
        d = await super().model_metadata(model_name)
        model = self.get_model_from_registry(model_name)
        d["versions"] = ["1"]
        d["platform"] = getattr(model, "platform", "")
        return d


def infer_route(dataplane: AscpackDataPlane):
    """``POST /v2/models/{model_name}/infer``: raw body -> the model's strict decoder -> DataPlane."""

    async def infer(request: Request, model_name: str) -> Response:
        model = dataplane.get_model_from_registry(model_name)
        if not await dataplane.model_ready(model_name, True):
            raise ModelNotReady(model_name)
        if len(request.headers.getlist(IHCL)) > 1:
            raise InvalidInput("the header Inference-Header-Content-Length is given more than once")
        headers = dict(request.headers.items())  # lower-case names
        payload = model.decode(await request.body(), headers)
        body, response_headers = await dataplane.infer(model_name, payload, headers)
        length = response_headers.get(IHCL)
        if length is None:
            return Response(body, media_type="application/json")
        return Response(body, media_type="application/octet-stream", headers={IHCL: length})

    return infer


def config_route(dataplane: AscpackDataPlane):
    """``GET /v2/models/{model_name}/config``: the model's configuration (Triton's JSON form)."""

    async def config(model_name: str) -> Response:
        model = dataplane.get_model_from_registry(model_name)
        return JSONResponse(model.triton_config())

    return config


def stats_route(dataplane: AscpackDataPlane):
    """``GET /v2/models/{model_name}/stats``: inference and execution counts (Triton's form)."""

    async def stats(model_name: str) -> Response:
        return JSONResponse(dataplane.get_model_from_registry(model_name).statistics())

    return stats


def _client_error(status: int):
    async def handler(request: Request, exc: Exception):
        message = str(exc)
        log_refusal(status, message, request.client and tuple(request.client), request.url.path)
        return JSONResponse(status_code=status, content={"error": message})
    return handler


async def _validation_error(request: Request, exc: RequestValidationError):
    parts = []
    for e in list(exc.errors())[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg')}")
    return await _client_error(400)(request, ValueError("invalid request: " + "; ".join(parts)))


async def _http_error(request: Request, exc: StarletteHTTPException):
    response = await _client_error(exc.status_code)(request, ValueError(str(exc.detail)))
    response.headers.update(getattr(exc, "headers", None) or {})
    return response


class AscpackRESTServer(RESTServer):
    """KServe's REST server on a fresh app with this server's uvicorn settings.

    Args:
        dataplane / repository_extension: the ``kserve.ModelServer``'s.
        host, port, access_log, timeout_keep_alive_s, limit_concurrency: uvicorn settings.
        limits: the HTTP edge's limits (header/body timeouts, sizes).
    """

    def __init__(self, dataplane: AscpackDataPlane, repository_extension, *, host: str, port: int,
                 limits: EdgeLimits, access_log: bool, timeout_keep_alive_s: float, limit_concurrency: int,
                 grace_period_s: int = 5):
        super().__init__("unused:app", dataplane, repository_extension, port, workers=1,
                         grace_period=grace_period_s)
        self.limits = limits
        self.app = FastAPI(title="ascendc-pack model server (KServe)", docs_url=None, redoc_url=None,
                           openapi_url=None)
        self.config = uvicorn.Config(
            self.app, host=host, port=port, log_config=None, access_log=access_log,
            timeout_graceful_shutdown=grace_period_s, timeout_keep_alive=timeout_keep_alive_s,
            limit_concurrency=limit_concurrency, http=protocol_factory(limits))
        self._server = uvicorn.Server(self.config)

    def create_application(self) -> None:
        app = self.app
        app.add_api_route("/v2/models/{model_name}/infer", infer_route(self.dataplane), methods=["POST"],
                          response_model=None)
        app.add_api_route("/v2/models/{model_name}/config", config_route(self.dataplane), methods=["GET"],
                          response_model=None)
        app.add_api_route("/v2/models/{model_name}/stats", stats_route(self.dataplane), methods=["GET"],
                          response_model=None)
        self._add_middlewares(app)
        self._register_endpoints(app)  # KServe's routes; the infer route above comes first
        self._add_exception_handlers(app)
        for exc, status in ((InvalidInput, 400), (ModelNotFound, 404), (ModelNotReady, 503), (ServerNotReady, 503)):
            app.add_exception_handler(exc, _client_error(status))
        app.add_exception_handler(RequestValidationError, _validation_error)
        app.add_exception_handler(StarletteHTTPException, _http_error)
        app.add_middleware(V2Middleware, limits=self.limits)  # outermost: runs before anything else


__all__ = ["AscpackDataPlane", "AscpackRESTServer", "infer_route", "config_route", "stats_route", "SERVED_EXTENSIONS"]
