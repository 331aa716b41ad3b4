"""Which model a name means, for allow-lists: any name of a model allows all of its names.

A name means one or more *identities*: the route a route name or alias belongs to (its public
name), and the catalog id of a catalog id, name or alias (a LoRA adapter's identity is its own
name: it is a model of its own, listed with its base as `parent`). A name that neither knows
stands for itself (the request then gets its 404 past the allow-list).

An allow-list entry names a model: a request is allowed when the name it sends means an
identity that some entry means. So a key created with `--models smollm2` may call the catalog
id `smollm2-135m-instruct`, its alias `default-chat` and its name, and a key listing the id may
call every alias. The request path (step 3, gateway/request_path.py) and the model listings
(api/listing.py: `/v1/models` shows exactly what a key may call) both ask `allows`.
"""

from __future__ import annotations

from collections.abc import Callable

from modelyard.gateway.base import ModelRouter, Principal
from modelyard.manager.base import ModelNotFoundError
from modelyard.model_spec import ModelSpec


class ModelNames:
    """Names -> identities over one router and one catalog (`spec_of`: the provider's `spec`)."""

    def __init__(self, router: ModelRouter, spec_of: Callable[[str], ModelSpec]) -> None:
        self.router = router
        self._spec_of = spec_of

    def identities(self, name: str) -> frozenset[str]:
        """The route and the catalog model `name` means; {name} when it means neither."""
        found: set[str] = set()
        route = self.router.resolve(name)
        if route is not None:
            found.add(route)
        spec = self.spec(name)
        if spec is not None:
            found.add(spec.id)
        return frozenset(found or {name})

    def allows(self, principal: Principal, name: str) -> bool:
        """Whether the principal's allow-list names a model that `name` means."""
        if principal.allowed_models is None:
            return True
        wanted = self.identities(name)
        return any(wanted & self.identities(entry) for entry in principal.allowed_models)

    def spec(self, name: str) -> ModelSpec | None:
        """The catalog entry `name` means, or None."""
        try:
            return self._spec_of(name)
        except ModelNotFoundError:
            return None
