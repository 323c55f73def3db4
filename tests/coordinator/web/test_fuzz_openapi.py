"""The published API description and schemathesis against it.

``docs/openapi.yaml`` is the source; ``coordinator/web/data/openapi.json`` is the
same document as JSON, packaged and served at ``GET /openapi.json``. These
tests keep the document, the packaged copy, the app's routes and the message
Structs in step, then fuzz every documented operation through it: the
operator API with the admin token, the agent API signed per request (a
``requests`` auth hook signs the exact bytes schemathesis sends).
"""

from __future__ import annotations

import json
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable

from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app, openapi_document
from vast_manager.protocol import messages

from support.coord_support import ADMIN, ADMIN_TOKEN, hello_msg, make_settings
from support.fakes_provider import FakeProvider, offer
from support.fault_support import SignedAuth, ThreadedCoordinator
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
DOCS_YAML = ROOT / "docs" / "openapi.yaml"
PACKAGED = ROOT / "src" / "vast_manager" / "coordinator" / "web" / "data" / "openapi.json"
REGENERATE = "regenerate the packaged copy: python -m vast_manager.docs"
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")


def load_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(DOCS_YAML.read_text())
    return doc


# --- the document is in step ---------------------------------------------------------------


def test_packaged_copy_is_the_docs_yaml() -> None:
    assert json.loads(PACKAGED.read_text()) == load_doc(), REGENERATE
    assert json.loads(openapi_document()) == load_doc(), "the served document"


def test_every_route_is_documented_and_every_documented_operation_routed(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "coord.db")
    try:
        app = create_app(make_settings(tmp_path), store, FakeProvider(), run_monitor=False)
        routed = {
            (route.resource.canonical, route.method.lower())
            for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"  # HEAD comes with GET
        }
    finally:
        store.close()
    documented = {
        (path, method)
        for path, item in load_doc()["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }
    assert routed - documented == set(), "routes missing from docs/openapi.yaml"
    assert documented - routed == set(), "documented operations the app does not route"


def test_every_result_flag_is_documented() -> None:
    from vast_manager.coordinator.decisions.policy import RESULT_FLAGS

    stored = load_doc()["components"]["schemas"]["StoredResult"]
    assert stored["properties"]["flags"]["items"]["enum"] == list(RESULT_FLAGS)


def _schema_for(tp: Any) -> dict[str, Any]:
    """The JSON Schema of one message field, from the same annotations the decoder reads."""
    meta: dict[str, Any] = {}
    while get_origin(tp) is Annotated:
        tp, *extras = get_args(tp)
        meta.update({k: getattr(m, k) for m in extras for k in ("ge", "max_length")
                     if getattr(m, k, None) is not None})
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        schema = _schema_for(inner)
        if "$ref" in schema:
            return {"anyOf": [schema, {"type": "null"}]}
        out = {**schema, "type": [schema["type"], "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    if origin is list:
        (item,) = get_args(tp)
        out = {"type": "array", "items": _schema_for(item)}
        if "max_length" in meta:
            out["maxItems"] = meta["max_length"]
        return out
    if origin is Literal:
        return {"type": "string", "enum": list(get_args(tp))}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "maximum": 2**63 - 1, "minimum": meta["ge"]}
    if tp is float:
        # Every float is bounded to the finite ones; only a lower bound of its own is shown.
        low = meta["ge"]
        return {"type": "number", **({"minimum": low} if low != -messages.FLOAT_MAX else {})}
    if tp is str:
        return {"type": "string", "maxLength": meta["max_length"]}
    assert isinstance(tp, type) and issubclass(tp, messages.Message), tp
    return {"$ref": f"#/components/schemas/{tp.__name__}"}


def _without_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    return value


MESSAGE_TYPES = [
    messages.Gpu, messages.HostInfo, messages.Hello, messages.GpuTelemetry,
    messages.CpuTelemetry, messages.RamTelemetry, messages.NetTelemetry, messages.CuzkWorker,
    messages.CuzkTelemetry, messages.Telemetry, messages.Progress, messages.Heartbeat,
    messages.ScalingRun, messages.Result, messages.LogLine, messages.LogBatch,
    messages.Directive, messages.ResultAck,
]


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_message_schemas_follow_the_messages(cls: type) -> None:
    documented = load_doc()["components"]["schemas"][cls.__name__]
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = msgspec.structs.fields(cls)
    expected_props = {f.name: _schema_for(hints[f.name]) for f in fields}
    required = [f.name for f in fields if f.required]
    assert _without_descriptions(documented["properties"]) == expected_props
    assert documented["required"] == required


async def test_served_at_openapi_json_without_a_token(aiohttp_client: Any, tmp_path: Path) -> None:
    store = Store(tmp_path / "coord.db")
    app = create_app(make_settings(tmp_path), store, FakeProvider(), run_monitor=False)
    app.on_cleanup.append(lambda _app: _close(store))
    client = await aiohttp_client(app)
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    assert orjson.loads(await resp.read()) == load_doc()
    assert ADMIN_TOKEN.encode() not in await resp.read()


async def _close(store: Store) -> None:
    store.close()


def test_document_loads_as_openapi_3_1() -> None:
    import schemathesis

    schema = schemathesis.openapi.from_dict(load_doc())
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == sum(
        1 for item in load_doc()["paths"].values() for m in item if m in HTTP_METHODS
    )


# --- schemathesis --------------------------------------------------------------------------


def run_schemathesis(tmp_path: Path, budget: int) -> Counter[str]:
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    provider = FakeProvider([offer(9001, 41001), offer(9002, 41002, num_gpus=2)])
    schema = schemathesis.openapi.from_dict(load_doc())
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    # Agent operations first: an operator case may destroy the fuzzing agent's instance.
    operations.sort(key=lambda op: (not op.path.startswith("/v1/"), op.path, op.method))
    outcomes: Counter[str] = Counter()
    # Negative cases send wrong admin tokens: throttling them (test_adversarial_http.py)
    # would turn every later operator case into a 429.
    with ThreadedCoordinator(tmp_path, provider=provider, nonces_per_agent=1_000_000,
                             admin_failures_per_minute=1_000_000) as coord:
        agent_id, key = coord.issue_agent("schemathesis-rig", gpus=16)
        status, raw, _ = coord.post_signed(agent_id, key, "/v1/hello",
                                           orjson.dumps(hello_msg("boot-st")))
        assert status == 200, raw
        auth = SignedAuth(agent_id, key)
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz_operation(coord, auth, operation, mode, budget, checks, outcomes)
    return outcomes


def fuzz_operation(coord: ThreadedCoordinator, auth: SignedAuth, operation: Any, mode: Any,
                   budget: int, checks: list[Any], outcomes: Counter[str]) -> None:
    """``budget`` schemathesis cases of one operation in one generation mode."""
    agent_api = operation.path.startswith("/v1/")

    @seed(20240605)
    @settings(max_examples=budget, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: Any) -> None:
        before = coord.rows()
        if agent_api:
            response = case.call(base_url=coord.url, auth=auth, timeout=10)
        else:
            response = case.call(base_url=coord.url, headers=dict(ADMIN), timeout=10)
        status = response.status_code
        key = f"{operation.method.upper()} {operation.path} {mode.value} {status}"
        outcomes[key] += 1
        assert status < 500, (key, response.text[:300])
        if status >= 400:
            assert coord.rows() == before, (key, response.text[:300])
            assert set(response.json()) >= {"error", "message"}
        case.validate_response(response, checks=checks)

    try:
        fuzz()
    except Unsatisfiable:
        # Nothing to make invalid (no parameters, no body): no negative cases exist.
        if mode.value != "negative":
            raise


def test_schemathesis_quick(tmp_path: Path) -> None:
    outcomes = run_schemathesis(tmp_path, budget=6)
    print(f"schemathesis (quick): {sum(outcomes.values())} cases")
    assert sum(outcomes.values()) >= 6 * 20


@pytest.mark.slow
def test_schemathesis_full_budget(tmp_path: Path) -> None:
    outcomes = run_schemathesis(tmp_path, budget=40)
    total = sum(outcomes.values())
    print(f"schemathesis: {total} cases; by status: "
          f"{Counter(k.rsplit(' ', 1)[1] for k in outcomes.elements())}")
    assert total >= 20 * 40
