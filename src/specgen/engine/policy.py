"""Provider policy: which answering providers / quantizations are acceptable.

The `provider` object is sent to the API as configured (OpenRouter filters on its side); the
engine checks every answer again, because routing can fall back, names drift, and a bad
quantization silently poisons a training set. An answer from outside the policy is rejected (its
cost still counted) and the request retried.

The endpoint list (`GET /models/{model}/endpoints`) maps provider names to their endpoints'
slugs, quantizations and prices. A provider with several endpoints (say fp4 and fp8) is
accepted when at least one of them is allowed: the response does not say which one served it,
and OpenRouter applies the same filter when routing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Endpoint:
    provider_name: str
    tag: str  # slug used by only/ignore, e.g. "deepinfra/fp4"
    quantization: str  # "unknown" when the list does not say
    prompt_price: float | None  # USD per token
    completion_price: float | None
    max_completion_tokens: int | None = None

    @property
    def base_slug(self) -> str:
        return self.tag.split("/", 1)[0]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _price(value: Any) -> float | None:
    try:
        price = float(value)
    except (TypeError, ValueError):
        return None
    return price if price >= 0 else None


def parse_endpoints(payload: Any) -> list[Endpoint]:
    """Endpoints from a `/models/{model}/endpoints` answer (parsed defensively)."""
    data = payload.get("data", payload) if isinstance(payload, dict) else payload
    items = data.get("endpoints", []) if isinstance(data, dict) else data
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        name = str(item.get("provider_name") or item.get("name") or "")
        tag = str(item.get("tag") or _norm(name))
        if not name and not tag:
            continue
        pricing = item.get("pricing") if isinstance(item.get("pricing"), dict) else {}
        mct = item.get("max_completion_tokens")
        out.append(Endpoint(
            provider_name=name or tag, tag=tag,
            quantization=str(item.get("quantization") or "unknown").lower(),
            prompt_price=_price(pricing.get("prompt")),
            completion_price=_price(pricing.get("completion")),
            max_completion_tokens=mct if isinstance(mct, int) else None,
        ))
    return out


class ProviderPolicy:
    """The configured provider object as an answer filter."""

    def __init__(self, provider: dict[str, Any], endpoints: Iterable[Endpoint] = ()):
        self.ignore = [s.lower() for s in provider.get("ignore") or []]
        only = [s.lower() for s in provider.get("only") or []]
        if provider.get("allow_fallbacks") is False and provider.get("order"):
            only = only or [s.lower() for s in provider["order"]]
        self.only = only
        self.quantizations = {q.lower() for q in provider.get("quantizations") or []}
        mp = provider.get("max_price") if isinstance(provider.get("max_price"), dict) else {}
        # USD per token, as the endpoint list gives prices (max_price is per million)
        self.max_price = {k: float(mp[k]) / 1e6 for k in ("prompt", "completion") if k in mp}
        self.endpoints = list(endpoints)
        # Providers taken out during the run (quality policing, `specgen provider
        # --exclude`): name as given -> {"by", "reason", "at", ...}; added to `ignore`.
        self.excluded: dict[str, dict[str, Any]] = {}

    @property
    def active(self) -> bool:
        return bool(self.ignore or self.only or self.quantizations or self.excluded
                    or self.max_price)

    # -- exclusions ---------------------------------------------------------------------------
    def exclude(self, name: str, info: dict[str, Any]) -> None:
        self.excluded[name] = {**info, "slug": self.slug_for(name)}

    def allow(self, name: str) -> str | None:
        """Put an excluded provider back; returns the name it was excluded under (or None)."""
        for key in list(self.excluded):
            if _norm(key) == _norm(name) or _norm(self.excluded[key].get("slug", "")) == \
                    _norm(name):
                del self.excluded[key]
                return key
        return None

    def is_excluded(self, provider: str) -> bool:
        if not self.excluded:
            return False
        eps = self.endpoints_of(provider)
        for key, info in self.excluded.items():
            slug = info.get("slug") or key
            if _norm(key) == _norm(provider) or _norm(slug) == _norm(provider) or any(
                    self._slug_matches(slug, ep) for ep in eps):
                return True
        return False

    def slug_for(self, name: str) -> str:
        """The slug OpenRouter's `ignore` takes for a provider named as answers name it."""
        eps = self.endpoints_of(name)
        return eps[0].base_slug if eps else name

    def provider_object(self, base: dict[str, Any] | None) -> dict[str, Any]:
        """The request's `provider` object with the excluded providers added to `ignore`."""
        obj = dict(base or {})
        ignore = list(obj.get("ignore") or [])
        for key, info in self.excluded.items():
            slug = info.get("slug") or key
            if slug not in ignore:
                ignore.append(slug)
        obj["ignore"] = ignore
        return obj

    # -- quantization -------------------------------------------------------------------------
    def declared_quantization(self, provider: str | None) -> str | None:
        """What the endpoint list says served an answer of `provider`: the quantization of its
        allowed endpoints (all of them when none is allowed), joined with "+" when several;
        "unknown" for a provider the list lacks; None without a list or a provider."""
        if not provider or not self.endpoints:
            return None
        eps = self.endpoints_of(provider)
        if not eps:
            return "unknown"
        allowed = [ep for ep in eps if self.endpoint_allowed(ep)] or eps
        return "+".join(sorted({ep.quantization for ep in allowed}))

    def quantization_mismatch(self, provider: str | None, revealed: str | None) -> bool:
        """The answer says it was served at a quantization none of its provider's listed
        endpoints declares."""
        if not provider or not revealed:
            return False
        eps = self.endpoints_of(provider)
        return bool(eps) and revealed.lower() not in {ep.quantization for ep in eps}

    # -- matching -----------------------------------------------------------------------------
    @staticmethod
    def _slug_matches(slug: str, ep: Endpoint) -> bool:
        if "/" in slug:
            return _norm(slug) == _norm(ep.tag)
        return _norm(slug) in (_norm(ep.base_slug), _norm(ep.provider_name))

    @staticmethod
    def _slug_names(slug: str, provider: str) -> bool:
        return "/" not in slug and _norm(slug) == _norm(provider)

    def endpoint_allowed(self, ep: Endpoint) -> bool:
        if any(self._slug_matches(s, ep) for s in self.ignore):
            return False
        if self.excluded and any(self._slug_matches(info.get("slug") or key, ep)
                                 for key, info in self.excluded.items()):
            return False
        if self.only and not any(self._slug_matches(s, ep) for s in self.only):
            return False
        if self.quantizations and ep.quantization not in self.quantizations:
            return False
        return self.within_price(ep)

    def within_price(self, ep: Endpoint) -> bool:
        """Whether the endpoint's listed prices are within `max_price` (unknown: yes)."""
        for side, price in (("prompt", ep.prompt_price), ("completion", ep.completion_price)):
            cap = self.max_price.get(side)
            if cap is not None and price is not None and price > cap * (1 + 1e-9):
                return False
        return True

    def endpoints_of(self, provider: str) -> list[Endpoint]:
        key = _norm(provider)
        return [ep for ep in self.endpoints
                if key in (_norm(ep.provider_name), _norm(ep.base_slug), _norm(ep.tag))]

    def routable_without(self, names: Iterable[str]) -> bool:
        """Whether an endpoint the policy allows remains once `names` (as answers name their
        providers) are excluded too. Without an endpoint list: yes (the answers of other
        providers, which the blame rule asks for, show there are some)."""
        if not self.endpoints:
            return True
        gone = [ep for n in names for ep in self.endpoints_of(n)]
        return any(ep not in gone for ep in self.allowed_endpoints())

    def allowed_endpoints(self) -> list[Endpoint]:
        return [ep for ep in self.endpoints if self.endpoint_allowed(ep)]

    # -- the check ----------------------------------------------------------------------------
    def rejection(self, provider: str | None, quantization: str | None = None) -> str | None:
        """Why an answer from `provider` must be rejected, or None when it is acceptable.
        `quantization`: what the answer says served it, checked against the allow-list.

        An answer naming no provider (a local server) cannot be checked: it is accepted when
        there is no endpoint list, but with a list and a quantization allow-list (or `only`)
        it cannot be shown to be allowed and is rejected (`""`, null or a list as provider).
        """
        if not self.active:
            return None
        if not provider:
            if self.endpoints and self.quantizations and "unknown" not in self.quantizations:
                return "quantization:unknown"
            if self.endpoints and self.only:
                return "provider_not_allowed"
            return None
        if any(self._slug_names(s, provider) for s in self.ignore):
            return "provider_ignored"
        if self.is_excluded(provider):
            return "provider_excluded"
        why = self._listed_rejection(provider)
        if why is None and quantization and self.quantizations \
                and quantization.lower() not in self.quantizations:
            return f"quantization:{quantization.lower()}"
        return why

    def _listed_rejection(self, provider: str) -> str | None:
        candidates = self.endpoints_of(provider)
        if self.only and not (
            any(self._slug_names(s, provider) for s in self.only)
            or any(self._slug_matches(s, ep) for s in self.only for ep in candidates)
        ):
            return "provider_not_allowed"
        if candidates:
            if any(self.endpoint_allowed(ep) for ep in candidates):
                return None
            if all(any(self._slug_matches(s, ep) for s in self.ignore) for ep in candidates):
                return "provider_ignored"
            if not any(self.within_price(ep) for ep in candidates):
                return "over_max_price"
            quants = sorted({ep.quantization for ep in candidates})
            return f"quantization:{'+'.join(quants)}"
        if self.quantizations and self.endpoints and "unknown" not in self.quantizations:
            # Listed endpoints exist but this provider is not among them: its quantization is
            # unknown, which the allow-list does not accept.
            return "quantization:unknown"
        return None

    def max_prices(self) -> tuple[float | None, float | None] | None:
        """Highest prompt/completion price over the allowed endpoints (None if no list)."""
        allowed = self.allowed_endpoints()
        if not allowed:
            return None
        prompts = [ep.prompt_price for ep in allowed if ep.prompt_price is not None]
        comps = [ep.completion_price for ep in allowed if ep.completion_price is not None]
        return (max(prompts) if prompts else None, max(comps) if comps else None)

    def describe(self) -> str:
        return ", ".join(f"{ep.tag}({ep.quantization})" for ep in self.endpoints) or "none"
