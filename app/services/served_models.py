"""The models a deployment serves: those `OVERNIGHT_MODELS` lists and those its workers announce.

A ready worker announces its served names, the endpoints vLLM built for its model and the LoRA
adapters it serves (`--lora-modules`, and `--lora-dir`'s, loaded on first use) in its `workers`
row; a switching worker (`--models`) also the models it loads by demand, announced while it
loads any of them. A name stays served while
a worker that served it was seen within `served_model_memory_seconds`, so a batch sent while
that worker restarts (the old row stopped, the new one still loading) is taken and waits for
it; a worker still loading counts while its heartbeat is fresh, its endpoints not known yet.
An announced model's endpoints are what its workers serve; a listed model no worker announced
keeps its listed ones. An adapter serves its base model's endpoints, and a batch may mix lines
for a base model and its adapters: the batch's model is the base.

`pin_models` pins the list: only the listed models, with their listed endpoints, and the
adapters workers loaded for them.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import RegisteredWorker
from app.db.session import read_scope
from app.endpoints import GENERATIVE, POOLING, SPEECH
from app.schemas.models import ModelObject, announcement_in

# Listed models are configuration, not objects with a history: they exist since this process
# started.
_STARTED_AT = int(time.time())
# Endpoints in the order the settings list them for each kind of model.
_ORDER = [*GENERATIVE, *POOLING, *SPEECH]


@dataclass
class Servable:
    name: str
    created: int
    # None: only a loading worker announced it; its worker answers a line it cannot serve.
    endpoints: list[str] | None
    # A LoRA adapter's base model (its batches' model) and source.
    parent: str | None = None
    root: str | None = None

    @property
    def base(self) -> str:
        return self.parent or self.name


def servable(session: Session, settings: Settings) -> list[Servable]:
    """Every served model: the listed ones in their order, then the announced ones by name."""
    found = {m.name: Servable(m.name, _STARTED_AT, list(m.endpoints)) for m in settings.models}
    announced: dict[str, Servable] = {}
    for entry in _announced(session, settings):
        if settings.pin_models and (entry.parent or entry.name) not in found:
            continue
        model = announced.setdefault(entry.name, entry)
        model.created = min(model.created, entry.created)
        if entry.endpoints is not None:
            model.endpoints = _in_order(set(model.endpoints or []) | set(entry.endpoints))
    for name, model in sorted(announced.items()):
        listed = found.get(name)
        if listed is None:
            found[name] = model
        elif model.endpoints is not None and not settings.pin_models:
            listed.endpoints = model.endpoints
    return list(found.values())


def read(settings: Settings) -> list[Servable]:
    """`servable` in a read-only transaction of its own (validation reads files outside one)."""
    with read_scope(settings) as session:
        return servable(session, settings)


def model_objects(session: Session, settings: Settings) -> list[ModelObject]:
    return [_object(m) for m in servable(session, settings)]


def model_object(session: Session, settings: Settings, name: str) -> ModelObject | None:
    found = named(servable(session, settings), name)
    return None if found is None else _object(found)


def named(models: list[Servable], name: str) -> Servable | None:
    return next((m for m in models if m.name == name), None)


def problem(
    models: list[Servable], settings: Settings, name: str, endpoint: str, shown: str
) -> tuple[str, str] | None:
    """Why a batch for `endpoint` may not name this model (an error code and message), if so.

    `shown`: the name as the message may quote it (a tenant's name may be long).
    """
    model = named(models, name)
    if model is None:
        served = ", ".join(m.name for m in models) or "none"
        return "model_not_found", f"{_not_served(shown, settings)} Served models: {served}."
    if model.endpoints is not None and endpoint not in model.endpoints:
        return (
            "model_endpoint_mismatch",
            f"The model {shown} does not serve {endpoint}; "
            f"it serves {', '.join(model.endpoints) or 'no batch endpoint'}.",
        )
    return None


def _not_served(shown: str, settings: Settings) -> str:
    if settings.pin_models:
        return (
            f"The model {shown} is not served by this deployment: OVERNIGHT_MODELS does not "
            "list it (nor a base model it is an adapter of), and OVERNIGHT_PIN_MODELS serves "
            "only the models it lists."
        )
    hours = settings.served_model_memory_seconds / 3600
    return (
        f"The model {shown} is not served by this deployment: no worker serves it (none "
        f"announced it in the last {hours:g} h) and OVERNIGHT_MODELS does not list it."
    )


def _announced(session: Session, settings: Settings) -> Iterator[Servable]:
    """Each name (and adapter) each counted worker announced, with its endpoints if known.

    Heartbeats are the workers' own clocks: a memory of hours makes their skew irrelevant.
    """
    now = time.time()
    w = RegisteredWorker
    seen = and_(
        w.ready_at.is_not(None), w.heartbeat_at >= now - settings.served_model_memory_seconds
    )
    loading = and_(
        w.ready_at.is_(None), w.stopped_at.is_(None), w.heartbeat_at >= now - settings.lease_seconds
    )
    rows = session.execute(
        select(w.model, w.engine_configuration, w.started_at).where(or_(seen, loading))
    )
    for model, configuration, started_at in rows:
        created = int(started_at)
        announcement = announcement_in(configuration)
        if announcement is None:
            yield Servable(model, created, None)
            continue
        endpoints = announcement.endpoints
        yield from (Servable(name, created, list(endpoints)) for name in announcement.names)
        for adapter in announcement.adapters:
            yield Servable(adapter.name, created, list(endpoints), adapter.parent, adapter.root)
        for standby in announcement.standby:
            known = None if standby.endpoints is None else list(standby.endpoints)
            yield Servable(standby.name, created, known)


def _in_order(endpoints: set[str]) -> list[str]:
    return [e for e in _ORDER if e in endpoints]


def _object(model: Servable) -> ModelObject:
    return ModelObject(
        id=model.name,
        created=model.created,
        endpoints=model.endpoints or [],
        parent=model.parent,
        root=model.root,
    )
